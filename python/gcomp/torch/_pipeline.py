"""One bucket's way through gcomp.torch, the same for the DDP hook (compression_hook) and the
optimizer (DistributedOptimizer): on the training thread, weight decay and momentum correction
on the bucket's gradients, the call's waits and label, and for CUDA tensors the side stream and
the event it waits for; then one job on the communication thread that sets the waits, runs the
bucket's collective, and records its statistics and masks the velocities it sent. What the
callers differ in is said by Bucket's and submit()'s parameters; which collective a bucket goes
in (the codec, the algorithm, per parameter or whole) is the caller's Collective."""

import collections
import time

import gcomp

from . import _cuda
from ._engine import _Waits, _check_world, _engine

_MASK = (1 << 64) - 1  # any int seed, as the library's 64 bits (the same seeds mod 2^64)

# comm.<method>(data, codec, **kwargs, label=..., stream=...): data a tensor or a list of them,
# handed to the module as _cuda._arrays gives them.
Collective = collections.namedtuple("Collective", "method data codec kwargs")


class Bucket:
    """One bucket of owner's (a CompressionState or a DistributedOptimizer), made on the
    training thread: kind names it in a stall report ("DDP bucket", "bucket"); step, index
    (what the label names); params and grads (their gradients in the bucket, changed in place
    by weight decay and momentum correction: owner.weight_decay, owner.momentum); keep: the
    tensors the job reads or writes, the first of which says where they are (host or a CUDA
    device), kept for the caching allocator with the velocities until the side stream is done;
    dense: the bucket is sent uncompressed (warm-up, small), so no velocity is masked; entered:
    when the caller began (perf_counter), for the statistics' hook time; plain: no weight decay
    or momentum correction (the tensors are not gradients: a model average's changes). submit()
    hands it on."""

    def __init__(self, owner, kind, step, index, params, grads, keep, dense, entered,
                 plain=False):
        self.owner, self.dense, self.entered = owner, dense, entered
        self.velocities = None
        if owner.weight_decay and not plain:
            owner._decay(params, grads)
        if owner.momentum and not plain:
            self.velocities = owner._accumulate_momentum(params, grads)
        self.waits = _Waits(owner)
        self.label = owner._label(kind, index, step, params)
        # CUDA tensors: the work runs on the module's side stream after they are ready on the
        # current stream (the momentum correction above included), and the future completes
        # there.
        self.on = _cuda._OnDevice.of(keep[0], keep + [u for _, u in self.velocities or []])

    def submit(self, collective, uncompressed, result=None, tail=False, world_check=None,
               errors=None):
        """Queues the bucket's job on the communication thread; returns its future (of
        result). uncompressed: the call counts as a dense one in the statistics; tail: the
        step's last bucket (its time to completion is the statistics' tail); world_check: the
        caller's name for gcomp's world check against torch's, in the owner's first job
        (owner._world_ok); errors: the text a gcomp.Error from the job is raised under, as a
        RuntimeError with its status (DDP raises a future's failure from backward as text),
        None to raise it as it is."""
        owner, dense, velocities, entered = self.owner, self.dense, self.velocities, self.entered
        waits, label, on = self.waits, self.label, self.on
        stats = owner._stats
        stream = _cuda._OnDevice.stream_of(on)
        call, codec, kwargs = collective.method, collective.codec, collective.kwargs
        data = _cuda._arrays(on, collective.data)

        def job(comm):
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                if world_check is not None and not owner._world_ok:  # the owner's first call
                    _check_world(comm, world_check)
                    owner._world_ok = True
                waits.set(comm)
                getattr(comm, call)(data, codec, label=label, stream=stream, **kwargs)
            except gcomp.Error as e:
                if errors is None:
                    raise
                raise RuntimeError(f"{errors}: {e.status}: {e}") from e
            finally:
                waits.reset(comm)
            stats.add(comm, uncompressed)
            if velocities and not dense:
                owner._mask_momentum(velocities)
            done = time.perf_counter()
            stats.add_timing(submitted - entered, started - submitted, done - started,
                             done - submitted if tail else None, time.thread_time() - cpu)
            return result

        submitted = time.perf_counter()
        return _engine().submit(job, on)
