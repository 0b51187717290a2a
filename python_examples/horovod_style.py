#!/usr/bin/python3
"""The model of ddp_fashion_mnist.py trained with gcomp.torch.DistributedOptimizer, as Horovod
users write it: no torch.distributed at all.

    PYTHONPATH=build/python mpiexec.mpich -n 4 /usr/bin/python3 \\
        python_examples/horovod_style.py --codec qsgd:bits=4 --epochs 2
"""

import argparse
import time

import torch

import gcomp.torch as gt
from fashion_mnist import accuracy, load, mlp, shard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="qsgd:bits=4")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--wide", action="store_true")
    a = ap.parse_args()

    torch.set_num_threads(1)
    comm = gt.communicator()  # MPI, initialized here
    rank, size = comm.rank, comm.size
    train_x, train_y, test_x, test_y = load()
    model = mlp(a.wide, seed=rank)  # different on each rank until the broadcast below
    opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9),
                                  named_parameters=model.named_parameters(), codec=a.codec)
    gt.broadcast_parameters(model.state_dict(), root_rank=0)
    gt.broadcast_optimizer_state(opt, root_rank=0)
    for epoch in range(a.epochs):
        start = time.perf_counter()
        for idx in shard(len(train_x), epoch, rank, size, a.batch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            opt.step()
        seconds = time.perf_counter() - start
        acc = accuracy(model, test_x, test_y)
        if rank == 0:
            s = opt.stats()
            print(f"epoch {epoch + 1}: test accuracy {acc:.4f}, {seconds:.1f} s, "
                  f"sent {s['bytes_sent'] / 1e6:.1f} MB", flush=True)


if __name__ == "__main__":
    main()
