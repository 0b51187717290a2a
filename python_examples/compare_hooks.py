#!/usr/bin/python3
"""DDP's own allreduce, torch's compression hooks and gcomp's hook, side by side: the same model,
data, seed, optimizer and global batch on 4 ranks, one run per row.

    PYTHONPATH=build/python /usr/bin/python3 python_examples/compare_hooks.py \\
        --model wide --network none --epochs 2 --out results/hooks

Rows (--rows, comma-separated; default all): ddp (DDP's default allreduce, gloo), torch_fp16
(fp16_compress_hook), powersgd1 and powersgd4 (powerSGD_hook, rank 1 and 4), gcomp_none,
gcomp_fp16, gcomp_topk1 (top-k 1% + error feedback), gcomp_topk01 (top-k 0.1% + error feedback),
gcomp_qsgd4, gcomp_sign (sign + error feedback), and gcomp_topk1_sync (top-k 1% with the
allreduce forced synchronous: what overlap buys); also gcomp_qsgd4_sync, gcomp_topk1_layers,
gcomp_topk1_layers_sync, gcomp_topk01_layers and gcomp_qsgd4_layers (per parameter instead of
per DDP bucket),
gcomp_sign_bucket (one sign scale per bucket), gcomp_topk1_auto (top-k 1% where auto may send a
tensor uncompressed), gcomp_topk1_by_hand, gcomp_topk01_by_hand (the hook registered by hand,
SGD keeping its momentum), and gcomp_topk1_mc, gcomp_topk01_mc (DGC's momentum correction asked
for by hand: the hook keeps the momentum, 0.9, and the optimizer is SGD without it). Every
top-k row but the _by_hand and _mc ones is registered with the one line a user writes,
gt.register(model, optimizer, codec, ...), which moves SGD's momentum into the hook as the _mc
rows do by hand; the table says which rows are which;
gcomp_powersgd1, gcomp_powersgd4, gcomp_powersgd4_fp16 (factors as binary16) and
gcomp_powersgd4_alt (alternating: one factor a step) are PowerSGD through gcomp's low_rank
algorithm on DDP's default buckets (torch's powersgd rows need one bucket, see Row), dense for
the first --powersgd-start steps as torch's; gcomp_powersgd4_auto lets auto send a bucket
uncompressed where that is faster. --network 1gbit shapes the loopback with
`tc qdisc replace dev lo root tbf rate 1gbit burst 256kb latency 50ms` (root; restored after)
and puts MPI on TCP (UCX_TLS=tcp,self); gloo is on TCP over loopback either way.
--cluster runs every row on the testbed of scripts/cluster instead (root): --ranks ranks,
--ranks-per-host of them on each host (default 1: --ranks hosts), each host's own link shaped to
--network in both directions, MPI and gloo over it; the testbed is brought up once for all rows
and taken down after. There each run also reads its hosts' link counters (every frame each
host's link carried, headers and all, every rank of the host together) after its first step
(which makes gcomp's Communicator and measures the network) and after its last, and the table
says what each host's link sent per step in between (the evaluations' barriers included).
Rows for several ranks a host: gcomp_topk1_two_level (top-k 1% on two_level: summed in the
host, compressed between hosts), gcomp_topk1_pinned (sparse_allgather: every rank's selection
over the network) and gcomp_topk1_srs (sparse_reduce_scatter, the flat global top-k), each the
one line; gcomp_topk1 leaves the algorithm to auto; gcomp_topk1_two_level_by_hand and
gcomp_topk1_pinned_by_hand register the first two by hand (SGD keeping its momentum). --seeds 0,1,2 runs every row once per seed
(a table each, and one across the seeds: each row's accuracies, their mean and range, and its
link bytes per step), for the run-to-run spread.
Periodic averaging (--period H, --period-from S; default 8 from 96): torch_post_local is torch's
post-local SGD (post_localSGD_hook with one subgroup per rank until S, then local steps, and
PostLocalSGDOptimizer with PeriodicModelAverager(period=H, warmup_steps=S)); the _period rows
are the one line with period=H, period_from=S: gcomp_none_period, gcomp_fp16_period,
gcomp_topk1_period (top-k 1% on sparse_allgather, every synchronized step and every average),
gcomp_sign_period; _reset and _avgmom rows set momentum_at_average to "reset" and "average"
(each rank's momentum zeroed, or averaged through the codec, at an average); _outer rows add an
outer Nesterov step (outer_lr=0.7, outer_momentum=0.5). Their evaluations are rank 0's model,
as every row's: between averages, that rank's own. Row nocomm is the compute
limit: a hook that returns the bucket as it is, without any communication (the ranks' models
drift apart, so its accuracy means nothing; its step time is what no communication costs).
--interleave runs the rows in one job instead of one job each, a step of each row in turn (each
row keeps its own model, optimizer, hook state and wall time), so that step times are compared
side by side: on a shared machine the drift between separate runs exceeds the differences.
Row nocomm_sync is nocomm plus a barrier at the end of backward: what a synchronous step costs
without any data, since every step then waits for the slowest rank's compute.
--launcher torchrun starts each run as PyTorch's launcher does, without mpiexec (with --cluster:
one torchrun agent per host, scripts/cluster run --launcher torchrun); gcomp's rows then run on
Gloo through torch's store instead of MPI. Its results are kept apart (_torchrun in their names).

--model vit trains the small vision transformer of fashion_mnist.py instead of an MLP.
--optimizer adamw trains every row with AdamW (--lr, --weight-decay); gcomp's rows then run
1-bit Adam through the one line, gt.register(model, optimizer, codec, warmup_steps=W) with W
from --warmup-steps (docs/python.md, "Adam and AdamW"), except gcomp_sign_gradients, which
compresses the gradients and leaves AdamW as it is (variance=None). Rows for it:
gcomp_sign_crs, gcomp_sign_layers_crs, gcomp_sign_bucket_crs (sign on
compressed_reduce_scatter: whole buckets, per parameter, whole with dense_below=0),
gcomp_topk1_pinned (sparse_allgather) and gcomp_qsgd8_crs. The table's "mean over the second
half" averages the evaluations after half the steps, and "fewer than a ring" divides what a
float32 ring allreduce sends over the run by the row's bytes.

Each run trains --epochs epochs (32 examples per rank per step, SGD lr 0.05 momentum 0.9) and
evaluates the test accuracy every --eval-every steps (on rank 0, not counted in the wall time). Written to
--out: compare_<model>_<network>.csv, .md (test accuracy at the end, bytes sent per rank, median
step time, wall time to --target accuracy) and .png (test accuracy against wall time, one line
per row), from every row's result in --out that was run with the same settings (rows run
in separate invocations share one table). gcomp's bytes are what it handed to MPI; torch's rows are the bytes a ring allreduce
of their tensors sends, 2 (P-1)/P of them (marked "model").
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# One BLAS thread a rank, as torch.set_num_threads(1) asks of torch's own threads: Debian's
# torch calls OpenBLAS, which starts a thread a core whatever torch is told; with several ranks
# a host those threads contend, and their count changes the last bits of the products (so a run
# under mpiexec would not repeat one under torchrun, which sets OMP_NUM_THREADS=1). Set before
# torch is imported (here and in every worker, which runs this file); a value given wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = ["nocomm", "nocomm_sync", "ddp", "torch_fp16", "powersgd1", "powersgd4", "gcomp_none", "gcomp_fp16",
        "gcomp_topk1", "gcomp_topk01", "gcomp_qsgd4", "gcomp_sign", "gcomp_topk1_sync",
        "gcomp_powersgd1", "gcomp_powersgd4", "gcomp_powersgd4_fp16", "gcomp_powersgd4_alt"]
# The codec rows apply their codec on every call (allow_uncompressed=False): auto would send a
# tensor uncompressed where that is faster (on unshaped loopback, often), and the row would then
# not show what its codec costs in accuracy. Each is gcomp's default otherwise: sign per
# parameter, the others on whole DDP buckets (per_parameter=None).
APPLIED = dict(allow_uncompressed=False)
# The top-k rows are the one line a user writes, gt.register(model, optimizer, codec, ...),
# which moves SGD's momentum into the hook (DGC's momentum correction); the _by_hand rows are
# the same codec with the hook registered by hand and the momentum left in the optimizer (the
# two lines of before: what register buys). The other rows register the hook by hand.
ONE_LINE = dict(form="register")


def chunk_row(ratio, bits, **periodic):
    """A periodic row of top-k per chunk of 4096 with B-bit codes on the algorithm that sends
    the fewest bytes, periodic's options (outer step, feedback_decay) given."""
    return dict(codec=f"topk:ratio={ratio},chunk=4096,bits={bits}", algorithm="fewest_bytes",
                periodic=periodic, **APPLIED, **ONE_LINE)


GCOMP_ROWS = {
    "gcomp_none": dict(codec="none"),
    "gcomp_fp16": dict(codec="fp16", **APPLIED),
    "gcomp_topk1": dict(codec="topk:ratio=0.01", **APPLIED, **ONE_LINE),
    "gcomp_topk01": dict(codec="topk:ratio=0.001", **APPLIED, **ONE_LINE),
    "gcomp_qsgd4": dict(codec="qsgd:bits=4", **APPLIED),
    "gcomp_sign": dict(codec="sign", **APPLIED),
    "gcomp_topk1_sync": dict(codec="topk:ratio=0.01", synchronous=True, **APPLIED, **ONE_LINE),
    "gcomp_qsgd4_sync": dict(codec="qsgd:bits=4", synchronous=True, **APPLIED),
    # Not in the default rows: the other choice of per_parameter, and auto unpinned.
    "gcomp_topk1_layers": dict(codec="topk:ratio=0.01", per_parameter=True, **APPLIED,
                               **ONE_LINE),
    "gcomp_topk1_layers_sync": dict(codec="topk:ratio=0.01", per_parameter=True,
                                    synchronous=True, **APPLIED, **ONE_LINE),
    "gcomp_topk01_layers": dict(codec="topk:ratio=0.001", per_parameter=True, **APPLIED,
                                **ONE_LINE),
    "gcomp_qsgd4_layers": dict(codec="qsgd:bits=4", per_parameter=True, **APPLIED),
    "gcomp_sign_bucket": dict(codec="sign", per_parameter=False, **APPLIED),
    # Sign on compressed_reduce_scatter (error feedback on both sides, as 1-bit Adam's): as
    # per_parameter's default has it (per parameter under SGD, whole buckets under 1-bit Adam),
    # per parameter, and whole buckets with the small tensors compressed too (dense_below=0).
    # Pinned algorithms: top-k 1% on sparse_allgather (auto, on a fast loopback, may choose the
    # dense algorithm, which sends the decoded float32 tensor); QSGD 8-bit on
    # compressed_reduce_scatter.
    "gcomp_topk1_pinned": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather", **APPLIED,
                               **ONE_LINE),
    # Several ranks a host (--ranks-per-host): two_level (each host's sum, compressed between
    # hosts) and the flat global top-k, against the pinned sparse_allgather above.
    "gcomp_topk1_two_level": dict(codec="topk:ratio=0.01", algorithm="two_level", **APPLIED,
                                  **ONE_LINE),
    "gcomp_topk1_srs": dict(codec="topk:ratio=0.01", algorithm="sparse_reduce_scatter",
                            **APPLIED, **ONE_LINE),
    # The same two registered by hand (SGD keeping its momentum: no momentum correction, so no
    # velocity masked by the residual's zeros).
    "gcomp_topk1_two_level_by_hand": dict(codec="topk:ratio=0.01", algorithm="two_level",
                                          **APPLIED),
    "gcomp_topk1_pinned_by_hand": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather",
                                       **APPLIED),
    "gcomp_qsgd8_crs": dict(codec="qsgd:bits=8", algorithm="compressed_reduce_scatter",
                            **APPLIED),
    "gcomp_sign_crs": dict(codec="sign", algorithm="compressed_reduce_scatter", **APPLIED),
    "gcomp_sign_layers_crs": dict(codec="sign", per_parameter=True,
                                  algorithm="compressed_reduce_scatter", **APPLIED),
    # With AdamW: its gradients compressed and the optimizer left as it is (variance=None), what
    # the one line did before 1-bit Adam.
    "gcomp_sign_gradients": dict(codec="sign", variance=None, **APPLIED),
    "gcomp_sign_bucket_crs": dict(codec="sign", per_parameter=False, dense_below=0,
                                  algorithm="compressed_reduce_scatter", **APPLIED),
    # With AdamW, 0/1 Adam's schedule (--zero-one) in place of the dense warm-up: the variance
    # refreshed at doubling intervals, then local steps; _refresh without the local steps.
    "gcomp_sign_zero_one": dict(codec="sign", algorithm="compressed_reduce_scatter",
                                schedule="zero_one", **APPLIED),
    "gcomp_sign_zero_one_refresh": dict(codec="sign", algorithm="compressed_reduce_scatter",
                                        schedule="zero_one_refresh", **APPLIED),
    "gcomp_topk1_zero_one": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather",
                                 schedule="zero_one", **APPLIED),
    "gcomp_topk1_zero_one_refresh": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather",
                                         schedule="zero_one_refresh", **APPLIED),
    "gcomp_topk1_auto": dict(codec="topk:ratio=0.01", **ONE_LINE),
    # The hook registered by hand, SGD keeping its momentum: what the one line replaces.
    "gcomp_topk1_by_hand": dict(codec="topk:ratio=0.01", **APPLIED),
    "gcomp_topk01_by_hand": dict(codec="topk:ratio=0.001", **APPLIED),
    # DGC's momentum correction asked for by hand (momentum=0.9 in the state, SGD without it):
    # what register does for the top-k rows, spelled out.
    "gcomp_topk1_mc": dict(codec="topk:ratio=0.01", momentum=0.9, **APPLIED),
    "gcomp_topk01_mc": dict(codec="topk:ratio=0.001", momentum=0.9, **APPLIED),
    # PowerSGD through gcomp (the low_rank algorithm) on DDP's default buckets: warm start, error
    # feedback, dense for the first --powersgd-start steps as torch's rows (",start=N" is added).
    "gcomp_powersgd1": dict(codec="powersgd:rank=1", **APPLIED),
    "gcomp_powersgd4": dict(codec="powersgd:rank=4", **APPLIED),
    "gcomp_powersgd4_fp16": dict(codec="powersgd:rank=4,values=fp16", **APPLIED),
    "gcomp_powersgd4_alt": dict(codec="powersgd:rank=4,alternate=true", **APPLIED),
    # Auto may send a bucket uncompressed where that is faster (the row's algorithm counts say).
    "gcomp_powersgd4_auto": dict(codec="powersgd:rank=4"),
    # Periodic model averaging (--period H from --period-from S), the one line with period=H:
    # every step synchronized until S, then local steps and an average every H (the change
    # since the last through the codec, with error feedback). Beside torch's post-local SGD
    # (row torch_post_local, the same H and S).
    "gcomp_none_period": dict(codec="none", periodic={}, **ONE_LINE),
    "gcomp_fp16_period": dict(codec="fp16", periodic={}, **APPLIED, **ONE_LINE),
    "gcomp_topk1_period": dict(codec="topk:ratio=0.01", periodic={}, algorithm="sparse_allgather",
                               **APPLIED, **ONE_LINE),
    "gcomp_sign_period": dict(codec="sign", periodic={}, **APPLIED, **ONE_LINE),
    # What happens to the optimizer's momentum at an average (momentum_at_average), and an
    # outer Nesterov step on the averaged change (DiLoCo's: outer_lr, outer_momentum).
    "gcomp_none_period_reset": dict(codec="none", periodic=dict(momentum_at_average="reset"),
                                    **ONE_LINE),
    "gcomp_none_period_avgmom": dict(codec="none",
                                     periodic=dict(momentum_at_average="average"), **ONE_LINE),
    "gcomp_none_period_outer": dict(codec="none",
                                    periodic=dict(outer_lr=0.7, outer_momentum=0.5), **ONE_LINE),
    "gcomp_topk1_period_outer": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather",
                                     periodic=dict(outer_lr=0.7, outer_momentum=0.5),
                                     **APPLIED, **ONE_LINE),
    "gcomp_topk1_period_avgmom": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather",
                                      periodic=dict(momentum_at_average="average"), **APPLIED,
                                      **ONE_LINE),
    "gcomp_sign_period_avgmom": dict(codec="sign", periodic=dict(momentum_at_average="average"),
                                     **APPLIED, **ONE_LINE),
    "gcomp_topk10_period_avgmom": dict(codec="topk:ratio=0.1", algorithm="sparse_allgather",
                                       periodic=dict(momentum_at_average="average"), **APPLIED,
                                       **ONE_LINE),
    "gcomp_topk10_period_avgmom_outer": dict(
        codec="topk:ratio=0.1", algorithm="sparse_allgather", periodic=dict(
            momentum_at_average="average", outer_lr=0.7, outer_momentum=0.5), **APPLIED,
        **ONE_LINE),
    "gcomp_none_period_avgmom_outer": dict(codec="none", periodic=dict(
        momentum_at_average="average", outer_lr=0.7, outer_momentum=0.5), **ONE_LINE),
    "gcomp_topk1_period_avgmom_outer": dict(
        codec="topk:ratio=0.01", algorithm="sparse_allgather", periodic=dict(
            momentum_at_average="average", outer_lr=0.7, outer_momentum=0.5), **APPLIED,
        **ONE_LINE),
    "gcomp_sign_period_avgmom_outer": dict(codec="sign", periodic=dict(
        momentum_at_average="average", outer_lr=0.7, outer_momentum=0.5), **APPLIED, **ONE_LINE),
    "gcomp_fp16_period_outer": dict(codec="fp16", periodic=dict(outer_lr=0.7, outer_momentum=0.5),
                                    **APPLIED, **ONE_LINE),
    # Language models over slow links (--model gpt, AdamW local steps): DiLoCo's outer Nesterov
    # step (outer_lr 0.7, outer_momentum 0.9) uncompressed and with plain top-k 1% on the changes;
    # SparseLoCo's top-k per chunk of 4096 with 2-bit values and error feedback decayed in place
    # of the outer momentum, on the algorithm that sends the fewest bytes (sparse_allgather at 3
    # ranks: no second compression).
    "gcomp_none_period_diloco": dict(codec="none", periodic=dict(outer_lr=0.7,
                                                                 outer_momentum=0.9), **ONE_LINE),
    "gcomp_topk1_period_diloco": dict(codec="topk:ratio=0.01", algorithm="sparse_allgather",
                                      periodic=dict(outer_lr=0.7, outer_momentum=0.9), **APPLIED,
                                      **ONE_LINE),
    "gcomp_chunk1b2_period": chunk_row(0.01, 2),
    "gcomp_chunk1b2_period_decay": chunk_row(0.01, 2, feedback_decay=0.95),
    # The same codec keeping 3% and 10% of each chunk; and with an outer Nesterov step (0.7, 0.5),
    # which on the GPT helps the compressed changes more than the uncompressed ones.
    "gcomp_chunk3b2_period": chunk_row(0.03, 2),
    "gcomp_chunk10b2_period": chunk_row(0.1, 2),
    "gcomp_chunk1b2_period_outer": chunk_row(0.01, 2, outer_lr=0.7, outer_momentum=0.5),
    "gcomp_chunk3b2_period_outer": chunk_row(0.03, 2, outer_lr=0.7, outer_momentum=0.5),
    "gcomp_chunk10b2_period_outer": chunk_row(0.1, 2, outer_lr=0.7, outer_momentum=0.5),
    # The outer step at full length (outer_lr 1.0, outer_momentum 0.5): on the GPT at period 8
    # the best of the momenta tried with outer_lr 1.0 and top-k per chunk; 2% and 6% of
    # each chunk besides 1% and 10% (docs/results.md gives each one's bytes), and 2% with 1-bit
    # codes (each chunk's kept values as their sign and mean magnitude).
    "gcomp_chunk1b2_period_outer1": chunk_row(0.01, 2, outer_lr=1.0, outer_momentum=0.5),
    "gcomp_chunk2b2_period_outer1": chunk_row(0.02, 2, outer_lr=1.0, outer_momentum=0.5),
    "gcomp_chunk2b1_period_outer1": chunk_row(0.02, 1, outer_lr=1.0, outer_momentum=0.5),
    "gcomp_chunk6b2_period_outer1": chunk_row(0.06, 2, outer_lr=1.0, outer_momentum=0.5),
    "gcomp_chunk10b2_period_outer1": chunk_row(0.1, 2, outer_lr=1.0, outer_momentum=0.5),
    # A longer outer step with less momentum: outer_lr / (1 - outer_momentum) times a change
    # that repeats, 2.25 here against (1.0, 0.5)'s 2, with a shorter memory; the best of the
    # outer steps tried at 6% (docs/results.md).
    "gcomp_chunk6b2_period_outer18": chunk_row(0.06, 2, outer_lr=1.8, outer_momentum=0.2),
    "gcomp_chunk2b1_period_outer18": chunk_row(0.02, 1, outer_lr=1.8, outer_momentum=0.2),
}
KNOWN = ROWS + [r for r in GCOMP_ROWS if r not in ROWS] + ["torch_post_local"]


# ---- one run (every rank) ----

def link_counters():
    """On the testbed (scripts/cluster run sets GCOMP_CLUSTER): this rank's network namespace
    (its host) and the bytes its host's link has sent and received so far; None elsewhere."""
    if not os.environ.get("GCOMP_CLUSTER"):
        return None
    stats = "/sys/class/net/eth0/statistics/"
    return (os.stat("/proc/self/ns/net").st_ino, int(open(stats + "tx_bytes").read()),
            int(open(stats + "rx_bytes").read()))


def link_per_step(before, after, steps):
    """Each host's link bytes per step between two readings of every rank's link_counters()
    (lists by rank), a host's read by its lowest rank; hosts in the order of their lowest rank."""
    hosts = {}
    for b, e in zip(before, after):
        hosts.setdefault(b[0], (e[1] - b[1], e[2] - b[2]))
    return {"steps": steps, "tx_per_step": [tx / steps for tx, _ in hosts.values()],
            "rx_per_step": [rx / steps for _, rx in hosts.values()]}


class Row:
    """One row's model, optimizer, hook state and measurements, in one worker process."""

    def __init__(self, a, name, torch, dist, DDP, default_hooks, powerSGD_hook, post_localSGD_hook,
                 gt, make_model, gpt_adamw=None):
        self.name = name
        if name.startswith("powersgd"):
            # torch 1.13's powerSGD_hook issues each bucket's P and Q allreduces from future
            # callbacks (gloo's thread) while backward issues the next bucket's from its own:
            # the ranks' orders can differ, and gloo then pairs different allreduces (an abort
            # on "op.preamble.length <= op.nbytes", or wrong sums when the sizes match). One
            # bucket (the first one included, whose 1 MiB default is this documented knob) has
            # no race.
            first = dist._DEFAULT_FIRST_BUCKET_BYTES
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
            self.model = DDP(make_model(a), bucket_cap_mb=1024)
            dist._DEFAULT_FIRST_BUCKET_BYTES = first
        else:
            self.model = DDP(make_model(a))
        self.state, self.form = None, None
        if name in ("nocomm", "nocomm_sync"):
            def no_communication(_, bucket):
                if name == "nocomm_sync" and bucket.is_last():
                    dist.barrier()  # the step waits for the slowest rank, and sends nothing
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
                return fut
            self.model.register_comm_hook(None, no_communication)
        elif name == "torch_fp16":
            self.model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name == "torch_post_local":
            # torch's post-local SGD: its hook allreduces every step until start_localSGD_iter,
            # then reduces over the subgroup (one group per rank: local steps; torch's subgroup
            # helpers ask for CUDA), and PeriodicModelAverager averages the parameters every
            # period from warmup_steps on.
            groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
            self.state = post_localSGD_hook.PostLocalSGDState(
                process_group=None, subgroup=groups[dist.get_rank()],
                start_localSGD_iter=a.period_from)
            self.model.register_comm_hook(self.state, post_localSGD_hook.post_localSGD_hook)
        elif name.startswith("powersgd"):
            self.state = powerSGD_hook.PowerSGDState(process_group=None,
                                                     matrix_approximation_rank=int(name[8:]),
                                                     start_powerSGD_iter=a.powersgd_start)
            self.model.register_comm_hook(self.state, powerSGD_hook.powerSGD_hook)
        # Momentum 0.9 in the optimizer, or in the hook for the momentum-correction rows (by
        # hand: momentum= given to the state; or moved there by register).
        in_hook = name in GCOMP_ROWS and GCOMP_ROWS[name].get("momentum", 0) > 0
        if a.model == "gpt":
            if in_hook:
                raise SystemExit(f"row {name} is SGD's momentum correction: not with AdamW")
            # gpt_text's AdamW: betas (0.9, 0.95), weight decay on the matrices only.
            self.opt = gpt_adamw(self.model.module, a.lr, a.weight_decay)
        elif a.optimizer == "adamw":
            if in_hook:
                raise SystemExit(f"row {name} is SGD's momentum correction: not with AdamW")
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=a.lr,
                                         weight_decay=a.weight_decay)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), lr=a.lr,
                                       momentum=0.0 if in_hook else 0.9)
        if name == "torch_post_local":
            from torch.distributed.algorithms.model_averaging import averagers
            from torch.distributed.optim import PostLocalSGDOptimizer
            self.averager = averagers.PeriodicModelAverager(period=a.period,
                                                            warmup_steps=a.period_from)
            self.opt = PostLocalSGDOptimizer(optim=self.opt, averager=self.averager)
        if name in GCOMP_ROWS:
            kw = dict(GCOMP_ROWS[name])
            self.form = kw.pop("form", "hook")
            schedule = kw.pop("schedule", None)
            periodic = kw.pop("periodic", None)
            if periodic is not None:
                kw.update(period=a.period, period_from=a.period_from, **periodic)
            if a.optimizer == "adamw" and periodic is not None:
                # Local AdamW steps between the averages (DiLoCo's inner optimizer): the
                # optimizer as it is, its gradients synchronized through the codec before
                # period_from.
                self.form = "register"
                kw["variance"] = None
            elif a.optimizer == "adamw":
                # 1-bit Adam: the one line with the optimizer, its warm-up exact; or 0/1 Adam's
                # schedule.
                self.form = "register"
                if schedule is None:
                    kw["warmup_steps"] = a.warmup_steps
                else:
                    import gcomp
                    freeze, kappa, local, double = a.zero_one
                    kw["variance"] = gcomp.AdamSchedule.zero_one(
                        freeze, kappa=kappa, local_double_every=double,
                        max_local_steps=1 if schedule == "zero_one_refresh" else local)
            elif "variance" in kw or schedule is not None:
                raise SystemExit(f"row {name} is AdamW's (--optimizer adamw)")
            if kw["codec"].startswith("powersgd"):
                kw["codec"] += f",start={a.powersgd_start}"
            if self.form == "register":
                self.state = gt.register(self.model, self.opt, kw.pop("codec"), **kw,
                                         seed=a.seed)  # the one line
            else:
                self.state = gt.CompressionState(**kw, seed=a.seed)
                self.model.register_comm_hook(self.state, gt.compression_hook)
        self.wall, self.steps, self.step_times, self.evals = 0.0, 0, [], []
        self.periodic = name == "torch_post_local" or "periodic" in GCOMP_ROWS.get(name, {})
        self.avg_evals = []  # periodic rows: (step, accuracy of the ranks' average model)
        self.eval_bytes = []  # the bytes this rank had sent at each evaluation (gcomp's rows)
        self.eval_link = (0, 0)  # the link bytes (sent, received) of those evaluations
        self.phases = []  # (forward, backward, optimizer) seconds of each step
        self.failed = None
        self.link_from, self.link = None, None  # every rank's link_counters() after step 1


def worker(a):
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import (default_hooks, post_localSGD_hook,
                                                             powerSGD_hook)
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, HERE)
    import gcomp.torch as gt
    from fashion_mnist import accuracy, load, mlp, shard, vit
    import gpt_text

    rank, size = gt.init_process_group()
    torch.set_num_threads(1)
    lm = a.model == "gpt"
    if lm:  # the byte-level GPT on Debian's fortunes: validation loss, nats per byte
        train_text, valid_text = gpt_text.load_text()
    else:
        train_x, train_y, test_x, test_y = load()
    # One row, or (--interleave) several, each step of each row in turn: the machine's drift
    # then falls on every row alike.
    def model_of(a):
        if lm:
            return gpt_text.gpt(seed=a.seed)
        return vit(seed=a.seed) if a.model == "vit" else mlp(a.model == "wide", seed=a.seed)

    def metric(model):
        """Test accuracy, or (the GPT) the validation loss in nats per byte."""
        if lm:
            return gpt_text.validation_loss(model, valid_text)
        return accuracy(model, test_x, test_y)

    rows = [Row(a, name, torch, dist, DDP, default_hooks, powerSGD_hook, post_localSGD_hook, gt,
                model_of, gpt_text.adamw)
            for name in a.worker.split(",")]
    results = a.result.split(",")
    # The hosts' links are counted where a job runs one row (interleaved rows share the links).
    counting = len(rows) == 1 and link_counters() is not None

    def read_links():
        dist.barrier()  # every rank past its step's communication
        every = [None] * size
        dist.all_gather_object(every, link_counters())
        return every

    def all_eval_links(r):
        every = [None] * size
        dist.all_gather_object(every, r.eval_link)
        return every

    def evaluate(r):
        # Rank 0 only (the parameters are the same on every rank); the others wait, untimed.
        # The GPT: the ranks' average model for every row (the same as rank 0's where the
        # ranks are synchronized), below.
        if rank == 0 and not lm:
            r.evals.append((r.steps, r.wall, accuracy(r.model.module, test_x, test_y)))
        if r.state is not None and hasattr(r.state, "stats"):
            r.eval_bytes.append(r.state.stats()["bytes_sent"])
        if r.periodic or lm:
            # Periodic rows: between averages the ranks' models differ; the ranks' average (what
            # average_parameters() would make) evaluated too, on a copy, through torch's
            # allreduce: neither counted nor changing the training.
            params = list(r.model.module.parameters())
            flat = torch.cat([q.detach().reshape(-1) for q in params])
            if counting:  # this evaluation's traffic is not the row's: counted apart
                dist.barrier()
                before = link_counters()
            dist.all_reduce(flat)
            if counting:
                dist.barrier()
                after = link_counters()
                r.eval_link = (r.eval_link[0] + after[1] - before[1],
                               r.eval_link[1] + after[2] - before[2])
            flat /= size
            if rank == 0:
                saved = [q.detach().clone() for q in params]
                with torch.no_grad():
                    torch.nn.utils.vector_to_parameters(flat, params)
                    value = metric(r.model.module)
                    r.avg_evals.append((r.steps, value))
                    if lm:
                        r.evals.append((r.steps, r.wall, value))
                    for q, v in zip(params, saved):
                        q.copy_(v)
        dist.barrier()

    def one_step(r, idx):
        t0 = time.perf_counter()
        r.opt.zero_grad()
        if lm:  # idx is the step: every row the same windows, a linear warm-up and a cosine
            for g in r.opt.param_groups:
                g["lr"] = gpt_text.learning_rate(idx, a.max_steps, a.lr, a.lr_warmup)
            x, y = gpt_text.batch(train_text, idx, rank, size, a.batch, seed=a.seed)
            loss = gpt_text.loss_of(r.model, x, y)
        else:
            loss = torch.nn.functional.cross_entropy(r.model(train_x[idx]), train_y[idx])
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        r.opt.step()
        dt = time.perf_counter() - t0
        r.phases.append((t1 - t0, t2 - t1, t0 + dt - t2))
        r.wall += dt
        r.step_times.append(dt)
        r.steps += 1
        if counting and r.steps == 1:
            # From the end of the first step: it made gcomp's Communicator (and measured the
            # network), which a long run does once.
            r.link_from = read_links()
        if r.steps % a.eval_every == 0:
            evaluate(r)

    def order(epoch):
        """The steps of an epoch: the GPT's are its step numbers (one epoch of --max-steps)."""
        if lm:
            return range(a.max_steps) if epoch == 0 else []
        return shard(len(train_x), epoch, rank, size, a.batch, seed=a.seed)

    done, taken = False, 0
    for epoch in range(a.epochs):
        for idx in order(epoch):
            taken += 1
            for r in rows:
                if r.failed:
                    continue
                try:
                    one_step(r, idx)
                except RuntimeError as e:
                    # A diverged run: gcomp's hook raises on every rank on a non-finite
                    # gradient. The row stops; the others go on.
                    r.failed = f"stopped at step {r.steps + 1}: {e}"
            if taken == a.max_steps or all(r.failed for r in rows):
                done = True
                break
        if done:
            break
    for r, result in zip(rows, results):
        if r.failed:
            if rank == 0:
                json.dump({"row": r.name, "config": config(a), "evals": r.evals,
                           "failed": r.failed}, open(result, "w"))
            continue
        if r.steps % a.eval_every != 0:  # the same test on every rank: each joins the barrier
            evaluate(r)
        if r.link_from is not None and r.steps > 1:
            # Less what this rank's link carried in the evaluations of the ranks' average.
            ended = [(ns, tx - etx, rx - erx) for (ns, tx, rx), (etx, erx) in
                     zip(read_links(), all_eval_links(r))]
            r.link = link_per_step(r.link_from, ended, r.steps - 1)
        record(a, r, result, rank, size)
    dist.barrier()


def record(a, r, result, rank, size):
    """Writes row r's result (rank 0)."""
    n = sum(p.numel() for p in r.model.parameters())
    if r.name in GCOMP_ROWS:
        st = r.state.stats()
        sent, how = st["bytes_sent"], "measured"
        extra = {"compressed": st["compressed"], "calls": st["calls"], "algorithm": st["algorithm"],
                 "transport": sys.modules["gcomp.torch"].communicator().transport,
                 "form": r.form, "moved": dict(getattr(r.state, "moved", {}) or {}),
                 # The hook's whole-step check (low-rank under auto): how many steps it sent
                 # uncompressed, in how many checks and switches.
                 "step_check": {k: st[k] for k in ("step_checks", "step_switches", "step_aborts",
                                                   "uncompressed_steps") if k in st},
                 "step_check_history": r.state._check.history if getattr(
                     r.state, "_check", None) else [],
                 # Means per step of where the communication's time went (state.stats()).
                 "split": {k[:-len("_seconds")]: st[k] / max(1, st["steps"]) for k in st
                           if k.endswith("_seconds")},
                 # Periodic averaging: local steps, averages and what each sent.
                 "periodic": {k: st[k] for k in ("local_steps", "averages", "average_bytes_sent",
                                                 "bytes_per_average") if k in st}}
    else:
        ring = 2 * (size - 1) / size

        def sent_by(steps):
            """What the row's ring allreduces send per rank over its first `steps` steps."""
            steps_sent = steps
            if r.name == "torch_post_local":
                # DDP's allreduce until --period-from, then the averager's allreduce of the
                # parameters at its steps S, S + H, ... (counted from 0).
                averages = (steps - 1 - a.period_from) // a.period + 1 \
                    if steps > a.period_from else 0
                per_step, steps_sent = 4 * n, min(steps, a.period_from) + averages
            elif r.name in ("nocomm", "nocomm_sync"):
                per_step = 0
            elif r.name == "ddp":
                per_step = 4 * n
            elif r.name == "torch_fp16":
                per_step = 2 * n
            else:
                k = int(r.name[8:])
                per_step = sum(4 * (p.shape[0] + p[0].numel()) * k if p.dim() > 1
                               else 4 * p.numel() for p in r.model.parameters())
            dense = min(steps, a.powersgd_start) if r.name.startswith("powersgd") else 0
            # torch's PowerSGD rows: their first --powersgd-start steps are DDP's dense allreduce.
            return int(ring * (per_step * (steps_sent - dense) + 4 * n * dense))

        sent = sent_by(r.steps)
        r.eval_bytes = [sent_by(steps) for steps, _, _ in r.evals]
        how, extra = "model", {}
        if r.name == "torch_post_local":
            averages = (r.steps - 1 - a.period_from) // a.period + 1 \
                if r.steps > a.period_from else 0
            extra["periodic"] = {"averages": averages, "bytes_per_average": ring * 4 * n}
    if rank == 0:
        json.dump({"row": r.name, "config": config(a), "steps": r.steps, "evals": r.evals,
                   "bytes_sent": sent,
                   "bytes_how": how, "step_median": statistics.median(r.step_times),
                   "phase_medians": [statistics.median(p[i] for p in r.phases) for i in range(3)],
                   "final_accuracy": r.evals[-1][2], "parameters": n, "ranks": size,
                   "interleaved": a.worker if "," in a.worker else None, "link": r.link,
                   "avg_evals": r.avg_evals, "eval_bytes": r.eval_bytes,
                   # The GPT's evaluations are validation losses (lower is better).
                   "metric": "loss" if a.model == "gpt" else "accuracy",
                   **extra},
                  open(result, "w"))


# ---- the driver ----

def config(a):
    """The settings that make two rows' results comparable."""
    keys = ["model", "network", "epochs", "eval_every", "max_steps", "batch", "lr", "seed", "ranks",
            "powersgd_start", "cluster", "interleave", "launcher", "optimizer", "ranks_per_host",
            "period", "period_from"]
    if a.optimizer == "adamw":
        keys += ["weight_decay", "warmup_steps", "zero_one"]
    if a.model == "gpt":
        keys += ["lr_warmup"]
    return {k: getattr(a, k) for k in keys}


def shaped(rate):
    if rate == "none":
        return False
    subprocess.run(["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate,
                    "burst", "256kb", "latency", "50ms"], check=True)
    return True


CLUSTER = os.path.join(HERE, "..", "scripts", "cluster")


def run_row(a, row, result):
    """Runs one row, or (row and result comma-separated lists) rows interleaved in one job;
    returns the results, one per row."""
    if a.cluster:
        # scripts/cluster run sets MPI's, gloo's and the rendezvous' addresses for each host.
        env = dict(os.environ, MASTER_PORT=str(a.port))
        launch = [CLUSTER, "run", "--timeout", str(a.timeout), "--launcher", a.launcher, "--"]
    elif a.launcher == "torchrun":
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        logs = os.path.join(a.out, "torchrun-logs")
        os.makedirs(logs, exist_ok=True)
        # Debian's torch 1.13 fails at start with torchrun's default --redirects 0 --tee 0.
        launch = ["timeout", "-k", "10", str(a.timeout), sys.executable, "-m",
                  "torch.distributed.run", "--nproc_per_node", str(a.ranks), "--master_port",
                  str(a.port), "--redirects", "1", "--tee", "1", "--log_dir", logs, "--no_python"]
    else:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port),
                   GLOO_SOCKET_IFNAME="lo", UCX_TLS="tcp,self", UCX_NET_DEVICES="lo")
        if a.network == "none":
            for k in ("UCX_TLS", "UCX_NET_DEVICES"):
                env.pop(k)
        launch = ["timeout", "-k", "10", str(a.timeout), "mpiexec.mpich", "-n", str(a.ranks)]
    cmd = launch + [
           sys.executable, os.path.abspath(__file__), "--worker", row, "--result", result,
           "--model", a.model, "--epochs", str(a.epochs), "--eval-every", str(a.eval_every),
           "--batch", str(a.batch), "--lr", str(a.lr), "--seed", str(a.seed),
           "--max-steps", str(a.max_steps), "--network", a.network, "--ranks", str(a.ranks),
           "--ranks-per-host", str(a.ranks_per_host),
           "--powersgd-start", str(a.powersgd_start), "--launcher", a.launcher,
           "--optimizer", a.optimizer, "--weight-decay", str(a.weight_decay),
           "--warmup-steps", str(a.warmup_steps), "--period", str(a.period),
           "--lr-warmup", str(a.lr_warmup),
           "--period-from", str(a.period_from),
           "--zero-one", ",".join(str(x) for x in a.zero_one)] + (
           ["--cluster"] if a.cluster else []) + (
           ["--interleave"] if a.interleave else [])
    paths = result.split(",")
    for path in paths:
        if os.path.exists(path):
            os.remove(path)
    log = paths[0][:-len(".json")] + ".log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        # MPICH over UCX/TCP can hang in MPI_Finalize after large allreduces: once rank 0 has
        # written the results, the run gets a minute to exit before it is stopped.
        written = None
        while proc.poll() is None:
            time.sleep(1)
            if all(os.path.exists(path) for path in paths) and written is None:
                written = time.monotonic()
            if written is not None and time.monotonic() - written > 60:
                proc.terminate()
                proc.wait()
    got = []
    for name, path in zip(row.split(","), paths):
        if os.path.exists(path):
            got.append(json.load(open(path)))
        else:
            tail = open(log).read().strip().splitlines()[-3:]
            got.append({"row": name, "failed": f"exit {proc.returncode}: " + " | ".join(tail)})
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["wide", "mlp", "vit", "gpt"], default="wide",
                    help="gpt: the byte-level GPT of gpt_text.py with AdamW, --max-steps steps "
                         "(default 1200), --batch sequences a rank (default 16), the validation "
                         "loss of the ranks' average model")
    ap.add_argument("--lr-warmup", type=int, default=60,
                    help="gpt: steps of linear learning-rate warm-up before the cosine")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="sgd (momentum 0.9) or adamw (gcomp's rows: 1-bit Adam, the one line)")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="gcomp's rows with AdamW: exact steps before the variance is frozen")
    ap.add_argument("--zero-one", default="90,4,4,32",
                    type=lambda x: [int(v) for v in x.split(",")],
                    help="the _zero_one rows' schedule: FREEZE,KAPPA,H,DOUBLE, "
                         "gcomp.AdamSchedule.zero_one(FREEZE, kappa=KAPPA, max_local_steps=H, "
                         "local_double_every=DOUBLE)")
    ap.add_argument("--period", type=int, default=8,
                    help="the periodic rows (_period, torch_post_local): average every H steps")
    ap.add_argument("--period-from", type=int, default=96,
                    help="the periodic rows: every step synchronized before this one")
    ap.add_argument("--network", default="none", help="none, or a tc rate such as 1gbit")
    ap.add_argument("--cluster", action="store_true",
                    help="run on scripts/cluster's testbed: --ranks ranks, --ranks-per-host a "
                         "host, each host's link --network")
    ap.add_argument("--ranks-per-host", type=int, default=1,
                    help="with --cluster: ranks on each host (it must divide --ranks)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--interleave", action="store_true",
                    help="run the rows in one job, a step of each in turn (step times side by "
                         "side: the machine's drift falls on every row alike)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: no limit)")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=lambda x: [int(v) for v in x.split(",")],
                    help="run every row once per seed (comma-separated; instead of --seed): a "
                         "table each, and one across them (_seeds.md)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--powersgd-start", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    ap.add_argument("--launcher", choices=["mpiexec", "torchrun"], default="mpiexec",
                    help="how each run starts: mpiexec (gcomp on MPI) or torchrun (on Gloo)")
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--out", default="results/hooks")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: write the table and plot from the results in --out")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.model == "gpt":  # its defaults where not given: AdamW, 1,200 steps, 16 sequences
        given = set(sys.argv)
        a.optimizer = "adamw"
        if "--max-steps" not in given:
            a.max_steps = 1200
        if "--batch" not in given:
            a.batch = 16
        if "--lr" not in given:
            a.lr = 2e-3
        if "--weight-decay" not in given:
            a.weight_decay = 0.1
        if "--epochs" not in given:
            a.epochs = 1
        if "--eval-every" not in given:
            a.eval_every = 100
        if "--target" not in given:
            a.target = 2.1
    if a.worker:
        return worker(a)

    if a.ranks_per_host < 1 or a.ranks % a.ranks_per_host:
        raise SystemExit(f"--ranks-per-host {a.ranks_per_host} does not divide --ranks {a.ranks}")
    if a.ranks_per_host > 1 and not a.cluster:
        raise SystemExit("--ranks-per-host needs --cluster (the testbed's hosts)")
    hosts = a.ranks // a.ranks_per_host
    os.makedirs(a.out, exist_ok=True)
    where = a.network
    if a.cluster:
        where = (f"cluster{hosts}x{a.ranks_per_host}_{a.network}" if a.ranks_per_host > 1
                 else f"cluster{a.ranks}_{a.network}")
    if a.launcher == "torchrun":
        where += "_torchrun"
    if a.optimizer != "sgd" and a.model != "gpt":  # the GPT's is always AdamW
        where += f"_{a.optimizer}"
    base = os.path.join(a.out, f"compare_{a.model}_{where}")
    todo = [] if a.report else a.rows.split(",")
    for row in todo:
        if row not in KNOWN:
            raise SystemExit(f"unknown row {row} (known: {', '.join(KNOWN)})")
    if a.cluster and not a.report:
        subprocess.run([CLUSTER, "up", "--hosts", str(hosts), "--rate", a.network,
                        "--ranks-per-host", str(a.ranks_per_host)], check=True)
        was_shaped = False
    else:
        was_shaped = not a.report and shaped(a.network)
    by_seed = {}
    try:
        for seed in a.seeds or [a.seed]:
            a.seed = seed
            at = base + (f"_seed{seed}" if a.seeds else "")
            results = []
            for group in ([todo] if a.interleave and todo else [[row] for row in todo]):
                print(f"{','.join(group)} (seed {seed}) ...", file=sys.stderr, flush=True)
                results += run_row(a, ",".join(group), ",".join(f"{at}.{r}.json" for r in group))
            # This invocation's rows, and those of earlier ones with the same settings.
            ran = {r["row"]: r for r in results}
            for row in KNOWN:
                path = f"{at}.{row}.json"
                if row not in ran and os.path.exists(path):
                    earlier = json.load(open(path))
                    if earlier.get("config") == config(a):
                        ran[row] = earlier
            by_seed[seed] = [ran[r] for r in KNOWN if r in ran]
            write(a, at, by_seed[seed])
    finally:
        if was_shaped:
            subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"])
        if a.cluster and not a.report:
            subprocess.run([CLUSTER, "down"])
    if a.seeds:
        write_seeds(a, base, by_seed)


def write_seeds_lm(a, base, by_seed):
    """The GPT's table across the seeds: each row's validation loss for every seed, the mean,
    the range, the mean against DDP's, the bytes (over the run, per synchronization) and the
    time to --target (the mean over the seeds that reached it)."""
    seeds = list(by_seed)
    names = [r for r in KNOWN if any(x["row"] == r for rs in by_seed.values() for x in rs)]

    def ok_of(name):
        got = [next((x for x in by_seed[s] if x["row"] == name), None) for s in seeds]
        return got, [g for g in got if g and "failed" not in g]

    _, ddp = ok_of("ddp")
    ddp_mean = statistics.mean(g["final_accuracy"] for g in ddp) if ddp else None
    lines = [f"{a.ranks} ranks, byte-level GPT, {testbed(a)}, {a.max_steps} steps, seeds "
             f"{', '.join(map(str, seeds))}; periodic rows: period {a.period} from step "
             f"{a.period_from}", "",
             f"| row | validation loss by seed | mean | range | against DDP | bytes sent per rank "
             f"| fewer than DDP's ring | per synchronization | of the float32 model | time to "
             f"{a.target} (seeds that reached it) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        got, ok = ok_of(name)
        cells = ", ".join("-" if not g or "failed" in g else f"{g['final_accuracy']:.4f}"
                          for g in got)
        if not ok:
            lines.append(f"| {name} | {cells} |" + " |" * 8)
            continue
        loss = [g["final_accuracy"] for g in ok]
        mean = statistics.mean(loss)
        sent = statistics.mean(g["bytes_sent"] for g in ok)
        ring = statistics.mean(ring_bytes(g) for g in ok)
        pers = [(g.get("periodic") or {}).get("bytes_per_average") for g in ok]
        model_bytes = 4 * ok[0]["parameters"]
        if all(pers):
            per = statistics.mean(pers)
        else:
            per = statistics.mean(g["bytes_sent"] / max(1, g["steps"]) for g in ok)
        reach = [next((t for _, t, v in g["evals"] if v <= a.target), None) for g in ok]
        reached = [t for t in reach if t is not None]
        lines.append(f"| {name} | {cells} | {mean:.4f} | {max(loss) - min(loss):.4f} | " +
                     (f"{100 * (mean / ddp_mean - 1):+.2f}%" if ddp_mean else "") +
                     f" | {sent / 1e6:.2f} MB | {ring / max(1.0, sent):.0f}x | {per / 1e3:.1f} kB "
                     f"| {share(per, model_bytes)} | " +
                     (f"{statistics.mean(reached):.1f} s ({len(reached)} of {len(ok)})"
                      if reached else f"not reached (0 of {len(ok)})") + " |")
    open(base + "_seeds.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_seeds(a, base, by_seed):
    """The table across the seeds (--seeds): each row's test accuracy at the end for every seed,
    their mean and range, the mean over the second half, and each host's link bytes per step
    (the largest host's, the mean over the seeds)."""
    if a.model == "gpt":
        return write_seeds_lm(a, base, by_seed)
    seeds = list(by_seed)
    names = [r for r in KNOWN if any(x["row"] == r for rs in by_seed.values() for x in rs)]
    lines = [f"{a.ranks} ranks, {'ViT' if a.model == 'vit' else a.model + ' MLP'}, "
             f"{testbed(a)}, seeds {', '.join(map(str, seeds))}", "",
             "| row | test accuracy by seed | mean | range | second half (mean) | second half, "
             "the ranks' average model (mean) | each host's link: sent per step (largest host, "
             "mean) | bytes sent per rank (mean) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        got = [next((x for x in by_seed[s] if x["row"] == name), None) for s in seeds]
        ok = [g for g in got if g and "failed" not in g]
        cells = ", ".join("-" if not g or "failed" in g else f"{g['final_accuracy']:.4f}"
                          for g in got)
        if not ok:
            lines.append(f"| {name} | {cells} | | | | | | |")
            continue
        acc = [g["final_accuracy"] for g in ok]
        links = [max(g["link"]["tx_per_step"]) for g in ok if g.get("link")]
        lines.append(f"| {name} | {cells} | {statistics.mean(acc):.4f} | "
                     f"{max(acc) - min(acc):.4f} | "
                     f"{statistics.mean(second_half(g) for g in ok):.4f} | "
                     f"{statistics.mean(second_half_averaged(g) for g in ok):.4f} | " +
                     (f"{statistics.mean(links) / 1e3:.1f} kB" if links else "") + " | "
                     f"{statistics.mean(g['bytes_sent'] for g in ok) / 1e6:.1f} MB |")
    open(base + "_seeds.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def split_table(results):
    """Where a step's time goes: the training thread's forward, backward (which ends by waiting
    for the hooks' futures) and optimizer step (medians), and for gcomp's rows the means per
    step of the communication thread's work (state.stats())."""
    rows = [r for r in results if "failed" not in r and "phase_medians" in r]
    if not rows:
        return []
    out = ["", "Where a step's time goes (ms; forward, backward, optimizer: medians; the rest: "
           "gcomp's means per step, state.stats()):", "",
           "| row | step | forward | backward | optimizer | hook | hand-off | encode | comm "
           "(agreement) | decode | python | tail | CPU |", "|---|" + "---:|" * 12]
    for r in rows:
        f, b, o = (1e3 * v for v in r["phase_medians"])
        cells = [f"{1e3 * r['step_median']:.1f}", f"{f:.1f}", f"{b:.1f}", f"{o:.1f}"]
        sp = r.get("split")
        if sp:
            cells += [f"{1e3 * sp['hook']:.2f}", f"{1e3 * sp['handoff']:.2f}",
                      f"{1e3 * sp['encode']:.2f}",
                      f"{1e3 * sp['comm']:.2f} ({1e3 * sp['agree']:.2f})",
                      f"{1e3 * sp['decode']:.2f}", f"{1e3 * sp['python']:.2f}",
                      f"{1e3 * sp['tail']:.2f}", f"{1e3 * sp.get('cpu', 0.0):.2f}"]
        else:
            cells += [""] * 8
        out.append(f"| {r['row']} | " + " | ".join(cells) + " |")
    return out


def calls_table(results):
    """gcomp's rows: how many of their collectives applied the codec (auto may send a bucket
    uncompressed where that is faster), and how many ran each algorithm."""
    rows = [r for r in results if "failed" not in r and "calls" in r]
    if not rows:
        return []
    out = ["", "gcomp's collectives (state.stats(): every bucket's call over the run, the small "
           "tensors' bucket included, which is always summed uncompressed):", "",
           "| row | calls | with the codec | uncompressed | calls by algorithm | whole steps "
           "uncompressed (checks, switches, aborted) |",
           "|---|---:|---:|---:|---|---:|"]
    for r in rows:
        alg = r["algorithm"]
        if isinstance(alg, dict):
            alg = ", ".join(f"{k} {v}" for k, v in alg.items())
        sc = r.get("step_check") or {}
        steps = (f"{sc['uncompressed_steps']} ({sc['step_checks']}, {sc['step_switches']}, "
                 f"{sc['step_aborts']})" if sc else "")
        out.append(f"| {r['row']} | {r['calls']} | {r['compressed']} | "
                   f"{r['calls'] - r['compressed']} | {alg} | {steps} |")
    return out


def second_half(r):
    """The mean test accuracy of the evaluations in the run's second half of steps."""
    late = [acc for s, _, acc in r["evals"] if s > r["steps"] / 2] or [r["final_accuracy"]]
    return sum(late) / len(late)


def second_half_averaged(r):
    """second_half of the ranks' average model (periodic rows; the others: second_half, their
    ranks' models being the same)."""
    late = [acc for s, acc in r.get("avg_evals") or [] if s > r["steps"] / 2]
    return sum(late) / len(late) if late else second_half(r)


def ring_bytes(r):
    """What a float32 ring allreduce of every step's gradients sends per rank over the run."""
    p = r["ranks"]
    return 2 * (p - 1) / p * 4 * r["parameters"] * r["steps"]


def testbed(a):
    """Where the runs ran, in words."""
    if not a.cluster:
        return f"network {a.network}"
    if a.ranks_per_host > 1:
        return (f"testbed: {a.ranks // a.ranks_per_host} hosts x {a.ranks_per_host} ranks, each "
                f"host's link {a.network}")
    return f"testbed: {a.ranks} hosts, each link {a.network}"


def link_cell(r):
    """What each host's link sent per step (kB, host by host), or empty where not counted."""
    link = r.get("link")
    return " / ".join(f"{tx / 1e3:.1f}" for tx in link["tx_per_step"]) + " kB" if link else ""


def share(part, whole):
    """part as a share of whole: 1/N below it, a multiple above."""
    if part <= 0:
        return "0"
    return f"1/{whole / part:.0f}" if part < whole else f"{part / whole:.2f}x"


def lm_row_cells(r, ddp, a):
    """The GPT table's cells of a row (ddp: DDP's row, or None)."""
    loss = r["final_accuracy"]
    vs = f"{100 * (loss / ddp['final_accuracy'] - 1):+.1f}%" if ddp else ""
    per = (r.get("periodic") or {}).get("bytes_per_average") or \
        r["bytes_sent"] / max(1, r["steps"])
    sync = f"{per / 1e3:.1f} kB | {share(per, 4 * r['parameters'])}"
    reach = next((t for _, t, v in r["evals"] if v <= a.target), None)
    return [f"{loss:.4f}", vs, f"{r['bytes_sent'] / 1e6:.2f} MB", 
            f"{ring_bytes(r) / max(1, r['bytes_sent']):.0f}x", sync,
            f"{r['step_median'] * 1e3:.1f} ms",
            "not reached" if reach is None else f"{reach:.1f} s"]


def write_lm(a, base, results):
    """The GPT's table (Markdown and CSV) and its plot: the validation loss of the ranks' average
    model, the bytes over the run and per synchronization, loss against wall time and bytes."""
    import csv
    ddp = next((r for r in results if r["row"] == "ddp" and "failed" not in r), None)
    linked = any(r.get("link") for r in results)
    lines = [f"{a.ranks} ranks, byte-level GPT (python_examples/gpt_text.py: Debian's fortunes), "
             f"AdamW lr {a.lr} (warm-up {a.lr_warmup} steps, cosine to a tenth), weight decay "
             f"{a.weight_decay}, {a.max_steps} steps of {a.batch} sequences of 64 bytes a rank, "
             f"{testbed(a)}; periodic rows: period {a.period} from step {a.period_from}", "",
             f"| row | validation loss (nats/byte) | against DDP | bytes sent per rank | fewer "
             f"than DDP's ring | per synchronization | of the float32 model | step time (median) "
             f"| time to {a.target} |" + (" each host's link: sent per step |" if linked else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if linked else "")]
    with open(base + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "validation_loss", "bytes_sent", "ring_ratio", "bytes_per_sync",
                    "step_median_s", "seconds_to_target", "failed", "link_tx_per_step_max"])
        for r in results:
            if "failed" in r:
                lines.append(f"| {r['row']} | failed: {r['failed']} |" + " |" * (7 + linked))
                w.writerow([r["row"], "", "", "", "", "", "", r["failed"], ""])
                continue
            lines.append(f"| {r['row']} | " + " | ".join(lm_row_cells(r, ddp, a)) + " |" +
                         (f" {link_cell(r)} |" if linked else ""))
            reach = next((t for _, t, v in r["evals"] if v <= a.target), None)
            link = r.get("link")
            per = (r.get("periodic") or {}).get("bytes_per_average")
            w.writerow([r["row"], r["final_accuracy"], r["bytes_sent"],
                        ring_bytes(r) / max(1, r["bytes_sent"]),
                        per if per else r["bytes_sent"] / max(1, r["steps"]), r["step_median"],
                        reach if reach is not None else "", "",
                        max(link["tx_per_step"]) if link else ""])
    lines += ["", "Bytes: gcomp's rows what they handed to the transport (the agreement "
                  "included); DDP's and torch's a ring allreduce's 2 (P-1)/P of the float32 "
                  "tensors they reduce. Per synchronization: a periodic row's bytes per average "
                  "(a rank's), the others' per step; the share is of the float32 model's bytes."]
    lines += split_table(results)
    lines += calls_table(results)
    open(base + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot_lm(a, base, results)


def plot_lm(a, base, results):
    """Validation loss against wall time and against the bytes sent, one line per row."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    colors = plt.get_cmap("tab20").colors
    for i, r in enumerate(results):
        if "failed" in r or r["row"].startswith("nocomm"):
            continue
        style = dict(label=r["row"], color=colors[i % len(colors)],
                     linestyle="--" if r["row"].startswith("gcomp") else "-")
        left.plot([t for _, t, _ in r["evals"]], [v for _, _, v in r["evals"]], **style)
        sent = r.get("eval_bytes") or []
        if len(sent) == len(r["evals"]):
            right.plot([max(b, 1) / 1e6 for b in sent], [v for _, _, v in r["evals"]], **style)
    left.set_xlabel("wall time (s, evaluation excluded)")
    right.set_xlabel("bytes sent per rank (MB, log)")
    right.set_xscale("log")
    for ax in (left, right):
        ax.set_ylabel("validation loss (nats/byte)")
        ax.axhline(a.target, color="grey", lw=0.5)
    left.set_title(f"byte-level GPT, {a.ranks} ranks, {testbed(a)}")
    right.legend(fontsize=7)
    fig.savefig(base + ".png", dpi=120, bbox_inches="tight")


def write(a, base, results):
    import csv
    if a.model == "gpt":
        return write_lm(a, base, results)
    where = testbed(a)
    what = "ViT" if a.model == "vit" else f"{a.model} MLP"
    how = (f"AdamW lr {a.lr} weight decay {a.weight_decay} (gcomp's rows: 1-bit Adam, warm-up "
           f"{a.warmup_steps} steps)" if a.optimizer == "adamw" else f"SGD lr {a.lr} momentum 0.9")
    steps = f"{a.max_steps} steps" if a.max_steps else f"{a.epochs} epochs"
    linked = any(r.get("link") for r in results)
    lines = [f"{a.ranks} ranks, {what}, {how}, {where}, {steps}, global batch "
             f"{a.ranks * a.batch}", "",
             f"| row | test accuracy | mean over the second half | bytes sent per rank | fewer "
             f"than a ring | step time (median) | time to {a.target:.0%} |" +
             (" each host's link: sent per step |" if linked else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if linked else "")]
    with open(base + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "accuracy", "second_half_accuracy", "bytes_sent", "bytes_how",
                    "ring_ratio", "step_median_s", "seconds_to_target", "failed",
                    "link_tx_per_step_max"])
        for r in results:
            if "failed" in r:
                best = max((acc for _, _, acc in r.get("evals", [])), default=None)
                seen = "" if best is None else f" (best accuracy before: {best:.4f})"
                lines.append(f"| {r['row']} | failed: {r['failed']}{seen} | | | | | |" +
                             (" |" if linked else ""))
                w.writerow([r["row"], "", "", "", "", "", "", "", r["failed"], ""])
                continue
            reach = next((t for s, t, acc in r["evals"] if acc >= a.target), None)
            lines.append(f"| {r['row']} | {r['final_accuracy']:.4f} | {second_half(r):.4f} | "
                         f"{r['bytes_sent'] / 1e6:.1f} MB{' (model)' if r['bytes_how'] == 'model' else ''} | "
                         f"{ring_bytes(r) / max(1, r['bytes_sent']):.1f}x | "
                         f"{r['step_median'] * 1e3:.1f} ms | "
                         f"{'not reached' if reach is None else f'{reach:.1f} s'} |" +
                         (f" {link_cell(r)} |" if linked else ""))
            link = r.get("link")
            w.writerow([r["row"], r["final_accuracy"], second_half(r), r["bytes_sent"],
                        r["bytes_how"], ring_bytes(r) / max(1, r["bytes_sent"]), r["step_median"],
                        reach if reach is not None else "", "",
                        max(link["tx_per_step"]) if link else ""])
    one_line = [r["row"] for r in results if r.get("form") == "register"]
    by_hand = [r["row"] for r in results if r.get("form") == "hook"]
    if one_line and a.optimizer == "adamw":
        zero_one = [r for r in one_line if "zero_one" in r]
        one_bit = [r for r in one_line if r not in zero_one]
        if one_bit:
            lines += ["", "Registered with the one line, `gt.register(model, optimizer, codec, "
                          f"warmup_steps={a.warmup_steps}, ...)`: 1-bit Adam, the variance "
                          "frozen after the warm-up and each rank's momentum sent through the "
                          "codec: " + ", ".join(one_bit) + "."]
        if zero_one:
            freeze, kappa, local, double = a.zero_one
            lines += ["", "0/1 Adam, `gt.register(model, optimizer, codec, variance=gcomp."
                          f"AdamSchedule.zero_one({freeze}, kappa={kappa}, max_local_steps={local}"
                          f", local_double_every={double}), ...)` (_refresh: max_local_steps=1, "
                          "no local steps): " + ", ".join(zero_one) + "."]
    elif one_line:
        moved = [r["row"] for r in results if r.get("form") == "register" and r.get("moved")]
        kept = [r for r in one_line if r not in moved]
        if moved:
            lines += ["", "Registered with the one line, `gt.register(model, optimizer, codec, "
                          "...)`, SGD's momentum 0.9 moved into the hook as momentum correction "
                          "(the optimizer's set to 0): " + ", ".join(moved) + "."]
        if kept:
            lines += ["", "Registered with the one line, SGD keeping its momentum (a codec that "
                          "does not delay: nothing moves): " + ", ".join(kept) + "."]
    periodic = [r for r in results if r.get("periodic")]
    if periodic or any(r["row"] == "torch_post_local" for r in results):
        lines += ["", f"Periodic rows: every step synchronized until step {a.period_from}, then "
                      f"local steps and an average every {a.period} (_period: "
                      f"`period={a.period}, period_from={a.period_from}`; torch_post_local: "
                      "post_localSGD_hook and PeriodicModelAverager). Averages made and bytes "
                      "each: " + ", ".join(
                          f"{r['row']} {r['periodic']['averages']} x "
                          f"{r['periodic']['bytes_per_average'] / 1e6:.2f} MB" for r in periodic) +
                  ". Mean over the second half of the ranks' average model (evaluated on a "
                  "copy; between averages the ranks differ): " + ", ".join(
                      f"{r['row']} {second_half_averaged(r):.4f}" for r in results
                      if r.get("avg_evals")) + "."]
    if by_hand:
        lines += ["", "Registered by hand, `model.register_comm_hook(gt.CompressionState(codec, "
                      "...), gt.compression_hook)`, SGD keeping its momentum 0.9 (the _mc rows: "
                      "momentum=0.9 given to the state, SGD without it): " +
                      ", ".join(by_hand) + "."]
    if linked:
        lines += ["", "Each host's link: every frame it sent (headers and all, every rank of the "
                      "host together) from the end of the first step to the end of the run, per "
                      "step, host by host (the links' counters, read by a rank of each host)."]
    lines += split_table(results)
    lines += calls_table(results)
    open(base + ".md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab20").colors
    for i, r in enumerate(results):
        if "failed" not in r and not r["row"].startswith("nocomm"):  # torch's solid, gcomp's dashed
            ax.plot([t for _, t, _ in r["evals"]], [acc for _, _, acc in r["evals"]],
                    label=r["row"], color=colors[i % len(colors)],
                    linestyle="--" if r["row"].startswith("gcomp") else "-")
    ax.axhline(a.target, color="grey", lw=0.5)
    ax.set_xlabel("wall time (s, evaluation excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{'ViT' if a.model == 'vit' else a.model + ' MLP'}, {a.ranks} ranks, "
                 f"{a.optimizer}, network {a.network}")
    ax.legend(fontsize=8)
    fig.savefig(base + ".png", dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
