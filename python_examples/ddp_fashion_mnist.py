#!/usr/bin/python3
"""An ordinary DistributedDataParallel script on Fashion-MNIST; its only gcomp line is the
register_comm_hook call.

    PYTHONPATH=build/python mpiexec.mpich -n 4 /usr/bin/python3 \\
        python_examples/ddp_fashion_mnist.py --codec topk:ratio=0.01 --epochs 2

--codec default runs DDP's own allreduce (no hook); --wide trains 784-2048-2048-10. Rank 0
prints each epoch's test accuracy, seconds, and what the hook sent.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp.torch as gt
from fashion_mnist import accuracy, load, mlp, shard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="topk:ratio=0.01", help='a gcomp spec, or "default"')
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--wide", action="store_true")
    a = ap.parse_args()

    rank, size = gt.init_process_group()
    torch.set_num_threads(1)
    train_x, train_y, test_x, test_y = load()
    model = DDP(mlp(a.wide))
    state = None
    if a.codec != "default":
        state = gt.CompressionState(a.codec)
        model.register_comm_hook(state, gt.compression_hook)  # the one gcomp line
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    for epoch in range(a.epochs):
        start = time.perf_counter()
        for idx in shard(len(train_x), epoch, rank, size, a.batch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            opt.step()
        seconds = time.perf_counter() - start
        acc = accuracy(model, test_x, test_y)
        if rank == 0:
            sent = f", sent {state.stats()['bytes_sent'] / 1e6:.1f} MB" if state else ""
            print(f"epoch {epoch + 1}: test accuracy {acc:.4f}, {seconds:.1f} s{sent}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
