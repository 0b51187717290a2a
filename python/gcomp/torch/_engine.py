"""The communication thread (_Engine, made once: _engine()) that owns gcomp's Communicator and
runs every collective of gcomp.torch; the launch's transport and gcomp's world checked against
torch.distributed's; init_process_group; and what the calls record (_Stats) and how long they
wait (_Waits)."""

import atexit
import contextlib
import itertools
import os
import queue
import threading

import numpy as np
import torch
import torch.distributed as dist

import gcomp
from gcomp import timeline

from . import _cuda, _timeline

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
        track = _timeline.Track("gcomp communication")
        while True:
            item = self._jobs.get()
            if item is None:
                return
            if timeline.on():
                track.name_once()
            job, fut, on = item
            # A job on CUDA tensors runs on its side stream and completes its future there.
            with _cuda.cuda.using(on.stream) if on is not None else contextlib.nullcontext():
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
        fut = _cuda.cuda.future(on.device) if on is not None else torch.futures.Future()
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


# ---- what the calls record, and how long they wait ----


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
