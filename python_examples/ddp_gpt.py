#!/usr/bin/python3
"""A byte-level GPT trained data-parallel with AdamW (python_examples/gpt_text.py: Debian's
fortunes as text), an ordinary DistributedDataParallel script whose only gcomp line is
gt.register(model, optimizer, codec, ...): every step synchronized, or DiLoCo's local steps and
an outer step every --period steps over a slow link.

    PYTHONPATH=build/python mpiexec.mpich -n 3 /usr/bin/python3 python_examples/ddp_gpt.py \\
        --codec topk:ratio=0.01,chunk=4096,bits=2 --period 25 --feedback-decay 0.95

or the same under torchrun (--nproc_per_node 3; gcomp then runs on Gloo through torch's store).
--codec default runs DDP's own allreduce every step (no gcomp). With --period H > 1 the ranks
take local AdamW steps from --period-from on and average every H steps: each rank's change since
the last average goes through the codec with error feedback (decayed by --feedback-decay before
each new change is added: SparseLoCo's error feedback in place of the outer momentum), then the
outer step (--outer-lr, Nesterov --outer-momentum: DiLoCo's 0.7 and 0.9); --fragments F and
--overlap-steps T stream the averages (F fragments at staggered steps, each merged T steps after
it starts, after that step or with --merge before_update inside it, before its update; the
whole model averaged once more at the end). Before --period-from
every step is synchronized through the codec (AdamW as it is: variance=None). --algorithm is
gcomp's collective (default fewest_bytes: the codec's own bytes on the algorithm that sends the
fewest; auto chooses by time, and may send float32 where that is faster). AdamW lr
--lr with a linear warm-up of --warmup steps and a cosine to a tenth at --steps, weight decay 0.1
on the matrices; --sequences windows of 64 bytes a rank and step; --width and --depth the
GPT's (96 and 3: 366,432 parameters).
Rank 0 prints the validation loss (nats per byte) of the ranks' average model every --eval-every
steps and at the end, the bytes each rank sent against DDP's ring (2 (P-1)/P of the float32
gradients every step), the bytes of each average, whether every rank ends with the same
parameters, and the CPU seconds gcomp's communication thread spent in its jobs.
"""

import argparse
import os
import sys
import time

# One BLAS thread a rank, as torch.set_num_threads(1) below asks of torch's own: Debian's torch
# calls OpenBLAS, which starts a thread a core whatever torch is told; with several ranks a host
# those threads contend, and their count changes the last bits of the products (a run under
# mpiexec would not repeat one under torchrun, which sets OMP_NUM_THREADS=1). A value given wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp.torch as gt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_text import TEXT, adamw, batch, gpt, learning_rate, load_text, loss_of, validation_loss


def average_model(model, size):
    """A copy of the flat parameters averaged over the ranks (torch's allreduce, not gcomp's:
    an evaluation, not part of the training), and the flat parameters themselves."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mean = flat.clone()
    dist.all_reduce(mean)
    return mean / size, flat


def evaluate(model, valid, size):
    """The validation loss of the ranks' average model (every rank takes part; on a copy)."""
    mean, flat = average_model(model, size)
    params = list(model.parameters())
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(mean, params)
        loss = validation_loss(model, valid)
        torch.nn.utils.vector_to_parameters(flat, params)
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="none", help='a gcomp spec, or "default" (DDP alone)')
    ap.add_argument("--period", type=int, default=1, help="average every H steps (1: every step)")
    ap.add_argument("--period-from", type=int, default=0,
                    help="steps before this one are synchronized")
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.0)
    ap.add_argument("--feedback-decay", type=float, default=1.0,
                    help="the averages' residual decays by this before each change is added")
    ap.add_argument("--momentum-at-average", default="local", choices=["local", "reset", "average"],
                    help="AdamW's first moment at an average: each rank's own, zeroed, or "
                         "averaged through the codec")
    ap.add_argument("--fragments", type=int, default=1,
                    help="with --period: streaming, the model averaged in F fragments at "
                         "staggered steps")
    ap.add_argument("--overlap-steps", type=int, default=0,
                    help="with --period: each average merged this many steps after it starts, "
                         "its bytes sent while they run")
    ap.add_argument("--pacing", type=int, default=None,
                    help="with --overlap-steps: each average sent in up to N parts (default T "
                         "for T >= 2, one a step; at T = 1, N > 1 spreads them over the step)")
    ap.add_argument("--merge", default="after_step", choices=["after_step", "before_update"],
                    help="when an overlapped average is merged at its step (gt.register's merge)")
    ap.add_argument("--timeline", default=None,
                    help="each rank's calls, steps, buckets and averages as Chrome trace events "
                         "in this file's rank files (scripts/timeline merge puts them together)")
    ap.add_argument("--algorithm", default="fewest_bytes",
                    help="gcomp's algorithm (default fewest_bytes: the codec's bytes on the "
                         "algorithm that sends the fewest; auto chooses by time)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--sequences", type=int, default=16, help="64-byte windows a rank and step")
    ap.add_argument("--width", type=int, default=96, help="the GPT's width (a multiple of 4)")
    ap.add_argument("--depth", type=int, default=3, help="the GPT's layers")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=60, help="steps of linear learning-rate warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--text", default=TEXT, help="the folder of text (default Debian's fortunes)")
    a = ap.parse_args()

    if a.width < 4 or a.width % 4 or a.depth < 1:
        ap.error("--width must be a positive multiple of 4 (4 heads) and --depth at least 1")
    rank, size = gt.init_process_group()
    torch.set_num_threads(1)
    train, valid = load_text(a.text)
    model = DDP(gpt(a.seed, width=a.width, depth=a.depth))
    opt = adamw(model.module, a.lr)
    state = None
    if a.codec != "default":
        # AdamW as it is (its gradients through the codec, or its local steps); the codec on
        # every call (auto would send float32 where that is faster, not what a metered link
        # wants).
        options = dict(variance=None, seed=a.seed, algorithm=a.algorithm,
                       allow_uncompressed=False, timeline=a.timeline)
        if a.period > 1:
            options.update(period=a.period, period_from=a.period_from, outer_lr=a.outer_lr,
                           outer_momentum=a.outer_momentum, feedback_decay=a.feedback_decay,
                           momentum_at_average=a.momentum_at_average, fragments=a.fragments,
                           overlap_steps=a.overlap_steps, pacing=a.pacing)
            if a.merge != "after_step":
                options["merge"] = a.merge
        state = gt.register(model, opt, a.codec, **options)  # the one gcomp line
    start, began = time.perf_counter(), time.monotonic()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, a.steps, a.lr, a.warmup)
        x, y = batch(train, step, rank, size, a.sequences, seed=a.seed)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        if a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            v = evaluate(model.module, valid, size)
            if rank == 0:
                print(f"step {step + 1}: validation loss {v:.4f} nats/byte", flush=True)
    seconds, ended = time.perf_counter() - start, time.monotonic()
    if state is not None and (a.fragments > 1 or a.overlap_steps > 0):
        state.average_parameters()  # what is in flight merged, the whole model averaged
    v = evaluate(model.module, valid, size)
    n = sum(p.numel() for p in model.parameters())
    ring = 2 * (size - 1) / size * 4 * n * a.steps
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    first = mine.clone()
    dist.broadcast(first, 0)
    same = torch.tensor([int(torch.equal(first, mine))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        st = state.stats() if state else {}
        sent = st.get("bytes_sent", ring)
        per = (f", {st['averages']} averages of {st['bytes_per_average'] / 1e3:.1f} kB "
               f"({4 * n / max(1.0, st['bytes_per_average']):.0f}x less than the float32 model)"
               if st.get("averages") else "")
        streaming = (f", fragments {a.fragments}, overlap {a.overlap_steps}"
                     if a.fragments > 1 or a.overlap_steps else "")
        if a.pacing is not None:
            streaming += f", pacing {a.pacing}"
        if a.merge != "after_step":
            streaming += f", merge {a.merge}"
        waited = (f", {st['average_seconds']:.2f} s of it in averages" if "average_seconds" in st
                  else "")
        print(f"result: codec {a.codec}, period {a.period}{streaming}, {size} ranks, "
              f"{a.steps} steps, "
              f"validation loss {v:.4f} nats/byte, sent {sent / 1e6:.2f} MB per rank, DDP's "
              f"ring {ring / 1e6:.2f} MB ({ring / max(1, sent):.1f}x fewer){per}, same "
              f"parameters on every rank: {bool(same.item())}, {seconds:.1f} s{waited}", flush=True)
        if "cpu_seconds" in st:  # what the communication thread took from the steps' cores
            print(f"communication thread: {st['cpu_seconds']:.2f} s of CPU in {st['jobs']} jobs",
                  flush=True)
    if rank == 0:  # the loop's span on CLOCK_MONOTONIC, to cut a link trace to it
        print(f"loop: monotonic {began:.4f} {ended:.4f}", flush=True)
    del model, state  # DDP's reducer holds the process group too
    dist.destroy_process_group()
    # The tensors handed to gloo last, dropped after its threads have ended (a finished call's
    # last reference dropped on gloo's thread would wait for the GIL the destructor holds).
    del first, same


if __name__ == "__main__":
    main()
