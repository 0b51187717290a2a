"""The gcomp module in one process: the API, bytes against the C++ library (the gcomp CLI and
gcomp_python_reference), zero-copy in and out, every kind of bad input, reference counting,
the GIL, and MPI left alone until a Communicator is made.

Run by CTest (tests/CMakeLists.txt), which sets PYTHONPATH to the build's python/ folder and
GCOMP_CLI, GCOMP_PYTHON_REFERENCE to the two programs.
"""

import ctypes
import gc
import os
import math
import pathlib
import pydoc
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gcomp
from cases import SPECS, gradient  # tests/python, which pytest puts on sys.path

CLI = os.environ.get("GCOMP_CLI", "gcomp")
REFERENCE = os.environ.get("GCOMP_PYTHON_REFERENCE", "gcomp_python_reference")


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


# ---- the API ----


def test_version_is_the_librarys():
    assert run([CLI, "--version"]).stdout.strip() == "gcomp " + gcomp.__version__


def test_codecs_are_what_the_cli_lists():
    lines = []
    for c in gcomp.codecs():
        lines.append(c["name"])
        lines.append("  " + c["summary"])
        assert list(c["defaults"]) == c["keys"] == list(c["help"])
        for k in c["keys"]:
            d = c["defaults"][k]
            d = "(no default)" if d is None else "default " + d
            lines.append(f"    {k:<8} {d:<14} {c['help'][k]}")
    assert "\n".join(lines) + "\n" == run([CLI, "list"]).stdout
    assert {c["name"] for c in gcomp.codecs()} >= {"topk", "qsgd", "sign", "terngrad"}


@pytest.mark.parametrize(
    "spec, part",
    [
        ("nope", "nope"),
        ("topk:ratio=2", "ratio"),
        ("topk:ratio=0.1,ratio=0.2", "ratio"),
        ("qsgd:bits=99", "bits"),
        ("sign:colour=red", "colour"),
        ("topk", "ratio"),
    ],
)
def test_a_bad_spec_names_the_spec_and_the_bad_part(spec, part):
    with pytest.raises(gcomp.Error) as e:
        gcomp.Codec(spec)
    assert e.value.status == "invalid_argument"
    assert spec in str(e.value) and part in str(e.value)
    assert isinstance(e.value, RuntimeError)


def test_codec_spec_and_bounds():
    c = gcomp.Codec("qsgd")
    assert c.spec == "qsgd:bits=4,bucket=512"
    assert repr(c) == "gcomp.Codec('qsgd:bits=4,bucket=512')"
    assert gcomp.Codec(c.spec).spec == c.spec
    assert gcomp.Codec("topk:ratio=0.01").properties["sparse"]
    assert gcomp.Codec("qsgd").properties["unbiased"]
    for spec in SPECS:  # error feedback's default: the codec's property, as in C++
        p = gcomp.Codec(spec).properties
        assert p["contraction"] == (not (p["unbiased"] or (p["stochastic"] and not p["sparse"])))
    assert gcomp.Codec("topk:ratio=0.01").properties["contraction"]
    assert not gcomp.Codec("qsgd").properties["contraction"]
    for spec in SPECS:
        c = gcomp.Codec(spec)
        for n in (0, 1, 1000, 70001):
            assert len(c.encode(gradient(n, n), seed=3)) <= c.max_bytes(n)
    with pytest.raises(gcomp.Error) as e:
        gcomp.Codec("none").max_bytes(1 << 61)
    assert e.value.status == "invalid_argument"


def test_properties_carry_what_gcomp_torch_asks():
    """gcomp.torch decides from these (tests/spec_test.cpp checks them against the codecs)."""
    keys = {"sparse", "unbiased", "stochastic", "shared_support", "contraction", "low_rank",
            "needs_shapes", "bits_per_element", "value_bytes", "elementwise",
            "split_per_tensor", "sends_late", "variance_bound", "start_steps"}
    for spec in SPECS + ["powersgd"]:
        assert set(gcomp.Codec(spec).properties) == keys, spec
    p = {s: gcomp.Codec(s).properties for s in
         ("none", "fp16", "threshold:tau=0.5", "topk:ratio=0.01,values=fp16", "sign", "terngrad",
          "qsgd", "powersgd:start=12")}
    assert [s for s in p if p[s]["elementwise"]] == ["none", "fp16", "threshold:tau=0.5"]
    assert [s for s in p if p[s]["split_per_tensor"]] == ["sign", "terngrad"]
    assert [s for s in p if p[s]["sends_late"]] == ["threshold:tau=0.5",
                                                    "topk:ratio=0.01,values=fp16", "sign"]
    assert p["topk:ratio=0.01,values=fp16"]["value_bytes"] == 2 and p["sign"]["value_bytes"] == 0
    assert abs(p["qsgd"]["variance_bound"] - 512 ** 0.5 / 7) < 1e-12
    assert p["none"]["variance_bound"] == 0 and math.isnan(p["sign"]["variance_bound"])
    assert p["powersgd:start=12"]["start_steps"] == 12 and p["powersgd:start=12"]["needs_shapes"]
    assert p["qsgd"]["start_steps"] == 0 and not p["qsgd"]["needs_shapes"]


def test_step_seed_is_the_librarys():
    mask = (1 << 64) - 1
    for seed, step, index in ((0, 0, 0), (7, 3, 2), (mask, mask - 1, 5)):
        want = (seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9
                + index * 0x94D049BB133111EB) & mask
        assert gcomp.step_seed(seed, step, index) == want
    assert gcomp.step_seed(5, 1) == gcomp.step_seed(5, 1, 0)
    with pytest.raises(ValueError, match="step must be an int in 0..2"):
        gcomp.step_seed(1, -1)
    with pytest.raises(TypeError, match="seed must be an int"):
        gcomp.step_seed(1.5, 0)


def test_help_reads_well():
    text = pydoc.render_doc(gcomp, renderer=pydoc.plaintext)
    for name in gcomp.__all__:
        assert name in text
        obj = getattr(gcomp, name)
        assert obj.__doc__ and len(obj.__doc__) > 40, name
    for cls in (gcomp.Codec, gcomp.ErrorFeedback, gcomp.Communicator):
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                assert member.__doc__, f"{cls.__name__}.{name}"
    assert "allreduce(x, codec, ef=None" in pydoc.render_doc(gcomp.Communicator)


# ---- the same bytes as the C++ library ----


@pytest.mark.parametrize("spec", SPECS)
def test_bytes_equal_the_clis(spec, tmp_path):
    c = gcomp.Codec(spec)
    for n in (1, 1000, 70001):
        x = gradient(n, n)
        np.save(tmp_path / "x.npy", x)
        for seed in (0, 1, 2**64 - 1):
            r = run([CLI, "encode", "--spec", spec, "--seed", str(seed),
                     str(tmp_path / "x.npy"), str(tmp_path / "p.gcmp")])
            assert r.returncode == 0, r.stderr
            want = (tmp_path / "p.gcmp").read_bytes()
            got = c.encode(x, seed=seed)
            assert got.dtype == np.uint8 and got.ndim == 1
            assert got.tobytes() == want, (spec, n, seed)
            # decode_add from zeros is the CLI's decode.
            r = run([CLI, "decode", str(tmp_path / "p.gcmp"), str(tmp_path / "d.npy")])
            assert r.returncode == 0, r.stderr
            acc = np.zeros(n, np.float32)
            assert gcomp.decode_add(got, acc) is acc
            assert acc.tobytes() == np.load(tmp_path / "d.npy").tobytes()


@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "randomk:ratio=0.05", "qsgd", "terngrad",
                                  "sign", "fp16", "threshold:tau=1"])
def test_error_feedback_equals_cpps(spec, tmp_path):
    steps, seed, n = 6, 41, 30011
    ef = gcomp.ErrorFeedback(n)
    for t in range(steps):
        x = gradient(n, 100 + t)
        before = x.copy()
        np.save(tmp_path / f"x{t}.npy", x)
        p = gcomp.Codec(spec).encode(x, seed=seed + t, ef=ef)
        assert np.array_equal(x, before)  # x is not modified
        (tmp_path / f"p{t}.gcmp").write_bytes(p.tobytes())
    np.save(tmp_path / "residual.npy", ef.residual)
    assert np.any(ef.residual != 0)
    (tmp_path / "case.txt").write_text(f"{spec} {seed} {steps}\n")
    r = run([REFERENCE, "ef", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    # The reference does fail on a difference.
    np.save(tmp_path / "residual.npy", ef.residual + np.float32(1))
    assert run([REFERENCE, "ef", str(tmp_path)]).returncode == 1


def test_error_feedback_residual_is_what_was_not_sent():
    # top-k: the residual is exactly v - decode(payload), v = x + e_before.
    n = 5000
    c = gcomp.Codec("topk:ratio=0.1")
    ef = gcomp.ErrorFeedback(n)
    assert len(ef) == ef.size == n and not ef.residual.any()
    for t in range(3):
        x = gradient(n, t)
        v = x + ef.residual
        p = c.encode(x, seed=0, ef=ef)
        sent = np.zeros(n, np.float32)
        gcomp.decode_add(p, sent)
        assert np.array_equal(ef.residual, np.where(sent != 0, np.float32(0), v))
    ef.reset()
    assert not ef.residual.any()


@pytest.mark.parametrize("spec", SPECS)
def test_torch_tensors_and_numpy_arrays_give_the_same_bytes(spec):
    torch = pytest.importorskip("torch")
    c = gcomp.Codec(spec)
    x = gradient(20011, 5)
    t = torch.tensor(x)  # its own memory
    assert c.encode(t, seed=9).tobytes() == c.encode(x, seed=9).tobytes()
    ef_n, ef_t = gcomp.ErrorFeedback(len(x)), gcomp.ErrorFeedback(len(x))
    for s in range(3):
        assert c.encode(t, seed=s, ef=ef_t).tobytes() == c.encode(x, seed=s, ef=ef_n).tobytes()
    assert np.array_equal(ef_n.residual, ef_t.residual)
    p = c.encode(x, seed=9)
    acc_t, acc_n = torch.ones(len(x)), np.ones(len(x), np.float32)
    ptr = acc_t.data_ptr()
    assert gcomp.decode_add(torch.from_numpy(p), acc_t, alpha=0.5) is acc_t
    gcomp.decode_add(p, acc_n, alpha=0.5)
    assert acc_t.data_ptr() == ptr and np.array_equal(acc_t.numpy(), acc_n)


def test_decode_add_adds_alpha_times_the_decode_in_place():
    x = gradient(4096, 8)
    p = gcomp.Codec("qsgd").encode(x, seed=2)
    d = np.zeros_like(x)
    gcomp.decode_add(p, d)
    acc = gradient(4096, 9)
    want = acc + np.float32(0.5) * d  # 0.5 d is exact: one rounding, as the library's
    gcomp.decode_add(p, acc, alpha=0.5)
    assert np.array_equal(acc, want)
    gcomp.decode_add(bytes(p), acc, alpha=0.0)  # bytes are a payload too
    assert np.array_equal(acc, want)


def test_inspect_is_the_clis(tmp_path):
    for spec in SPECS:
        p = gcomp.Codec(spec).encode(gradient(777, 1), seed=4)
        (tmp_path / "p.gcmp").write_bytes(p.tobytes())
        out = run([CLI, "inspect", str(tmp_path / "p.gcmp")]).stdout
        cli = dict(line.split(":", 1) for line in out.splitlines())
        cli = {k.strip(): v.strip() for k, v in cli.items()}
        info = gcomp.inspect(p)
        # The payload names its codec: the spec's, but top-k per chunk's own wire name.
        wire = "topk_chunked" if "chunk=" in spec else spec.split(":")[0]
        assert info["codec"] == cli["codec"] == wire
        assert info["version"] == int(cli["version"])
        assert info["n"] == int(cli["elements"]) == 777
        assert info["bytes"] == int(cli["total bytes"]) == len(p)
        assert info["header_bytes"] == int(cli["header bytes"])
        assert f"{info['ratio']:.3f}" == cli["ratio"]
        assert " ".join(map(str, info["sections"])) == cli["sections"].replace("(none)", "")
        params = cli["params"]
        assert info["spec"] == (info["codec"] + ":" + params if params else info["codec"])


def test_encode_into_a_given_buffer():
    x = gradient(10000, 3)
    c = gcomp.Codec("fp16")
    out = np.full(c.max_bytes(len(x)) + 10, 7, np.uint8)
    view = c.encode(x, seed=0, out=out)
    assert view.tobytes() == c.encode(x).tobytes()
    assert np.shares_memory(view, out) and out[len(view)] == 7
    with pytest.raises(gcomp.Error) as e:
        c.encode(x, out=np.zeros(100, np.uint8))
    assert e.value.status == "buffer_too_small"
    with pytest.raises(ValueError, match="read-only"):
        c.encode(x, out=bytes(c.max_bytes(len(x))))
    b = bytearray(c.max_bytes(len(x)))
    view = c.encode(x, out=b)
    assert view.tobytes() == c.encode(x).tobytes() and np.shares_memory(view, b)
    with pytest.raises(BufferError):
        b.extend(b"\0")  # the view holds b's memory: it cannot move
    del view
    b.extend(b"\0")
    threshold = gcomp.Codec("threshold:tau=3")  # its bound is far above what it writes
    p = threshold.encode(x)
    assert len(p) < threshold.max_bytes(len(x)) / 2 and p.base is None


# ---- bad inputs: each named, nothing copied or converted ----

X = gradient(100, 0)


def bad_inputs():
    unaligned = np.frombuffer(bytearray(4 * 100 + 1), dtype=np.float32, count=100, offset=1)
    cases = [
        ([1.0, 2.0], TypeError, "not list"),
        ("abc", TypeError, "not str"),
        (X.astype(np.float64), TypeError, "dtype float64"),
        (X.astype(np.float16), TypeError, "dtype float16"),
        (X.astype(np.int32), TypeError, "dtype int32"),
        (X.astype(">f4"), TypeError, "dtype >f4"),
        (X.reshape(10, 10), ValueError, "shape (10, 10)"),
        (np.float32(1.0).reshape(()), ValueError, "shape ()"),
        (X[::2], ValueError, "not contiguous"),
        (unaligned, ValueError, "not aligned"),
    ]
    try:
        import torch
    except ImportError:
        return cases
    t = torch.tensor(X)
    cases += [
        (t.double(), TypeError, "dtype torch.float64"),
        (t.reshape(10, 10), ValueError, "shape (10, 10)"),
        (t[::2], ValueError, "not contiguous"),
        (torch.zeros(5, dtype=torch.uint8), TypeError, "dtype torch.uint8"),
    ]
    return cases


@pytest.mark.parametrize("x, error, message", bad_inputs())
def test_a_bad_array_is_named_and_refused(x, error, message):
    c = gcomp.Codec("topk:ratio=0.1")
    with pytest.raises(error) as e:
        c.encode(x)
    assert message in str(e.value) and "x " in str(e.value)
    if isinstance(x, np.ndarray) and x.dtype != np.float32:
        # decode_add's accumulator: the same checks, named acc.
        with pytest.raises(error) as e:
            gcomp.decode_add(c.encode(X), x)
        assert "acc" in str(e.value)


def test_other_bad_arguments():
    c = gcomp.Codec("topk:ratio=0.1")
    p = c.encode(X)
    acc = np.zeros(100, np.float32)
    cases = [
        (lambda: c.encode(X, ef=gcomp.ErrorFeedback(99)), ValueError, "ef holds 99"),
        (lambda: c.encode(X, ef="ef"), TypeError, "gcomp.ErrorFeedback"),
        (lambda: c.encode(X, seed=-1), ValueError, "seed"),
        (lambda: c.encode(X, seed=2**64), ValueError, "seed"),
        (lambda: c.encode(X, seed=1.5), TypeError, "seed"),
        (lambda: gcomp.decode_add(p, np.zeros(99, np.float32)), ValueError, "acc has 99"),
        (lambda: gcomp.decode_add(X, acc), TypeError, "payload has dtype float32"),
        (lambda: gcomp.decode_add(p[:100].reshape(2, -1), acc), ValueError, "payload has shape"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as e:
            call()
        assert message in str(e.value)
    ro = np.zeros(100, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="acc is read-only"):
        gcomp.decode_add(p, ro)
    with pytest.raises(TypeError):
        gcomp.ErrorFeedback(-1)
    with pytest.raises(gcomp.Error) as e:
        gcomp.ErrorFeedback(1 << 61)
    assert e.value.status == "invalid_argument"
    with pytest.raises(gcomp.Error) as e:
        gcomp.set_num_threads(0)
    assert e.value.status == "invalid_argument"


def test_torch_tensors_that_cannot_be_written_in_place():
    torch = pytest.importorskip("torch")
    p = gcomp.Codec("fp16").encode(X)
    w = torch.zeros(100, requires_grad=True)
    with pytest.raises(ValueError, match="requires grad"):
        gcomp.decode_add(p, w)
    gcomp.Codec("fp16").encode(w)  # reading one is fine


@pytest.mark.parametrize("spec", ["topk:ratio=0.1", "qsgd", "sign", "fp16"])
def test_corrupt_and_truncated_payloads_leave_acc_alone(spec):
    p = gcomp.Codec(spec).encode(X, seed=1)
    acc = gradient(100, 7)
    before = acc.copy()
    flipped = p.copy()
    flipped[9] ^= 0x10  # the element count: the header's CRC catches it
    nan_values = p.copy()
    nan_values[-4:] = 0xFF  # the last four bytes: a NaN value, or signs/codes past the end
    for bad in (p[:-1], p[:10], flipped, np.zeros(0, np.uint8), np.concatenate([p, p[:1]])):
        with pytest.raises(gcomp.Error) as e:
            gcomp.decode_add(bad, acc)
        assert e.value.status == "bad_payload", (spec, len(bad))
        assert np.array_equal(acc, before)
        with pytest.raises(gcomp.Error):
            gcomp.inspect(bad)
    try:
        gcomp.decode_add(nan_values, acc)
    except gcomp.Error as e:
        assert e.status == "bad_payload"
        assert np.array_equal(acc, before)
    else:
        assert np.all(np.isfinite(acc))


def test_nonfinite_input_raises_and_keeps_the_residual():
    c = gcomp.Codec("topk:ratio=0.1")
    ef = gcomp.ErrorFeedback(100)
    c.encode(X, seed=0, ef=ef)
    before = ef.residual.copy()
    bad = X.copy()
    bad[17] = np.nan
    with pytest.raises(gcomp.Error) as e:
        c.encode(bad, seed=0, ef=ef)
    assert e.value.status == "nonfinite" and "17" in str(e.value)
    assert np.array_equal(ef.residual, before)


class _CudaLooking:
    """Says it is CUDA memory (both protocols) but is a numpy array's host memory."""

    def __init__(self, host):
        self.host = host
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str,
                                         "data": (host.ctypes.data, False), "version": 2}

    def __dlpack_device__(self):
        return (2, 0)


def test_a_cuda_array_where_none_can_be_used_is_a_clear_error():
    status = gcomp.device_status()
    assert status["backend"] in ("cuda", "none")
    if status["usable"]:
        pytest.skip("a GPU is usable here: test_device.py and scripts/gpu-check cover CUDA")
    error = TypeError if status["backend"] == "none" else ValueError
    fake = _CudaLooking(np.zeros(10, np.float32))
    with pytest.raises(error) as e:
        gcomp.Codec("none").encode(fake)
    assert str(e.value) == "x is a CUDA array, but " + status["why"]
    with pytest.raises(error, match="acc is a CUDA array, but"):
        gcomp.decode_add(gcomp.Codec("none").encode(np.zeros(10, np.float32)), fake)
    with pytest.raises(error, match=r"ErrorFeedback\(device='cuda'\): "):
        gcomp.ErrorFeedback(10, device="cuda")
    with pytest.raises(TypeError, match="velocity is a CUDA array; this call takes host memory"):
        gcomp.momentum_correct(fake, np.zeros(10, np.float32), 0.9)
    with pytest.raises(TypeError, match="DLPack device type 10"):
        gcomp.Codec("none").encode(type("Rocm", (), {"__dlpack_device__": lambda self: (10, 0)})())


# ---- reference counting: what numpy holds stays alive, and nothing more ----


def test_payloads_and_residual_views_keep_their_memory():
    c = gcomp.Codec("topk:ratio=0.1")
    x = gradient(50000, 2)
    p = c.encode(x, seed=0)
    want = p.tobytes()
    del c
    gc.collect()
    filler = [np.full(50000, 3.0, np.float32) for _ in range(20)]  # reuse freed memory
    assert p.tobytes() == want

    ef = gcomp.ErrorFeedback(50000)
    gcomp.Codec("topk:ratio=0.1").encode(x, seed=0, ef=ef)
    r = ef.residual
    kept = r.copy()
    assert r.base is ef
    count = sys.getrefcount(ef)
    views = [ef.residual for _ in range(10)]
    assert sys.getrefcount(ef) == count + 10
    del views
    assert sys.getrefcount(ef) == count
    del ef
    gc.collect()
    filler += [np.full(50000, 5.0, np.float32) for _ in range(20)]
    assert np.array_equal(r, kept)  # the ErrorFeedback lives as long as a view of it
    del filler


def test_the_callers_arrays_hold_no_extra_reference():
    x = gradient(1000, 1)
    acc = np.zeros(1000, np.float32)
    p = gcomp.Codec("fp16").encode(x)
    counts = sys.getrefcount(x), sys.getrefcount(acc), sys.getrefcount(p)
    for _ in range(100):
        gcomp.Codec("fp16").encode(x)
        gcomp.decode_add(p, acc)
        gcomp.inspect(p)
    assert (sys.getrefcount(x), sys.getrefcount(acc), sys.getrefcount(p)) == counts
    # A buffer that is exported cannot be resized while the library uses it, and is released.
    b = bytearray(p.tobytes())
    gcomp.inspect(b)
    b.extend(b"\0")  # would raise BufferError had the export leaked


def test_a_refused_array_is_let_go():
    wide = np.zeros((2, 2), np.float32)
    strided = np.zeros(20, np.float32)[::2]
    counts = sys.getrefcount(wide), sys.getrefcount(strided)
    for _ in range(10):
        with pytest.raises(ValueError):
            gcomp.Codec("none").encode(wide)
        with pytest.raises(ValueError):
            gcomp.Codec("none").encode(strided)
    assert (sys.getrefcount(wide), sys.getrefcount(strided)) == counts
    b = bytearray(8)
    with pytest.raises(TypeError, match="acc has dtype"):
        gcomp.decode_add(gcomp.Codec("none").encode(np.zeros(2, np.float32)), b)
    b.extend(b"\0")  # would raise BufferError had the refused export leaked


# ---- the GIL ----


def longest_pause_of_python_while(call, min_seconds=0.05):
    """Runs call() in a thread while this thread counts; returns (longest gap between counts
    while the call ran, the call's duration)."""
    stamps, span = [], []

    def worker():
        t0 = time.perf_counter()
        call()
        span.extend([t0, time.perf_counter()])

    th = threading.Thread(target=worker)
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
    th.join()
    t0, t1 = span
    inside = [t0] + [s for s in stamps if t0 <= s <= t1] + [t1]
    return max(b - a for a, b in zip(inside, inside[1:])), t1 - t0


@pytest.mark.parametrize("what", ["encode", "decode_add"])
def test_the_gil_is_released_while_the_library_works(what):
    # Held, the GIL would stop this thread for the whole call: the longest pause would be the
    # call's length. Released, this thread keeps counting (2 cores or not, the OS shares them
    # in slices far shorter than the call). A loaded machine may stall a try; five are made,
    # and a held GIL fails every one of them.
    c = gcomp.Codec("qsgd:bits=8,bucket=64")
    n = 1 << 22
    while True:
        x = gradient(n, 0)
        p = c.encode(x)
        acc = np.zeros(n, np.float32)
        call = (lambda: c.encode(x)) if what == "encode" else (lambda: gcomp.decode_add(p, acc))
        t = time.perf_counter()
        call()
        if time.perf_counter() - t >= 0.08 or n >= 1 << 26:
            break
        n *= 2
    results = [longest_pause_of_python_while(call) for _ in range(5)]
    assert any(gap < 0.5 * length for gap, length in results), results


# ---- MPI only when a Communicator is made ----


def child(code):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PMI_", "HYDRA_", "MPIR_")):
            del env[k]
    return run([sys.executable, "-c", textwrap.dedent(code)], env=env)


MPI_LIB = """
import ctypes, gcomp
# The MPI library the module loaded (its symbols are not global: open it by its path).
mpi = ctypes.CDLL([l.split()[-1] for l in open("/proc/self/maps") if "/libmpi" in l][0])
def flag(name):
    f = ctypes.c_int(0)
    getattr(mpi, name)(ctypes.byref(f))
    return f.value
"""


def test_a_script_without_a_communicator_never_touches_mpi():
    r = child(MPI_LIB + """
import numpy as np
c = gcomp.Codec("topk:ratio=0.5")
gcomp.decode_add(c.encode(np.ones(10, np.float32)), np.zeros(10, np.float32))
print("initialized", flag("MPI_Initialized"))
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["initialized", "0"]


def test_the_module_initializes_mpi_and_finalizes_it_at_exit():
    # atexit runs last-in first-out: this check, registered first, runs after gcomp's finalize.
    r = child(MPI_LIB + """
import atexit, numpy as np
atexit.register(lambda: print("finalized at exit", flag("MPI_Finalized"), flush=True))
comm = gcomp.Communicator()
print("initialized", flag("MPI_Initialized"), comm.rank, comm.size)
x = np.arange(5, dtype=np.float32)
assert comm.allreduce(x, gcomp.Codec("none")) is x and x[4] == 4
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["initialized 1 0 1", "finalized at exit 1"]


def test_mpi_initialized_by_the_program_is_left_to_it():
    r = child(MPI_LIB + """
import atexit
provided = ctypes.c_int(0)
assert mpi.MPI_Init_thread(None, None, 2, ctypes.byref(provided)) == 0  # SERIALIZED
def done():
    print("finalized by gcomp", flag("MPI_Finalized"), flush=True)
    mpi.MPI_Finalize()
atexit.register(done)
comm = gcomp.Communicator()
del comm
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["finalized", "by", "gcomp", "0"]


def test_the_package_installs_where_debians_python_finds_it(tmp_path):
    build = pathlib.Path(gcomp.__file__).resolve().parents[2]
    r = run(["cmake", "--install", str(build), "--prefix", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    site = tmp_path / "lib/python3/dist-packages"
    assert (site / "gcomp/__init__.py").exists()
    env = dict(os.environ, PYTHONPATH=str(site))  # the build tree's package is not on the path
    r = run([sys.executable, "-c", textwrap.dedent("""
        import gcomp, numpy as np
        p = gcomp.Codec("sign").encode(np.ones(9, np.float32))
        print(gcomp.__file__)
        print([l.split()[-1] for l in open("/proc/self/maps") if "libgcomp_core" in l][0])
        """)], env=env)
    assert r.returncode == 0, r.stderr
    module, core = r.stdout.split()
    assert module.startswith(str(site)) and core.startswith(str(tmp_path)), r.stdout


def test_momentum_correction_is_dgcs_in_place():
    rng = np.random.default_rng(3)
    u = rng.standard_normal(1001).astype(np.float32)
    g = rng.standard_normal(1001).astype(np.float32)
    want = (np.float32(0.9) * u + g).astype(np.float32)  # each product and sum rounded alone
    gcomp.momentum_correct(u, g, 0.9)
    assert np.array_equal(u, want) and np.array_equal(g, want)
    # Masking: the velocity is zeroed where the residual is 0, unless the residual is all 0.
    r = np.where(np.arange(1001) % 3 == 0, 0.0, 1.0).astype(np.float32)
    kept = u.copy()
    assert gcomp.mask_momentum(u, r)
    assert np.array_equal(u, np.where(r == 0, 0.0, kept).astype(np.float32))
    kept = u.copy()
    assert not gcomp.mask_momentum(u, np.zeros(1001, np.float32))
    assert np.array_equal(u, kept)
    with pytest.raises(ValueError, match="elements"):
        gcomp.momentum_correct(u, g[:5], 0.9)
    with pytest.raises(ValueError, match="elements"):
        gcomp.mask_momentum(u, r[:5])
    with pytest.raises(gcomp.Error, match="momentum"):
        gcomp.momentum_correct(u, g, 1.0)
    with pytest.raises(TypeError, match="float32"):
        gcomp.mask_momentum(u, np.zeros(1001, np.float64))


def test_adam_and_one_bit_adams_halves_in_place():
    rng = np.random.default_rng(4)
    n = 1001
    g = rng.standard_normal(n).astype(np.float32)
    for decoupled in (False, True):
        kw = {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.03,
              "decoupled": decoupled}
        # The moments of 8 exact steps (which belong together: the frozen step's bound holds).
        p0 = rng.standard_normal(n).astype(np.float32)
        m0, v0 = np.zeros(n, np.float32), np.zeros(n, np.float32)
        for t in range(1, 9):
            gcomp.adam_step(p0, rng.standard_normal(n).astype(np.float32), m0, v0, lr=0.01,
                            step=t, **kw)
        p1, m1, v1 = p0.copy(), m0.copy(), v0.copy()
        gcomp.adam_step(p1, g, m1, v1, lr=0.01, step=9, **kw)
        assert not np.array_equal(p1, p0)
        # The compressed stage's halves with the variance the exact step made: that step.
        sent = g.copy()
        gcomp.adam_local_momentum(p0, sent, m0, sent, beta1=0.8, weight_decay=0.03,
                                  decoupled=decoupled)
        assert np.array_equal(sent, m1)
        p2, m2 = p0.copy(), m0.copy()
        gcomp.adam_frozen_update(p2, sent, m2, v1, lr=0.01, step=9, variance_steps=9, **kw)
        assert np.array_equal(p2, p1) and np.array_equal(m2, m1)
    with pytest.raises(gcomp.Error, match="variance_steps"):
        gcomp.adam_frozen_update(p2, sent, m2, v1, lr=0.01, step=3, variance_steps=4)
    with pytest.raises(gcomp.Error, match="beta1"):
        gcomp.adam_step(p2, g, m2, v1, lr=0.01, step=1, beta1=1.0)
    with pytest.raises(gcomp.Error, match="differ in size"):
        gcomp.adam_step(p2, g[:5], m2, v1, lr=0.01, step=1)
    with pytest.raises(TypeError, match="float32"):
        gcomp.adam_step(p2.astype(np.float64), g, m2, v1, lr=0.01, step=1)


def test_zero_one_adams_schedule_and_synchronization_halves():
    s = gcomp.AdamSchedule.zero_one(10, kappa=2, max_local_steps=4, local_double_every=3)
    assert [t for t in range(1, 31) if s.refreshes(t)] == [1, 2, 4, 6, 10]
    assert [t for t in range(1, 31) if s.local(t) and s.synchronizes(t)] == \
        [11, 12, 13, 14, 16, 18, 22, 26, 30]
    assert s.variance_steps(100) == 5 and s.frozen_after() == 10
    assert gcomp.AdamSchedule(**s.as_dict()) == s and s != gcomp.AdamSchedule.one_bit(2)
    assert "freeze_step=10" in repr(s)
    with pytest.raises(gcomp.Error, match="warmup_steps must be at least 1"):
        gcomp.AdamSchedule.one_bit(0)
    with pytest.raises(gcomp.Error, match="max_local_steps"):
        gcomp.AdamSchedule(max_local_steps=0)
    # One rank's way from the anchor as a momentum and back: the same parameters (a product
    # and a quotient's roundings), the anchor moved there, m = the momentum (1 - beta1^step).
    rng = np.random.default_rng(5)
    n = 777
    a = rng.standard_normal(n).astype(np.float32)
    v = (rng.standard_normal(n) ** 2 * 1e-4).astype(np.float32)
    p = (a - 3e-3 * np.tanh(rng.standard_normal(n))).astype(np.float32)
    x, m = np.empty(n, np.float32), np.empty(n, np.float32)
    gcomp.adam_sync_momentum(p, a, v, x, lr_sum=3e-3, decay=1.0, variance_steps=20)
    q = p.copy()
    gcomp.adam_sync_update(q, a, x, m, v, lr_sum=3e-3, decay=1.0, step=30, variance_steps=20)
    assert np.allclose(q, p, rtol=0, atol=1e-6) and np.array_equal(a, q)
    assert np.allclose(m, x * (1 - 0.9 ** 30), rtol=1e-6)
    with pytest.raises(gcomp.Error, match="lr_sum"):
        gcomp.adam_sync_momentum(p, a, v, x, lr_sum=0.0, decay=1.0, variance_steps=20)
