#!/usr/bin/python3
"""The PyTorch peer of bench/codec_bench.cpp: the same codecs written the way GRACE
(sands-lab/grace, grace_dl/dist/compressor/*.py) writes them, timed on one thread.

For every codec and size it times three ops, as gcomp's benchmark does:
  encode      compress(x)
  encode_ef   GRACE's ResidualMemory: compensated = x + residual; compress; decompress;
              residual = compensated - decompressed (the residual is kept across repetitions)
  decode_add  decompress(payload) + acc.add_(decompressed), payload prepared beforehand
Each op runs once to warm up, then `reps` times; the median (time.perf_counter) is reported.
The payload size counts the tensors GRACE would send (int64 indices for the sparse codecs, one
byte per element for the int8/bool codes), so the peer's ratio is GRACE's, not gcomp's.

QSGD: GRACE's original compressor uses one L2 norm for the whole tensor ("qsgd:bits=B/global");
gcomp's qsgd is bucketed (512 elements per norm), so the peer that carries gcomp's spec name is
the bucketed variant (reshape to [-1, 512], one norm per row). Both are written to the JSON.

Run with Debian's torch: /usr/bin/python3 bench/torch_codecs.py --out results/torch_codecs.json
"""

import argparse
import json
import platform
import re
import statistics
import sys
import time

try:
  import torch
except ImportError:
  sys.exit("torch_codecs.py: PyTorch is missing for " + sys.executable +
           " (Debian: apt-get install python3-torch)")

SIZES = {"1M": 1 << 20, "16M": 1 << 24}
INPUT_SEED = 20240611
BUCKET = 512


def nbytes(t):
  return t.numel() * t.element_size()


# ---- the codecs: compress(x) -> (payload tensors, ctx); decompress(payload, ctx) -> dense ----


class NoneCodec:
  # GRACE's NoneCompressor hands the tensor itself on; a clone is what sending a copy costs.
  def compress(self, x):
    return [x.clone()], None

  def decompress(self, payload, ctx):
    return payload[0]


class CastCodec:
  def __init__(self, dtype):
    self.dtype = dtype

  def compress(self, x):
    return [x.type(self.dtype)], x.dtype

  def decompress(self, payload, ctx):
    return payload[0].type(ctx)


class TopK:
  def __init__(self, ratio):
    self.ratio = ratio

  def compress(self, x):
    numel = x.numel()
    k = max(1, int(numel * self.ratio))
    _, indices = torch.topk(x.abs(), k, sorted=False)
    values = torch.gather(x, 0, indices)
    return [values, indices], numel

  def decompress(self, payload, numel):
    values, indices = payload
    return torch.zeros(numel, dtype=values.dtype).scatter_(0, indices, values)


class RandomK:
  def __init__(self, ratio):
    self.ratio = ratio
    self.step = 0

  def compress(self, x):
    numel = x.numel()
    k = max(1, int(numel * self.ratio))
    torch.manual_seed(self.step)  # GRACE seeds from the tensor name and the step
    self.step += 1
    indices = torch.randperm(numel)[:k]
    values = x[indices]
    return [values, indices], numel

  def decompress(self, payload, numel):
    values, indices = payload
    return torch.zeros(numel, dtype=values.dtype).scatter_(0, indices, values)


class Threshold:
  def __init__(self, tau):
    self.tau = tau

  def compress(self, x):
    indices = (x.abs() >= self.tau).nonzero().view(-1)
    values = x[indices]
    return [values, indices], x.numel()

  def decompress(self, payload, numel):
    values, indices = payload
    return torch.zeros(numel, dtype=values.dtype).scatter_(0, indices, values)


class QSGD:
  """GRACE's QSGD with s = 2^(bits-1) - 1 levels; bucket=None is GRACE's one global norm."""

  def __init__(self, bits, bucket):
    self.s = (1 << (bits - 1)) - 1
    self.bucket = bucket

  def compress(self, x):
    shape = x.shape
    if self.bucket:
      x = x.view(-1, self.bucket)  # the benchmark sizes are multiples of the bucket
      norm = x.norm(dim=1, keepdim=True)
    else:
      norm = x.norm()
    abs_gradient = x.abs()
    level_float = self.s / norm * abs_gradient
    previous_level = level_float.floor()
    prob = torch.empty_like(x).uniform_()
    is_next_level = (prob < (level_float - previous_level)).type(torch.float32)
    new_level = previous_level + is_next_level
    sign = x.sign()
    compressed = (new_level * sign).type(torch.int16)
    compressed = compressed.type(torch.int8 if self.s < 128 else torch.half)
    return [compressed, norm], shape

  def decompress(self, payload, shape):
    compressed, norm = payload
    return (norm / self.s * compressed.type(torch.float32)).view(shape)


class TernGrad:
  def compress(self, x):
    std = (x - torch.mean(x)) ** 2
    std = torch.sqrt(torch.mean(std))
    c = 2.5 * std.item()
    gradient = torch.clamp(x, -c, c)
    abs_gradient = gradient.abs()
    scalar = abs_gradient.max()
    sign_gradient = gradient.sign() * scalar
    rnd_sample = torch.empty_like(x).uniform_(0, scalar.item())
    sign_gradient[rnd_sample >= abs_gradient] = 0
    new_sign = sign_gradient.sign()
    return [new_sign.type(torch.int8), scalar.flatten()], None

  def decompress(self, payload, ctx):
    signs, scalar = payload
    return signs.type(torch.float32) * scalar


class Sign:
  """EF-signSGD: scale = mean |x|, one bool per element."""

  def compress(self, x):
    magnitude = x.norm(p=1) / x.numel()
    return [x >= 0, magnitude.view(1)], None

  def decompress(self, payload, ctx):
    signs, magnitude = payload
    return (signs.type(torch.float32) * 2 - 1) * magnitude


def codecs():
  """(name, codec): names are gcomp's specs; extra GRACE variants carry a /suffix."""
  return [
      ("none", NoneCodec()),
      ("fp16", CastCodec(torch.float16)),
      ("bf16", CastCodec(torch.bfloat16)),
      ("topk:ratio=0.01", TopK(0.01)),
      ("topk:ratio=0.001", TopK(0.001)),
      ("randomk:ratio=0.01", RandomK(0.01)),
      ("threshold:tau=2.576", Threshold(2.576)),
      ("qsgd:bits=4", QSGD(4, BUCKET)),
      ("qsgd:bits=8", QSGD(8, BUCKET)),
      ("qsgd:bits=4/global", QSGD(4, None)),
      ("qsgd:bits=8/global", QSGD(8, None)),
      ("terngrad", TernGrad()),
      ("sign", Sign()),
  ]


# ---- timing ----


def median_seconds(fn, reps):
  fn()  # warm up (allocator, first touch)
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


def bench_codec(name, codec, x, reps, ops):
  n = x.numel()
  out = []
  payload, ctx = codec.compress(x)
  payload_bytes = sum(nbytes(t) for t in payload)

  def encode():
    codec.compress(x)

  residual = [torch.zeros_like(x)]

  def encode_ef():
    compensated = x + residual[0]
    p, c = codec.compress(compensated)
    residual[0] = compensated - codec.decompress(p, c)

  acc = torch.zeros_like(x)

  def decode_add():
    acc.add_(codec.decompress(payload, ctx))

  for op, fn in (("encode", encode), ("encode_ef", encode_ef), ("decode_add", decode_add)):
    if not ops(op):
      continue
    sec, times = median_seconds(fn, reps)
    out.append({
        "codec": name,
        "op": op,
        "n": n,
        "seconds": sec,
        "times": times,
        "gbps": 4.0 * n / sec / 1e9,
        "payload_bytes": payload_bytes,
        "ratio": 4.0 * n / payload_bytes,
        "reps": reps,
    })
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", required=True, help="JSON file to write")
  ap.add_argument("--sizes", default="1M,16M", help="comma list of 1M, 16M (default both)")
  ap.add_argument("--reps", type=int, default=0,
                  help="timed repetitions per op (default: 7 at 1M, 3 at 16M)")
  ap.add_argument("--filter", default="",
                  help="regex over '<op>/<codec>/<n>' (as the C++ benchmark names)")
  ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
  args = ap.parse_args()

  torch.set_num_threads(1)
  pattern = re.compile(args.filter) if args.filter else None
  results = []
  t_start = time.perf_counter()
  for label in args.sizes.split(","):
    if label not in SIZES:
      sys.exit("torch_codecs.py: unknown size '%s' (1M or 16M)" % label)
    n = SIZES[label]
    reps = args.reps or (7 if n <= (1 << 20) else 3)
    gen = torch.Generator().manual_seed(INPUT_SEED ^ n)
    x = torch.randn(n, generator=gen, dtype=torch.float32)
    for name, codec in codecs():
      def wanted(op, name=name):
        return not pattern or pattern.search("%s/%s/%d" % (op, name, n)) is not None
      if not any(wanted(op) for op in ("encode", "encode_ef", "decode_add")):
        continue
      t0 = time.perf_counter()
      rows = bench_codec(name, codec, x, reps, wanted)
      results.extend(rows)
      if not args.quiet:
        summary = "  ".join("%s %.3f GB/s" % (r["op"], r["gbps"]) for r in rows)
        print("torch %-20s %-4s %s  (%.1f s)" % (name, label, summary, time.perf_counter() - t0),
              file=sys.stderr)

  doc = {
      "context": {
          "torch_version": torch.__version__,
          "python": platform.python_version(),
          "torch_threads": torch.get_num_threads(),
          "machine": platform.machine(),
          "qsgd_bucket": BUCKET,
          "seconds_total": time.perf_counter() - t_start,
      },
      "results": results,
  }
  with open(args.out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")


if __name__ == "__main__":
  main()
