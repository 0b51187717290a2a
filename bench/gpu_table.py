#!/usr/bin/env python3
"""One Markdown table from gcomp's CUDA codec benchmark (Google Benchmark JSON of
gcomp_bench_cuda) and its PyTorch peer (JSON of bench/torch_cuda_peer.py), as scripts/gpu-check
prints it, with the targets of the CUDA backend:

  * none, fp16, bf16, sign, terngrad, qsgd: encode and decode_add at >= 50% of the device copy's
    bandwidth measured in the same run (input GB/s: 4 n bytes over the op's time, against 4 n bytes
    over the copy's time);
  * top-k 1%: at least 5 times as fast as torch.topk on the same tensor.

usage: gpu_table.py GCOMP_JSON [TORCH_JSON] > table.md     (stdlib only)
"""

import json
import sys

BANDWIDTH_TARGET = ("none", "fp16", "bf16", "sign", "terngrad", "qsgd:bits=4", "qsgd:bits=8")
TOPK_TARGET = "topk:ratio=0.01"


def gcomp_results(path):
  """{name: (seconds, gbps, ratio or None, error or None)}, medians when repeated."""
  with open(path) as f:
    doc = json.load(f)
  out = {}
  scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
  repeated = any(b.get("run_type") == "aggregate" for b in doc.get("benchmarks", []))
  for b in doc.get("benchmarks", []):
    if repeated and (b.get("run_type") != "aggregate" or b.get("aggregate_name") != "median"):
      if not b.get("error_occurred"):
        continue
    name = b.get("run_name", b["name"]).replace("/real_time", "")
    if b.get("error_occurred"):
      out[name] = (None, None, None, b.get("error_message", "error"))
      continue
    sec = b["real_time"] * scale[b.get("time_unit", "ns")]
    out[name] = (sec, b.get("gbps"), b.get("ratio"), None)
  return doc.get("context", {}), out


def fmt(v, digits=3):
  return "-" if v is None else ("%.*g" % (digits, v))


def main(argv):
  if len(argv) < 2:
    sys.exit(__doc__)
  context, ours = gcomp_results(argv[1])
  peer = {}
  peer_doc = {}
  if len(argv) > 2:
    with open(argv[2]) as f:
      peer_doc = json.load(f)
    peer = peer_doc.get("seconds", {})
  copy = ours.get("copy", (None, None, None, None))
  copy_gbps = copy[1]
  lines = []
  dev = peer_doc.get("device", "the GPU")
  lines.append("gcomp CUDA codecs on %s, n = %s floats (torch %s)" %
               (dev, peer_doc.get("n", "?"), peer_doc.get("torch", "-")))
  lines.append("")
  peer_copy = peer.get("copy")
  peer_copy_gbps = None if not peer_copy else 4.0 * peer_doc.get("n", 0) / peer_copy / 1e9
  lines.append("device copy: gcomp (cudaMemcpy) %s GB/s of input, torch copy_ %s GB/s" %
               (fmt(copy_gbps, 4), fmt(peer_copy_gbps, 4)))
  lines.append("")
  lines.append("| op | gcomp ms | input GB/s | of copy | ratio | torch ms | gcomp vs torch |"
               " target | met |")
  lines.append("|---|---:|---:|---:|---:|---:|---:|---|---|")
  met = 0
  total = 0
  for name, (sec, gbps, ratio, err) in ours.items():
    if name == "copy":
      continue
    op, _, spec = name.partition("/")
    if err:
      lines.append("| %s | error: %s | | | | | | | |" % (name, err.replace("|", "/")))
      if (op in ("encode", "decode_add") and spec in BANDWIDTH_TARGET) or \
         (op == "encode" and spec == TOPK_TARGET):
        total += 1
      continue
    share = None if not (gbps and copy_gbps) else gbps / copy_gbps
    tsec = peer.get(name)
    speedup = None if not (tsec and sec) else tsec / sec
    target = ""
    ok = None
    if op in ("encode", "decode_add") and spec in BANDWIDTH_TARGET:
      target = ">= 50% of copy"
      ok = share is not None and share >= 0.5
    elif op == "encode" and spec == TOPK_TARGET:
      target = ">= 5x torch.topk"
      ok = speedup is not None and speedup >= 5
    if ok is not None:
      total += 1
      met += ok
    lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        name, fmt(sec * 1e3 if sec else None), fmt(gbps, 4),
        "-" if share is None else "%.0f%%" % (100 * share), fmt(ratio),
        fmt(tsec * 1e3 if tsec else None), "-" if speedup is None else "%.1fx" % speedup,
        target, "" if ok is None else ("yes" if ok else "NO")))
  lines.append("")
  lines.append("targets met: %d of %d" % (met, total))
  print("\n".join(lines))
  return 0 if met == total else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv))
