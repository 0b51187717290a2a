#!/usr/bin/env bash
# End-to-end test of gcomp-train under MPI: usage:
#   train_cli_test.sh GCOMP_TRAIN MPIEXEC SCRATCH_DIR
# A one-epoch run on a subset of Fashion-MNIST with 2 ranks (its JSON record checked field by
# field) and the same with periodic averaging (--period 8: its averages and bytes), then bad
# flags, a missing and a corrupt data set, an unwritable record and a run that diverges: each
# must exit non-zero with a message that names the problem, within a time limit (a hang fails).
# Exits 77 (skipped) when Fashion-MNIST is not installed and no --data is given.
# Needs bash, timeout and python3 (standard library only, to read the JSON).
set -u

T=${1:?usage: train_cli_test.sh GCOMP_TRAIN MPIEXEC SCRATCH_DIR}
M=${2:?usage: train_cli_test.sh GCOMP_TRAIN MPIEXEC SCRATCH_DIR}
S=${3:?usage: train_cli_test.sh GCOMP_TRAIN MPIEXEC SCRATCH_DIR}
DATA=${GCOMP_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -x "$T" ] || { echo "train_cli_test: $T is not an executable" >&2; exit 1; }
case $T in /*) ;; *) T=$PWD/$T ;; esac
mkdir -p "$S" && S=$(cd "$S" && pwd) && cd "$S" || exit 1
rm -f ./*.json ./*.txt

fail() {
  echo "train_cli_test: FAIL: $*" >&2
  exit 1
}

# train P ARGS...: gcomp-train on P ranks with a time limit; stdout in out.txt, stderr in err.txt.
train() {
  local p=$1
  shift
  timeout 180 "$M" -n "$p" "$T" "$@" >out.txt 2>err.txt
}

# bad RC WORD ARGS...: 2 ranks must exit RC (not a crash, not the time limit) and stderr must
# mention WORD.
bad() {
  local want_rc=$1 word=$2
  shift 2
  train 2 "$@"
  local rc=$?
  [ "$rc" -ne 124 ] || fail "gcomp-train $* hung (killed after 180 s)"
  [ "$rc" -eq "$want_rc" ] || fail "gcomp-train $* exited $rc, expected $want_rc: $(head -c 2000 err.txt)"
  grep -qF -- "$word" err.txt || fail "gcomp-train $*: stderr does not mention '$word': $(head -c 2000 err.txt)"
}

# ---- errors that need no data ----
bad 2 "epochs" --epochs 0
bad 2 "ratio" --codec topk:ratio=7
bad 2 "dgc" --codec dgc:rate=0.1
bad 2 "unknown model" --model resnet
bad 2 "schedule" --schedule step
bad 2 "--bogus" --bogus
bad 2 "--warmup-steps" --optimizer adamw
bad 2 "unknown optimizer" --optimizer lamb --warmup-steps 10
bad 2 "--zero-one must be" --optimizer adamw --zero-one 90,x
bad 2 "--zero-one is Adam's" --zero-one 90
bad 2 "--period must be at least 1" --period 0
bad 2 "--period: a count" --period -1
bad 2 "--outer-lr means nothing without --period" --outer-lr 0.5
bad 2 "--period > 1 with dgc" --period 4 --codec dgc:ratio=0.01
bad 2 "no such directory" --data "$S/not-there"
mkdir -p corrupt
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  head -c 100 /dev/zero >corrupt/$f
done
bad 2 "corrupt/train-images-idx3-ubyte" --data "$S/corrupt"
grep -qF "magic" err.txt || fail "a corrupt file's error does not give the reason: $(cat err.txt)"

if [ ! -d "$DATA" ]; then
  echo "train_cli_test: Fashion-MNIST is not installed ($DATA): skipping the training runs"
  exit 77
fi

bad 1 "cannot write" --data "$DATA" --out "$S/no-such-dir/run.json" --epochs 1 --subset 640
bad 1 "diverged" --data "$DATA" --lr 1e12 --schedule constant --epochs 1 --subset 2000 --test-subset 100

# ---- a short run: 2 ranks, top-k 1% with error feedback ----
train 2 --data "$DATA" --codec topk:ratio=0.01 --epochs 1 --subset 4000 --test-subset 1000 --out run.json
rc=$?
[ "$rc" -eq 0 ] || fail "the short run exited $rc: $(head -c 2000 err.txt)"
grep -q "epoch 1/1 .*test" out.txt || fail "no progress line: $(cat out.txt)"
python3 - run.json <<'EOF' || fail "the JSON record is not what it should be"
import json, sys
r = json.load(open(sys.argv[1]))
c = r["config"]
assert c["codec"] == "topk:ratio=0.01" and c["error_feedback"] is True, c
assert c["ranks"] == 2 and c["global_batch"] == 2 * c["batch_per_rank"], c
assert r["parameters"] == 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10, r["parameters"]
(e,) = r["epochs"]
assert e["epoch"] == 1
assert 0 < e["train_loss"] < 2.3, e               # below a uniform guess, ln 10
assert e["test_accuracy"] > 0.5, e                # chance is 0.1
# 1% as (value, packed index) pairs, about 5.2 bytes an entry against a dense allreduce's 4
# bytes an element at 2 ranks: 4 / 0.052 = 77x, less the biases sent dense and the agreements.
assert 55 < e["reduction_vs_dense"] < 80, e
assert abs(e["dense_bytes_per_rank"] / e["bytes_sent_per_rank"] - e["reduction_vs_dense"]) < 1e-9
s = e["seconds"]
for k in ("wall", "compute", "encode", "communicate", "decode"):
    assert s[k] >= 0, (k, s)
assert s["encode"] > 0 and s["compute"] > 0, s
assert s["compute"] + s["encode"] + s["communicate"] + s["decode"] <= 1.05 * s["wall"] + 0.05, s
assert c["period"] == 1 and c["momentum_at_average"] == "local" and e["averages"] == 0, (c, e)
EOF

# ---- the same, averaged every 8 steps: 62 local steps, averages after 8, 16, ..., 56 and at
# the epoch's end ----
train 2 --data "$DATA" --codec topk:ratio=0.01 --epochs 1 --subset 4000 --test-subset 1000 \
  --period 8 --out periodic.json
rc=$?
[ "$rc" -eq 0 ] || fail "the periodic run exited $rc: $(head -c 2000 err.txt)"
grep -q "averaged every 8 steps" out.txt || fail "no period in the first line: $(cat out.txt)"
python3 - run.json periodic.json <<'EOF' || fail "the periodic run's record is not what it should be"
import json, sys
(e,) = json.load(open(sys.argv[1]))["epochs"]
r = json.load(open(sys.argv[2]))
c = r["config"]
assert (c["period"], c["period_from"], c["outer_lr"], c["outer_momentum"],
        c["momentum_at_average"]) == (8, 0, 1.0, 0.0, "local"), c
(p,) = r["epochs"]
assert p["averages"] == 8, p
assert p["test_accuracy"] > 0.5, p
# 8 collectives against 62: about 62 / 8 times fewer bytes than the synchronized run.
assert 5 < e["bytes_sent_per_rank"] / p["bytes_sent_per_rank"] < 10, (e, p)
EOF
# ---- top-k per chunk with 2-bit codes (the spec as the trainer takes any): it trains, and an
# entry costs at most 12 index bits, 2 code bits and a share of its chunk's scale ----
train 2 --data "$DATA" --codec topk:ratio=0.01,chunk=4096,bits=2 --epochs 1 --subset 4000 \
  --test-subset 1000 --out chunked.json
rc=$?
[ "$rc" -eq 0 ] || fail "the top-k per chunk run exited $rc: $(head -c 2000 err.txt)"
python3 - run.json chunked.json <<'EOF' || fail "the top-k per chunk run is not what it should be"
import json, sys
(e,) = json.load(open(sys.argv[1]))["epochs"]
r = json.load(open(sys.argv[2]))
assert r["config"]["codec"] == "topk:ratio=0.01,chunk=4096,bits=2", r["config"]
(c,) = r["epochs"]
assert c["test_accuracy"] > 0.5, c
# Under 15 bits an entry against about 42 (f32 values and packed gaps): over 2.5 times fewer
# bytes than top-k 1%, the biases' dense sums and the agreements aside on both.
assert c["bytes_sent_per_rank"] * 2.5 < e["bytes_sent_per_rank"], (c, e)
EOF
echo "train_cli_test: all passed"
