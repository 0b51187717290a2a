"""The gcomp Communicator from Python, on every rank of `mpiexec.mpich -n P` (tests/python/
mpi_test.sh runs it, then gcomp_python_reference, which redoes the recorded collectives with
the C++ Communicator and compares the bits).

Every test is collective: all ranks run the same tests in the same order. GCOMP_PYTHON_MPI_DIR
is where the inputs and results of the compared collectives go.
"""

import os
import pathlib
import threading
import time

import numpy as np
import pytest

import gcomp

OUT = pathlib.Path(os.environ.get("GCOMP_PYTHON_MPI_DIR", "python_mpi_out"))


@pytest.fixture(scope="module")
def comm():
    return gcomp.Communicator()


def gradient(n, seed):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_rank_and_size_are_mpiexecs(comm):
    assert comm.size == int(os.environ.get("PMI_SIZE", "1"))
    assert comm.rank == int(os.environ.get("PMI_RANK", "0"))
    assert all(v >= 0 for v in comm.network.values())


# (name, spec, algorithm, average, seed, error feedback, steps, sizes)
CASES = [
    ("none_dense", "none", "dense", 0, 0, 0, 2, [10007]),
    ("fp16_dense_avg", "fp16", "dense", 1, 0, 1, 3, [10007]),
    ("topk_allgather", "topk:ratio=0.01", "sparse_allgather", 0, 0, 1, 3, [10007]),
    ("topk_rd", "topk:ratio=0.02", "sparse_recursive_doubling", 1, 0, 1, 3, [10007]),
    ("topk_split", "topk:ratio=0.05,values=fp16", "sparse_split", 0, 0, 1, 3, [10007]),
    ("randomk", "randomk:ratio=0.03", "sparse_allgather", 0, 5, 1, 3, [10007]),
    ("threshold", "threshold:tau=2", "sparse_split", 0, 0, 0, 2, [10007]),
    ("qsgd_allgather", "qsgd", "allgather", 1, 7, 0, 2, [10007]),
    ("qsgd_crs", "qsgd:bits=3,bucket=100", "compressed_reduce_scatter", 0, 9, 1, 3, [10007]),
    ("terngrad_crs", "terngrad", "compressed_reduce_scatter", 1, 11, 1, 3, [10007]),
    ("sign_allgather", "sign", "allgather", 0, 0, 1, 3, [10007]),
    ("buckets_topk", "topk:ratio=0.01", "sparse_allgather", 0, 3, 1, 3, [5000, 3, 20000, 100, 7000]),
    ("buckets_qsgd", "qsgd", "compressed_reduce_scatter", 1, 3, 1, 2, [4000, 12000, 10, 4000]),
]


def run_case(comm, case, as_torch=False):
    """Runs a case through the module; returns each step's results and the final residuals."""
    name, spec, algorithm, average, seed, with_ef, steps, sizes = case
    codec = gcomp.Codec(spec)
    efs = [gcomp.ErrorFeedback(n) for n in sizes] if with_ef else None
    results = []
    for s in range(steps):
        xs = [gradient(n, 1000 * comm.rank + 10 * s + t) for t, n in enumerate(sizes)]
        ins = [x.copy() for x in xs]
        if as_torch:
            import torch
            xs = [torch.tensor(x) for x in xs]
        if len(sizes) == 1:
            out = comm.allreduce(xs[0], codec, ef=efs[0] if efs else None, algorithm=algorithm,
                                 average=bool(average), seed=seed)
            assert out is xs[0]
            assert comm.last_stats["algorithm"] == algorithm and comm.last_stats["calls"] == 1
        else:
            assert comm.allreduce_buckets(xs, codec, efs=efs, bucket_bytes=4 * sizes[0],
                                          average=bool(average), seed=seed,
                                          algorithm=algorithm) is xs
        outs = [np.array(x) for x in xs]
        results.append((ins, outs))
    residuals = [ef.residual.copy() for ef in efs] if efs else []
    return results, residuals


def test_allreduce_is_the_cpp_communicators(comm):
    """Records inputs and results for gcomp_python_reference (run after this, by mpi_test.sh)."""
    OUT.mkdir(parents=True, exist_ok=True)
    lines = []
    for case in CASES:
        name, spec, algorithm, average, seed, with_ef, steps, sizes = case
        results, residuals = run_case(comm, case)
        base = OUT / f"{name}.r{comm.rank}"
        for s, (ins, outs) in enumerate(results):
            for t in range(len(sizes)):
                np.save(f"{base}.s{s}.t{t}.in.npy", ins[t])
                np.save(f"{base}.s{s}.t{t}.out.npy", outs[t])
        for t, r in enumerate(residuals):
            np.save(f"{base}.t{t}.ef.npy", r)
        lines.append(f"{name} {spec} {algorithm} {average} {seed} {with_ef} {steps} "
                     + ",".join(map(str, sizes)))
    # Every rank ends with the same bits: each compares its results with rank 0's files.
    comm.allreduce(np.zeros(1, np.float32), "none")  # everyone has written
    for name, *_, steps, sizes in CASES:
        for s in range(steps):
            for t in range(len(sizes)):
                mine = np.load(f"{OUT}/{name}.r{comm.rank}.s{s}.t{t}.out.npy")
                first = np.load(f"{OUT}/{name}.r0.s{s}.t{t}.out.npy")
                assert mine.tobytes() == first.tobytes(), (name, s, t)
    if comm.rank == 0:
        (OUT / "cases.txt").write_text("\n".join(lines) + "\n")


def test_torch_tensors_give_the_same_results_as_numpy(comm):
    pytest.importorskip("torch")
    for case in (CASES[2], CASES[9], CASES[11]):
        a, ra = run_case(comm, case)
        b, rb = run_case(comm, case, as_torch=True)
        for (_, oa), (_, ob) in zip(a, b):
            assert all(np.array_equal(x, y) for x, y in zip(oa, ob)), case[0]
        assert all(np.array_equal(x, y) for x, y in zip(ra, rb))


def test_the_sum_and_the_mean_of_integers_are_exact(comm):
    p = comm.size
    x = np.full(1001, comm.rank + 1, np.float32)
    comm.allreduce(x, "none", algorithm="dense")
    assert np.all(x == p * (p + 1) / 2)
    x = np.full(1001, 2.0 * p, np.float32)
    comm.allreduce(x, gcomp.Codec("none"), average=True)
    assert np.all(x == 2.0 * p)


def test_stats_count_the_bytes(comm):
    codec = gcomp.Codec("topk:ratio=0.01")
    x = gradient(100000, comm.rank)
    mine = len(codec.encode(x))  # this rank's payload: its packed indices take what they need
    before = comm.total_stats
    comm.allreduce(x, codec, algorithm="sparse_allgather")
    s = comm.last_stats
    after = comm.total_stats
    p = comm.size
    assert s["encode_seconds"] > 0 and s["comm_seconds"] >= 0 and s["decode_seconds"] >= 0
    assert 0 <= s["agree_seconds"] <= s["comm_seconds"]
    assert after["agree_seconds"] == before["agree_seconds"] + s["agree_seconds"]
    assert s["compressed"] is True and s["calls"] == 1
    assert after["calls"] == before["calls"] + 1
    assert after["compressed"] == before["compressed"] + 1
    assert after["bytes_sent"] == before["bytes_sent"] + s["bytes_sent"]
    assert after["algorithm"]["sparse_allgather"] == before["algorithm"].get("sparse_allgather", 0) + 1
    sizes = np.array([mine], np.float32)  # every rank's payload size, summed (exact in float32)
    comm.allreduce(sizes, "none", algorithm="dense")
    # The agreement (eleven int64 each way), the sizes (8 bytes to each peer), the payload to each.
    assert s["bytes_sent"] == 2 * 96 + (p - 1) * (8 + mine)
    assert s["bytes_received"] == 2 * 96 + (p - 1) * 8 + int(sizes[0]) - mine
    comm.allreduce_buckets([gradient(5000, 1), gradient(10, 2)], codec, bucket_bytes=1 << 20,
                           algorithm="sparse_allgather")
    s = comm.last_stats
    assert s["calls"] == 2  # one bucket and the dense one
    assert s["algorithms"] == {"sparse_allgather": 1, "dense": 1} and s["algorithm"] == "dense"
    assert s["compressed_calls"] == 1  # the small tensors' bucket did not apply the codec


def test_a_step_and_an_index_seed_the_call_as_the_documented_sum(comm):
    def mixed(seed, step, index):
        return (seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9
                + index * 0x94D049BB133111EB) % 2**64

    codec = gcomp.Codec("qsgd")  # stochastic: its bytes follow the seed
    for seed, step, index in ((0, 0, 0), (3, 5, 2), (2**64 - 1, 7, 1)):
        a, b = gradient(5000, comm.rank), gradient(5000, comm.rank)
        comm.allreduce(a, codec, algorithm="allgather", seed=seed, step=step, index=index)
        comm.allreduce(b, codec, algorithm="allgather", seed=mixed(seed, step, index))
        assert a.tobytes() == b.tobytes()
        a = [gradient(5000, comm.rank), gradient(7, 1)]
        b = [t.copy() for t in a]
        comm.allreduce_buckets(a, codec, algorithm="allgather", seed=seed, step=step, index=index)
        comm.allreduce_buckets(b, codec, algorithm="allgather", seed=mixed(seed, step, index))
        assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))
    a, b = gradient(5000, comm.rank), gradient(5000, comm.rank)
    comm.allreduce(a, codec, algorithm="allgather", seed=3, step=0)
    comm.allreduce(b, codec, algorithm="allgather", seed=3, step=1)
    assert a.tobytes() != b.tobytes()
    x = gradient(5000, 0)
    with pytest.raises(ValueError, match="without a step"):
        comm.allreduce(x, codec, index=1)
    with pytest.raises(TypeError, match="step"):
        comm.allreduce_buckets([x], codec, step=1.5)


def test_total_stats_sum_calls_as_the_communicator_does(comm):
    t = gcomp.TotalStats()
    assert t.as_dict() == {"calls": 0, "bytes_sent": 0, "bytes_received": 0,
                           "encode_seconds": 0.0, "comm_seconds": 0.0, "decode_seconds": 0.0,
                           "agree_seconds": 0.0, "algorithm": {}, "compressed": 0}
    codec = gcomp.Codec("topk:ratio=0.01")
    before = comm.total_stats
    comm.allreduce(gradient(20000, comm.rank), codec, algorithm="sparse_allgather")
    t.add(comm)
    comm.allreduce_buckets([gradient(5000, 1), gradient(10, 2)], codec, bucket_bytes=1 << 20,
                           algorithm="sparse_allgather")
    t.add(comm)
    after, mine = comm.total_stats, t.as_dict()
    for key in ("calls", "bytes_sent", "bytes_received"):
        assert mine[key] == after[key] - before[key], key
    for key in ("encode_seconds", "comm_seconds", "decode_seconds", "agree_seconds"):
        assert mine[key] == pytest.approx(after[key] - before[key], abs=1e-9), key
    assert mine["algorithm"] == {"sparse_allgather": 2, "dense": 1}
    assert mine["compressed"] == 2  # the small tensors' bucket did not apply the codec
    comm.allreduce(gradient(1000, 3), "none", algorithm="dense")
    t.add(comm, codec_applied=False)  # sent uncompressed on purpose: no compressed call
    assert t.as_dict()["calls"] == 4 and t.as_dict()["compressed"] == 2


def expect_every_rank_raises(comm, call, culprit, error, status):
    """call() fails on rank `culprit` with `error` (and gcomp.Error `status` when that is it);
    the others raise gcomp.Error("mismatch") naming the culprit. Then a good call works."""
    with pytest.raises(Exception) as e:
        call()
    if comm.rank == culprit:
        assert isinstance(e.value, error), repr(e.value)
        if error is gcomp.Error:
            assert e.value.status == status, repr(e.value)
    else:
        assert isinstance(e.value, gcomp.Error) and e.value.status == "mismatch", repr(e.value)
        assert f"rank {culprit}" in str(e.value)
    x = np.ones(100, np.float32)
    comm.allreduce(x, "none")
    assert np.all(x == comm.size)


def test_nan_on_one_rank_raises_on_every_rank(comm):
    culprit = comm.size - 1
    x = gradient(5000, comm.rank)
    if comm.rank == culprit:
        x[123] = np.nan
    for algorithm in ("auto", "sparse_allgather", "sparse_split"):
        ef = gcomp.ErrorFeedback(5000)
        y = x.copy()
        expect_every_rank_raises(
            comm, lambda: comm.allreduce(y, "topk:ratio=0.01", ef=ef, algorithm=algorithm),
            culprit, gcomp.Error, "nonfinite")
        assert not ef.residual.any()  # the residual is as it was
        assert np.array_equal(y, x, equal_nan=True)  # found before the exchange: untouched


@pytest.mark.skipif(int(os.environ.get("PMI_SIZE", "1")) < 2, reason="needs two ranks")
def test_ranks_passing_different_specs_all_raise(comm):
    spec = "topk:ratio=0.01" if comm.rank == 0 else "topk:ratio=0.02"
    x = gradient(5000, 0)
    with pytest.raises(gcomp.Error) as e:
        comm.allreduce(x, spec)
    assert e.value.status == "mismatch"


@pytest.mark.parametrize(
    "bad, error, status",
    [
        (lambda x: x.astype(np.float64), TypeError, None),
        (lambda x: x[::2], ValueError, None),
        (lambda x: x.reshape(2, -1), ValueError, None),
        (lambda x: [1.0], TypeError, None),
    ],
)
def test_a_bad_array_on_one_rank_raises_on_every_rank(comm, bad, error, status):
    culprit = comm.size // 2
    x = gradient(5000, 0)
    arg = bad(x) if comm.rank == culprit else x
    expect_every_rank_raises(comm, lambda: comm.allreduce(arg, "qsgd"), culprit, error, status)


def test_bad_arguments_on_one_rank_raise_on_every_rank(comm):
    culprit = 0
    x = gradient(5000, 0)
    mine = comm.rank == culprit
    calls = [
        (lambda: comm.allreduce(x, "nope" if mine else "fp16"), gcomp.Error, "invalid_argument"),
        (lambda: comm.allreduce(x, "fp16", algorithm="nope" if mine else "dense"), gcomp.Error,
         "invalid_argument"),
        (lambda: comm.allreduce(x, "fp16", seed=-1 if mine else 0), ValueError, None),
        (lambda: comm.allreduce(x, "fp16", ef=gcomp.ErrorFeedback(3 if mine else 5000)),
         ValueError, None),
        (lambda: comm.allreduce(x, 42 if mine else "fp16"), TypeError, None),
        (lambda: comm.allreduce_buckets([x], "fp16", efs=[] if mine else None), ValueError, None),
        (lambda: comm.allreduce_buckets([x, x[::2] if mine else x.copy()], "fp16"), ValueError,
         None),
        (lambda: comm.allreduce_buckets([x], "fp16", bucket_bytes=-1 if mine else 1 << 20),
         ValueError, None),
        (lambda: comm.allreduce_buckets([x], "powersgd", shapes=[] if mine else [(5000,)]),
         ValueError, None),
        (lambda: comm.allreduce_buckets([x], "powersgd", shapes=[(50, 99) if mine else (50, 100)]),
         ValueError, None),
        (lambda: comm.allreduce_buckets([x], "powersgd", shapes=None if mine else [(50, 100)]),
         gcomp.Error, "invalid_argument"),
    ]
    for call, error, status in calls:
        expect_every_rank_raises(comm, call, culprit, error, status)


@pytest.mark.skipif(int(os.environ.get("PMI_SIZE", "1")) < 2, reason="needs two ranks")
def test_the_gil_is_released_during_a_collective(comm):
    # Rank 0 calls from a thread while its main thread keeps counting; the others join a second
    # later, so rank 0's call waits that long inside MPI. Held, the GIL would stop the count.
    x = np.ones(1000, np.float32)
    comm.allreduce(x, "none")  # everyone here
    if comm.rank != 0:
        time.sleep(1.0)
        comm.allreduce(x, "none")
        return
    stamps = []
    th = threading.Thread(target=lambda: comm.allreduce(x, "none"))
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
        time.sleep(0.001)
    th.join()
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 0.5
    assert np.all(x == comm.size * comm.size)


def test_calls_from_another_thread_work(comm):
    out = {}

    def work():
        x = np.ones(1000, np.float32)
        comm.allreduce(x, "fp16")
        out["x"] = x

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert np.all(out["x"] == comm.size)


def test_allow_uncompressed_false_keeps_the_codec(comm):
    # Top-k with k = n sends every value with its index: twice the bytes of the plain allreduce,
    # and an encode besides. Whether auto sends it uncompressed depends on this machine's network
    # (where latency dominates, an allgather's fewer rounds can win), so the call must do what
    # choose() says; allow_uncompressed=False always applies the codec.
    p = comm.size
    exact = p * (p + 1) / 2
    codec = gcomp.Codec("topk:ratio=1")
    want = comm.choose(codec, 5003)
    assert set(want) == {"algorithm", "compressed"}
    assert comm.choose(codec, 5003, allow_uncompressed=False)["compressed"] is True
    x = np.full(5003, comm.rank + 1, np.float32)
    comm.allreduce(x, codec)
    assert comm.last_stats["compressed"] is want["compressed"]
    assert comm.last_stats["algorithm"] == want["algorithm"]
    if not want["compressed"]:
        assert want["algorithm"] == "dense"
    assert np.all(x == exact)
    x = np.full(5003, comm.rank + 1, np.float32)
    comm.allreduce(x, codec, allow_uncompressed=False)
    # (dense may still be the algorithm: MPI_Allreduce of each rank's decoded contribution)
    assert comm.last_stats["compressed"] is True
    assert np.all(x == exact)
    # bucket_bytes=1: each tensor a collective of its own (the small one in the dense bucket).
    ts = [np.full(n, comm.rank + 1, np.float32) for n in (3001, 10, 4001)]
    comm.allreduce_buckets(ts, codec, bucket_bytes=1, allow_uncompressed=False)
    assert comm.last_stats["calls"] == 3 and comm.last_stats["compressed"] is True
    assert all(np.all(t == exact) for t in ts)


def test_powersgd_through_shaped_buckets(comm):
    # A 60 x 40 matrix at rank 3, a 1-D tensor and a conv-like 8 x 2 x 3 x 3 weight (8 x 18:
    # below the rate at rank 3, 26 x 3 x 2 > 144): the matrix comes back of rank 3 at most, the
    # others as the float32 sum. Flat tensors, shapes given apart (torch.Size works too).
    w, b, c = gradient(2400, 10 + comm.rank), gradient(40, 20 + comm.rank), gradient(144, 30)
    dense_b, dense_c = comm.allreduce(b.copy(), "none"), comm.allreduce(c.copy(), "none")
    efs = [gcomp.ErrorFeedback(2400), gcomp.ErrorFeedback(40), gcomp.ErrorFeedback(144)]
    comm.allreduce_buckets([w, b, c], "powersgd:rank=3", efs=efs, shapes=[(60, 40), (40,),
                           (8, 2, 3, 3)], dense_below=0, algorithm="low_rank", seed=4)
    assert comm.last_stats["algorithms"] == {"low_rank": 1}
    assert np.linalg.matrix_rank(w.reshape(60, 40).astype(np.float64), tol=1e-4) <= 3
    np.testing.assert_allclose(b, dense_b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(c, dense_c, rtol=0, atol=1e-5)
    assert np.any(efs[0].residual != 0) and not np.any(efs[1].residual != 0)
    assert gcomp.Codec("powersgd:rank=3").properties["low_rank"]
