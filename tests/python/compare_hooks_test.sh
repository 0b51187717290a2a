#!/usr/bin/env bash
# python_examples/compare_hooks.py end to end, briefly: four rows (no communication, DDP's
# allreduce, PowerSGD, gcomp's top-k) of the small MLP for 20 steps on 4 ranks; every row must
# have run and the CSV, tables (the accuracy and bytes, and where the step's time goes) and plot
# must be written.
#   compare_hooks_test.sh PYTHON OUT_DIR PORT
set -euo pipefail
python=$1 out=$2 port=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
timeout -k 10 600 "$python" "$here/../../python_examples/compare_hooks.py" --model mlp \
  --network none --rows nocomm,ddp,powersgd1,gcomp_topk1 --epochs 1 --max-steps 20 --eval-every 10 \
  --powersgd-start 5 --timeout 300 --port "$port" --out "$out"
csv=$out/compare_mlp_none.csv
test -s "$out/compare_mlp_none.md" && test -s "$out/compare_mlp_none.png"
"$python" - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["row"] for r in rows] == ["nocomm", "ddp", "powersgd1", "gcomp_topk1"], rows
for r in rows:
    assert not r["failed"], r
    assert 0.1 < float(r["accuracy"]) <= 1, r
    assert (int(r["bytes_sent"]) == 0) == r["row"].startswith("nocomm"), r
PY
# The split: a line per row; gcomp's with its communication thread's 8 figures (the last its CPU
# time), all numbers;
# then the table of gcomp's collectives.
"$python" - "$out/compare_mlp_none.md" <<'PY'
import sys
text = open(sys.argv[1]).read()
assert "Where a step's time goes" in text, text
# The top-k row is the one line (gt.register, momentum moved into the hook), and says so.
one = [l for l in text.splitlines() if l.startswith("Registered with the one line")]
assert len(one) == 1 and one[0].endswith(": gcomp_topk1."), text
lines = {l.split("|")[1].strip(): l for l in text.splitlines() if l.startswith("| ")}
for row in ("nocomm", "ddp", "powersgd1", "gcomp_topk1"):
    cells = [c.strip() for c in lines[row].split("|")[2:-1]] if row in lines else []
    assert cells, (row, text)
split, calls = text.split("Where a step's time goes")[1].split("gcomp's collectives")
g = [c.strip() for c in [l for l in split.splitlines() if l.startswith("| gcomp_topk1 |")][-1].split("|")[2:-1]]
assert len(g) == 12 and all(c for c in g), g
float(g[0]); float(g[4]); float(g[6]); assert float(g[11]) > 0, g
# gcomp's collectives: calls = with the codec + uncompressed, and the algorithms' counts add up.
c = [c.strip() for c in [l for l in calls.splitlines() if l.startswith("| gcomp_topk1 |")][-1].split("|")[2:-1]]
total, coded, plain = int(c[0]), int(c[1]), int(c[2])
assert total > 0 and total == coded + plain, c
assert sum(int(p.split()[1]) for p in c[3].split(", ")) == total, c
PY
echo "compare_hooks.py: 4 rows written to $out"
