#!/usr/bin/env bash
# bench/gpu_table.py (the table scripts/gpu-check prints): medians picked from Google Benchmark's
# aggregates, shares of the device copy, the torch ratio, errors shown, targets counted, and the
# exit status 1 when a target is missed (0 when all are met); then bench/gpu_stages.py (its stage
# breakdown).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
row() {  # name ms gbps ratio
  printf '{"name": "%s/real_time_median", "run_name": "%s/real_time", "run_type": "aggregate",
   "aggregate_name": "median", "real_time": %s, "time_unit": "ms", "gbps": %s, "ratio": %s},
  {"name": "%s/real_time_mean", "run_name": "%s/real_time", "run_type": "aggregate",
   "aggregate_name": "mean", "real_time": 99, "time_unit": "ms", "gbps": 1, "ratio": 1},\n' \
    "$1" "$1" "$2" "$3" "$4" "$1" "$1"
}
{
  echo '{"context": {}, "benchmarks": ['
  row copy 0.5 2000 0
  row encode/fp16 0.6 1600 2
  row encode/qsgd:bits=4 2.5 400 7.8
  row encode/topk:ratio=0.01 2.0 500 12.5
  echo '{"name": "decode_add/sign/real_time", "run_name": "decode_add/sign/real_time",
         "run_type": "iteration", "error_occurred": true, "error_message": "no | kernel"}]}'
} >"$tmp/g.json"
echo '{"device": "GPU X", "torch": "9", "n": 1024,
       "seconds": {"copy": 0.0005, "encode/topk:ratio=0.01": 0.012}}' >"$tmp/t.json"

set +e
"$py" "$root/bench/gpu_table.py" "$tmp/g.json" "$tmp/t.json" >"$tmp/out.md"
rc=$?
set -e
cat "$tmp/out.md"
fail() { echo "gpu_table_test: $*" >&2; exit 1; }
[[ $rc -eq 1 ]] || fail "exit status $rc with a missed target, expected 1"
grep -q '| encode/fp16 | 0.6 | 1600 | 80% | 2 | - | - | >= 50% of copy | yes |' "$tmp/out.md" ||
  fail "fp16 row (median, share of copy, met)"
grep -q '| encode/qsgd:bits=4 | 2.5 | 400 | 20% | 7.8 | - | - | >= 50% of copy | NO |' "$tmp/out.md" ||
  fail "qsgd row (missed target)"
grep -q '| encode/topk:ratio=0.01 | 2 | 500 | 25% | 12.5 | 12 | 6.0x | >= 5x torch.topk | yes |' \
  "$tmp/out.md" || fail "top-k row (ratio to torch)"
grep -q '| decode_add/sign | error: no / kernel |' "$tmp/out.md" || fail "error row"
grep -q 'targets met: 2 of 4' "$tmp/out.md" || fail "target count"

# All targets met: exit status 0.
{
  echo '{"context": {}, "benchmarks": ['
  row copy 0.5 2000 0
  row encode/fp16 0.6 1600 2
  row encode/topk:ratio=0.01 2.0 500 12.5
  echo '{"name": "end", "run_name": "copy/real_time", "run_type": "aggregate",
         "aggregate_name": "mean", "real_time": 1, "time_unit": "ms"}]}'
} >"$tmp/g2.json"
"$py" "$root/bench/gpu_table.py" "$tmp/g2.json" "$tmp/t.json" >"$tmp/out2.md" ||
  fail "exit status $? with every target met"
grep -q 'targets met: 2 of 2' "$tmp/out2.md" || fail "target count when all are met"

# bench/gpu_stages.py: medians per stage per op and size, shares of their sum; other lines ignored.
cat >"$tmp/stages.log" <<'LOG'
Run on (16 X 2000 MHz CPU s)
gcomp-cuda-stages encode/topk n=1024 first_pass=1.0000 select=3.0000
gcomp-cuda-stages encode/topk n=1024 first_pass=2.0000 select=1.0000
gcomp-cuda-stages encode/topk n=1024 first_pass=9.0000 select=2.0000
gcomp-cuda-stages decode_add/qsgd n=1024 validate=0.5000 add=0.5000
LOG
"$py" "$root/bench/gpu_stages.py" "$tmp/stages.log" >"$tmp/stages.md"
cat "$tmp/stages.md"
grep -q '^encode/topk, n = 1024 (3 calls; medians):' "$tmp/stages.md" || fail "stages: heading"
grep -q '| first_pass | 2.0000 | 50% |' "$tmp/stages.md" || fail "stages: median and share"
grep -q '| select | 2.0000 | 50% |' "$tmp/stages.md" || fail "stages: second stage"
grep -q '| (sum) | 4.0000 | |' "$tmp/stages.md" || fail "stages: sum of medians"
grep -q '| add | 0.5000 | 50% |' "$tmp/stages.md" || fail "stages: second op"
echo 'nothing here' >"$tmp/none.log"
if "$py" "$root/bench/gpu_stages.py" "$tmp/none.log" >/dev/null; then
  fail "stages: no lines must exit 1"
fi
echo "gpu_table_test: ok"
