#!/usr/bin/python3
"""What the Python module costs over the C++ library: the same calls from Python and from the
C++ benchmarks, in one run, alternating, medians.

    /usr/bin/python3 bench/python_overhead.py [--build build] [--ranks 4] [--rounds 3]
                                              [--sizes 65536,1048576,16777216] [--csv FILE]

Codecs (1 library thread): encode and decode_add of fp16, top-k 1% and 4-bit QSGD, against
gcomp_bench_codecs' rows of the same names. Python's encode is timed twice: into a given buffer
(out=, as the C++ benchmark encodes into one) and returning a new payload array each call; where
torch imports, encode and decode_add are timed again on torch CPU tensors over the same memory.
Allreduce: a 4-rank (--ranks) allreduce of none (dense), top-k 1% (sparse_allgather) and 4-bit
QSGD (compressed_reduce_scatter) under mpiexec.mpich, against gcomp_bench_collectives' rows; both
time an iteration as the C++ benchmark does (a barrier, then the slowest rank's time).

Prints a Markdown table: microseconds per call (medians over rounds of per-round medians), the
ratio Python / C++ and the difference in microseconds per call. For the codecs, a third timing
isolates the binding: the library's C API called through ctypes on the very arrays the Python
calls use (so the same memory, the same interpreter loop around it); "Python / C API" is then what
the module itself costs, apart from where the arrays live.
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CODEC_SPECS = ["fp16", "topk:ratio=0.01", "qsgd:bits=4"]
ALLREDUCE_ROWS = [("none", "dense"), ("topk:ratio=0.01", "sparse_allgather"),
                  ("qsgd:bits=4", "compressed_reduce_scatter")]
MIN_TIME = 0.2  # seconds of calls per measurement, as gcomp_bench_codecs' default


def median_batch_seconds(call, min_time=MIN_TIME, batches=5):
    """Median over batches of the mean seconds per call, each batch filling min_time / batches."""
    call()  # warm: first-touch page faults, caches
    t0 = time.perf_counter()
    call()
    one = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, int(min_time / batches / one))
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call()
        out.append((time.perf_counter() - t0) / per_batch)
    return statistics.median(out)


# ---- codecs ----

def c_api(build):
    import ctypes
    lib = ctypes.CDLL(os.path.join(build, "lib", "libgcomp_core.so"))
    lib.gcomp_codec_create.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.gcomp_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_size_t)]
    lib.gcomp_decode_add.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_float]
    return lib, ctypes


def python_codecs(build, sizes):
    import numpy as np
    import gcomp
    try:
        import torch
    except ImportError:
        torch = None
    gcomp.set_num_threads(1)
    lib, ctypes = c_api(build)
    lib.gcomp_set_num_threads(1)
    rows = {}
    for spec in CODEC_SPECS:
        c = gcomp.Codec(spec)
        handle = ctypes.c_void_p()
        assert lib.gcomp_codec_create(spec.encode(), ctypes.byref(handle)) == 0
        for n in sizes:
            x = np.random.default_rng(20240611).standard_normal(n).astype(np.float32)
            out = np.empty(c.max_bytes(n), np.uint8)
            seed = [1]

            def enc_out():
                seed[0] += 1
                c.encode(x, seed[0], out=out)

            def enc_new():
                seed[0] += 1
                c.encode(x, seed[0])

            written = ctypes.c_size_t()

            def enc_c():
                seed[0] += 1
                lib.gcomp_encode(handle, x.ctypes.data, n, seed[0], out.ctypes.data, out.size,
                                 ctypes.byref(written))

            p = c.encode(x, 1)
            acc = np.zeros(n, np.float32)
            rows[("encode", spec, n)] = median_batch_seconds(enc_out)
            rows[("encode (new array)", spec, n)] = median_batch_seconds(enc_new)
            rows[("decode_add", spec, n)] = median_batch_seconds(lambda: gcomp.decode_add(p, acc))
            if torch is not None:  # the same calls on torch CPU tensors over the same memory
                tx, tacc = torch.from_numpy(x), torch.from_numpy(acc)
                rows[("encode (torch CPU)", spec, n)] = median_batch_seconds(
                    lambda: c.encode(tx, 1, out=out))
                rows[("decode_add (torch CPU)", spec, n)] = median_batch_seconds(
                    lambda: gcomp.decode_add(p, tacc))
            rows[("c_api encode", spec, n)] = median_batch_seconds(enc_c)
            rows[("c_api decode_add", spec, n)] = median_batch_seconds(
                lambda: lib.gcomp_decode_add(p.ctypes.data, p.size, acc.ctypes.data, n, 1.0))
        lib.gcomp_codec_destroy(handle)
    return rows


def cpp_codecs(build, sizes):
    specs = "|".join(s.replace(".", r"\.") for s in CODEC_SPECS)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([os.path.join(build, "bin", "gcomp_bench_codecs"),
                        "--sizes=" + ",".join(map(str, sizes)),
                        f"--benchmark_filter=^(encode|decode_add)/({specs})/[0-9]+/threads:1/",
                        f"--benchmark_min_time={MIN_TIME}", "--benchmark_out=" + f.name,
                        "--benchmark_out_format=json"],
                       check=True, stdout=subprocess.DEVNULL, timeout=900)
        runs = json.load(open(f.name))["benchmarks"]
    rows = {}
    for r in runs:
        op, spec, n = r["name"].split("/")[:3]
        rows[(op, spec, int(n))] = r["real_time"] * {"ms": 1e-3, "us": 1e-6, "ns": 1e-9}[r["time_unit"]]
    return rows


# ---- allreduce ----

class Mpich:
    """MPI_Barrier, MPI_Wtime and a MAX over ranks through MPICH's C API (its handles are
    constants), for timing iterations as gcomp_bench_collectives does."""
    COMM_WORLD, DOUBLE, MAX = 0x44000000, 0x4c00080b, 0x58000001

    def __init__(self):
        import ctypes
        path = [l.split()[-1] for l in open("/proc/self/maps") if "/libmpi" in l][0]
        self.lib = ctypes.CDLL(path)
        self.lib.MPI_Wtime.restype = ctypes.c_double
        self.ctypes = ctypes

    def barrier(self):
        self.lib.MPI_Barrier(self.COMM_WORLD)

    def wtime(self):
        return self.lib.MPI_Wtime()

    def slowest(self, seconds):
        c = self.ctypes
        mine, worst = c.c_double(seconds), c.c_double(0)
        self.lib.MPI_Allreduce(c.byref(mine), c.byref(worst), 1, self.DOUBLE, self.MAX,
                               self.COMM_WORLD)
        return worst.value


def allreduce_worker(sizes, out_path):
    import numpy as np
    import gcomp
    comm = gcomp.Communicator()
    mpi = Mpich()
    rows = {}
    for spec, algorithm in ALLREDUCE_ROWS:
        codec = gcomp.Codec(spec)
        for n in sizes:
            x = np.random.default_rng(1234 + comm.rank).standard_normal(n).astype(np.float32)
            out = np.empty_like(x)
            seed = 1

            def once():
                nonlocal seed
                out[:] = x  # the C++ benchmark reads x and writes out, out of place
                seed += 1
                mpi.barrier()
                t0 = mpi.wtime()
                comm.allreduce(out, codec, algorithm=algorithm, seed=seed)
                return mpi.slowest(mpi.wtime() - t0)

            once()
            first = once()
            reps = max(3, int(0.3 / max(first, 1e-6)))
            reps = int(mpi.slowest(reps))  # every rank runs as many
            rows[f"{spec}|{n}"] = statistics.median(once() for _ in range(reps))
    if comm.rank == 0:
        json.dump(rows, open(out_path, "w"))
    print("", end="", flush=True)


def python_allreduce(build, ranks, sizes):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(["timeout", "-k", "10", "900", "mpiexec.mpich", "-n", str(ranks),
                        sys.executable, os.path.abspath(__file__), "--worker", f.name,
                        "--build", build, "--sizes", ",".join(map(str, sizes))],
                       check=True, timeout=960)
        got = json.load(open(f.name))
    return {("allreduce", spec, int(n)): s for key, s in got.items()
            for spec, n in [key.split("|")]}


def cpp_allreduce(build, ranks, sizes):
    names = "|".join(f"{a}/{s}" for s, a in ALLREDUCE_ROWS).replace(".", r"\.")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(["timeout", "-k", "10", "900", "mpiexec.mpich", "-n", str(ranks),
                        os.path.join(build, "bin", "gcomp_bench_collectives"),
                        "--sizes=" + ",".join(map(str, sizes)), f"--benchmark_filter=^({names})/",
                        "--benchmark_out=" + f.name, "--benchmark_out_format=json"],
                       check=True, stdout=subprocess.DEVNULL, timeout=960)
        runs = json.load(open(f.name))["benchmarks"]
    rows = {}
    for r in runs:
        _, spec, n = r["name"].split("/")[:3]
        rows[("allreduce", spec, int(n))] = r["real_time"] * {"ms": 1e-3, "us": 1e-6, "ns": 1e-9}[r["time_unit"]]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="65536,1048576,16777216")
    ap.add_argument("--csv")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    sys.path.insert(0, os.path.join(a.build, "python"))
    if a.worker:
        return allreduce_worker(sizes, a.worker)

    cpp, py = {}, {}
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
        for k, v in cpp_codecs(a.build, sizes).items():
            cpp.setdefault(k, []).append(v)
        for k, v in python_codecs(a.build, sizes).items():
            py.setdefault(k, []).append(v)
        for k, v in cpp_allreduce(a.build, a.ranks, sizes).items():
            cpp.setdefault(k, []).append(v)
        for k, v in python_allreduce(a.build, a.ranks, sizes).items():
            py.setdefault(k, []).append(v)

    table = []
    for (op, spec, n), ts in py.items():
        if op.startswith("c_api"):
            continue
        call = op.split(" (")[0]  # "encode (new array)", "decode_add (torch CPU)": the same call
        base = cpp.get((call, spec, n))
        if not base:
            continue
        c, p = statistics.median(base), statistics.median(ts)
        capi = py.get(("c_api " + call, spec, n))
        capi = statistics.median(capi) if capi else None
        table.append((op, spec, n, c * 1e6, capi * 1e6 if capi else None, p * 1e6, p / c,
                      p / capi if capi else None, (p - c) * 1e6))
    print(f"\n{a.ranks}-rank allreduce and 1-thread codecs, medians of {a.rounds} rounds\n")
    print("| call | codec | n | C++ us | C API us | Python us | Python / C++ | Python / C API "
          "| difference us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for op, spec, n, c, capi, p, ratio, ratio_c, diff in table:
        capi_s = f"{capi:.1f}" if capi else "-"
        ratio_s = f"{ratio_c:.3f}" if ratio_c else "-"
        print(f"| {op} | {spec} | {n} | {c:.1f} | {capi_s} | {p:.1f} | {ratio:.3f} | {ratio_s} "
              f"| {diff:+.1f} |")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["call", "codec", "n", "cpp_us", "c_api_us", "python_us", "ratio",
                        "ratio_c_api", "difference_us"])
            w.writerows(table)


if __name__ == "__main__":
    main()
