"""gcomp.torch's CUDA path, run on CPU tensors: on every rank of `mpiexec.mpich -n 2` with the
stand-in build of gcomp (build/python_standin), a stand-in for gcomp.torch's CUDA layer
(gt._cuda.cuda) treats every tensor as a CUDA tensor whose memory is the stand-in's, and logs the
streams, events and allocator hints it is asked for. So the hook's and the optimizer's device
path (device residuals, momentum correction by torch ops, the side stream, the event, the
CUDA-aware future) runs here, and must give the CPU path's parameters bit for bit. The real
CUDA run is in scripts/gpu-check.
"""

import contextlib
import itertools
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp
import gcomp.torch as gt
from gcomp import _gcomp

standin = getattr(_gcomp, "standin", None)
pytestmark = pytest.mark.skipif(standin is None, reason="not the stand-in build of the module")

CURRENT, SIDE = 1000, 2000  # the stand-in's stream handles: the caller's and gcomp.torch's


class Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


class TensorAsCuda:
    """A 1-D CPU tensor shown to gcomp through __cuda_array_interface__ alone."""

    def __init__(self, t):
        assert t.dim() == 1 and t.is_contiguous()
        self.t = t
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "<f4",
                                         "data": (t.data_ptr(), False), "version": 3,
                                         "strides": None, "stream": None}


class StandinCuda(gt._cuda._Cuda):
    def __init__(self):
        super().__init__()
        self.log = []
        self.events = itertools.count()
        self.local = threading.local()
        self.lock = threading.Lock()

    def note(self, *entry):
        with self.lock:
            self.log.append(entry)

    def stream_now(self):
        return getattr(self.local, "stream", CURRENT)

    def on_device(self, t):
        return True

    def device(self, t):
        return 0

    def current_stream(self, device):
        return Stream(self.stream_now())

    def side_stream(self, device):
        return Stream(SIDE)

    def ready_event(self, stream):
        event = next(self.events)
        self.note("record", event, stream.cuda_stream)
        return event

    def wait(self, stream, event):
        self.note("wait", event, stream.cuda_stream)

    def keep_for(self, tensors, stream):
        self.note("keep", tuple(t.data_ptr() for t in tensors), stream.cuda_stream)

    @contextlib.contextmanager
    def using(self, stream):
        before = self.stream_now()
        self.local.stream = stream.cuda_stream
        try:
            yield
        finally:
            self.local.stream = before

    def future(self, device):
        cuda = self

        class Logged(torch.futures.Future):
            def set_result(self, result):
                cuda.note("complete", cuda.stream_now())
                super().set_result(result)

        return Logged()

    def array(self, t):
        storage = t.storage()  # the whole storage: views of one bucket are one block
        standin.adopt(storage.data_ptr(), storage.nbytes())
        return TensorAsCuda(t)

    def residual(self, ef):
        return torch.from_numpy(standin.host(ef.residual))


@pytest.fixture(scope="module", autouse=True)
def group():
    gt.init_process_group()  # backend None: gloo, as torch picks for CPU tensors
    yield


@contextlib.contextmanager
def device_path():
    real, gt._cuda.cuda = gt._cuda.cuda, StandinCuda()
    try:
        yield gt._cuda.cuda
    finally:
        gt._cuda.cuda = real


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48),
                               torch.nn.ReLU(), torch.nn.Linear(48, 5))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)


def train(m, opt, steps):
    """steps steps of m with opt on batch(0), batch(1), ...; the parameters after them."""
    for s in range(steps):
        opt.zero_grad()
        x, y = batch(s)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def train_ddp(codec, steps, **options):
    m = DDP(model(), bucket_cap_mb=0.01)  # a few buckets
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    state = gt.register(m, opt, codec, **options)
    return train(m, opt, steps), state


def same_bits(a, b):
    return all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(a, b))


def test_backend_none_picks_as_torch_would(monkeypatch):
    assert dist.get_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    assert gt._engine._default_backend() == "gloo", "two ranks on one GPU: NCCL would refuse"
    monkeypatch.setenv("MPI_LOCALNRANKS", "1")
    assert gt._engine._default_backend() == "nccl"


@pytest.mark.parametrize("codec, options", [
    # Each with its algorithm pinned: auto measures the codec where the tensor is, so the two
    # paths may choose differently (each right for its memory).
    ("topk:ratio=0.05", {"algorithm": "sparse_allgather"}),  # momentum moved into the hook
    ("qsgd:bits=4", {"algorithm": "allgather"}),
    ("sign", {"per_parameter": True, "algorithm": "allgather"}),
    ("fp16", {"warmup_steps": 2, "algorithm": "dense"}),
    ("powersgd:rank=2", {"algorithm": "low_rank"}),
    ("randomk:ratio=0.1", {"algorithm": "sparse_split"}),
    ("terngrad", {"algorithm": "compressed_reduce_scatter"}),
])
def test_the_hook_on_the_device_path_gives_the_cpus_parameters(codec, options):
    steps = 5
    want, host_state = train_ddp(codec, steps, **options)
    standin.reset()
    with device_path() as cuda:
        got, state = train_ddp(codec, steps, **options)
        a = state.state_dict()
    assert same_bits(got, want), codec
    # The checkpoint of the device path is the CPU path's (residuals and velocities by name).
    b = host_state.state_dict()
    for part in ("residuals", "velocities"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            assert a[part][k].numpy().tobytes() == b[part][k].numpy().tobytes(), (part, k)
    assert SIDE in standin.counters()["streams"], "the module ran on gcomp.torch's stream"
    check_the_event_logic(cuda.log, calls=steps * 1)


def check_the_event_logic(log, calls):
    """Every job: an event recorded on the caller's stream when it was handed over, with its
    tensors kept for the side stream; in the job, the side stream waits for that event first;
    the future completes on the side stream, after the work."""
    records = [e for e in log if e[0] == "record"]
    waits = [e for e in log if e[0] == "wait"]
    keeps = [e for e in log if e[0] == "keep"]
    completes = [e for e in log if e[0] == "complete"]
    assert len(records) >= calls
    assert len(records) == len(waits) == len(keeps) == len(completes)
    assert all(stream == CURRENT for _, _, stream in records)
    assert all(stream == SIDE for _, _, stream in waits + keeps)
    assert all(stream == SIDE for _, stream in completes)
    # Jobs run in the order handed over: the n-th wait is for the n-th event, and each job's
    # future completes before the next job waits.
    assert [e for _, e, _ in waits] == [e for _, e, _ in records]
    order = [e[0] for e in log if e[0] in ("wait", "complete")]
    assert order == ["wait", "complete"] * len(waits)


def test_the_optimizer_on_the_device_path_gives_the_cpus_parameters():
    def run():
        m = model(1)
        opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                      named_parameters=m.named_parameters(),
                                      codec="topk:ratio=0.1", momentum=0.9, bucket_bytes=4000,
                                      algorithm="sparse_allgather")
        return train(m, opt, 4)

    want = run()
    with device_path() as cuda:
        got = run()
    assert same_bits(got, want)
    check_the_event_logic(cuda.log, calls=4)


def test_device_residuals_are_device_memory():
    with device_path():
        m = DDP(model(2))
        state = gt.CompressionState("topk:ratio=0.1", algorithm="sparse_allgather")
        m.register_comm_hook(state, gt.compression_hook)
        x, y = batch(0)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        homes = {id(ef): ef for ef, _, _ in state._home.values()}
        assert homes and all(ef.device == "cuda:0" for ef in homes.values())
        r = state.residual(next(m.parameters()))
        assert isinstance(r, torch.Tensor) and r.count_nonzero() > 0


@pytest.mark.parametrize("way", ["hook", "optimizer"])
def test_zero_one_adam_on_the_device_path_is_the_cpus(way):
    # 0/1 Adam's every kind of step but the warm-up's (refreshes after compressed steps,
    # compressed steps, local steps and their synchronizations) runs the library's functions on
    # device arrays, on the caller's current stream, with the CPU path's bits; the exact steps
    # are torch's own on both paths.
    def run():
        sched = gcomp.AdamSchedule.zero_one(6, kappa=2, max_local_steps=2, local_double_every=2)
        m = model(3)
        adamw = torch.optim.AdamW
        if way == "hook":
            m = DDP(m, bucket_cap_mb=0.01)
            opt = adamw(m.parameters(), lr=0.01, weight_decay=0.05)
            gt.register(m, opt, "sign", variance=sched, algorithm="compressed_reduce_scatter",
                        allow_uncompressed=False)
        else:
            opt = gt.DistributedOptimizer(adamw(m.parameters(), lr=0.01, weight_decay=0.05),
                                          named_parameters=m.named_parameters(), codec="sign",
                                          variance=sched, algorithm="compressed_reduce_scatter",
                                          allow_uncompressed=False)
        return train(m, opt, 11)

    want = run()
    standin.reset()
    with device_path():
        got = run()
    assert same_bits(got, want)
    c = standin.counters()
    # Steps 1-2 exact (torch's), compressed steps 3 and 5, refreshes 4 and 6, local steps 7-11
    # synchronizing after 7, 8 and 10.
    calls = c["adam"]
    assert calls["step"] > 0 and calls["local_momentum"] > 0 and calls["frozen_update"] > 0
    assert calls["sync_momentum"] == calls["sync_update"] == 3 * len(want)
    assert c["adam_streams"] == [CURRENT], "the caller's current stream"
