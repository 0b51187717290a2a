"""One bucket's way through gcomp.torch, the same for the DDP hook (compression_hook) and the
optimizer (DistributedOptimizer):

1. bucket_stage: what a step's buckets do (a local step, 0/1 Adam's local step, uncompressed,
   or through the codec);
2. bucket_collective: which collective a bucket runs (the codec, the algorithm and the options);
3. Bucket, on the training thread: weight decay and momentum correction on the bucket's
   gradients (at submit), the call's waits and label, and for CUDA tensors the side stream and
   the event it waits for;
4. Bucket.submit: one job on the communication thread that sets the waits, runs the bucket's
   collective, records its statistics and masks the velocities it sent.
"""

import collections
import time

import gcomp
import torch
from gcomp import timeline

from . import _cuda, _timeline
from ._engine import _Waits, _check_world, _engine

_MASK = (1 << 64) - 1  # any int seed, as the library's 64 bits (the same seeds mod 2^64)

# comm.<method>(data, codec, **kwargs, label=..., stream=...): data a tensor or a list of them,
# handed to the module as _cuda._arrays gives them.
Collective = collections.namedtuple("Collective", "method data codec kwargs")


def bucket_stage(owner, step):
    """What the buckets of a step do, for the hook and DistributedOptimizer alike.

    Args:
        owner: the CompressionState or DistributedOptimizer; read: warmup_steps, _adam (1-bit or
            0/1 Adam, or None) and _periodic (periodic averaging, or None).
        step: the steps taken before this one (counted from 0).

    Returns:
        "local": a local step of periodic averaging; nothing is sent (the optimizer averages the
            models where a period ends).
        "adam_local": 0/1 Adam's local step; this rank's momentum stays here.
        "warm": averaged uncompressed (the warm-up, or Adam's variance refresh).
        "coded": through the codec (under 1-bit Adam, this rank's momentum).
    """
    periodic, adam = owner._periodic, owner._adam
    if periodic is not None and periodic.local(step):
        return "local"
    if adam is not None and adam.schedule.local(step + 1):
        return "adam_local"
    warm = adam.schedule.refreshes(step + 1) if adam is not None else step < owner.warmup_steps
    return "warm" if warm else "coded"


def bucket_collective(owner, data, step, index, uncompressed=False, plain=False, **layout):
    """The collective a bucket runs, for the hook and DistributedOptimizer alike.

    Args:
        owner: the CompressionState or DistributedOptimizer; read: codec, seed, algorithm,
            allow_uncompressed and _check (the hook's whole-step check, or None).
        data: the bucket's tensor (one allreduce) or its gradients' views (allreduce_buckets).
        step, index: the step and the bucket's place in it (the library mixes them into the
            seed).
        uncompressed: the bucket goes uncompressed (bucket_stage's "warm"; a bucket or parameter
            under dense_below).
        plain: the whole-step check's uncompressed step: x + e sent with codec none, the
            residuals (layout's efs) sent and zeroed.
        layout: the call's other keywords: ef (one allreduce); efs, shapes, bucket_bytes,
            dense_below (allreduce_buckets).

    Returns:
        A Collective: "allreduce" for a tensor, "allreduce_buckets" for views, averaged;
        uncompressed or plain, codec none on the dense algorithm; else the owner's codec, seed
        and algorithm, and allow_uncompressed unless a whole-step check weighs the uncompressed
        way itself (its steps' calls must not).
    """
    method = "allreduce" if isinstance(data, torch.Tensor) else "allreduce_buckets"
    kwargs = {"average": True, "step": step, "index": index, **layout}
    if uncompressed or plain:
        return Collective(method, data, "none", {**kwargs, "algorithm": "dense"})
    kwargs.update(seed=owner.seed & _MASK, algorithm=owner.algorithm,
                  allow_uncompressed=owner.allow_uncompressed and owner._check is None)
    return Collective(method, data, owner.codec, kwargs)


class Bucket:
    """One bucket of owner's, made on the training thread; submit() hands it on.

    Args:
        owner: a CompressionState or a DistributedOptimizer.
        kind: its name in a stall report ("DDP bucket", "bucket").
        step, index: what the label names.
        params, grads: the parameters and their gradients in the bucket, which submit() changes
            in place by weight decay and momentum correction (owner.weight_decay,
            owner.momentum); the constructor changes nothing.
        keep: the tensors the job reads or writes, the first of which says where they are (host
            or a CUDA device), kept for the caching allocator with the velocities until the side
            stream is done.
        dense: the bucket is sent uncompressed (warm-up, small), so no velocity is masked.
        entered: when the caller began (perf_counter), for the statistics' hook time.
        plain: no weight decay or momentum correction (the tensors are not gradients: a model
            average's changes).
    """

    def __init__(self, owner, kind, step, index, params, grads, keep, dense, entered,
                 plain=False):
        self.owner, self.dense, self.entered = owner, dense, entered
        self.params, self.grads, self.keep, self.plain = params, grads, keep, plain
        self.waits = _Waits(owner)
        self.label = owner._label(kind, index, step, params)

    def _correct(self):
        """Weight decay and momentum correction on the gradients, in place (not for plain);
        returns the velocities and where the tensors are. CUDA tensors: the work runs on the
        module's side stream after they are ready on the current stream (the momentum
        correction included), and the future completes there."""
        owner, params, grads = self.owner, self.params, self.grads
        velocities = None
        if owner.weight_decay and not self.plain:
            owner._decay(params, grads)
        if owner.momentum and not self.plain:
            velocities = owner._accumulate_momentum(params, grads)
        on = _cuda._OnDevice.of(self.keep[0], self.keep + [u for _, u in velocities or []])
        return velocities, on

    def submit(self, collective, uncompressed, result=None, tail=False, world_check=None,
               errors=None, not_before=None):
        """Corrects the gradients (weight decay, momentum) and queues the bucket's job on the
        communication thread; returns its future (of result).

        Args:
            collective: what the job runs (bucket_collective's).
            uncompressed: the call counts as a dense one in the statistics.
            result: what the future holds.
            tail: the step's last bucket (its time to completion is the statistics' tail).
            world_check: the caller's name for gcomp's world check against torch's, in the
                owner's first job (owner._world_ok).
            errors: the text a gcomp.Error from the job is raised under, as a RuntimeError with
                its status (DDP raises a future's failure from backward as text); None to raise
                it as it is.
            not_before: a function of no arguments, called on the thread when the job's turn
                comes, giving the time.perf_counter() before which the job does not start (a
                paced average's part: the thread sleeps until then, later jobs behind it).
        """
        velocities, on = self._correct()
        owner, dense, entered = self.owner, self.dense, self.entered
        waits, label = self.waits, self.label
        stats = owner._stats
        stream = _cuda._OnDevice.stream_of(on)
        call, codec, kwargs = collective.method, collective.codec, collective.kwargs
        data = _cuda._arrays(on, collective.data)

        traced = timeline.on()  # the bucket from submit to done, and its job, on the timeline
        if traced:
            event = _timeline.next_id()
            timeline.begin(label, "bucket", event)

        def job(comm):
            if not_before is not None:
                wait = not_before() - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            started, cpu = time.perf_counter(), time.thread_time()
            began = timeline.now() if traced else 0.0
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
                if traced:
                    ended = timeline.now()
                    timeline.span(label, "job", began, ended, call=call)
                    timeline.end(label, "bucket", event, ended)
            stats.add(comm, uncompressed)
            if velocities and not dense:
                owner._mask_momentum(velocities)
            done = time.perf_counter()
            stats.add_timing(submitted - entered, started - submitted, done - started,
                             done - submitted if tail else None, time.thread_time() - cpu)
            return result

        submitted = time.perf_counter()
        return _engine().submit(job, on)
