"""Fashion-MNIST for the examples: Debian's dataset-fashion-mnist (IDX files, gzip), as float32
tensors scaled to [0, 1], and the two MLPs the examples train.

    from fashion_mnist import load, mlp, shard
"""

import gzip
import os

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"


def _idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data=DATA):
    """(train_x, train_y, test_x, test_y): x float32 (N, 784) in [0, 1], y int64."""
    if not os.path.isdir(data):
        raise SystemExit(f"{data} not found: apt-get install dataset-fashion-mnist")
    out = []
    for part in ("train", "t10k"):
        x = _idx(os.path.join(data, f"{part}-images-idx3-ubyte.gz")).reshape(-1, 784)
        y = _idx(os.path.join(data, f"{part}-labels-idx1-ubyte.gz"))
        out += [torch.from_numpy(x.astype(np.float32) / 255), torch.from_numpy(y.astype(np.int64))]
    return tuple(out)


def mlp(wide=False, seed=0):
    """784-512-256-10, or with wide=True 784-2048-2048-10 (5.8M parameters)."""
    torch.manual_seed(seed)
    h1, h2 = (2048, 2048) if wide else (512, 256)
    return torch.nn.Sequential(torch.nn.Linear(784, h1), torch.nn.ReLU(),
                               torch.nn.Linear(h1, h2), torch.nn.ReLU(), torch.nn.Linear(h2, 10))


def shard(n, epoch, rank, size, batch, seed=0):
    """This rank's slices of one epoch's shuffled order: a list of index tensors, one per step,
    each the rank's part of a global batch of size * batch examples."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    steps = n // (size * batch)
    return [order[(s * size + rank) * batch:(s * size + rank + 1) * batch] for s in range(steps)]


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
