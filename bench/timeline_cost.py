#!/usr/bin/python3
"""What the timeline (gcomp.timeline, docs/timeline.md) costs a training step: the byte-level
GPT of python_examples/ddp_gpt.py with the one line, its steps recorded and not in alternating
blocks of 8 (a period's worth: each block holds the same averages' starts and merges;
gcomp.timeline.pause/resume: the same job, the machine's drift on both alike), each step timed
from a barrier to the slowest rank's end; medians and their ratio.

    mpiexec.mpich -n 3 /usr/bin/python3 bench/timeline_cost.py [--steps 160] [--warmup 16]

Rows: every step synchronized through top-k per chunk (6%, 2-bit values: a call per DDP bucket,
the most events a step), and DiLoCo's local steps with streaming averages (period 8, 4 fragments,
merged 2 steps later: an average's start or merge every other step). Off is the path a job
without a timeline takes (on() false: the library's one relaxed load per phase, gcomp.torch's one
call per bucket and step). Prints a Markdown table and each row's events a recorded step.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp
import gcomp.torch as gt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python_examples"))
from gpt_text import TEXT, adamw, batch, gpt, load_text, loss_of  # noqa: E402

ROWS = [("every step, top-k 6% per chunk", dict()),
        ("period 8, 4 fragments, overlap 2", dict(period=8, fragments=4, overlap_steps=2))]
CODEC = "topk:ratio=0.06,chunk=4096,bits=2"
BLOCK = 8  # steps recorded or not in a row: the streaming row's period


def run_row(options, steps, warmup, text, folder, rank, size):
    model = DDP(gpt(0))
    opt = adamw(model.module, 2e-3)
    state = gt.register(model, opt, CODEC, variance=None, algorithm="sparse_allgather",
                        allow_uncompressed=False, **options)
    off, on, events = [], [], []
    for step in range(warmup + steps):
        recording = step >= warmup and (step - warmup) // BLOCK % 2 == 1
        if recording:
            gcomp.timeline.resume()
        else:
            gcomp.timeline.pause()
        before = gcomp.timeline.events()
        x, y = batch(text, step, rank, size, 16, seed=0)
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        mine = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        gcomp.timeline.pause()
        if step >= warmup:
            (on if recording else off).append(mine.item())
            if recording:
                events.append(gcomp.timeline.events() - before)
    if options:
        state.average_parameters()  # what is in flight merged before the next row's calls
    del model, state
    return off, on, events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=160, help="timed steps a row (half recorded)")
    ap.add_argument("--warmup", type=int, default=16)
    a = ap.parse_args()
    rank, size = gt.init_process_group()
    torch.set_num_threads(1)
    text, _ = load_text(TEXT)
    folder = tempfile.mkdtemp(prefix="gcomp_timeline_cost_") if rank == 0 else None
    box = [folder]
    dist.broadcast_object_list(box, 0)
    folder = box[0]
    gcomp.timeline.open(os.path.join(folder, "cost.json"), rank)
    gcomp.timeline.pause()
    lines = ["| steps | off: median step | on: median step | on / off | events a step |",
             "|---|---:|---:|---:|---:|"]
    for name, options in ROWS:
        off, on, events = run_row(options, a.steps, a.warmup, text, folder, rank, size)
        m_off, m_on = statistics.median(off), statistics.median(on)
        lines.append(f"| {name} | {m_off * 1e3:.2f} ms | {m_on * 1e3:.2f} ms | "
                     f"{m_on / m_off:.4f} | {statistics.mean(events):.1f} |")
    gcomp.timeline.close()
    os.remove(os.path.join(folder, f"cost.{rank}.json"))  # the rank's file (one machine)
    dist.barrier()
    if rank == 0:
        os.rmdir(folder)
        print(f"{size} ranks, {a.steps} timed steps a row ({a.steps // 2} recorded), "
              f"{a.warmup} warm-up; the slowest rank's step from a barrier")
        print("\n".join(lines), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
