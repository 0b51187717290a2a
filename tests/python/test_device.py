"""The module's device path on the stand-in build (build/python_standin, python/standin_device.cpp):
its "CUDA" memory is host memory the stand-in keeps and its kernels are the CPU codecs, so every
part of the binding that CUDA tensors go through runs here without a GPU: DLPack and
__cuda_array_interface__ in, gcomp.DeviceArray out, streams, devices, lifetimes, device
residuals, mixed memory refused, and the Communicator on device tensors, whose results must be
the host path's bits. (What the stand-in cannot show, the kernels themselves, tests/cuda/ and
scripts/gpu-check check on a GPU.)

Run by CTest with PYTHONPATH at the stand-in build, in one process (python_device) and on every
rank of `mpiexec.mpich -n 2` (python_device_ranks_2): the Communicator tests are collective.
"""

import gc
import sys

import numpy as np
import pytest

import gcomp
from gcomp import _gcomp
from cases import SPECS, adam_calls, adam_inputs, gradient  # tests/python, on sys.path

standin = getattr(_gcomp, "standin", None)
pytestmark = pytest.mark.skipif(standin is None, reason="not the stand-in build of the module")


def on_device(values, device=0):
    """A stand-in device copy of a numpy array, as a gcomp.DeviceArray."""
    a = standin.empty(len(values), "float32" if values.dtype == np.float32 else "uint8", device)
    standin.host(a)[:] = values
    return a


def bits(a):
    return np.asarray(a).view(np.uint8).tobytes()


class CudaArray:
    """Shows a numpy array's memory through __cuda_array_interface__ alone, the memory adopted
    as stand-in device memory while this lives."""

    def __init__(self, host, device=0, readonly=False, **changes):
        self.host = host
        standin.adopt(host.ctypes.data, host.nbytes, device)
        self.__cuda_array_interface__ = {
            "shape": host.shape, "typestr": host.dtype.str, "strides": None,
            "data": (host.ctypes.data, readonly), "version": 3, "stream": None}
        self.__cuda_array_interface__.update(changes)

    def __del__(self):
        standin.forget(self.host.ctypes.data)


class DLPackArray:
    """Shows a DeviceArray through DLPack alone, and records the streams it was asked for."""

    def __init__(self, inner):
        self.inner, self.streams = inner, []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.inner.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


@pytest.fixture(autouse=True)
def fresh_counters():
    standin.set_unusable("")
    standin.reset()
    yield
    standin.set_unusable("")


# ---- the codecs ----


def test_the_status_says_stand_in():
    assert gcomp.device_status() == {"backend": "standin", "usable": True, "why": ""}


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [0, 1, 4097, 100003])
def test_a_device_payload_is_the_hosts_bytes(spec, n):
    x = gradient(n, 3)
    codec = gcomp.Codec(spec)
    p = codec.encode(on_device(x), seed=11, stream=5)
    assert isinstance(p, gcomp.DeviceArray)
    assert (p.dtype, p.device, len(p)) == ("uint8", "cuda:0", p.nbytes)
    counters = standin.counters()
    assert counters["encodes"] == 1 and counters["streams"] == [5]
    assert p.numpy().tobytes() == bits(codec.encode(x, seed=11))


@pytest.mark.parametrize("spec", ["topk:ratio=0.02", "qsgd", "sign", "fp16"])
def test_device_error_feedback_follows_the_host_bit_for_bit(spec):
    n = 30011
    codec = gcomp.Codec(spec)
    ef_host, ef_dev = gcomp.ErrorFeedback(n), gcomp.ErrorFeedback(n, device="cuda:0")
    assert (ef_host.device, ef_dev.device) == ("cpu", "cuda:0")
    assert repr(ef_dev) == 'gcomp.ErrorFeedback(30011, device="cuda:0")'
    out = standin.empty(codec.max_bytes(n), "uint8")
    for step in range(4):
        x = gradient(n, step)
        want = codec.encode(x, seed=step, ef=ef_host)
        got = codec.encode(on_device(x), seed=step, ef=ef_dev, out=out, stream=9)
        assert isinstance(got, gcomp.DeviceArray) and len(got) == len(want)
        assert standin.host(got).tobytes() == bits(want), step
        r = ef_dev.residual
        assert isinstance(r, gcomp.DeviceArray) and r.dtype == "float32" and len(r) == n
        assert bits(standin.host(r)) == bits(ef_host.residual), step
    ef_dev.reset()
    assert not standin.host(ef_dev.residual).any()


@pytest.mark.parametrize("spec", SPECS)
def test_decode_add_on_the_device_is_the_hosts(spec):
    n = 10007
    codec = gcomp.Codec(spec)
    p = codec.encode(gradient(n, 1), seed=2)
    want = gradient(n, 5)
    acc = on_device(want)
    gcomp.decode_add(p, want, alpha=0.5)
    assert gcomp.decode_add(on_device(p), acc, alpha=0.5, stream=3) is acc
    assert bits(standin.host(acc)) == bits(want)
    assert standin.counters()["decodes"] == 1


def test_a_bad_device_payload_leaves_the_accumulator_as_it_was():
    n = 1000
    p = gcomp.Codec("topk:ratio=0.1").encode(gradient(n, 1))[:-1]  # truncated
    acc = on_device(gradient(n, 2))
    before = standin.host(acc).copy()
    with pytest.raises(gcomp.Error) as e:
        gcomp.decode_add(on_device(p), acc)
    assert e.value.status == "bad_payload"
    assert bits(standin.host(acc)) == bits(before)
    with pytest.raises(gcomp.Error) as e:
        gcomp.decode_add(on_device(gcomp.Codec("none").encode(gradient(5, 1))), acc)
    assert e.value.status == "mismatch"


def test_encode_out_on_the_device_allocates_nothing_and_returns_its_prefix():
    n = 5000
    codec = gcomp.Codec("topk:ratio=0.01")
    out = standin.empty(codec.max_bytes(n), "uint8")
    got = codec.encode(on_device(gradient(n, 1)), out=out)
    assert isinstance(got, gcomp.DeviceArray)
    assert got.data_ptr == out.data_ptr and len(got) < len(out)
    assert standin.host(got).tobytes() == bits(codec.encode(gradient(n, 1)))
    with pytest.raises(gcomp.Error) as e:
        codec.encode(on_device(gradient(n, 1)), out=standin.empty(10, "uint8"))
    assert e.value.status == "buffer_too_small"


# ---- the protocols ----


def test_cuda_array_interface_in_place():
    x = gradient(4097, 7)
    codec = gcomp.Codec("qsgd")
    assert codec.encode(CudaArray(x), seed=1).numpy().tobytes() == bits(codec.encode(x, seed=1))
    acc = np.zeros(4097, np.float32)
    gcomp.decode_add(codec.encode(CudaArray(x), seed=1), CudaArray(acc))
    want = np.zeros(4097, np.float32)
    gcomp.decode_add(codec.encode(x, seed=1), want)
    assert bits(acc) == bits(want)


def test_a_producer_stream_is_waited_for_on_the_calls_stream():
    x = gradient(100, 1)
    gcomp.Codec("fp16").encode(CudaArray(x, stream=77), stream=5)
    gcomp.Codec("fp16").encode(CudaArray(x, stream=None), stream=5)
    assert standin.counters()["orders"] == [(5, 77)]
    with pytest.raises(ValueError, match="stream is 0"):
        gcomp.Codec("fp16").encode(CudaArray(x, stream=0))


@pytest.mark.parametrize("change, error, words", [
    ({"typestr": "<f8"}, TypeError, "typestr '<f8'"),
    ({"shape": (10, 10)}, ValueError, "has shape (10, 10)"),
    ({"strides": (8,)}, ValueError, "not contiguous"),
    ({"mask": 1}, ValueError, "mask"),
    ({"data": (16, False)}, ValueError, "not in CUDA device memory"),
])
def test_a_bad_cuda_array_interface_says_what_is_wrong(change, error, words):
    with pytest.raises(error) as e:
        gcomp.Codec("none").encode(CudaArray(gradient(100, 1), **change))
    assert words in str(e.value) and "x" in str(e.value)


def test_a_read_only_device_array_is_not_written():
    acc = CudaArray(np.zeros(10, np.float32), readonly=True)
    with pytest.raises(ValueError, match="acc is read-only"):
        gcomp.decode_add(gcomp.Codec("none").encode(on_device(gradient(10, 1))), acc)


def test_dlpack_is_asked_for_the_calls_stream():
    x = on_device(gradient(1000, 1))
    held = DLPackArray(x)
    before = sys.getrefcount(x)
    codec = gcomp.Codec("sign")
    codec.encode(held)
    codec.encode(held, stream=1234)
    codec.encode(held, stream=type("Stream", (), {"cuda_stream": 99})())
    # DLPack's legacy default stream is 1 (0 is not allowed); a handle goes as it is.
    assert held.streams == [1, 1234, 99]
    gc.collect()
    assert sys.getrefcount(x) == before, "every DLPack export was released after its call"


def test_a_refused_dlpack_array_is_given_back():
    x = on_device(gradient(100, 1))
    before = sys.getrefcount(x)
    for _ in range(5):
        with pytest.raises(TypeError, match="payload has DLPack dtype"):
            gcomp.decode_add(DLPackArray(x), on_device(np.zeros(100, np.float32)))
    gc.collect()
    assert sys.getrefcount(x) == before, "a refused DLPack export was given back"


def test_encode_into_any_device_array_returns_a_view_that_keeps_it():
    n = 1000
    codec = gcomp.Codec("qsgd")
    memory = np.zeros(codec.max_bytes(n), np.uint8)
    got = codec.encode(on_device(gradient(n, 1)), out=CudaArray(memory))
    assert isinstance(got, gcomp.DeviceArray) and got.data_ptr == memory.ctypes.data
    gc.collect()
    assert standin.host(got).tobytes() == bits(codec.encode(gradient(n, 1)))


def test_a_device_array_exports_itself_through_both_protocols():
    a = on_device(np.arange(10, dtype=np.float32))
    assert a.__dlpack_device__() == (2, 0)
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (10,) and cai["typestr"] == "<f4" and cai["data"] == (a.data_ptr, False)
    before = sys.getrefcount(a)
    capsule = a.__dlpack__()
    assert type(capsule).__name__ == "PyCapsule"
    assert sys.getrefcount(a) == before + 1, "the export holds the array"
    del capsule
    assert sys.getrefcount(a) == before, "an export nobody took is released"
    assert bits(a.numpy()) == bits(np.arange(10, dtype=np.float32))
    assert repr(a) == "gcomp.DeviceArray(10, dtype=float32, device=cuda:0)"


def test_a_payload_and_a_residual_keep_their_memory():
    n = 2000
    ef = gcomp.ErrorFeedback(n, device=0)
    x = on_device(gradient(n, 1))
    p = gcomp.Codec("topk:ratio=0.01").encode(x, ef=ef)
    r = ef.residual
    want = bits(standin.host(r))
    del ef, x
    gc.collect()
    assert bits(standin.host(r)) == want, "the residual's array keeps its ErrorFeedback"
    out = np.zeros(n, np.float32)
    gcomp.decode_add(p.numpy(), out)
    assert np.count_nonzero(out) == 20


# ---- what is refused ----


def test_mixed_memory_in_one_call_is_a_value_error():
    n = 100
    codec = gcomp.Codec("topk:ratio=0.1")
    with pytest.raises(ValueError, match="x is on CUDA device 0 but out is in host memory"):
        codec.encode(on_device(gradient(n, 1)), out=np.zeros(codec.max_bytes(n), np.uint8))
    with pytest.raises(ValueError, match="payload is in host memory but acc is on CUDA device 0"):
        gcomp.decode_add(codec.encode(gradient(n, 1)), on_device(np.zeros(n, np.float32)))
    with pytest.raises(ValueError, match="ef is in host memory but x is in CUDA device 0"):
        codec.encode(on_device(gradient(n, 1)), ef=gcomp.ErrorFeedback(n))
    with pytest.raises(ValueError, match="ef is in CUDA device 0 but x is in host memory"):
        codec.encode(gradient(n, 1), ef=gcomp.ErrorFeedback(n, device="cuda"))
    with pytest.raises(ValueError, match="x is on CUDA device 0 but out is on CUDA device 1"):
        codec.encode(on_device(gradient(n, 1)), out=standin.empty(codec.max_bytes(n), "uint8", 1))
    with pytest.raises(ValueError, match="stream= is for CUDA arrays"):
        codec.encode(gradient(n, 1), stream=5)
    assert standin.counters()["encodes"] == 0


def test_a_call_on_another_device_switches_to_it_and_back():
    x = on_device(gradient(100, 1), device=1)
    standin.reset()
    p = gcomp.Codec("fp16").encode(x)
    assert p.device == "cuda:1"
    counters = standin.counters()
    assert counters["current_device"] == 0 and counters["switches"] == 2


@pytest.mark.parametrize("stream, error", [("5", TypeError), (-1, ValueError), (1.5, TypeError)])
def test_a_bad_stream_is_refused(stream, error):
    with pytest.raises(error, match="stream"):
        gcomp.Codec("none").encode(on_device(gradient(10, 1)), stream=stream)


def test_without_a_usable_gpu_a_device_array_is_a_clear_error():
    standin.set_unusable("no usable GPU: (the test says so)")
    with pytest.raises(ValueError, match=r"x is a CUDA array, but no usable GPU: \(the test"):
        gcomp.Codec("none").encode(CudaArray(gradient(10, 1)))
    with pytest.raises(ValueError, match="no usable GPU"):
        gcomp.ErrorFeedback(10, device="cuda")
    gcomp.Codec("none").encode(gradient(10, 1))  # host memory is fine


@pytest.mark.parametrize("device", ["gpu", "cuda:x", -1, "cuda:"])
def test_a_bad_device_is_named(device):
    with pytest.raises(ValueError, match="device"):
        gcomp.ErrorFeedback(10, device=device)


def test_the_momentum_helpers_take_host_memory_only():
    with pytest.raises(TypeError, match="velocity is a CUDA array; this call takes host memory"):
        gcomp.momentum_correct(on_device(gradient(10, 1)), on_device(gradient(10, 2)), 0.9)
    with pytest.raises(TypeError, match="this call takes host memory"):
        gcomp.ErrorFeedback(10).kept = on_device(gradient(10, 1))


# ---- Adam's steps ----


def test_adam_on_device_arrays_is_the_hosts_bits_on_the_calls_stream():
    host = adam_inputs(1001)
    dev = [on_device(x) for x in host[:4]] + [CudaArray(host[4].copy())]  # both protocols
    adam_calls(*host)
    standin.reset()
    adam_calls(*dev, stream=77)
    for d, h in zip(dev, host):
        assert bits(d.host if isinstance(d, CudaArray) else standin.host(d)) == bits(h)
    c = standin.counters()
    assert c["adam"] == {"step": 1, "local_momentum": 1, "frozen_update": 1, "sync_momentum": 1,
                         "sync_update": 1}
    assert c["adam_streams"] == [77] and c["copied"] == 0


def test_adam_takes_one_memory_a_call():
    n = 10
    host = [gradient(n, seed) for seed in (1, 2, 3, 4)]
    dev = [on_device(x) for x in host]
    with pytest.raises(ValueError, match="param is on CUDA device 0 but grad is in host memory"):
        gcomp.adam_step(dev[0], host[1], dev[2], dev[3], lr=1e-3, step=1)
    with pytest.raises(ValueError, match="stream= is for CUDA arrays"):
        gcomp.adam_local_momentum(*host, stream=5)
    with pytest.raises(gcomp.Error, match="differ in size"):
        gcomp.adam_frozen_update(dev[0], dev[1], dev[2], on_device(gradient(n + 1, 5)), lr=1e-3,
                                 step=2, variance_steps=1)
    assert standin.counters()["adam"]["frozen_update"] == 0


# ---- the Communicator (collective: every rank runs these in order) ----


@pytest.fixture(scope="module")
def comm():
    return gcomp.Communicator()


CASES = [
    ("none", "dense", False),
    ("fp16", "dense", True),
    ("topk:ratio=0.01", "sparse_allgather", True),
    ("topk:ratio=0.02", "sparse_recursive_doubling", True),
    ("topk:ratio=0.05", "sparse_split", True),
    ("qsgd", "allgather", False),
    ("qsgd:bits=3,bucket=100", "compressed_reduce_scatter", False),
    ("terngrad", "compressed_reduce_scatter", False),
    ("sign", "allgather", True),
]


@pytest.mark.parametrize("spec, algorithm, with_ef", CASES)
def test_allreduce_on_the_device_is_the_hosts_bits(comm, spec, algorithm, with_ef):
    n = 20011
    ef_h = gcomp.ErrorFeedback(n) if with_ef else None
    ef_d = gcomp.ErrorFeedback(n, device=0) if with_ef else None
    for step in range(3):
        x = gradient(n, 100 * step + comm.rank)
        d = on_device(x)
        comm.allreduce(x, spec, ef=ef_h, algorithm=algorithm, seed=4, step=step, average=True)
        assert comm.allreduce(d, spec, ef=ef_d, algorithm=algorithm, seed=4, step=step,
                              average=True, stream=21) is d
        assert bits(standin.host(d)) == bits(x), (spec, step)
        if with_ef:
            assert bits(standin.host(ef_d.residual)) == bits(ef_h.residual), (spec, step)
    assert 21 in standin.counters()["streams"]


def test_only_payloads_cross_to_the_host(comm):
    n = 1 << 17
    codec = gcomp.Codec("topk:ratio=0.01")
    d = on_device(gradient(n, comm.rank))
    standin.reset()
    comm.allreduce(d, codec, algorithm="sparse_allgather")
    crossed = standin.counters()["copied"]
    # Out: this rank's payload; in: every rank's (at most max_bytes each), decoded on the device.
    assert 0 < crossed <= (comm.size + 1) * codec.max_bytes(n) < 4 * n


def test_allreduce_buckets_on_the_device_is_the_hosts_bits(comm):
    sizes = [5000, 3, 20000, 100, 7000]
    codec = gcomp.Codec("topk:ratio=0.01")
    efs_h = [gcomp.ErrorFeedback(n) for n in sizes]
    efs_d = [gcomp.ErrorFeedback(n, device=0) for n in sizes]
    for step in range(2):
        xs = [gradient(n, 7 * step + i + 10 * comm.rank) for i, n in enumerate(sizes)]
        ds = [on_device(x) for x in xs]
        comm.allreduce_buckets(xs, codec, efs=efs_h, bucket_bytes=40000, algorithm="sparse_allgather",
                               seed=1, step=step)
        comm.allreduce_buckets(ds, codec, efs=efs_d, bucket_bytes=40000, algorithm="sparse_allgather",
                               seed=1, step=step, stream=8)
        for t, (x, d) in enumerate(zip(xs, ds)):
            assert bits(standin.host(d)) == bits(x), (step, t)
            assert bits(standin.host(efs_d[t].residual)) == bits(efs_h[t].residual), (step, t)


def test_a_bad_device_call_raises_on_every_rank_and_the_next_call_works(comm):
    n = 1000
    with pytest.raises(ValueError, match="tensors\\[0\\] is on CUDA device 0 but tensors\\[1\\]"):
        comm.allreduce_buckets([on_device(gradient(n, 1)), gradient(n, 2)], "none")
    with pytest.raises(ValueError, match="ef is in host memory"):
        comm.allreduce(on_device(gradient(n, 1)), "topk:ratio=0.1", ef=gcomp.ErrorFeedback(n))
    d = on_device(np.ones(n, np.float32))
    comm.allreduce(d, "none", algorithm="dense")
    assert (standin.host(d) == comm.size).all()
