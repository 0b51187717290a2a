"""Fashion-MNIST for the examples: Debian's dataset-fashion-mnist (IDX files, gzip), as float32
tensors scaled to [0, 1], and the models the examples train: two MLPs and a small vision
transformer.

    from fashion_mnist import load, mlp, shard, vit
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


class ViT(torch.nn.Module):
    """A small vision transformer: the 28 x 28 image cut into 16 patches of 7 x 7, each embedded
    in `width`, a class token and learned positions, `depth` pre-norm encoder layers (4 heads,
    an MLP of 2 x width), and a linear head on the class token."""

    def __init__(self, width=64, depth=2, heads=4):
        super().__init__()
        self.embed = torch.nn.Linear(49, width)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, width))
        self.pos = torch.nn.Parameter(0.02 * torch.randn(1, 17, width))
        layer = torch.nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width,
                                                 dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        patches = x.view(-1, 4, 7, 4, 7).permute(0, 1, 3, 2, 4).reshape(-1, 16, 49)
        t = self.embed(patches)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        return self.head(self.norm(self.encoder(t)[:, 0]))


def vit(seed=0):
    """The ViT above (width 64, 2 layers: 72,074 parameters, 2,314 of them in tensors under 1,024), seeded."""
    torch.manual_seed(seed)
    return ViT()


def shard(n, epoch, rank, size, batch, seed=0):
    """This rank's slices of one epoch's shuffled order: a list of index tensors, one per step,
    each the rank's part of a global batch of size * batch examples."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    steps = n // (size * batch)
    return [order[(s * size + rank) * batch:(s * size + rank + 1) * batch] for s in range(steps)]


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
