#!/usr/bin/python3
"""What a job's first calls cost: auto's first --calls allreduces of one tensor, each call's
time (the slowest rank's), the algorithm it ran and whether it compressed, next to the steady
state (the median of the last quarter of the calls) and to what a fixed algorithm costs.

    mpiexec.mpich -n 4 /usr/bin/python3 bench/first_calls.py [--n 16777216] \\
        [--codec topk:ratio=0.01] [--calls 48] [--no-ef]

The 1 Gbit case, on the loopback shaped as scripts/bench-network does:
    tc qdisc replace dev lo root tbf rate 1gbit burst 256kb latency 50ms
    UCX_TLS=tcp,self UCX_NET_DEVICES=lo timeout 900 mpiexec.mpich -n 4 ... ; tc qdisc del dev lo root
Needs PYTHONPATH=build/python. Rank 0 prints a Markdown table and a summary line.
"""

import argparse
import statistics
import time

import numpy as np

import gcomp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--codec", default="topk:ratio=0.01")
    ap.add_argument("--calls", type=int, default=48)
    ap.add_argument("--no-ef", action="store_true", help="without error feedback")
    a = ap.parse_args()
    t_start = time.perf_counter()
    comm = gcomp.Communicator()
    t_network = time.perf_counter() - t_start
    rng = np.random.default_rng(comm.rank)
    # A new input every call, as the collective benchmark gives (a random input rotated by a
    # random offset: each element's value is new): gradients change from step to step, and a
    # repeating input would make error feedback's residual grow without pause.
    base = rng.standard_normal(a.n).astype(np.float32)
    ef = None if a.no_ef else gcomp.ErrorFeedback(a.n)
    slowest = np.zeros(1, np.float32)
    rows = []
    for i in range(a.calls):
        x = np.roll(base, int(rng.integers(a.n)))
        comm.allreduce(slowest, "none", algorithm="dense")  # lines the ranks up
        t0 = time.perf_counter()
        comm.allreduce(x, a.codec, ef=ef, seed=i)
        dt = np.array([time.perf_counter() - t0], np.float32)
        st = comm.last_stats
        # The slowest rank's time: every rank's in its own slot, summed.
        slots = np.zeros(comm.size, np.float32)
        slots[comm.rank] = dt[0]
        comm.allreduce(slots, "none", algorithm="dense")
        rows.append((i + 1, float(slots.max()), st["algorithm"], st["compressed"],
                     st["bytes_sent"]))
    if comm.rank == 0:
        print(f"auto's first {a.calls} calls: {a.codec}{'' if a.no_ef else ' + EF'}, {a.n} floats, "
              f"{comm.size} ranks (the Communicator's network measurement took "
              f"{t_network:.2f} s)\n")
        print("| call | seconds | algorithm | compressed | bytes sent (rank 0) |")
        print("|---:|---:|---|---|---:|")
        for call, sec, alg, comp, sent in rows:
            print(f"| {call} | {sec:.3f} | {alg} | {'yes' if comp else 'no'} | {sent} |")
        tail = [r[1] for r in rows[-max(1, a.calls // 4):]]
        steady = statistics.median(tail)
        first = sum(r[1] for r in rows)
        extra = first - steady * len(rows)
        print(f"\nsteady state (median of the last {len(tail)}): {steady:.3f} s; the {len(rows)} "
              f"calls took {first:.2f} s, {extra:.2f} s more than {len(rows)} steady calls; "
              f"first call {rows[0][1]:.3f} s ({rows[0][1] / steady:.1f}x)", flush=True)


if __name__ == "__main__":
    main()
