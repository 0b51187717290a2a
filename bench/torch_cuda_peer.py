#!/usr/bin/env python3
"""The PyTorch peer of bench/cuda_codec_bench.cpp on the same GPU: what a user would write
instead of gcomp's CUDA codecs, timed with CUDA events (median of --reps after a warm-up).

  copy                     y.copy_(x): the device's bandwidth reference (reads and writes 4 n bytes)
  encode/topk:ratio=R      torch.topk(x.abs(), k, sorted=False) (GRACE's top-k)
  encode/fp16, bf16        x.half(), x.bfloat16()
  encode/sign              scale = x.abs().mean(); bits = x < 0 (one bool per element)
  encode/qsgd:bits=B       QSGD's formula per bucket of 512 (norm per bucket, stochastic rounding
                           with torch.rand_like, int8 codes)
  encode/terngrad          TernGrad's formula (clip to 2.5 sigma, s = max |g|, Bernoulli with
                           torch.rand_like, int8 codes)
  decode_add/<spec>        acc += decode(payload) for fp16, bf16, sign, qsgd:bits=4, terngrad

With --only-topk, the copy and the top-k rows alone (a second size's run). The input is
torch.randn(n) from a fixed seed; --save FILE writes it as raw float32 so that gcomp's benchmark
(--input FILE) runs on the same tensor. Writes JSON: device, n, seconds per op.
"""

import argparse
import json
import statistics
import sys

try:
  import torch
except ImportError:
  sys.exit("torch_cuda_peer.py: PyTorch is missing for " + sys.executable)

BUCKET = 512


def timed(fn, reps):
  fn()  # warm-up (and allocation)
  torch.cuda.synchronize()
  times = []
  for _ in range(reps):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
  return statistics.median(times)


def qsgd_encode(x, bits):
  s = (1 << (bits - 1)) - 1
  xb = x.view(-1, BUCKET)
  norm = xb.norm(dim=1, keepdim=True)
  r = xb.abs() / norm * s
  low = r.floor()
  level = low + (torch.rand_like(r) < (r - low)).to(r.dtype)
  codes = (level * xb.sign()).to(torch.int8)
  return codes, norm


def qsgd_decode_add(acc, codes, norm, bits):
  s = (1 << (bits - 1)) - 1
  acc.view(-1, BUCKET).add_(codes.to(torch.float32) * (norm / s))


def terngrad_encode(x, clip=2.5):
  c = clip * x.std()
  g = x.clamp(-c, c)
  scaler = g.abs().max()
  keep = torch.rand_like(g) * scaler < g.abs()
  codes = (g.sign() * keep).to(torch.int8)
  return codes, scaler


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=1 << 28, help="elements (a multiple of 512)")
  ap.add_argument("--reps", type=int, default=20)
  ap.add_argument("--seed", type=int, default=20240611)
  ap.add_argument("--save", help="write the input as raw float32 to this file")
  ap.add_argument("--out", required=True, help="JSON file for the results")
  ap.add_argument("--only-topk", action="store_true",
                  help="time the copy and the top-k rows alone (a second size's run)")
  a = ap.parse_args()
  if a.n % BUCKET != 0:
    sys.exit("torch_cuda_peer.py: --n must be a multiple of %d" % BUCKET)
  if not torch.cuda.is_available():
    sys.exit("torch_cuda_peer.py: torch sees no CUDA device")
  dev = torch.device("cuda")
  gen = torch.Generator(device=dev)
  gen.manual_seed(a.seed)
  x = torch.randn(a.n, device=dev, generator=gen)
  if a.save:
    x.cpu().numpy().tofile(a.save)
  y = torch.empty_like(x)
  acc = torch.zeros_like(x)
  res = {}
  res["copy"] = timed(lambda: y.copy_(x), a.reps)
  for ratio in ("0.01", "0.001"):
    k = max(1, round(float(ratio) * a.n))
    res["encode/topk:ratio=" + ratio] = timed(lambda: torch.topk(x.abs(), k, sorted=False), a.reps)
  if a.only_topk:
    report(a, res)
    return
  res["encode/fp16"] = timed(lambda: x.half(), a.reps)
  res["encode/bf16"] = timed(lambda: x.bfloat16(), a.reps)
  res["encode/sign"] = timed(lambda: (x.abs().mean(), x < 0), a.reps)
  for bits in (4, 8):
    res["encode/qsgd:bits=%d" % bits] = timed(lambda: qsgd_encode(x, bits), a.reps)
  res["encode/terngrad"] = timed(lambda: terngrad_encode(x), a.reps)
  h = x.half()
  res["decode_add/fp16"] = timed(lambda: acc.add_(h.float()), a.reps)
  b = x.bfloat16()
  res["decode_add/bf16"] = timed(lambda: acc.add_(b.float()), a.reps)
  scale = x.abs().mean()
  neg = x < 0
  res["decode_add/sign"] = timed(lambda: acc.add_(torch.where(neg, -scale, scale)), a.reps)
  codes, norm = qsgd_encode(x, 4)
  res["decode_add/qsgd:bits=4"] = timed(lambda: qsgd_decode_add(acc, codes, norm, 4), a.reps)
  tcodes, scaler = terngrad_encode(x)
  res["decode_add/terngrad"] = timed(lambda: acc.add_(tcodes.to(torch.float32) * scaler), a.reps)
  report(a, res)


def report(a, res):
  out = {
      "device": torch.cuda.get_device_name(0),
      "torch": torch.__version__,
      "n": a.n,
      "seconds": res,
  }
  with open(a.out, "w") as f:
    json.dump(out, f, indent=1)
  print("torch_cuda_peer.py: %s, torch %s, n = %d: %d ops timed" %
        (out["device"], out["torch"], a.n, len(res)))


if __name__ == "__main__":
  main()
