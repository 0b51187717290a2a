#!/usr/bin/env bash
# python_examples/compare_hooks.py end to end, briefly: three rows (DDP's allreduce, PowerSGD,
# gcomp's top-k) of the small MLP for 20 steps on 4 ranks; every row must have run and the CSV,
# table and plot must be written.
#   compare_hooks_test.sh PYTHON OUT_DIR PORT
set -euo pipefail
python=$1 out=$2 port=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
timeout -k 10 600 "$python" "$here/../../python_examples/compare_hooks.py" --model mlp \
  --network none --rows ddp,powersgd1,gcomp_topk1 --epochs 1 --max-steps 20 --eval-every 10 \
  --powersgd-start 5 --timeout 300 --port "$port" --out "$out"
csv=$out/compare_mlp_none.csv
test -s "$out/compare_mlp_none.md" && test -s "$out/compare_mlp_none.png"
"$python" - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["row"] for r in rows] == ["ddp", "powersgd1", "gcomp_topk1"], rows
for r in rows:
    assert not r["failed"], r
    assert 0.1 < float(r["accuracy"]) <= 1 and int(r["bytes_sent"]) > 0, r
PY
echo "compare_hooks.py: 3 rows written to $out"
