#!/usr/bin/python3
"""An ordinary DistributedDataParallel script on Fashion-MNIST; its only gcomp line is
gt.register(model, optimizer, codec).

    PYTHONPATH=build/python mpiexec.mpich -n 3 /usr/bin/python3 \\
        python_examples/ddp_fashion_mnist.py --codec topk:ratio=0.01 --steps 600

--codec default runs DDP's own allreduce (no hook); --applied applies the codec on every call
(allow_uncompressed=False: auto would send a bucket uncompressed where that is faster, as on an
unshaped loopback, and the bytes would then not be the codec's); --algorithm pins gcomp's
algorithm (auto's learner also tries the others, dense among them); --by-hand registers the
hook as before register existed (SGD keeps its momentum), for comparison; --wide trains
784-2048-2048-10 (else 784-512-256-10, 0.5M parameters). SGD lr 0.05 momentum 0.9 (register
moves the momentum into the hook for top-k, random-k, threshold and sign). --steps stops after
that many steps (else --epochs epochs); --eval-every N also evaluates every N steps (rank 0).
--device cuda trains on the GPUs (rank r on GPU r mod their count; torch.distributed's backend
as gt.init_process_group picks it: gloo where ranks share a GPU) and compresses on them with
gcomp's CUDA kernels; --data is the Fashion-MNIST folder (default Debian's).
Rank 0 prints each epoch's test accuracy and at the end one line: the test accuracy, the bytes
each rank handed to MPI against a ring allreduce's 2 (P-1)/P of the gradients every step, and
whether every rank ends with the same parameters.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp.torch as gt
from fashion_mnist import DATA, accuracy, load, mlp, shard


def same_everywhere(model, held):
    """Whether every rank holds rank 0's parameters, bit for bit. The tensors handed to gloo go
    into held, which the caller keeps until the process group is destroyed: torch 1.13's gloo
    thread drops its reference to a finished call's tensors a moment after the call returns,
    and where that is the last one it needs the GIL, which the main thread holds while the
    process group's destructor waits for that thread (a deadlock at exit, seen here)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    mine = flat.clone()
    dist.broadcast(flat, 0)
    ok = torch.tensor([1 if torch.equal(flat, mine) else 0])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    held += [flat, ok]
    return bool(ok.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="topk:ratio=0.01", help='a gcomp spec, or "default"')
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all)")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--wide", action="store_true")
    ap.add_argument("--applied", action="store_true",
                    help="apply the codec on every call (allow_uncompressed=False), where auto "
                         "would send a bucket uncompressed when that is faster")
    ap.add_argument("--algorithm", default="auto", help="gcomp's algorithm (default auto)")
    ap.add_argument("--by-hand", action="store_true",
                    help="register the hook by hand (register_comm_hook with a CompressionState), "
                         "SGD keeping its momentum: the form register replaces, for comparison")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="also evaluate every this many steps (rank 0 prints them)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--data", default=DATA, help="the Fashion-MNIST folder")
    a = ap.parse_args()

    rank, size = gt.init_process_group()
    torch.set_num_threads(1)
    train_x, train_y, test_x, test_y = load(a.data)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no GPU here (torch.cuda.is_available())")
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))
        model = DDP(mlp(a.wide).to(device), device_ids=[device.index])
    else:
        model = DDP(mlp(a.wide))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    state = None
    if a.codec != "default":
        options = {"allow_uncompressed": False} if a.applied else {}
        if a.algorithm != "auto":
            options["algorithm"] = a.algorithm
        if a.by_hand:
            state = gt.CompressionState(a.codec, **options)
            model.register_comm_hook(state, gt.compression_hook)
        else:
            state = gt.register(model, opt, a.codec, **options)  # the one gcomp line
    steps, start, evals = 0, time.perf_counter(), []
    for epoch in range(a.epochs):
        began = time.perf_counter()
        for idx in shard(len(train_x), epoch, rank, size, a.batch):
            idx = idx.to(train_x.device)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            opt.step()
            steps += 1
            if a.eval_every and steps % a.eval_every == 0 and rank == 0:
                # The parameters are the same on every rank: rank 0 alone evaluates (the
                # module itself, outside DDP), the others go on to the next step.
                evals.append(accuracy(model.module, test_x, test_y))
            if steps == a.steps:
                break
        acc = accuracy(model, test_x, test_y)
        if rank == 0:
            sent = f", sent {state.stats()['bytes_sent'] / 1e6:.1f} MB" if state else ""
            print(f"epoch {epoch + 1}: test accuracy {acc:.4f}, "
                  f"{time.perf_counter() - began:.1f} s{sent}", flush=True)
        if steps == a.steps:
            break
    n = sum(p.numel() for p in model.parameters())
    ring = 2 * (size - 1) / size * 4 * n * steps
    held = []
    same = same_everywhere(model, held)
    if rank == 0:
        sent = state.stats()["bytes_sent"] if state else ring
        print(f"result: codec {a.codec}, {size} ranks on {a.device}, {steps} steps, "
              f"test accuracy {acc:.4f}, "
              f"sent {sent / 1e6:.2f} MB per rank, ring {ring / 1e6:.2f} MB "
              f"({ring / sent:.1f}x fewer), same parameters on every rank: {same}, "
              f"{time.perf_counter() - start:.1f} s"
              + (f", calls {state.stats()['algorithm']}" if state else ""), flush=True)
        if evals:
            print("evaluations: " + " ".join(f"{e:.4f}" for e in evals), flush=True)
    del model, state  # DDP's reducer holds the process group too
    dist.destroy_process_group()
    del held  # after the gloo threads have ended (same_everywhere)


if __name__ == "__main__":
    main()
