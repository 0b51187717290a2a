"""What the module's tests share: one spec per codec (and the variants whose bytes differ in
kind), and the fixed-seed gradients they encode."""

import numpy as np

SPECS = [
    "none",
    "fp16",
    "bf16",
    "topk:ratio=0.01",
    "topk:k=7,values=fp16",
    "randomk:ratio=0.05",
    "randomk:ratio=0.1,scale=true",
    "threshold:tau=1.5",
    "qsgd",
    "qsgd:bits=2,bucket=100",
    "terngrad",
    "sign",
]


def gradient(n, seed):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)
