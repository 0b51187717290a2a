#!/usr/bin/env bash
# scripts/sweep end to end, shortened: two configs, one epoch, 2 ranks. Checks the CSV's columns
# and rows, the table, the plot (when matplotlib is there), the per-run records, --replot, and
# that a bad --only is refused. Usage: sweep_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR
# Exits 77 (skipped) when Fashion-MNIST or Debian's /usr/bin/python3 is missing.
set -u
SRC=${1:?usage: sweep_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR}
B=${2:?usage: sweep_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR}
S=${3:?usage: sweep_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR}
DATA=${GCOMP_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
fail() {
  echo "sweep_test: FAIL: $*" >&2
  exit 1
}
[ -x /usr/bin/python3 ] || { echo "sweep_test: /usr/bin/python3 is missing: skipped"; exit 77; }
[ -d "$DATA" ] || { echo "sweep_test: Fashion-MNIST is not installed: skipped"; exit 77; }
rm -rf "$S" && mkdir -p "$S" || exit 1

timeout 600 "$SRC/scripts/sweep" --quick --epochs 1 --ranks 2 --only "dense,topk 1% + EF" \
  --build "$B" --data "$DATA" --out "$S" >"$S/out.txt" 2>&1 || fail "the sweep failed: $(tail -20 "$S/out.txt")"
grep -q "| topk 1% + EF | yes |" "$S/out.txt" || fail "no table printed: $(cat "$S/out.txt")"
/usr/bin/python3 - "$S" <<'PY' || fail "the sweep's files are not what they should be"
import csv, json, os, sys
d = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(d, "sweep.csv"))))
cols = ["compressor", "ef", "model", "ranks", "epochs", "test_accuracy", "bytes_sent_per_rank",
        "reduction_vs_dense", "wall_seconds"]
assert list(rows[0].keys())[:len(cols)] == cols, rows[0].keys()
assert [r["compressor"] for r in rows] == ["dense", "topk 1% + EF"], rows
dense, topk = rows
for r in rows:
    assert r["status"] == "ok" and r["model"] == "mlp" and r["ranks"] == "2" and r["epochs"] == "1", r
    assert 0.5 < float(r["test_accuracy"]) <= 1, r        # one epoch of all the data; chance is 0.1
    rec = json.load(open(os.path.join(d, "runs", "dense.json" if r is dense else "topk-1-ef.json")))
    assert abs(rec["epochs"][-1]["bytes_sent_per_rank"] - float(r["bytes_sent_per_rank"])) < 1, r
assert abs(float(dense["reduction_vs_dense"]) - 1) < 0.01, dense
# 2 ranks: 1% at about 5.2 bytes an entry (packed indices) against 4 bytes an element, 77x, less
# the biases sent dense and the agreements.
assert 55 < float(topk["reduction_vs_dense"]) < 80, topk
assert dense["ef"] == "no" and topk["ef"] == "yes"
md = open(os.path.join(d, "sweep.md")).read()
assert "| dense | no |" in md and "+0.00" in md, md
try:
    import matplotlib  # noqa: F401
    assert os.path.getsize(os.path.join(d, "sweep.png")) > 10000
except ImportError:
    pass
PY
rm -f "$S/sweep.md"
"$SRC/scripts/sweep" --replot --out "$S" >/dev/null 2>&1 || fail "--replot failed"
[ -s "$S/sweep.md" ] || fail "--replot wrote no table"
if "$SRC/scripts/sweep" --only "no such config" --build "$B" --out "$S" >/dev/null 2>"$S/err.txt"; then
  fail "an unknown --only was accepted"
fi
grep -q "unknown" "$S/err.txt" || fail "an unknown --only is not named: $(cat "$S/err.txt")"
echo "sweep_test: all passed"
