"""The module and gcomp.torch on real CUDA tensors, with the GPU machine's own torch: what
tests/python/test_device.py and test_torch_device.py check on the stand-in, here on a GPU.
Plain python (the GPU machines have torch and numpy, not necessarily pytest): every check_*
runs, each failure is printed, and the exit status is the number of failures (0: all passed).

    python3 tests/python/cuda_check.py                  # one process
    mpiexec -n 2 python3 tests/python/cuda_check.py     # the collectives with 2 ranks

scripts/gpu-check runs both (PYTHONPATH at the build's python/ folder).
"""

import os
import sys
import traceback

import numpy as np
import torch

import gcomp
import cases  # tests/python's shared specs and gradients (this script's folder is on sys.path)
from cases import SPECS

SIZES = [0, 1, 17, 4097, 1000003]
RANKS = int(os.environ.get("PMI_SIZE", "1"))


def gradient(n, seed):
    return torch.from_numpy(cases.gradient(n, seed))


def bits(t):
    if isinstance(t, gcomp.DeviceArray):
        return t.numpy().tobytes()
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return np.asarray(t).view(np.uint8).tobytes()


def raises(error, call, words=""):
    try:
        call()
    except error as e:
        assert words in str(e), f"{error.__name__} without {words!r}: {e}"
        return
    raise AssertionError(f"{error.__name__} not raised")


# ---- the codecs (one process) ----


def check_the_status_is_usable():
    s = gcomp.device_status()
    assert s["backend"] == "cuda" and s["usable"], s


def check_payloads_from_cuda_tensors_are_the_cpus_bytes():
    stream = torch.cuda.Stream()
    for spec in SPECS:
        codec = gcomp.Codec(spec)
        for n in SIZES:
            x = gradient(n, n + 3)
            want = bits(codec.encode(x, seed=11))
            with torch.cuda.stream(stream):
                xc = x.cuda()
                p = codec.encode(xc, seed=11, stream=stream)
            assert isinstance(p, gcomp.DeviceArray), type(p)
            assert bits(p) == want, (spec, n, "DeviceArray")
            t = torch.from_dlpack(p)
            assert t.is_cuda and t.dtype == torch.uint8 and bits(t) == want, (spec, n, "DLPack")
            out = torch.empty(codec.max_bytes(n), dtype=torch.uint8, device="cuda")
            got = codec.encode(xc, seed=11, out=out, stream=torch.cuda.current_stream())
            assert isinstance(got, torch.Tensor) and got.data_ptr() == out.data_ptr()
            assert bits(got) == want, (spec, n, "out=")


def check_decode_add_into_a_cuda_accumulator_is_the_cpus():
    for spec in SPECS:
        codec = gcomp.Codec(spec)
        p = codec.encode(gradient(100003, 1), seed=2)
        want = gradient(100003, 5)
        acc = want.cuda()
        gcomp.decode_add(p, want.numpy(), alpha=0.5)
        gcomp.decode_add(torch.from_numpy(p).cuda(), acc, alpha=0.5,
                         stream=torch.cuda.current_stream().cuda_stream)
        assert bits(acc) == bits(want), spec


def check_device_error_feedback_follows_the_cpu():
    n = 1000003
    for spec in ["topk:ratio=0.01", "sign", "fp16", "randomk:ratio=0.05"]:
        codec = gcomp.Codec(spec)
        ef_h, ef_d = gcomp.ErrorFeedback(n), gcomp.ErrorFeedback(n, device=torch.device("cuda", 0))
        assert ef_d.device == "cuda:0"
        stream = torch.cuda.Stream()
        for step in range(3):
            x = gradient(n, step)
            want = codec.encode(x, seed=step, ef=ef_h)
            with torch.cuda.stream(stream):
                got = codec.encode(x.cuda(), seed=step, ef=ef_d, stream=stream)
            assert bits(got) == bits(want), (spec, step)
            assert bits(torch.from_dlpack(ef_d.residual)) == bits(ef_h.residual), (spec, step)


def check_adam_on_cuda_tensors_is_the_cpus_bits():
    # gcomp.torch's Adam stages on CUDA parameters: the library's kernels, on a side stream.
    for n in SIZES:
        host = [torch.from_numpy(x) for x in cases.adam_inputs(n)]
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            dev = [x.cuda() for x in host]
            cases.adam_calls(*dev, stream=stream)
        cases.adam_calls(*host)
        stream.synchronize()
        for i, (d, h) in enumerate(zip(dev, host)):
            assert bits(d) == bits(h), (n, i)


def check_what_is_refused():
    codec = gcomp.Codec("topk:ratio=0.1")
    x = gradient(1000, 1).cuda()
    raises(ValueError, lambda: codec.encode(x, out=np.zeros(codec.max_bytes(1000), np.uint8)),
           "x is on CUDA device 0 but out is in host memory")
    raises(ValueError, lambda: codec.encode(x, ef=gcomp.ErrorFeedback(1000)),
           "ef is in host memory")
    raises(ValueError, lambda: codec.encode(x.cpu(), stream=5), "stream= is for CUDA arrays")
    raises(TypeError, lambda: gcomp.momentum_correct(x, x, 0.9), "takes host memory")
    raises(TypeError, lambda: codec.encode(x.double()), "dtype")
    raises(ValueError, lambda: codec.encode(x.clone().requires_grad_()), "__dlpack__")


# ---- the Communicator (collective over every rank) ----

CASES = [("none", "dense", False), ("fp16", "dense", True),
         ("topk:ratio=0.01", "sparse_allgather", True),
         ("topk:ratio=0.02", "sparse_recursive_doubling", True), ("qsgd", "allgather", False),
         ("qsgd:bits=3,bucket=100", "compressed_reduce_scatter", False),
         ("sign", "allgather", True)]


def check_allreduce_of_cuda_tensors_is_the_cpus(comm):
    n = 1 << 20
    for spec, algorithm, with_ef in CASES:
        ef_h = gcomp.ErrorFeedback(n) if with_ef else None
        ef_d = gcomp.ErrorFeedback(n, device="cuda") if with_ef else None
        for step in range(3):
            x = gradient(n, 100 * step + comm.rank)
            xc = x.cuda()
            comm.allreduce(x, spec, ef=ef_h, algorithm=algorithm, seed=4, step=step, average=True)
            comm.allreduce(xc, spec, ef=ef_d, algorithm=algorithm, seed=4, step=step,
                           average=True, stream=torch.cuda.current_stream().cuda_stream)
            assert bits(xc) == bits(x), (spec, step)


def check_allreduce_buckets_of_cuda_tensors_is_the_cpus(comm):
    sizes = [5000, 3, 200000, 100, 70000]
    codec = gcomp.Codec("topk:ratio=0.01")
    efs_h = [gcomp.ErrorFeedback(n) for n in sizes]
    efs_d = [gcomp.ErrorFeedback(n, device=0) for n in sizes]
    for step in range(2):
        xs = [gradient(n, 7 * step + i + 10 * comm.rank) for i, n in enumerate(sizes)]
        ds = [x.cuda() for x in xs]
        comm.allreduce_buckets(xs, codec, efs=efs_h, bucket_bytes=400000,
                               algorithm="sparse_allgather", seed=1, step=step)
        comm.allreduce_buckets(ds, codec, efs=efs_d, bucket_bytes=400000,
                               algorithm="sparse_allgather", seed=1, step=step)
        for t, (x, d) in enumerate(zip(xs, ds)):
            assert bits(d) == bits(x), (step, t)


def main():
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}, "
          f"{RANKS} rank(s)", flush=True)
    checks = [(name, f) for name, f in globals().items() if name.startswith("check_")]
    failures = 0
    skipped = 0
    comm = gcomp.Communicator() if RANKS > 1 or "--with-comm" in sys.argv else None
    for name, f in checks:
        needs_comm = "comm" in f.__code__.co_varnames[:f.__code__.co_argcount]
        if RANKS > 1 and not needs_comm:
            continue  # with ranks, the collectives alone (one process ran the rest)
        if needs_comm and comm is None:
            skipped += 1
            print(f"skipped {name}: the Communicator's checks need --with-comm or mpiexec",
                  flush=True)
            continue
        try:
            f(comm) if needs_comm else f()
        except Exception:  # noqa: BLE001 - every check runs and reports
            failures += 1
            print(f"FAILED {name}:\n{traceback.format_exc()}", flush=True)
        else:
            print(f"passed {name}", flush=True)
    print(f"cuda_check: {len(checks) - failures - skipped} passed, {failures} failed, "
          f"{skipped} skipped"
          if RANKS == 1 else f"cuda_check rank {comm.rank}: {failures} failed", flush=True)
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main())
