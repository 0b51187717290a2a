#!/usr/bin/python3
"""A gradient through every codec: payload size, compression ratio, error, and error feedback.

    PYTHONPATH=build/python /usr/bin/python3 python_examples/codecs_numpy.py

The gradient is a made-up one with a few large coordinates among many small ones, as real
gradients have. For each codec: bytes of one payload, the ratio 4 n / bytes, and the relative
error |x - decode(encode(x))| / |x| of one step. Then error feedback over 20 steps of the same
gradient: the sum of the decoded steps is 20 x + e_0 - e_20 (the residual carries what was not
sent), so the mean approaches x as long as the residual stays bounded. It does for the biased,
contracting codecs (top-k, threshold, sign, fp16). Unbiased QSGD with few levels has a variance
above |x|^2 (omega = min(n/s^2, sqrt(n)/s) for s levels), so it is no contraction and its residual
grows: the qsgd:bits=2 row shows error feedback diverging, as the theory says it may.
"""

import numpy as np

import gcomp

SPECS = ["none", "fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.01,values=fp16",
         "randomk:ratio=0.01", "threshold:tau=2.5", "qsgd:bits=4", "qsgd:bits=2",
         "terngrad", "sign"]


def main():
    rng = np.random.default_rng(0)
    n = 1 << 20
    x = (rng.standard_normal(n) * np.where(rng.random(n) < 0.01, 10, 0.1)).astype(np.float32)
    norm = np.linalg.norm(x)
    steps = 20
    print(f"{n} floats, {gcomp.simd_level()} kernels\n")
    print(f"{'codec':<30} {'bytes':>9} {'ratio':>8} {'error, 1 step':>14} {'error, EF mean':>15}")
    for spec in SPECS:
        codec = gcomp.Codec(spec)
        payload = codec.encode(x, seed=0)
        decoded = np.zeros_like(x)
        gcomp.decode_add(payload, decoded)
        one = np.linalg.norm(x - decoded) / norm

        ef = gcomp.ErrorFeedback(n)
        total = np.zeros_like(x)
        for step in range(steps):
            gcomp.decode_add(codec.encode(x, seed=step, ef=ef), total, alpha=1.0 / steps)
        mean = np.linalg.norm(x - total) / norm
        info = gcomp.inspect(payload)
        print(f"{codec.spec:<30} {info['bytes']:>9} {info['ratio']:>8.1f} {one:>14.4f} {mean:>15.4f}")


if __name__ == "__main__":
    main()
