#!/usr/bin/python3
"""A compressed allreduce over MPI ranks, with error feedback and the library's statistics.

    PYTHONPATH=build/python mpiexec.mpich -n 4 /usr/bin/python3 python_examples/allreduce.py

Each rank holds a gradient (the same large coordinates, its own noise); 10 steps of top-k 1% with
error feedback average them. The script prints, on rank 0, each step's bytes against a float32
ring allreduce and the error of the running mean of the results against the true mean; a plain
uncompressed allreduce of the same tensor is the reference. A torch CPU tensor works the same
way as the numpy array here.

The algorithm is auto's: in its first calls it tries each plausible one, then keeps the fastest.
Where a plain float32 allreduce is faster than any compressed one (on one machine's shared
memory it often is), auto sends x + residual uncompressed ("compressed" no): the result is then
exact and the residual becomes zero. Pass algorithm="sparse_allgather" (or another) to always
compress.
"""

import numpy as np

import gcomp


def main():
    comm = gcomp.Communicator()  # initializes MPI; finalized at exit
    n, steps = 1 << 20, 10
    rng = np.random.default_rng(comm.rank)
    signal = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    signal *= np.float32(10) * (np.random.default_rng(1).random(n) < 0.01)
    grad = signal + rng.standard_normal(n).astype(np.float32) * np.float32(0.1)

    exact = grad.copy()
    comm.allreduce(exact, "none", algorithm="dense", average=True)

    codec = gcomp.Codec("topk:ratio=0.01")
    ef = gcomp.ErrorFeedback(n)
    mean = np.zeros(n, np.float32)
    ring = 2 * (comm.size - 1) / comm.size * 4 * n  # bytes a float32 ring allreduce sends
    if comm.rank == 0:
        print(f"{comm.size} ranks, {n} floats, {codec.spec} with error feedback")
        print(f"{'step':>4} {'algorithm':>26} {'compressed':>10} {'bytes sent':>11} {'vs ring':>8} "
              f"{'error':>8}")
    for step in range(steps):
        x = grad.copy()
        comm.allreduce(x, codec, ef=ef, average=True, seed=step)
        mean += (x - mean) / np.float32(step + 1)
        s = comm.last_stats
        err = np.linalg.norm(mean - exact) / np.linalg.norm(exact)
        if comm.rank == 0:
            print(f"{step:>4} {s['algorithm']:>26} {'yes' if s['compressed'] else 'no':>10} "
                  f"{s['bytes_sent']:>11} "
                  f"{ring / s['bytes_sent']:>7.1f}x {err:>8.4f}")
    if comm.rank == 0:
        t = comm.total_stats
        print(f"\ntotal: {t['calls']} calls, {t['bytes_sent']} bytes sent, "
              f"encode {t['encode_seconds']:.3f} s, comm {t['comm_seconds']:.3f} s, "
              f"decode {t['decode_seconds']:.3f} s, algorithms {t['algorithm']}")


if __name__ == "__main__":
    main()
