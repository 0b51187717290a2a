#!/usr/bin/env python3
"""The stage breakdown of gcomp's CUDA codecs as scripts/gpu-check prints it: from the lines that
GCOMP_CUDA_STAGES=1 makes each encode and decode_add write to stderr,

  gcomp-cuda-stages <op>/<codec> n=<n> <stage>=<ms> ...

one Markdown table per op and size: each stage's median over the calls, its share of the summed
medians, and the calls counted. Other lines are ignored.

usage: gpu_stages.py STDERR_LOG > stages.md     (stdlib only)
"""

import statistics
import sys


def parse(lines):
    """{(op, n): {"calls": int, "stages": {stage: [ms, ...]}}}, stages in first-seen order."""
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 3 or parts[0] != "gcomp-cuda-stages" or not parts[2].startswith("n="):
            continue
        key = (parts[1], parts[2][2:])
        entry = out.setdefault(key, {"calls": 0, "stages": {}})
        entry["calls"] += 1
        for item in parts[3:]:
            name, sep, value = item.partition("=")
            if not sep:
                continue
            try:
                entry["stages"].setdefault(name, []).append(float(value))
            except ValueError:
                continue
    return out


def tables(parsed):
    lines = []
    for (op, n), entry in parsed.items():
        medians = [(name, statistics.median(v)) for name, v in entry["stages"].items()]
        total = sum(m for _, m in medians)
        lines.append(f"{op}, n = {n} ({entry['calls']} calls; medians):")
        lines.append("")
        lines.append("| stage | ms | share |")
        lines.append("|---|---:|---:|")
        for name, m in medians:
            share = "-" if total <= 0 else f"{100 * m / total:.0f}%"
            lines.append(f"| {name} | {m:.4f} | {share} |")
        lines.append(f"| (sum) | {total:.4f} | |")
        lines.append("")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    with open(argv[1], errors="replace") as f:
        parsed = parse(f)
    if not parsed:
        print("no gcomp-cuda-stages lines (was GCOMP_CUDA_STAGES=1 set?)")
        return 1
    print(tables(parsed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
