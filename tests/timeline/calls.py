"""A job's calls under GCOMP_TIMELINE (tests/timeline/timeline_test.sh): allreduces of several
codecs and algorithms (auto among them), a call of buckets, labelled calls and one that fails on
every rank (the ranks disagree on its codec). Rank 0 prints "calls N": the calls every rank made,
the failed one counted, which the timeline must hold one span each of."""

import numpy as np

import gcomp

comm = gcomp.Communicator()
rng = np.random.default_rng(comm.rank)
x = rng.standard_normal(50000).astype(np.float32)
made = 0
for codec, algorithm in [("none", "dense"), ("none", "auto"), ("fp16", "allgather"),
                         ("qsgd:bits=4", "compressed_reduce_scatter"),
                         ("topk:ratio=0.01", "sparse_allgather"),
                         ("topk:ratio=0.01", "sparse_recursive_doubling"),
                         ("topk:ratio=0.01", "auto"), ("sign", "allgather")]:
    ef = gcomp.ErrorFeedback(len(x))
    for step in range(3):
        comm.allreduce(x.copy(), codec, ef=ef, algorithm=algorithm, step=step, label=f"{codec} "
                       f"by {algorithm}, step {step}")
        made += 1
tensors = [rng.standard_normal(n).astype(np.float32) for n in (3000, 40000, 500, 20000)]
before = comm.total_stats["calls"]
comm.allreduce_buckets(tensors, "topk:ratio=0.05", bucket_bytes=100000, dense_below=1000)
made += comm.total_stats["calls"] - before
try:  # the ranks disagree: every rank fails the call, which the timeline shows as failed
    comm.allreduce(x.copy(), "none" if comm.rank == 0 else "fp16", algorithm="allgather")
except gcomp.Error as e:
    assert e.status == "mismatch", e.status
    made += 1
else:
    raise SystemExit("the mismatched call did not fail")
assert comm.total_stats["calls"] == made - 1, (comm.total_stats["calls"], made)
if comm.rank == 0:
    print(f"calls {made}", flush=True)
