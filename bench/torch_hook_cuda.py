"""What gcomp's DDP hook adds per bucket on a GPU, against torch's own fp16_compress_hook.

For one DDP bucket of --mib MiB of float32 on the GPU (default 25, DDP's bucket_cap_mb), the
median wall time of gcomp's encode (into a preallocated payload, as gcomp.torch does) plus
decode_add of that payload into an accumulator, per codec, next to what torch's
fp16_compress_hook does to the same bucket besides its allreduce (the cast to float16 and the
copy back to float32), and a device-to-device copy of the bucket (the memory-bandwidth floor of
any pass over it). Each timed call ends with a stream synchronize, as gcomp's calls do (their
payload size comes back to the host).

    python3 bench/torch_hook_cuda.py [--mib 25] [--reps 50] [--json OUT.json]

Prints a Markdown table; scripts/gpu-check runs it. Needs the CUDA build of gcomp on PYTHONPATH.
"""

import argparse
import json
import statistics
import time

import torch

import gcomp

CODECS = ["topk:ratio=0.01", "qsgd:bits=4", "fp16"]


def median_seconds(f, reps, warmup=5):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=25)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    n = int(a.mib * (1 << 20)) // 4
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, device="cuda", generator=g)
    acc = torch.zeros_like(x)
    stream = torch.cuda.current_stream()
    rows = []

    copy_to = torch.empty_like(x)
    rows.append(("device copy (floor)", median_seconds(lambda: copy_to.copy_(x), a.reps), 4 * n))

    def fp16_hook_work():
        half = x.to(torch.float16)  # fp16_compress_hook: compress
        acc.copy_(half)  # its decompress into the bucket

    rows.append(("torch fp16_compress_hook cast", median_seconds(fp16_hook_work, a.reps), 2 * n))
    for spec in CODECS:
        codec = gcomp.Codec(spec)
        out = torch.empty(codec.max_bytes(n), dtype=torch.uint8, device="cuda")
        sizes = []

        def gcomp_work():
            p = codec.encode(x, seed=1, out=out, stream=stream.cuda_stream)
            gcomp.decode_add(p, acc, stream=stream.cuda_stream)
            sizes.append(p.numel())

        rows.append((f"gcomp {spec}", median_seconds(gcomp_work, a.reps), sizes[-1]))

    cast = rows[1][1]
    print(f"{a.mib:g} MiB bucket ({n} floats) on {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}, median of {a.reps}:\n")
    print("| per bucket | ms | payload bytes | vs the fp16 hook's cast |")
    print("|---|---:|---:|---:|")
    for name, sec, payload in rows:
        print(f"| {name} | {1e3 * sec:.3f} | {payload} | {sec / cast:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"mib": a.mib, "n": n, "device": torch.cuda.get_device_name(0),
                       "torch": torch.__version__,
                       "rows": [{"name": r[0], "seconds": r[1], "payload_bytes": r[2]}
                                for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
