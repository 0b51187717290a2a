"""One gcomp.torch training job under mpiexec, for test_torch_jobs.py: a checkpoint's save and
resume, a rank that sleeps past the stall time, a rank that skips a call under a timeout.

    mpiexec.mpich -n P python3 torch_job.py train --form hook --codec topk:ratio=0.05
        --first 0 --count 6 [--load FILE] [--save FILE [--save-at S]] --out FILE
    mpiexec.mpich -n P python3 torch_job.py stall --form hook|optimizer --late-rank 1 --sleep 2.5
    mpiexec.mpich -n P python3 torch_job.py skip --late-rank 1 --sleep 4 (0: at once)
    mpiexec.mpich -n P python3 torch_job.py world --entry register|hook|optimizer|init
        --init reversed     (torch's ranks the reverse of mpiexec's)
    python3 -m torch.distributed.run --nproc_per_node P ... torch_job.py world --init env

Every mode runs under torch's launcher too (python3 -m torch.distributed.run ... torch_job.py
...): gcomp over Gloo on torch's store.

Each rank's own files are FILE with ".rank<r>" appended. The data of step s on rank r is drawn
from a generator seeded with (s, r), so a job that resumes at step s sees what one run sees.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp
import gcomp.torch as gt


def ddp(net):
    """DDP with several buckets (about 10 KB each, the first too), which it lays out anew from
    the gradients' order after the first step."""
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = 10000
    try:
        return DDP(net, bucket_cap_mb=0.01)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 96), torch.nn.ReLU(), torch.nn.Linear(96, 80),
                               torch.nn.ReLU(), torch.nn.Linear(80, 5))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)


def build(a, rank):
    """The model, optimizer and (hook form) state, made as a job makes them before training."""
    net = model()
    adam = {}  # AdamW: 1-bit Adam, a warm-up of a.warmup exact steps; or 0/1 Adam's schedule
    if a.optimizer == "adamw":
        sgd = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.01)
        adam = {"warmup_steps": a.warmup}
        if a.zero_one:
            freeze, kappa, local, double = (int(x) for x in a.zero_one.split(","))
            adam = {"variance": gcomp.AdamSchedule.zero_one(
                freeze, kappa=kappa, max_local_steps=local, local_double_every=double)}
    else:
        sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    # --period H: periodic averaging from step 1 (step 0 synchronized).
    periodic = dict(period=a.period, period_from=1) if a.period > 1 else {}
    pinned = "sparse_allgather"
    if a.codec.startswith("powersgd"):
        pinned = "low_rank"
    elif a.codec == "sign":  # 1-bit Adam's: error feedback on both sides
        pinned = "compressed_reduce_scatter"
    if a.form == "hook":
        net = ddp(net) if a.buckets == "several" else DDP(net)
        state = gt.register(net, sgd, a.codec, algorithm=pinned, allow_uncompressed=False,
                            seed=7, stall_seconds=a.stall,
                            per_parameter=True if a.per_parameter else None, **adam,
                            **periodic)
        return net, sgd, state
    opt = gt.DistributedOptimizer(sgd, named_parameters=net.named_parameters(), codec=a.codec,
                                  algorithm=pinned, allow_uncompressed=False, seed=7,
                                  bucket_bytes=20000, **adam)
    return net, opt, opt


def one_step(net, opt, step, rank):
    opt.zero_grad()
    x, y = batch(step, rank)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()


def train(a, rank):
    net, opt, state = build(a, rank)
    if a.load:
        saved = torch.load(f"{a.load}.rank{rank}")
        net.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        if a.form == "hook":
            state.load_state_dict(saved["gcomp"])
    def save():
        saved = {"model": net.state_dict(), "optimizer": opt.state_dict()}
        if a.form == "hook":
            saved["gcomp"] = state.state_dict()
        torch.save(saved, f"{a.save}.rank{rank}")
        # The parameters at the checkpoint, beside it.
        torch.save([p.detach().clone() for p in net.parameters()], f"{a.save}.params.rank{rank}")

    end = a.first + a.count
    save_at = end if a.save_at is None else a.save_at
    if a.save and not a.first < save_at <= end:
        raise SystemExit(f"--save-at {save_at} is not within steps {a.first + 1}..{end}")
    for s in range(a.first, end):
        one_step(net, opt, s, rank)
        if a.save and s + 1 == save_at:  # mid-run, as a job checkpoints every N steps
            save()
    torch.save([p.detach().clone() for p in net.parameters()], f"{a.out}.rank{rank}")
    print(f"rank {rank}: steps {a.first}..{a.first + a.count - 1} done", flush=True)


def stall(a, rank):
    net, opt, _ = build(a, rank)
    for s in range(4):
        if s == 2 and rank == a.late_rank:
            time.sleep(a.sleep)
        one_step(net, opt, s, rank)
    print(f"rank {rank}: completed", flush=True)


def skip(a, rank):
    """The late rank skips one call (its hook passes step 1's bucket 0 back without averaging
    it), sleeps, and goes on to its next call: every rank must raise, none wait for ever."""
    net = ddp(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    once = []
    state = gt.CompressionState(a.codec, algorithm="sparse_allgather", allow_uncompressed=False)
    net.register_comm_hook(state, lambda st, bucket: (
        skipped(a, bucket, once) if rank == a.late_rank and st.step == 1 and bucket.index() == 0
        and not once else gt.compression_hook(st, bucket)))
    try:
        for s in range(3):
            one_step(net, opt, s, rank)
        print(f"rank {rank}: no error", flush=True)
    except (RuntimeError, gcomp.Error) as e:
        status = getattr(e, "status", None) or next(
            (k for k in ("timeout", "mismatch") if f": {k}: " in str(e)), "other")
        print(f"rank {rank}: raised {status}: {e}", flush=True)


def skipped(a, bucket, once):
    assert not bucket.is_last(), "the skipped call must not be the step's last"
    once.append(True)
    time.sleep(a.sleep)
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def world(a):
    """torch.distributed's world made apart from gcomp's (--init env: from torch's launcher's
    variables; reversed: torch's ranks the reverse of mpiexec's), then the entry into gcomp.torch
    tried: every rank must raise gcomp's mismatch naming both worlds."""
    if a.init == "env":
        dist.init_process_group("gloo")
    elif a.init == "reversed":
        size = int(os.environ["PMI_SIZE"])
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
            rank=size - 1 - int(os.environ["PMI_RANK"]), world_size=size)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    try:
        if a.entry == "init":
            gt.init_process_group()
        else:
            net = DDP(model())
            sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
            if a.entry == "register":
                gt.register(net, sgd, a.codec)
            elif a.entry == "hook":
                net.register_comm_hook(gt.CompressionState(a.codec), gt.compression_hook)
            else:
                sgd = gt.DistributedOptimizer(sgd, named_parameters=net.named_parameters(),
                                              codec=a.codec)
            one_step(net, sgd, 0, rank)
        comm = gt.communicator()
        print(f"rank {rank}: no error, gcomp on {comm.transport}, {comm.size} ranks", flush=True)
    except (RuntimeError, gcomp.Error) as e:
        status = getattr(e, "status", None) or ("mismatch" if ": mismatch: " in str(e) else
                                                "other")
        print(f"rank {rank}: raised {status}: {e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "stall", "skip", "world"])
    ap.add_argument("--form", choices=["hook", "optimizer"], default="hook")
    ap.add_argument("--codec", default="topk:ratio=0.05")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--buckets", choices=["one", "several"], default="several",
                    help="DDP's buckets: one for the model, or several (laid out anew after "
                         "the first step)")
    ap.add_argument("--per-parameter", action="store_true")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd",
                    help="train: SGD with momentum, or AdamW (gcomp.torch runs it as 1-bit Adam)")
    ap.add_argument("--warmup", type=int, default=2, help="AdamW: its exact steps")
    ap.add_argument("--zero-one", help="AdamW: 0/1 Adam's FREEZE,KAPPA,H,DOUBLE instead")
    ap.add_argument("--load")
    ap.add_argument("--save")
    ap.add_argument("--save-at", type=int, default=None,
                    help="train: save after this many steps (default: at the end)")
    ap.add_argument("--out")
    ap.add_argument("--late-rank", type=int, default=1)
    ap.add_argument("--period", type=int, default=1, help="the hook's period (from step 1)")
    ap.add_argument("--sleep", type=float, default=2.5)
    ap.add_argument("--stall", type=float, default=None, help="the hook state's stall_seconds")
    ap.add_argument("--entry", choices=["register", "hook", "optimizer", "init"],
                    default="register", help="world: where gcomp.torch meets torch's world")
    ap.add_argument("--init", choices=["env", "reversed", "none"], default="env",
                    help="world: how torch.distributed's world is made")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.mode == "world":
        return world(a)
    rank, _ = gt.init_process_group()
    {"train": train, "stall": stall, "skip": skip}[a.mode](a, rank)
    sys.stdout.flush()
    if a.mode != "skip":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
