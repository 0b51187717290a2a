#!/usr/bin/python3
"""Streaming averages on the testbed (scripts/cluster: a host a network namespace, its link
shaped to the rate): the GPT of python_examples/ddp_gpt.py on 3 hosts, for each rate and codec
three runs of the same steps: without communication (local steps only, never averaged: the step
time the run could have), the periodic average, and the same period with fragments and overlap.

    bench/streaming_testbed.py [--rates 100mbit,1gbit] [--steps 1200] [--sequences 16] [--seeds 0]
        [--width 96] [--depth 3] [--merge after_step|before_update]
        [--codecs "topk:ratio=0.06,chunk=4096,bits=2@1.8,0.2;none@1.0,0.0"] [--period 8]
        [--fragments 4] [--overlap 2] [--pacing N] [--repeat R] [--cpus C] [--out DIR]

Per run: the loop's seconds (ddp_gpt.py's), utilization = the run without communication's
seconds / the run's, the validation loss, the bytes a rank sent, and from each host's link
sampled every 10 ms (scripts/cluster run --link-trace) cut to the loop's span less its first
second (SETTLE): the mean bytes a second each host sent and the most it sent in any 100 ms, the
busiest host's shown. The first
seed's runs also write timelines (ddp_gpt.py --timeline) into --out. Prints a Markdown table;
the runs' outputs and traces stay in --out. --cpus C: each host C cores of its own
(scripts/cluster up --cpus: a CPU cgroup a host), so that a rank that waits does not hand its
core to the others, as no host of a cluster can. --repeat R: each seed's three runs R times,
interleaved, and a second table: each round's utilization against the same round's run without
communication, the medians' and how many rounds reached 0.95 (single runs scatter by several
percent on a shared machine). --pacing N: the streaming run's ddp_gpt.py --pacing; --width and
--depth its GPT's (longer steps without a larger batch); --merge the streaming run's ddp_gpt.py
--merge.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Seconds of the loop left out of the link figures: the setup's bytes (DDP's broadcast of the
# model, gcomp's measurement of the network) still drain from the links' queues when the first
# steps begin.
SETTLE = 1.0
ROOT = os.path.join(HERE, "..")


def busiest(t, c, start, end, window=0.1):
    """The most bytes between two samples of (t, c) at most window apart, within [start, end]."""
    pts = [(a, b) for a, b in zip(t, c) if start <= a <= end]
    best, j = 0, 0
    for k in range(len(pts)):
        while pts[k][0] - pts[j][0] > window:
            j += 1
        best = max(best, pts[k][1] - pts[j][1])
    return best


def link_stats(trace_path, began, ended):
    """Each host's mean bytes a second sent and busiest 100 ms within the loop's span."""
    with open(trace_path) as f:
        d = json.load(f)
    t = [d["t0"] + x for x in d["t"]]
    out = []
    for tx in d["tx"]:
        inside = [(a, b) for a, b in zip(t, tx) if began <= a <= ended]
        sent = inside[-1][1] - inside[0][1] if len(inside) > 1 else 0
        span = inside[-1][0] - inside[0][0] if len(inside) > 1 else 1.0
        out.append((sent / span, busiest(t, tx, began, ended)))
    return out


def run(args, rate, codec, outer, seed, kind, out, repeat=0):
    name = f"{rate}_{re.sub(r'[^A-Za-z0-9]+', '_', codec)}_{kind}_s{seed}"
    if repeat:
        name += f"_r{repeat}"
    lr, mu = outer
    cmd = [sys.executable, os.path.join(ROOT, "python_examples", "ddp_gpt.py"), "--codec", codec,
           "--steps", str(args.steps), "--sequences", str(args.sequences), "--width", str(args.width),
           "--depth", str(args.depth), "--eval-every", "0",
           "--seed", str(seed), "--algorithm", "fewest_bytes", "--outer-lr", str(lr),
           "--outer-momentum", str(mu)]
    if kind == "compute":
        cmd += ["--period", str(10 ** 9)]  # local steps only: nothing is sent
    else:
        cmd += ["--period", str(args.period)]
    if kind == "streaming":
        cmd += ["--fragments", str(args.fragments), "--overlap-steps", str(args.overlap)]
        if args.pacing is not None:
            cmd += ["--pacing", str(args.pacing)]
        if args.merge != "after_step":
            cmd += ["--merge", args.merge]
    if seed == args.seeds[0] and kind != "compute" and not repeat:
        cmd += ["--timeline", os.path.join(out, name + ".timeline.json")]
    trace = os.path.join(out, name + ".link.json")
    full = [os.path.join(ROOT, "scripts", "cluster"), "run", "--timeout", str(args.timeout),
            "--link-trace", trace, "--"] + cmd
    p = subprocess.run(full, capture_output=True, text=True)
    with open(os.path.join(out, name + ".out"), "w") as f:
        f.write(p.stdout + "\n--- stderr ---\n" + p.stderr)
    if p.returncode != 0:
        sys.exit(f"{name}: exit {p.returncode}: {p.stderr[-2000:]}")
    res = re.search(r"^result: .*validation loss ([0-9.]+).*sent ([0-9.]+) MB per rank.*"
                    r", ([0-9.]+) s(, ([0-9.]+) s of it in averages)?$", p.stdout, re.M)
    loop = re.search(r"^loop: monotonic ([0-9.]+) ([0-9.]+)$", p.stdout, re.M)
    if not res or not loop:
        sys.exit(f"{name}: no result line: {p.stdout[-2000:]}")
    began, ended = float(loop.group(1)), float(loop.group(2))
    links = link_stats(trace, began + SETTLE, ended)
    return {"name": name, "loss": float(res.group(1)), "mb": float(res.group(2)),
            "seconds": float(res.group(3)),
            "average_seconds": float(res.group(5)) if res.group(5) else 0.0,
            "mean_tx": max(m for m, _ in links), "busiest_tx": max(b for _, b in links),
            "links": links}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--sequences", type=int, default=16,
                    help="ddp_gpt.py's --sequences: 64-byte windows a rank and step")
    ap.add_argument("--width", type=int, default=96, help="ddp_gpt.py's --width")
    ap.add_argument("--depth", type=int, default=3, help="ddp_gpt.py's --depth")
    ap.add_argument("--codecs", default="topk:ratio=0.06,chunk=4096,bits=2@1.8,0.2")
    ap.add_argument("--period", type=int, default=8)
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument("--overlap", type=int, default=2)
    ap.add_argument("--pacing", type=int, default=None,
                    help="ddp_gpt.py's --pacing for the streaming run (default: its own)")
    ap.add_argument("--merge", default="after_step", choices=["after_step", "before_update"],
                    help="ddp_gpt.py's --merge for the streaming run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="each seed's three runs this many times, interleaved (utilization "
                         "against the same round's run without communication, and medians)")
    ap.add_argument("--cpus", default="", help="cores a host (scripts/cluster up --cpus)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default="/tmp/gcomp_streaming")
    a = ap.parse_args()
    a.seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.out, exist_ok=True)
    rows, medians = [], []
    for rate in a.rates.split(","):
        subprocess.run([os.path.join(ROOT, "scripts", "cluster"), "up", "--hosts", "3", "--rate",
                        rate] + (["--cpus", a.cpus] if a.cpus else []), check=True)
        try:
            for spec in a.codecs.split(";"):
                codec, outer = spec.split("@")
                outer = tuple(float(v) for v in outer.split(","))
                for seed in a.seeds:
                    rounds = []
                    for r in range(a.repeat):
                        got = {k: run(a, rate, codec, outer, seed, k, a.out, r)
                               for k in ("compute", "periodic", "streaming")}
                        rounds.append(got)
                        for k in ("periodic", "streaming"):
                            g = got[k]
                            rows.append((rate, codec, seed, k, g, got["compute"]["seconds"]))
                            print(json.dumps({"rate": rate, "codec": codec, "seed": seed,
                                              "kind": k, "round": r,
                                              **{x: g[x] for x in g if x != "links"},
                                              "compute_seconds": got["compute"]["seconds"]}),
                                  flush=True)
                    if a.repeat > 1:
                        medians.append((rate, codec, seed, rounds))
        finally:
            subprocess.run([os.path.join(ROOT, "scripts", "cluster"), "down"], check=False)
    print("| rate | codec | seed | run | loop s | utilization | averages' wait s | loss | "
          "sent MB/rank | mean link tx kB/s | busiest 100 ms kB |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for rate, codec, seed, kind, g, compute in rows:
        label = kind if kind == "periodic" else f"F={a.fragments}, T={a.overlap}"
        print(f"| {rate} | `{codec}` | {seed} | {label} | {g['seconds']:.1f} | "
              f"{compute / g['seconds']:.3f} | {g['average_seconds']:.2f} | {g['loss']:.4f} | "
              f"{g['mb']:.2f} | {g['mean_tx'] / 1e3:.1f} | {g['busiest_tx'] / 1e3:.1f} |")
    if medians:
        print()
        print("| rate | seed | run | loop s, each round | median s | utilization, each round "
              "| median's utilization | rounds at least 0.95 |")
        print("|---|---:|---|---|---:|---|---:|---:|")
        for rate, codec, seed, rounds in medians:
            base = statistics.median(g["compute"]["seconds"] for g in rounds)
            for k in ("compute", "periodic", "streaming"):
                secs = [g[k]["seconds"] for g in rounds]
                label = {"compute": "without communication", "periodic": "periodic"}.get(
                    k, f"F={a.fragments}, T={a.overlap}")
                if k == "compute":
                    print(f"| {rate} | {seed} | {label} | {', '.join(f'{x:.1f}' for x in secs)} "
                          f"| {statistics.median(secs):.1f} | | | |")
                    continue
                each = [g["compute"]["seconds"] / g[k]["seconds"] for g in rounds]
                print(f"| {rate} | {seed} | {label} | {', '.join(f'{x:.1f}' for x in secs)} | "
                      f"{statistics.median(secs):.1f} | {', '.join(f'{u:.3f}' for u in each)} | "
                      f"{base / statistics.median(secs):.3f} | "
                      f"{sum(u >= 0.95 for u in each)} of {len(each)} |")


if __name__ == "__main__":
    main()
