"""What the module's tests share: one spec per codec (and the variants whose bytes differ in
kind), the fixed-seed gradients they encode, and Adam's functions each called once."""

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
    "topk:ratio=0.01,chunk=4096,bits=2",
    "topk:k=2,chunk=7,values=fp16",
]


def gradient(n, seed):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def adam_inputs(n):
    """param, grad, exp_avg, exp_avg_sq and anchor of n elements (float32 numpy), v 0 at every
    7th element (the frozen steps leave it) and small elsewhere (their bound holds some)."""
    x = [gradient(n, seed) for seed in (1, 2, 3, 4, 5)]
    x[3] = x[3] * x[3] * np.float32(1e-3)
    x[3][::7] = 0
    return x


def adam_calls(p, g, m, v, a, stream=None):
    """Every Adam function of gcomp once, in place, on the arrays (all host or all CUDA, with
    stream=)."""
    import gcomp

    kw = {} if stream is None else {"stream": stream}
    s = {"beta1": 0.9, "beta2": 0.99, "eps": 1e-8}
    gcomp.adam_step(p, g, m, v, lr=1e-3, step=9, variance_steps=3, weight_decay=0.05,
                    decoupled=True, **s, **kw)
    gcomp.adam_local_momentum(p, g, m, g, beta1=0.9, weight_decay=0.01, **kw)
    gcomp.adam_frozen_update(p, g, m, v, lr=1e-3, step=10, variance_steps=3, **s, **kw)
    gcomp.adam_sync_momentum(p, a, v, g, lr_sum=3e-3, decay=0.999, variance_steps=3,
                             beta2=0.99, eps=1e-8, **kw)
    gcomp.adam_sync_update(p, a, g, m, v, lr_sum=3e-3, decay=0.999, step=12, variance_steps=3,
                           **s, **kw)
