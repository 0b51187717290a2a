"""gcomp.torch: compressed gradient averaging for PyTorch data-parallel training (CPU and CUDA).

Two ways in, both averaging gradients over the MPI ranks of ``mpiexec.mpich -n P``:

* An existing DistributedDataParallel script adds one line::

      import gcomp.torch as gt
      gt.init_process_group()          # torch.distributed (gloo) from mpiexec's rank and size
      model = torch.nn.parallel.DistributedDataParallel(model)
      model.register_comm_hook(gt.CompressionState("topk:ratio=0.01"), gt.compression_hook)

* A script without torch.distributed wraps its optimizer (Horovod's way)::

      opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                    named_parameters=model.named_parameters(),
                                    codec="qsgd:bits=4")
      gt.broadcast_parameters(model.state_dict(), root_rank=0)

Communication runs on one background thread that owns the gcomp Communicator, so it overlaps
backward: the hook returns a future that thread completes; the optimizer's gradient hooks hand
each bucket over as backward produces it and ``step()`` waits for the last. Calls reach that
thread in the same order on every rank (DDP and autograd order the buckets alike), which is what
the collectives need. A failure on any rank (NaN in a gradient, ranks with different codecs, a bad
spec) raises on every rank, from backward (the hook) or from ``step()``, never a hang.

CUDA models work the same: buckets and gradients are compressed by gcomp's CUDA kernels on a
side stream of this module's, ordered after the current stream by an event, and only payloads
cross to host memory for MPI (docs/python.md, "GPUs").
Reference: docs/python.md, "PyTorch".
"""

import atexit
import contextlib
import itertools
import math
import os
import pickle
import queue
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

import gcomp

__all__ = [
    "CompressionState",
    "DistributedOptimizer",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "communicator",
    "compression_hook",
    "init_process_group",
    "register",
]

_MASK = (1 << 64) - 1  # any int seed, as the library's 64 bits (the same seeds mod 2^64)


def _codec_or_none(codec):
    """The gcomp.Codec of a spec (or the Codec given), None for a bad spec."""
    if isinstance(codec, gcomp.Codec):
        return codec
    try:
        return gcomp.Codec(codec)
    except gcomp.Error:
        return None


def _feedback_wanted(codec, setting):
    """Whether error feedback applies: setting False, True (the codecs whose error is a
    contraction, |x - C(x)|^2 <= (1 - delta) |x|^2, which error feedback's theory asks for: the
    codec's properties["contraction"], as the library's other users read it) or "always". The
    stochastic quantizers (QSGD, TernGrad) and scaled random-k are not: their error's variance
    is omega |x|^2 with omega >= 1 at useful compression, a residual fed back grows instead of
    shrinking, and training diverges (4-bit QSGD on the MLP of
    python_examples/horovod_style.py does within 120 steps on 4 ranks). They are averaged
    without it unless setting is "always". Top-k, threshold, sign, fp16/bf16 and unscaled
    random-k get it."""
    if setting == "always":
        return True
    if setting is not True and setting is not False:
        raise ValueError(f"error_feedback must be True, False or \"always\", not {setting!r}")
    if not setting:
        return False
    c = _codec_or_none(codec)
    if c is None:
        return True  # a bad spec: the first allreduce reports it, on every rank
    return c.properties["contraction"]


def _splits(codec, per_parameter):
    """Whether to compress each parameter on its own. None (the default): for the codecs with
    one scale per call (properties' split_per_tensor: sign's mean |x|, TernGrad's max), which
    must follow each layer's magnitude; the others compress the bucket whole, in one collective
    (top-k and random-k then select over the bucket's layers together; QSGD has a norm per 512
    elements anyway). True: every codec but the element-wise ones (properties' elementwise:
    none, fp16, bf16, threshold), whose values are the same either way. False: none."""
    if per_parameter not in (None, True, False):
        raise ValueError(f"per_parameter must be None, True or False, not {per_parameter!r}")
    if per_parameter is False:
        return False
    c = _codec_or_none(codec)
    if c is None:
        return False  # a bad spec: the first allreduce reports it, on every rank
    props = c.properties
    if per_parameter is None:
        return props["split_per_tensor"]
    return not props["elementwise"]


def _needs_shapes(codec):
    """Whether the codec needs each gradient's shape (powersgd, a low-rank codec): the
    bucket then goes to allreduce_buckets as one bucket of its parameters' views, with their
    shapes and one ErrorFeedback each (which holds the residual and the warm-start Q, and so
    follows the parameter through DDP's rebuild of its buckets)."""
    c = _codec_or_none(codec)
    return c is not None and c.properties["needs_shapes"]


def _momentum_of(momentum, error_feedback):
    """The momentum-correction factor, checked: 0 <= momentum < 1, and only with error
    feedback (the residual is where the velocities accumulate)."""
    m = float(momentum)
    if not 0.0 <= m < 1.0:
        raise ValueError(f"momentum must be in [0, 1), not {momentum!r}")
    if m > 0.0 and not error_feedback:
        raise ValueError("momentum correction needs error feedback (error_feedback=True for a "
                         "codec whose error contracts, or \"always\")")
    return m


def _weight_decay_of(weight_decay):
    wd = float(weight_decay)
    if not wd >= 0.0 or math.isinf(wd):
        raise ValueError(f"weight_decay must be finite and >= 0, not {weight_decay!r}")
    return wd


def _waits_of(stall_seconds, timeout_seconds):
    """The stall report's and the timeout's seconds, checked (None: the Communicator's, from
    GCOMP_STALL_SECONDS and GCOMP_TIMEOUT_SECONDS; 0: never)."""
    out = []
    for name, v in (("stall_seconds", stall_seconds), ("timeout_seconds", timeout_seconds)):
        if v is not None:
            v = float(v)
            if not v >= 0.0 or math.isinf(v):
                raise ValueError(f"{name} must be finite and >= 0 (0: never), not {v!r}")
        out.append(v)
    return tuple(out)


def _delays(codec, error_feedback):
    """Whether the codec sends much of each gradient late, through error feedback (properties'
    sends_late: the sparsifiers top-k, random-k, threshold; and sign): the codecs whose delay
    plain momentum amplifies, and whose momentum belongs in the hook (DGC's momentum
    correction)."""
    c = _codec_or_none(codec)
    return c is not None and bool(error_feedback) and c.properties["sends_late"]


def _take_momentum(optimizer, codec, options, who):
    """register's and DistributedOptimizer's move of the optimizer's momentum (and weight decay)
    into momentum correction, for the codecs that delay (_delays): options gains momentum and
    weight_decay and the optimizer's groups lose them (SGD with one momentum and weight decay
    over its groups, no Nesterov, no dampening, not maximizing). Where it cannot move them, a
    warning says why and that the optimizer is left as it is. Returns what moved (a dict, empty
    when nothing did). A momentum given in options is the caller's choice: nothing moves."""
    given = options.get("momentum")
    if optimizer is None or not _delays(codec, _feedback_wanted(codec, options.get(
            "error_feedback", True))):
        return {}
    groups = getattr(optimizer, "param_groups", [])
    held = sorted({float(g.get("momentum", 0.0)) for g in groups})
    if given is not None:
        if float(given) > 0 and any(held):
            raise ValueError(f"{who}: momentum={given} in the hook and momentum {held[-1]} in "
                             f"{type(optimizer).__name__} would apply momentum twice; give one")
        return {}
    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.SGD):
        warnings.warn(f"{who}: {name} is left as it is: momentum correction moves SGD's momentum "
                      f"only, so {codec} compresses the gradient and {name} applies its update "
                      "to the delayed sum (docs/python.md, \"The one line\")", stacklevel=3)
        return {}
    if not any(held):
        return {}
    why = []
    if any(g.get("nesterov") for g in groups):
        why.append("Nesterov momentum (momentum correction is heavy-ball momentum)")
    if any(float(g.get("dampening", 0.0)) for g in groups):
        why.append("dampening")
    if any(g.get("maximize") for g in groups):
        why.append("maximize=True")
    if len(held) > 1:
        why.append(f"different momentum in its groups ({', '.join(map(str, held))})")
    decays = {float(g.get("weight_decay", 0.0)) for g in groups}
    if len(decays) > 1:
        why.append("different weight decay in its groups")
    if why:
        warnings.warn(f"{who}: SGD keeps its momentum ({'; '.join(why)} cannot move into the "
                      f"hook): {codec} then sends each gradient late and momentum amplifies the "
                      "delay, which costs accuracy (docs/python.md, \"The one line\")",
                      stacklevel=3)
        return {}
    moved = {"momentum": held[0], "weight_decay": decays.pop()}
    for g in groups:
        g["momentum"] = 0.0
        g["weight_decay"] = 0.0
    options.update(moved)
    return moved


# ---- CUDA tensors ----


class _Cuda:
    """What this module does with CUDA tensors, in one place. The work on a device's tensors
    runs on a side stream of this module's (one per device), after an event recorded where the
    tensors were made ready (the caller's current stream: no device-wide sync); the tensors are
    kept for the caching allocator until that stream is done with them; a job's future is a
    CUDA-aware torch future completed on the side stream, so whoever waits on it waits for the
    result on the device. tests/python/test_torch_device.py swaps in a stand-in that runs this
    path on CPU tensors with the stand-in build of gcomp, and logs what it is asked to do."""

    def __init__(self):
        self._side = {}

    def on_device(self, t):
        return t.is_cuda

    def device(self, t):
        return t.device.index if t.device.index is not None else torch.cuda.current_device()

    def current_stream(self, device):
        return torch.cuda.current_stream(device)

    def side_stream(self, device):
        stream = self._side.get(device)
        if stream is None:
            stream = self._side[device] = torch.cuda.Stream(device)
        return stream

    def handle(self, stream):
        return stream.cuda_stream

    def ready_event(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream, event):
        stream.wait_event(event)

    def keep_for(self, tensors, stream):
        for t in tensors:
            t.record_stream(stream)

    def using(self, stream):
        return torch.cuda.stream(stream)

    def future(self, device):
        return torch.futures.Future(devices=[torch.device("cuda", device)])

    def array(self, t):
        return t  # the module takes CUDA tensors in place (DLPack)

    def residual(self, ef):
        return torch.from_dlpack(ef.residual)


_cuda = _Cuda()


def _residual_of(ef):
    """An ErrorFeedback's residual as a float32 torch tensor over its memory (no copy)."""
    return _cuda.residual(ef) if ef.device != "cpu" else torch.from_numpy(ef.residual)


def _new_feedback(n, like):
    """An ErrorFeedback of n zeros where the tensor `like` is (host, or its CUDA device)."""
    if _cuda.on_device(like):
        return gcomp.ErrorFeedback(n, device=_cuda.device(like))
    return gcomp.ErrorFeedback(n)


class _OnDevice:
    """The device side of one job on CUDA tensors (None for CPU tensors): the side stream it
    runs on, the event it waits for, what it hands the module."""

    __slots__ = ("device", "stream", "ready", "stream_handle")

    def __init__(self, tensor, keep):
        self.device = _cuda.device(tensor)
        self.stream = _cuda.side_stream(self.device)
        self.ready = _cuda.ready_event(_cuda.current_stream(self.device))
        self.stream_handle = _cuda.handle(self.stream)
        _cuda.keep_for(keep, self.stream)

    def start(self):
        """In the job, first: the side stream waits for the tensors to be ready."""
        _cuda.wait(self.stream, self.ready)

    @staticmethod
    def of(tensor, keep):
        return _OnDevice(tensor, keep) if _cuda.on_device(tensor) else None

    @staticmethod
    def stream_of(on):
        """The stream= the module's calls get: the side stream's handle, or None (host)."""
        return on.stream_handle if on is not None else None


def _arrays(on, tensors):
    """What the module gets for these tensors: themselves, or on a device what _cuda gives."""
    if on is None or tensors is None:
        return tensors
    if isinstance(tensors, list):
        return [_cuda.array(t) for t in tensors]
    return _cuda.array(tensors)


# ---- the communication thread ----


def _under_mpiexec():
    """Whether a process manager of MPI started this process (its PMI variables)."""
    return any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK"))


_prefixes = itertools.count()


def _new_communicator():
    """The Communicator of this module's thread, on the transport the launch calls for
    (GCOMP_TRANSPORT=mpi|gloo overrides the choice; docs/python.md, "Transports"):

    * under mpiexec (PMI variables): MPI, MPI_COMM_WORLD;
    * otherwise, with torch.distributed initialized (torchrun, Slurm, Kubernetes, any
      init_method): Gloo, met through the default group's store under a prefix of gcomp's own,
      with torch's rank and size, whatever backend the model uses (gcomp's traffic goes over
      Gloo on the host);
    * a process alone (no launcher's variables): MPI's singleton, one rank.
    """
    choice = os.environ.get("GCOMP_TRANSPORT", "auto")
    if choice not in ("auto", "mpi", "gloo"):
        raise ValueError(f"GCOMP_TRANSPORT must be mpi, gloo or auto, not {choice!r}")
    if choice == "mpi" or (choice == "auto" and _under_mpiexec()):
        return gcomp.Communicator()
    if dist.is_available() and dist.is_initialized():
        if not gcomp.have_gloo():
            raise _world_error("gcomp.torch: this build of gcomp has no Gloo transport, so it "
                               "runs only under mpiexec (mpiexec.mpich -n N python3 script.py)")
        store = dist.distributed_c10d._get_default_store()
        return gcomp.Communicator(store, rank=dist.get_rank(), size=dist.get_world_size(),
                                  prefix=f"gcomp/{next(_prefixes)}")
    if choice == "gloo" or _env_int("WORLD_SIZE", default=1) > 1:
        raise _world_error(
            "gcomp.torch was started without mpiexec (WORLD_SIZE="
            f"{os.environ.get('WORLD_SIZE', 'unset')}) before torch.distributed was "
            "initialized: it meets the other ranks through torch.distributed's store, so call "
            "gt.init_process_group() (or torch.distributed.init_process_group) first")
    return gcomp.Communicator()


class _Engine:
    """One thread that owns the Communicator and runs every collective of this module, one at a
    time, in the order they were submitted."""

    def __init__(self):
        self.comm = _new_communicator()
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gcomp-communication", daemon=True)
        self._thread.start()
        # Ended before the interpreter's teardown: a daemon thread still inside torch's or
        # gcomp's C++ code when Python stops its threads aborts the process. Registered after
        # the Communicator, so it runs before the module closes that (atexit runs in reverse).
        atexit.register(self.stop)

    def stop(self):
        """Lets the jobs queued so far finish, then ends the thread."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self):
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, fut, on = item
            # A job on CUDA tensors runs on its side stream and completes its future there.
            with _cuda.using(on.stream) if on is not None else contextlib.nullcontext():
                try:
                    if on is not None:
                        on.start()
                    result = job(self.comm)
                except BaseException as e:  # noqa: B902 - handed to the waiting side
                    fut.set_exception(e)
                else:
                    fut.set_result(result)

    def submit(self, job, on=None):
        """Queues job(comm); returns a torch.futures.Future of its result (on a device: a
        CUDA-aware one, whose waiters wait for the job's work on the device)."""
        fut = _cuda.future(on.device) if on is not None else torch.futures.Future()
        self._jobs.put((job, fut, on))
        return fut

    def run(self, job):
        return self.submit(job).wait()


_engine_lock = threading.Lock()
_the_engine = None


def _engine():
    global _the_engine
    with _engine_lock:
        if _the_engine is None:
            _the_engine = _Engine()
        return _the_engine


def communicator():
    """The gcomp.Communicator this module uses (made, collectively, on first use). Call its
    methods only through this module's functions while training runs: they run on its thread."""
    return _engine().comm


# ---- gcomp's world against torch.distributed's ----

_world_checked = None  # torch's (rank, size) that gcomp's world was found to match


def _world_error(text):
    e = gcomp.Error(text)
    e.status = "mismatch"
    return e


def _check_world(comm, who):
    """Raises gcomp.Error ("mismatch") on every rank unless gcomp's world (comm's size, and
    this process's rank in it) is torch.distributed's default group's. Otherwise each process
    would average with a different set of ranks (a singleton MPI world under a launcher that
    is not mpiexec: every process alone) and train a model of its own, silently. Collective
    over comm when the sizes agree (the ranks' places are compared on every rank); a no-op
    without torch.distributed, and after the first check that passed."""
    global _world_checked
    if not (dist.is_available() and dist.is_initialized()):
        return
    torch_world = (dist.get_rank(), dist.get_world_size())
    if _world_checked == torch_world:
        return
    trank, tsize = torch_world
    places = None
    if comm.size == tsize:
        # Each rank's torch rank at its gcomp rank, summed over gcomp's world: exact in float32.
        places = np.zeros(tsize, np.float32)
        places[comm.rank] = trank + 1
        comm.allreduce(places, "none", algorithm="dense", label="the world check")
        if all(int(v) == r + 1 for r, v in enumerate(places)):
            _world_checked = torch_world
            return
    mine = f"{comm.size} rank{'s' if comm.size != 1 else ''}, this process rank {comm.rank}"
    theirs = f"{tsize} rank{'s' if tsize != 1 else ''}, this process rank {trank}"
    order = "" if places is None else (
        "; gcomp's ranks 0.. are torch's " + ", ".join(str(int(v) - 1) for v in places))
    raise _world_error(
        f"{who}: gcomp's world ({mine}) is not torch.distributed's ({theirs}){order}: each "
        "process would average gradients with other ranks than torch's and train a model of "
        "its own. Launch every process of the job one way: with mpiexec.mpich -n "
        f"{tsize} python3 script.py and gt.init_process_group() (gcomp over MPI, torch's "
        "world from mpiexec's ranks), or without mpiexec (torchrun --nproc_per_node "
        f"{tsize}, srun, ...) with torch.distributed initialized before gcomp.torch is used "
        "(gcomp over Gloo on torch's store; GCOMP_TRANSPORT unset or gloo).")


def _env_int(*names, default):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


def _default_backend():
    """torch.distributed's backend for this process's tensors, as torch picks it: nccl for CUDA
    training where every rank on this host can have a GPU of its own, gloo otherwise (CPU
    training; or more ranks on a host than GPUs, since NCCL refuses two ranks on one GPU)."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return "gloo"
    local = _env_int("MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", default=1)
    return "nccl" if torch.cuda.device_count() >= local else "gloo"


def init_process_group(backend=None, master_addr=None, master_port=None, **kwargs):
    """init_process_group(backend=None, master_addr=None, master_port=None, **kwargs)
    -> (rank, size)

    Initializes torch.distributed for the launch at hand: under mpiexec.mpich from the rank and
    size it gives each process (PMI_RANK, PMI_SIZE), with the rendezvous at
    master_addr:master_port (default MASTER_ADDR and MASTER_PORT, else 127.0.0.1:29500); under a
    torch launcher (torchrun, or RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set by Slurm or
    Kubernetes scripts) as torch's env:// does; else one process. Then gcomp's Communicator is
    made on the transport that goes with it (MPI under mpiexec, else Gloo on torch's store) and
    its world checked against torch's.
    backend None picks as torch does for the device: "nccl" where CUDA and NCCL are there and
    each rank on this host (MPI_LOCALNRANKS, else LOCAL_WORLD_SIZE) can have a GPU of its own,
    which it then makes the rank's current device (GPU MPI_LOCALRANKID, else LOCAL_RANK);
    "gloo" otherwise. Other keyword arguments (timeout, ...) go to
    torch.distributed.init_process_group.
    """
    if backend is None:
        backend = _default_backend()
        if backend == "nccl":
            torch.cuda.set_device(_env_int("MPI_LOCALRANKID", "LOCAL_RANK", default=0))
    if not _under_mpiexec() and "RANK" in os.environ and master_addr is None and \
            master_port is None:
        # A torch launcher's job: its variables, and its store where it keeps one (torchrun's
        # agent), as torch's env:// reads them.
        dist.init_process_group(backend, init_method="env://", **kwargs)
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        rank = _env_int("PMI_RANK", "RANK", default=0)
        size = _env_int("PMI_SIZE", "WORLD_SIZE", default=1)
        addr = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = master_port or os.environ.get("MASTER_PORT", "29500")
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=size, **kwargs)
    _engine().run(lambda comm: _check_world(comm, "gcomp.torch.init_process_group"))
    return rank, size


# ---- statistics ----


class _Stats:
    def __init__(self):
        self.lock = threading.Lock()
        # The calls' statistics, summed by the library as it sums a Communicator's own totals;
        # the dense calls (warm-up, small whole buckets) once more on their own, for dense_calls.
        self.totals = gcomp.TotalStats()
        self.dense = gcomp.TotalStats()
        # Where a step's communication time goes (docs/python.md, `state.stats()`):
        # the hook on the training thread; the hand-off (submitted -> started on the
        # communication thread); the job there, of which encode/comm/decode are the library's
        # and the rest Python's; and the tail: from the step's last submission to its
        # completion, what backward's end waits for.
        # cpu: the communication thread's CPU time in the jobs (time.thread_time()), what they
        # take from training where the cores are shared.
        self.hook_seconds = self.handoff_seconds = self.job_seconds = self.tail_seconds = 0.0
        self.cpu_seconds = 0.0
        self.jobs = 0

    def add_timing(self, hook, handoff, job, tail=None, cpu=0.0):
        with self.lock:
            self.hook_seconds += hook
            self.handoff_seconds += handoff
            self.job_seconds += job
            self.cpu_seconds += cpu
            self.jobs += 1
            if tail is not None:
                self.tail_seconds += tail

    def add_tail(self, seconds):
        with self.lock:
            self.tail_seconds += seconds

    def add(self, comm, dense):
        """Adds comm's last call (one allreduce, or all the buckets of an allreduce_buckets); a
        dense one counts as no compressed call."""
        with self.lock:
            self.totals.add(comm, codec_applied=not dense)
            if dense:
                self.dense.add(comm)

    def snapshot(self, **extra):
        with self.lock:
            t = self.totals.as_dict()
            d = {"calls": t["calls"], "dense_calls": self.dense.as_dict()["calls"],
                 "compressed": t["compressed"]}
            for k in ("bytes_sent", "bytes_received", "encode_seconds", "comm_seconds",
                      "decode_seconds", "agree_seconds", "algorithm"):
                d[k] = t[k]
            for k in ("hook_seconds", "handoff_seconds", "job_seconds", "tail_seconds",
                      "cpu_seconds", "jobs"):
                d[k] = getattr(self, k)
        d["python_seconds"] = max(0.0, d["job_seconds"] - d["encode_seconds"] - d["comm_seconds"]
                                  - d["decode_seconds"])
        d.update(extra)
        return d


# ---- the DDP communication hook ----


class _PerParameterFeedback:
    """Where each parameter's error-feedback residual lives: _home maps a parameter's id to
    (ErrorFeedback, offset, numel), its own ErrorFeedback (offset 0) or its share of a
    bucket's. _keys names each parameter met for checkpoints (its name where known, else its
    place in the order first met); _loaded holds a loaded checkpoint's values until each
    parameter is met again."""

    _format = None  # the checkpoint's "format" (set by each subclass)

    def _init_feedback(self, names=None):
        self._velocity = {}  # parameter id -> its velocity (momentum correction)
        self._home = {}  # parameter id -> (ErrorFeedback, offset, numel): where its residual is
        # parameter id -> its name (checkpoint keys), from (name, parameter) pairs
        self._names = {id(q): n for n, q in (names or [])}
        self._keys = {}  # parameter id -> its checkpoint key, in the order first met
        self._params = {}  # parameter id -> the parameter (kept for state_dict)
        self._loaded = {"residuals": {}, "kept": {}, "velocities": {}, "buckets": {}}

    def _meet(self, params):
        """Gives each parameter not met before its checkpoint key."""
        keys = self._keys
        for p in params:
            if id(p) not in keys:
                keys[id(p)] = self._names.get(id(p), f"#{len(keys)}")
                self._params[id(p)] = p

    def _label(self, kind, index, step, params):
        """A call's name in a stall report: "DDP bucket 2 of step 17 (fc.weight, fc.bias)"."""
        names = [self._names[id(p)] for p in params if id(p) in self._names]
        if len(names) > 3:
            names = names[:3] + [f"{len(names) - 3} more"]
        return f"{kind} {index} of step {step}" + (f" ({', '.join(names)})" if names else "")

    def residual(self, param):
        """The error-feedback residual of one parameter, or None: a float32 numpy view (CPU
        parameters) or a torch tensor view on the parameter's device (CUDA parameters)."""
        home = self._home.get(id(param))
        if home is None:
            return None
        ef, offset, numel = home
        r = ef.residual if ef.device == "cpu" else _residual_of(ef)
        return r[offset:offset + numel]

    def _feedback_of(self, p):
        """A parameter's own ErrorFeedback, made once (not a throwaway one every step), with a
        loaded checkpoint's residual and kept state where there is one."""
        home = self._home.get(id(p))
        if home is None:
            ef = _new_feedback(p.numel(), p)
            key = self._keys.get(id(p))
            r = self._loaded["residuals"].pop(key, None)
            if r is not None and r.numel() == p.numel():
                _residual_of(ef).copy_(r)
            k = self._loaded["kept"].pop(key, None)
            if k is not None:
                ef.kept = k.numpy()
            home = self._home[id(p)] = (ef, 0, p.numel())
        return home[0]

    def velocity(self, param):
        """The momentum-correction velocity of one parameter (a float32 tensor), or None."""
        return self._velocity.get(id(param))

    def _decay(self, params, grads):
        """Weight decay before compression (where register() moved it from SGD, as DGC adds it
        before momentum correction): g += weight_decay * p, in place."""
        with torch.no_grad():
            for p, g in zip(params, grads):
                g.add_(p.detach().reshape(g.shape), alpha=self.weight_decay)

    def _accumulate_momentum(self, params, grads):
        """Momentum correction (Lin et al., DGC), before compression: each parameter's velocity
        u = momentum * u + g replaces its gradient g (in place), so that the error-feedback
        residual accumulates velocities and top-k selects on them. Returns [(param, u)]."""
        pairs = []
        with torch.no_grad():
            for p, g in zip(params, grads):
                u = self._velocity.get(id(p))
                if u is None:
                    u = self._loaded["velocities"].pop(self._keys.get(id(p)), None)
                    if u is not None and u.numel() == g.numel():
                        u = self._velocity[id(p)] = u.to(g.device, copy=True)
                    else:
                        u = self._velocity[id(p)] = g.detach().reshape(-1).clone()
                        pairs.append((p, u))
                        continue
                if g.is_contiguous() and not _cuda.on_device(g):
                    gcomp.momentum_correct(u, g.view(-1), self.momentum)  # in place, no GIL
                else:  # the same two roundings, by torch (on the device, on its stream)
                    u.mul_(self.momentum).add_(g.reshape(-1))
                    g.copy_(u.view_as(g))
                pairs.append((p, u))
        return pairs

    def _mask_momentum(self, pairs):
        """Momentum factor masking, after the allreduce: a parameter's velocity is zeroed where
        its accumulated value was sent (the residual is 0 there), so that a gradient already
        applied late does not go on pushing. A parameter sent whole (its residual all zero:
        warm-up, a tensor auto or dense_below sent uncompressed) keeps its velocity: nothing of it
        was delayed, and the update is plain momentum SGD."""
        for p, u in pairs:
            r = self.residual(p)
            if r is None:
                continue
            if isinstance(r, np.ndarray):
                gcomp.mask_momentum(u, r)
            else:  # on the device, without a host sync: the same zeros as mask_momentum's
                sent = r == 0
                u.masked_fill_(sent & ~sent.all(), 0.0)

    # ---- checkpoints ----

    def _feedback_state(self):
        """The per-parameter part of state_dict(): residuals, kept states and velocities by
        checkpoint key (float32 tensors, copies), and the shared buckets' kept states."""
        out = {"residuals": {}, "kept": {}, "velocities": {}, "buckets": {}}
        for pid, key in self._keys.items():
            home = self._home.get(pid)
            if home is not None:
                ef, off, numel = home
                out["residuals"][key] = _residual_of(ef)[off:off + numel].to("cpu", copy=True)
                if numel == ef.size:  # its own memory: what the collectives keep beside it
                    kept = ef.kept
                    if kept.size:
                        out["kept"][key] = torch.from_numpy(kept)
            u = self._velocity.get(pid)
            if u is not None:
                out["velocities"][key] = u.clone()
        # Not yet met since a load: carried on as loaded.
        for part in ("residuals", "kept", "velocities", "buckets"):
            for key, v in self._loaded[part].items():
                out[part].setdefault(key, v)
        return out

    def _check_format(self, sd):
        if not isinstance(sd, dict) or sd.get("format") != self._format:
            raise ValueError(f"load_state_dict: not a {self._format} state_dict "
                             f"(format {sd.get('format') if isinstance(sd, dict) else type(sd)!r})")
        if sd.get("version") != 1:
            raise ValueError(f"load_state_dict: version {sd.get('version')!r} is not known "
                             "(this gcomp reads version 1)")
        spec = _codec_or_none(self.codec)
        spec = spec.spec if spec is not None else str(self.codec)
        if sd.get("codec") != spec:
            raise ValueError(f"load_state_dict: the checkpoint is of codec {sd.get('codec')!r}, "
                             f"this state's is {spec!r}")
        if float(sd.get("momentum", 0.0)) != self.momentum:
            raise ValueError(f"load_state_dict: the checkpoint's momentum {sd.get('momentum')} "
                             f"is not this state's {self.momentum}")

    def _load_feedback(self, sd):
        """Forgets this rank's residuals and velocities and holds the checkpoint's until each
        parameter is met (by its key)."""
        self._velocity.clear()
        self._home.clear()
        self._loaded = {part: {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1)
                                if part != "buckets" else v
                                for k, v in dict(sd.get(part, {})).items()}
                         for part in ("residuals", "kept", "velocities", "buckets")}


class CompressionState(_PerParameterFeedback):
    """CompressionState(codec, error_feedback=True, warmup_steps=0, algorithm="auto",
    dense_below=1024, seed=0, synchronous=False, per_parameter=None, allow_uncompressed=True,
    momentum=0.0, weight_decay=0.0, stall_seconds=None, timeout_seconds=None, names=None)

    The state of compression_hook for one DDP model. codec: a spec or gcomp.Codec.
    per_parameter: True compresses each parameter's gradient in the bucket on its own (one
    collective each, parameters of fewer than dense_below elements fused into one
    uncompressed), as layer-wise compression does: a codec's scale or top-k's selection then
    follows each layer. False compresses the whole bucket as one tensor (fewer collectives; a
    top-k over the bucket's layers together). None (the default): True for the codecs with one
    scale per tensor (sign, TernGrad), False for the others. The element-wise codecs (none,
    fp16, bf16, threshold) always send the bucket whole: their values are the same either way.
    error_feedback: keep what the codec did not send, per parameter, and add it to the next
    step's gradient (it follows the parameters when DDP rebuilds its buckets after the first
    step). True applies it to the codecs whose error contracts (top-k, threshold, sign, fp16,
    bf16, random-k), not to QSGD, TernGrad and scaled random-k, whose residual would grow
    without bound; "always" applies it to every codec, False to none.
    warmup_steps: the first steps are averaged uncompressed. dense_below: parameters (whole
    buckets, where not per parameter) of fewer elements go uncompressed. algorithm,
    allow_uncompressed: as gcomp.Communicator.allreduce (auto may send a tensor uncompressed
    when that is faster, unless allow_uncompressed is False). synchronous: wait for each
    bucket's allreduce in the hook (no overlap with backward; for measuring overlap).
    momentum: DGC's momentum correction (0 = off). The hook keeps a velocity per parameter,
    u = momentum * u + g, and compresses u with error feedback instead of g: the residual
    accumulates velocities, top-k selects on them, and where a value is sent its velocity is
    zeroed (momentum factor masking). Train with an optimizer without momentum (SGD with
    momentum=0): the momentum is here. Needs error feedback. register() sets it (and
    weight_decay) from the optimizer. weight_decay: added to each gradient before momentum
    correction and compression, g += weight_decay * p (SGD's weight decay, moved here).
    stall_seconds, timeout_seconds: for this hook's calls, the Communicator's (None: its own,
    from GCOMP_STALL_SECONDS, default 60, and GCOMP_TIMEOUT_SECONDS, default never; 0: never):
    a rank that waits that long for another at a bucket's call names the call and the missing
    ranks on stderr, or with the timeout raises gcomp.Error("timeout") from backward on every
    rank (docs/python.md, "A rank that does not come"). names: (name, parameter) pairs
    (register() passes model.named_parameters()), the keys of state_dict() and the names in a
    stall report. state_dict() / load_state_dict(): checkpoints (docs/python.md).
    A low-rank codec ("powersgd:rank=4", docs/python.md) takes each gradient's shape from
    bucket.gradients() and sends the bucket's matrices as their factors in one collective, its
    vectors and small matrices dense in the same one (per_parameter and dense_below do not
    apply; the bucket is reduced where DDP holds it, without a copy); its state (residual and
    warm-start Q) is per parameter, so it works with DDP's default buckets and their rebuild.
    Without error feedback it keeps no Q: every step starts cold. Under auto with
    allow_uncompressed, whole steps are compared too (_StepCheck, docs/python.md): where the
    uncompressed steps measure faster, the hook sends whole steps uncompressed.
    """

    def __init__(self, codec, error_feedback=True, warmup_steps=0, algorithm="auto",
                 dense_below=1024, seed=0, synchronous=False, per_parameter=None,
                 allow_uncompressed=True, momentum=0.0, weight_decay=0.0, stall_seconds=None,
                 timeout_seconds=None, names=None):
        self.codec = codec
        self.error_feedback = _feedback_wanted(codec, error_feedback)
        self.warmup_steps = int(warmup_steps)
        self.algorithm = algorithm
        self.dense_below = int(dense_below)
        self.seed = int(seed)
        self.synchronous = bool(synchronous)
        self.per_parameter = per_parameter
        self._split = _splits(codec, per_parameter)
        self._shaped = _needs_shapes(codec)
        self.allow_uncompressed = bool(allow_uncompressed)
        self.momentum = _momentum_of(momentum, self.error_feedback)
        self.weight_decay = _weight_decay_of(weight_decay)
        self.stall_seconds, self.timeout_seconds = _waits_of(stall_seconds, timeout_seconds)
        self._init_feedback(names)
        self.step = 0  # completed backward passes (a bucket with is_last() ends one)
        self._layout = {}  # bucket index -> (layout key, ErrorFeedback)
        self._stats = _Stats()
        self._new_step = True  # the next hook call is a step's first
        self._world_ok = False  # gcomp's world checked against torch's (the first call)
        # Low-rank under auto, uncompressed allowed: whole steps compared too (_StepCheck).
        self._check = (_StepCheck(self.warmup_steps + _start_steps(codec) + _StepCheck.window)
                       if self._shaped and algorithm == "auto" and self.allow_uncompressed
                       else None)

    def stats(self):
        """stats() -> dict: calls, dense_calls (warm-up; small whole buckets), compressed,
        bytes_sent, bytes_received, encode/comm/decode_seconds, algorithm (calls per
        algorithm) and steps, summed over this rank's hook calls so far; and where the time
        goes: hook_seconds (in the hook, on the training thread), handoff_seconds (submitted
        to started on the communication thread), job_seconds (the jobs there: encode, comm,
        decode and python_seconds, the rest; agree_seconds is comm's agreement), tail_seconds
        (from each step's last bucket handed over to its result: what the end of backward
        waits for), cpu_seconds (the communication thread's CPU time in the jobs), jobs; for a
        low-rank codec under auto (whole steps compared, docs/python.md), step_checks,
        step_switches, step_aborts and uncompressed_steps."""
        extra = self._check.stats() if self._check else {}
        return self._stats.snapshot(steps=self.step, **extra)

    def _feedback_for(self, bucket):
        """The bucket's ErrorFeedback (per_parameter=False); when DDP has laid out this bucket
        anew (its rebuild after the first step), a new one filled with each parameter's residual
        from where it was (or from a loaded checkpoint)."""
        entries = _layout_of(bucket)
        key = tuple(entries)
        known = self._layout.get(bucket.index())
        if known is not None and known[0] == key:
            return known[1]
        ef = _new_feedback(bucket.buffer().numel(), bucket.buffer())
        residual = _residual_of(ef)
        pending = self._loaded["residuals"]
        for pid, off, numel in entries:
            home = self._home.get(pid)
            if home is not None:
                old, old_off, old_numel = home
                if old_numel == numel:
                    residual[off:off + numel] = _residual_of(old)[old_off:old_off + numel]
            else:
                r = pending.pop(self._keys.get(pid), None)
                if r is not None and r.numel() == numel:
                    residual[off:off + numel] = r
        # What the collectives kept beside the bucket's residual, where a checkpoint has it for
        # this very layout.
        kept = self._loaded["buckets"].pop(self._bucket_key(entries), None)
        if kept is not None:
            ef.kept = torch.as_tensor(kept, dtype=torch.float32).numpy()
        for pid, off, numel in entries:
            self._home[pid] = (ef, off, numel)
        self._layout[bucket.index()] = (key, ef)
        return ef

    def _bucket_key(self, entries):
        return tuple((self._keys.get(pid), off, numel) for pid, off, numel in entries)

    _format = "gcomp.torch.CompressionState"

    def state_dict(self):
        """state_dict() -> dict: what a resumed job needs to go on exactly where this one is
        (for torch.save): the step count, every parameter's error-feedback residual and
        momentum-correction velocity, and what the collectives keep beside a residual (the
        low-rank warm-start factors), each parameter by its name (register(), names=) or else
        by its place in the order the hook first met it; float32 tensors, copies. Not in it:
        what auto learned and the whole-step check, which a resumed job learns again
        (docs/python.md, "Checkpoints"). Call it between steps (no bucket in flight)."""
        fb = self._feedback_state()
        for (layout, ef) in self._layout.values():
            kept = ef.kept
            if kept.size:
                fb["buckets"][self._bucket_key(layout)] = torch.from_numpy(kept)
        spec = _codec_or_none(self.codec)
        return {"format": self._format, "version": 1,
                "codec": spec.spec if spec is not None else str(self.codec),
                "step": self.step, "momentum": self.momentum, **fb}

    def load_state_dict(self, state_dict):
        """load_state_dict(state_dict): goes on from a state_dict() of a state with the same
        codec and momentum (ValueError otherwise), before the hook's first call or between
        steps: the step count as saved, and each parameter's residual and velocity when the hook
        next meets it (by its key), whatever buckets DDP has laid it out in."""
        self._check_format(state_dict)
        self._load_feedback(state_dict)
        self._layout.clear()
        self.step = int(state_dict["step"])
        self._new_step = True
        if self._check is not None:  # the whole-step check measures afresh
            self._check = _StepCheck(max(self.warmup_steps + _start_steps(self.codec),
                                         self.step) + _StepCheck.window)


class _StepCheck:
    """Whole steps compared, for a low-rank codec under auto with allow_uncompressed (the hook's
    defaults): auto weighs each call, but what a low-rank step costs beyond its calls (the
    products' CPU time and memory traffic, which backward loses where training and the hook share
    the cores) is not in any call. After the codec's start steps and a `window` of steps, and
    every `interval` steps after (doubling up to `max_interval`), the hook runs up to `probe`
    steps the other way (uncompressed: each bucket's x + e summed as auto's own uncompressed
    choice does, the residual zeroed; or the codec again) and compares their median step time
    with the `window` steps before it; the ranks vote (one allreduce of the votes) and where
    most find the other way faster by more than `margin`, the steps until the next check go that
    way. A first probe step more than `abort` times the window's median (the uncompressed
    allreduce on a slow link) ends the check at once, on the ranks' vote, so a check costs a slow
    link one step. A step's time is from its first bucket's hook call to the next step's. The low-rank
    steps' calls run without allow_uncompressed: the check weighs the uncompressed way, and a call
    trying it inside a low-rank step would blur the step times compared."""

    window, probe, interval, max_interval, margin, abort = 8, 5, 64, 1024, 0.03, 2.0

    def __init__(self, first):
        self.first = first  # the first check's step
        self.uncompressed = False  # the way the steps go between checks
        self.next_check = first
        self.interval = type(self).interval
        self.starts = {}  # step -> its first hook call's time
        self.modes = {}  # step -> True where it went uncompressed
        self.checks = self.switches = self.aborted = self.uncompressed_steps = 0
        self.zeroed = set()  # buckets whose residuals an uncompressed step sent (and zeroed)
        # (step, uncompressed before, this rank's medians: the way kept and the other, how many
        # ranks voted for the other (or to abort), ranks, "switch" / "keep" / "abort")
        self.history = []
        self.clock = time.perf_counter  # a test may give its own

    def mode(self, step, first_call, vote):
        """Whether `step` goes uncompressed. first_call: this is the step's first hook call (its
        time is taken, and within a check the ranks vote through vote(local) -> (ranks, how many
        voted 1)); every rank comes to the same answer."""
        if first_call:
            self.starts[step] = self.clock()
            c = self.next_check
            if step == c + self.probe:
                self._decide(step, vote)
            elif step == c + 1:
                # Once, on the first probe step's time: a vote is a collective, which lines the
                # ranks up and so costs the step it falls in; one in the probe keeps the
                # probe's median free of it.
                self._maybe_abort(step, vote)
            probing = self.next_check <= step < self.next_check + self.probe
            self.modes[step] = self.uncompressed != probing
            self.uncompressed_steps += self.modes[step]
            for old in [k for k in self.starts if k < step - self.window - self.probe - 1]:
                del self.starts[old]
                self.modes.pop(old, None)
        return self.modes.get(step, self.uncompressed)

    def _median(self, steps):
        times = sorted(self.starts[k + 1] - self.starts[k] for k in steps
                       if k in self.starts and k + 1 in self.starts)
        return times[len(times) // 2] if times else None

    def _maybe_abort(self, step, vote):
        c = self.next_check
        ours, last = self._median(range(c - self.window, c)), self._median([step - 1])
        slow = ours is not None and last is not None and last > self.abort * ours
        ranks, yes = vote(1 if slow else 0)
        if 2 * yes > ranks:
            self.history.append((step, self.uncompressed, ours, last, yes, ranks, "abort"))
            self.checks += 1
            self.aborted += 1
            self._schedule(step)

    def _decide(self, step, vote):
        c = self.next_check
        ours = self._median(range(c - self.window, c))
        other = self._median(range(c, c + self.probe))
        faster = ours is not None and other is not None and other < (1 - self.margin) * ours
        self.checks += 1
        ranks, yes = vote(1 if faster else 0)
        switch = 2 * yes > ranks
        self.history.append((step, self.uncompressed, ours, other, yes, ranks,
                             "switch" if switch else "keep"))
        if switch:
            self.uncompressed = not self.uncompressed
            self.switches += 1
        self._schedule(step)

    def _schedule(self, step):
        self.next_check = step + self.interval
        self.interval = min(2 * self.interval, self.max_interval)

    def stats(self):
        return {"step_checks": self.checks, "step_switches": self.switches,
                "step_aborts": self.aborted, "uncompressed_steps": self.uncompressed_steps}


def _start_steps(codec):
    """The steps the codec sends uncompressed first (properties' start_steps: powersgd's
    start=N), or 0."""
    return _codec_or_none(codec).properties["start_steps"]


def _vote(local):
    """(ranks, how many voted 1): one small allreduce on the communication thread."""
    def job(comm):
        v = np.array([float(local), 1.0], dtype=np.float32)
        comm.allreduce(v, "none", algorithm="dense")
        return int(round(float(v[1]))), int(round(float(v[0])))
    return _engine().run(job)


def _layout_of(bucket):
    """[(parameter id, offset in the bucket's buffer, numel)] in the bucket's order."""
    buffer = bucket.buffer()
    base, size = buffer.data_ptr(), buffer.element_size()
    entries, offset = [], 0
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        if g.data_ptr() >= base and g.data_ptr() < base + buffer.numel() * size:
            offset = (g.data_ptr() - base) // size  # a view into the bucket
        entries.append((id(p), offset, p.numel()))
        offset += p.numel()
    return entries


class _Waits:
    """A state's stall_seconds and timeout_seconds for its calls: set on the Communicator for
    the call (where given) and set back after it, so that states with their own settings and
    the module's other calls share the one Communicator."""

    __slots__ = ("stall", "timeout", "old")

    def __init__(self, state):
        self.stall, self.timeout, self.old = state.stall_seconds, state.timeout_seconds, None

    def set(self, comm):
        if self.stall is not None or self.timeout is not None:
            self.old = (comm.stall_seconds, comm.timeout_seconds)
            if self.stall is not None:
                comm.stall_seconds = self.stall
            if self.timeout is not None:
                comm.timeout_seconds = self.timeout

    def reset(self, comm):
        if self.old is not None:
            comm.stall_seconds, comm.timeout_seconds = self.old
            self.old = None


def compression_hook(state, bucket):
    """compression_hook(state, bucket) -> torch.futures.Future[torch.Tensor]

    A DDP communication hook (torch's contract: register it with
    ``model.register_comm_hook(state, compression_hook)``): averages the bucket over the ranks
    through gcomp with state's codec, on the communication thread, and returns a future of the
    averaged bucket, as DDP's default hook does.
    """
    entered = time.perf_counter()
    tensor = bucket.buffer()
    step, index = state.step, bucket.index()
    last = bucket.is_last()
    params = bucket.parameters()
    state._meet(params)
    per_parameter, shaped = state._split, state._shaped
    dense = step < state.warmup_steps or (not per_parameter and not shaped and
                                          tensor.numel() < state.dense_below)
    first_call, state._new_step = state._new_step, last
    # Whole steps uncompressed, where the step check found them faster: x + e summed with codec
    # none (the residual sent and zeroed, as auto's own uncompressed choice does).
    plain = (not dense and state._check is not None and
             state._check.mode(step, first_call, _vote))
    # Past a bucket's first uncompressed step its residuals are zero: the plain allreduce.
    bare = plain and index in state._check.zeroed
    if state._check is not None:
        if plain:
            state._check.zeroed.add(index)
        elif not dense:
            state._check.zeroed.clear()
    seed = state.seed & _MASK  # the library mixes in step and index: a seed per bucket and step
    codec, algorithm, allow = state.codec, state.algorithm, state.allow_uncompressed
    allow = allow and state._check is None  # the step check weighs that way (_StepCheck)
    dense_below = state.dense_below
    ef = views = efs = velocities = shapes = None
    if shaped and not dense:
        # Low-rank: the bucket's gradients as matrices, in one collective of their factors.
        views = [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        if state.error_feedback:
            efs = [state._feedback_of(p) for p in bucket.parameters()]
    elif per_parameter and not dense:
        views = [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
        if state.error_feedback:
            efs = [state._feedback_of(p) for p in bucket.parameters()]
    elif state.error_feedback and not dense:
        ef = state._feedback_for(bucket)
    if state.momentum or state.weight_decay:
        grads = views or [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
        if state.weight_decay:
            state._decay(params, grads)
        if state.momentum:
            velocities = state._accumulate_momentum(params, grads)
    waits = _Waits(state)
    label = state._label("DDP bucket", index, step, params)
    # CUDA buckets: the work runs on the module's side stream after the bucket is ready on the
    # current stream (the momentum correction above included), and the future completes there.
    on = _OnDevice.of(tensor, [tensor] + [u for _, u in velocities or []])
    stream = _OnDevice.stream_of(on)
    whole, views = _arrays(on, tensor), _arrays(on, views)

    def job(comm):
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            if not state._world_ok:  # the state's first call
                _check_world(comm, "gcomp.torch.compression_hook")
                state._world_ok = True
            waits.set(comm)
            if dense or bare:
                comm.allreduce(whole, "none", algorithm="dense", average=True, label=label,
                               stream=stream)
            elif plain:
                comm.allreduce_buckets(views, "none", efs=efs,
                                       bucket_bytes=max(4 * tensor.numel(), 1), dense_below=0,
                                       average=True, algorithm="dense", step=step, index=index,
                                       label=label, stream=stream)
            elif shaped:
                # dense_below=0: the low-rank algorithm sends the small tensors dense in its
                # first collective (one collective a bucket, not two), and the views, which lie
                # in the bucket's buffer in order, are reduced there.
                comm.allreduce_buckets(views, codec, efs=efs, shapes=shapes,
                                       bucket_bytes=max(4 * tensor.numel(), 1),
                                       dense_below=0, average=True, seed=seed,
                                       algorithm=algorithm, allow_uncompressed=allow, step=step,
                                       index=index, label=label, stream=stream)
            elif per_parameter:
                # bucket_bytes=1: each parameter is a bucket of its own, compressed on its own.
                comm.allreduce_buckets(views, codec, efs=efs, bucket_bytes=1,
                                       dense_below=dense_below, average=True, seed=seed,
                                       algorithm=algorithm, allow_uncompressed=allow, step=step,
                                       index=index, label=label, stream=stream)
            else:
                comm.allreduce(whole, codec, ef=ef, algorithm=algorithm, average=True, seed=seed,
                               allow_uncompressed=allow, step=step, index=index, label=label,
                               stream=stream)
        except gcomp.Error as e:
            # DDP raises the future's failure from backward as text: keep the status in it.
            raise RuntimeError(f"gcomp compression_hook, bucket {index}: {e.status}: {e}") from e
        finally:
            waits.reset(comm)
        state._stats.add(comm, dense or plain)
        if velocities and not dense:
            state._mask_momentum(velocities)
        done = time.perf_counter()
        state._stats.add_timing(submitted - entered, started - submitted, done - started,
                                done - submitted if last else None, time.thread_time() - cpu)
        return tensor

    if last:
        state.step += 1
    submitted = time.perf_counter()
    fut = _engine().submit(job, on)
    if state.synchronous:
        try:
            fut.wait()
        except Exception:  # noqa: BLE001 - the future holds it; DDP raises it from backward
            pass
    return fut


def register(model, optimizer, codec, **options):
    """register(model, optimizer, codec, **options) -> CompressionState

    The one line for a DistributedDataParallel script: makes a CompressionState(codec,
    **options) (options as CompressionState's), registers compression_hook with it on model,
    and returns it. For the codecs that send much of a gradient late through error feedback
    (the sparsifiers top-k, random-k, threshold; sign), momentum SGD amplifies the delay and
    loses accuracy; register moves optimizer's momentum (and weight decay) into the hook as
    DGC's momentum correction: the state gets momentum= and weight_decay= of the optimizer's
    param groups, and the groups get 0 (a bucket sent whole is then plain momentum SGD, bit for
    bit the same update). What it cannot move (an optimizer other than SGD, Nesterov momentum,
    dampening, maximize, groups with different momentum or weight decay) it leaves as it is,
    with a warning saying so. momentum= among the options is taken as given (nothing moves;
    a momentum in both places is a ValueError); optimizer None moves nothing. The state's
    checkpoint keys are model's parameter names."""
    if not hasattr(model, "register_comm_hook"):
        raise TypeError("register: model must be a torch.nn.parallel.DistributedDataParallel "
                        f"model (it has register_comm_hook), not {type(model).__name__}")
    options = dict(options)
    moved = _take_momentum(optimizer, codec, options, "gcomp.torch.register")
    options.setdefault("names", list(model.named_parameters()))
    state = CompressionState(codec, **options)
    _engine().run(lambda comm: _check_world(comm, "gcomp.torch.register"))
    state.moved = moved
    model.register_comm_hook(state, compression_hook)
    return state


# ---- the optimizer wrapper ----


class DistributedOptimizer(_PerParameterFeedback):
    """DistributedOptimizer(optimizer, named_parameters=None, codec="none", error_feedback=True,
    warmup_steps=0, algorithm="auto", dense_below=1024, bucket_bytes=25 << 20, seed=0,
    synchronous=False, per_parameter=None, allow_uncompressed=True, momentum=None,
    weight_decay=None, stall_seconds=None, timeout_seconds=None)

    Wraps a torch optimizer so that step() applies gradients averaged over the ranks through
    gcomp, without torch.distributed. Gradients are allreduced as backward produces them: a
    hook on each parameter's gradient accumulator collects the ready gradients into buckets of
    bucket_bytes (float32) and hands each to the communication thread; step() sends the last,
    waits for all, and steps the wrapped optimizer. per_parameter, as CompressionState's: True,
    each gradient of a bucket compressed on its own (one collective each); False, the bucket's
    gradients fused and compressed as one tensor; None, True for sign and TernGrad only. Error
    feedback is per parameter, as in CompressionState (True: for the codecs whose error
    contracts). momentum: DGC's momentum correction, as CompressionState's; None (the
    default) takes the wrapped SGD's momentum and weight decay for the codecs that send much of
    a gradient late (top-k, random-k, threshold, sign), as register() does, and sets the SGD's
    to 0; a number is taken as given. stall_seconds, timeout_seconds, state_dict(),
    load_state_dict(): as CompressionState's. A low-rank codec ("powersgd:rank=4") gets each gradient's shape, as in
    CompressionState. Every other attribute (param_groups, state_dict, ...) is the wrapped
    optimizer's.
    """

    def __init__(self, optimizer, named_parameters=None, codec="none", error_feedback=True,
                 warmup_steps=0, algorithm="auto", dense_below=1024, bucket_bytes=25 << 20,
                 seed=0, synchronous=False, per_parameter=None, allow_uncompressed=True,
                 momentum=None, weight_decay=None, stall_seconds=None, timeout_seconds=None):
        self.optimizer = optimizer
        if named_parameters is None:
            named = [(f"param{i}", p) for i, p in
                     enumerate(p for g in optimizer.param_groups for p in g["params"])]
        else:
            named = list(named_parameters)
        seen = set()
        for name, p in named:
            if id(p) in seen:
                raise ValueError(f"parameter {name} is given twice in named_parameters")
            seen.add(id(p))
        self.codec = codec
        self.error_feedback = _feedback_wanted(codec, error_feedback)
        self.warmup_steps = int(warmup_steps)
        self.algorithm = algorithm
        self.dense_below = int(dense_below)
        self.bucket_bytes = int(bucket_bytes)
        self.seed = int(seed)
        self.synchronous = bool(synchronous)
        self.per_parameter = per_parameter
        self._split = _splits(codec, per_parameter)
        self._shaped = _needs_shapes(codec)
        self.allow_uncompressed = bool(allow_uncompressed)
        # The wrapped SGD's momentum and weight decay move here for the codecs that delay
        # (register()'s rule), unless momentum is given.
        options = {"error_feedback": error_feedback}
        if momentum is not None:
            options["momentum"] = momentum
        if weight_decay is not None:
            options["weight_decay"] = weight_decay
        self.moved = _take_momentum(optimizer, codec, options, "gcomp.torch.DistributedOptimizer")
        self.momentum = _momentum_of(options.get("momentum", 0.0), self.error_feedback)
        self.weight_decay = _weight_decay_of(options.get("weight_decay", 0.0))
        self.stall_seconds, self.timeout_seconds = _waits_of(stall_seconds, timeout_seconds)
        self.steps = 0
        self._init_feedback(named)  # parameter id -> (its ErrorFeedback, 0, numel) in _home
        self._meet(p for _, p in named)
        self._ready, self._ready_bytes = [], 0
        self._pending, self._buckets = [], 0
        self._stats = _Stats()
        self._accumulators = []  # kept alive: their hooks must stay registered
        # The Communicator, made now on every rank alike, and its world checked against
        # torch.distributed's where that is initialized.
        _engine().run(lambda comm: _check_world(comm, "gcomp.torch.DistributedOptimizer"))
        for _, p in named:
            if p.requires_grad:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._ready_hook(p))
                self._accumulators.append(acc)

    def __getattr__(self, name):
        return getattr(self.__dict__["optimizer"], name)

    def stats(self):
        """stats() -> dict, as CompressionState.stats(), with steps (tail_seconds: what
        step() waited for, from handing over the last bucket to every result)."""
        return self._stats.snapshot(steps=self.steps)

    def _ready_hook(self, p):
        def hook(*_):
            self._ready.append(p)
            self._ready_bytes += 4 * p.numel()
            if self._ready_bytes >= self.bucket_bytes:
                self._submit()
        return hook

    def _submit(self):
        entered = time.perf_counter()
        params, self._ready, self._ready_bytes = self._ready, [], 0
        if not params:
            return
        dense = self.steps < self.warmup_steps
        grads = []
        for p in params:
            g = p.grad
            if g is None or not g.is_contiguous():
                raise ValueError(f"the gradient of {self._names.get(id(p), 'a parameter')} is "
                                 f"{'missing' if g is None else 'not contiguous'}")
            grads.append(g.view(-1))
        efs = velocities = None
        if self.error_feedback and not dense:
            efs = [self._feedback_of(p) for p in params]
        if self.weight_decay:
            self._decay(params, grads)
        if self.momentum:
            velocities = self._accumulate_momentum(params, grads)
        codec = "none" if dense else self.codec
        algorithm = "dense" if dense else self.algorithm
        seed, step, index = self.seed & _MASK, self.steps, self._buckets  # the library mixes them
        waits = _Waits(self)
        label = self._label("bucket", index, step, params)
        self._buckets += 1
        stats, dense_below, allow = self._stats, self.dense_below, self.allow_uncompressed
        # Per parameter, bucket_bytes=1 makes each gradient a collective of its own; a low-rank
        # codec gets the gradients' shapes.
        shaped = self._shaped and not dense
        bucket_bytes = 1 if self._split and not dense and not shaped else self.bucket_bytes
        shapes = [tuple(p.shape) for p in params] if shaped else None
        # CUDA gradients: on the side stream, after they are ready on the current stream.
        on = _OnDevice.of(grads[0], grads + [u for _, u in velocities or []])
        stream = _OnDevice.stream_of(on)
        arrays = _arrays(on, grads)

        def job(comm):
            started, cpu = time.perf_counter(), time.thread_time()
            waits.set(comm)
            try:
                comm.allreduce_buckets(arrays, codec, efs=efs, bucket_bytes=bucket_bytes,
                                       dense_below=dense_below, average=True, seed=seed,
                                       algorithm=algorithm, allow_uncompressed=allow, step=step,
                                       index=index, shapes=shapes, label=label, stream=stream)
            finally:
                waits.reset(comm)
            stats.add(comm, dense)
            if velocities and not dense:
                self._mask_momentum(velocities)
            done = time.perf_counter()
            stats.add_timing(submitted - entered, started - submitted, done - started,
                             cpu=time.thread_time() - cpu)

        submitted = time.perf_counter()
        fut = _engine().submit(job, on)
        self._pending.append(fut)
        if self.synchronous:
            self._wait()

    def _wait(self):
        pending, self._pending = self._pending, []
        failure = None
        for fut in pending:  # every one, so that nothing of this step is still in flight
            try:
                fut.wait()
            except Exception as e:  # noqa: BLE001
                failure = failure or e
        if failure is not None:
            raise failure

    def synchronize(self):
        """Sends the gradients still waiting and waits until every allreduce of this step is
        done: the parameters' .grad then hold the averages."""
        entered = time.perf_counter()
        self._submit()
        self._buckets = 0
        try:
            self._wait()
        finally:
            self._stats.add_tail(time.perf_counter() - entered)

    def step(self, closure=None):
        """Averages the gradients (synchronize()) and steps the wrapped optimizer."""
        try:
            self.synchronize()
        finally:
            self.steps += 1
        return self.optimizer.step(closure)

    def zero_grad(self, *args, **kwargs):
        return self.optimizer.zero_grad(*args, **kwargs)

    _format = "gcomp.torch.DistributedOptimizer"

    def state_dict(self):
        """state_dict() -> dict: the wrapped optimizer's state_dict ("optimizer") and what
        gcomp keeps ("gcomp": the step count, every parameter's residual, velocity and kept
        state, by its name in named_parameters), for torch.save; a resumed job loads it with
        load_state_dict and goes on exactly. Call it between steps."""
        fb = self._feedback_state()
        fb.pop("buckets")
        spec = _codec_or_none(self.codec)
        return {"optimizer": self.optimizer.state_dict(),
                "gcomp": {"format": self._format, "version": 1,
                          "codec": spec.spec if spec is not None else str(self.codec),
                          "steps": self.steps, "momentum": self.momentum, **fb}}

    def load_state_dict(self, state_dict):
        """load_state_dict(state_dict): the wrapped optimizer's part into it, gcomp's (same
        codec and momentum, else ValueError) here. A plain torch optimizer state_dict (without
        gcomp's part) goes to the wrapped optimizer alone."""
        if isinstance(state_dict, dict) and "gcomp" not in state_dict:
            self.optimizer.load_state_dict(state_dict)
            return
        ours = state_dict["gcomp"]
        self._check_format(ours)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._load_feedback(ours)
        self.steps = int(ours["steps"])


# ---- broadcasts (root's values to every rank), through the same thread ----


def _broadcast_floats(comm, t, root):
    flat = t.view(-1)
    if comm.rank != root:
        flat.zero_()
    # root's values plus zeros: exact (a -0.0 on the root arrives as +0.0).
    comm.allreduce(flat, "none", algorithm="dense")


def broadcast_parameters(params, root_rank=0):
    """broadcast_parameters(params, root_rank=0)

    Sets every rank's tensors to root_rank's, in place: params is a state_dict, a list of
    (name, tensor) or a list of tensors. Float32 tensors go as they are; others by value
    through broadcast_object. Collective: every rank calls it with the same tensors."""
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = [(f"tensor{i}", p) if isinstance(p, torch.Tensor) else tuple(p)
                 for i, p in enumerate(params)]

    def job(comm):
        for name, t in items:
            with torch.no_grad():
                if t.dtype == torch.float32 and t.is_contiguous():
                    _broadcast_floats(comm, t, root_rank)
                else:
                    value = _broadcast_object_on(comm, t.detach().clone() if comm.rank == root_rank
                                                 else None, root_rank)
                    t.copy_(value)

    _engine().run(job)


def _broadcast_object_on(comm, obj, root):
    # Bytes travel as float32 values below 2^24 (three bytes each): sums with zeros, exact.
    if comm.rank == root:
        data = pickle.dumps(obj)
        head = np.array([len(data) & 0xFFFFFF, len(data) >> 24], np.float32)
    else:
        data, head = b"", np.zeros(2, np.float32)
    comm.allreduce(head, "none", algorithm="dense")
    n = int(head[0]) + (int(head[1]) << 24)
    words = (n + 2) // 3
    body = np.zeros(words, np.float32)
    if comm.rank == root:
        raw = np.frombuffer(data + b"\0" * (3 * words - n), np.uint8).reshape(-1, 3).astype(np.uint32)
        body[:] = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
    if words:
        comm.allreduce(body, "none", algorithm="dense")
    if comm.rank == root:
        return obj
    v = body.astype(np.uint32)
    raw = np.stack([v & 0xFF, (v >> 8) & 0xFF, v >> 16], axis=1).astype(np.uint8).tobytes()[:n]
    return pickle.loads(raw)


def broadcast_object(obj, root_rank=0):
    """broadcast_object(obj, root_rank=0) -> obj

    root_rank's obj (any picklable object) on every rank. Collective."""
    return _engine().run(lambda comm: _broadcast_object_on(comm, obj, root_rank))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """broadcast_optimizer_state(optimizer, root_rank=0)

    Loads root_rank's optimizer state (state_dict: buffers such as momentum, and the param
    groups' settings) into every rank's optimizer (a torch optimizer or a
    DistributedOptimizer). Collective."""
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    state = broadcast_object(inner.state_dict(), root_rank)
    if _engine().comm.rank != root_rank:
        inner.load_state_dict(state)
