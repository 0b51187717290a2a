#!/usr/bin/env bash
# The interposer (libgcomp_preload.so) end to end:
#   preload_test.sh PRELOAD CALLS PLAIN_TRAIN GCOMP_TRAIN MPIEXEC SCRATCH
# - the calls it must pass through are bit-identical with and without it (1, 2 and 4 ranks), and
#   a taken call equals gcomp_allreduce with the same codec, seed and error feedback;
# - bad settings fail at MPI_Init on every rank with a one-line message naming the variable (a
#   low-rank codec among them: the interposer has no shapes);
# - ranks whose settings differ fail at the first taken call on every rank, within a time limit;
# - a late rank is named (GCOMP_STALL_SECONDS), or fails every rank (GCOMP_TIMEOUT_SECONDS);
# - the plain training program: with GCOMP_CODEC=none the same weights, bit for bit, as without
#   the interposer; with top-k 1% + error feedback it trains, and sends >= 20x fewer bytes;
# - gcomp-train under it: nothing taken twice (gcomp's own traffic is not the program's).
# Every run is bounded by a timeout. Exits 77 (skipped) without Fashion-MNIST.
set -u
PRE=$1 CALLS=$2 TRAIN=$3 GTRAIN=$4 M=$5 S=$6
DATA=${GCOMP_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
abs() { case $1 in /* | "") echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
PRE=$(abs "$PRE") CALLS=$(abs "$CALLS") TRAIN=$(abs "$TRAIN") GTRAIN=$(abs "$GTRAIN")
mkdir -p "$S" && cd "$S" || exit 1

fail() {
  echo "preload_test: FAIL: $*" >&2
  exit 1
}

# run P [VAR=VALUE...] PROGRAM ARGS: under mpiexec, the interposer preloaded in every rank when
# the first argument after P is "pre"; stdout in out.txt, stderr in err.txt; returns the status.
run() {
  local p=$1 pre=
  shift
  if [ "$1" = pre ]; then
    pre="LD_PRELOAD=$PRE"
    shift
  fi
  timeout -k 10 300 "$M" -n "$p" env $pre "$@" >out.txt 2>err.txt
}

for p in 1 2 4; do
  run "$p" "$CALLS" || fail "calls on $p ranks: $(head -c 2000 err.txt)"
  grep '^pass_' out.txt >plain.txt
  run "$p" pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_ALGORITHM=sparse_allgather GCOMP_STATS=1 \
    "$CALLS" || fail "calls under the interposer on $p ranks: $(head -c 2000 err.txt)"
  grep '^pass_' out.txt >under.txt
  [ "$(wc -l <plain.txt)" -ge 6 ] || fail "calls printed $(wc -l <plain.txt) pass-through cases"
  diff plain.txt under.txt >/dev/null || fail "$p ranks: a pass-through call changed: $(diff plain.txt under.txt)"
  grep -q '^taken_equals_gcomp_allreduce yes$' out.txt ||
    fail "$p ranks: the taken call differs from gcomp_allreduce: $(cat out.txt)"
  grep -q '^taken_in_place_equals yes$' out.txt || fail "$p ranks: in place differs: $(cat out.txt)"
  # Taken: the two float sums of the fresh communicator; everything else passed.
  grep -q 'gcomp preload: rank 0: taken=2 ' err.txt || fail "$p ranks: $(cat err.txt)"
done

# Error feedback per call site: a site's residual is kept (the default) or freed when the
# memory bound is reached (GCOMP_EF_MEMORY_MB=1 holds two of the three sites' residuals).
run 2 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_ALGORITHM=sparse_allgather "$CALLS" sites ||
  fail "sites: $(head -c 2000 err.txt)"
grep -q '^site_kept yes$' out.txt && grep -q '^site_from_zero no$' out.txt ||
  fail "sites: the first site's residual was not kept: $(cat out.txt)"
run 2 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_ALGORITHM=sparse_allgather GCOMP_EF_MEMORY_MB=1 \
  "$CALLS" sites || fail "sites, 1 MiB: $(head -c 2000 err.txt)"
grep -q '^site_from_zero yes$' out.txt && grep -q '^site_kept no$' out.txt ||
  fail "sites, 1 MiB: the first site's residual was not freed: $(cat out.txt)"

# MPI_THREAD_MULTIPLE: the initializing thread's call is taken, another thread's passes through
# bit for bit (skipped where MPICH does not provide MULTIPLE).
run 2 "$CALLS" threads || fail "threads: $(head -c 2000 err.txt)"
if grep -q '^provided 3$' out.txt; then
  grep '^threads_' out.txt >plain.txt
  run 2 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_STATS=1 "$CALLS" threads ||
    fail "threads under the interposer: $(head -c 2000 err.txt)"
  grep '^threads_' out.txt >under.txt
  [ "$(grep '^threads_other' plain.txt)" = "$(grep '^threads_other' under.txt)" ] ||
    fail "threads: the other thread's call changed: $(cat plain.txt under.txt)"
  [ "$(grep '^threads_main' plain.txt)" != "$(grep '^threads_main' under.txt)" ] ||
    fail "threads: the main thread's call was not taken: $(cat under.txt)"
  grep -q 'gcomp preload: rank 0: taken=1 passed=1 ' err.txt || fail "threads: $(cat err.txt)"
else
  echo "preload_test: MPI_THREAD_MULTIPLE not provided: $(cat out.txt)" >&2
fi

# bad VAR=VALUE WORD: fails at init, non-zero on every rank, one line naming VAR=VALUE.
bad() {
  run 2 pre GCOMP_ALGORITHM=auto "$1" "$CALLS"
  local rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "$1: hung"
  [ "$rc" -ne 0 ] || fail "$1: exited 0"
  grep -q "gcomp preload: rank 0: $1: " err.txt || fail "$1: no message naming it: $(head -c 2000 err.txt)"
  [ "$(grep -c 'gcomp preload' err.txt)" -eq 1 ] || fail "$1: not one line: $(cat err.txt)"
  [ ! -s out.txt ] || fail "$1: the program ran on: $(cat out.txt)"
}
bad GCOMP_CODEC=bogus
bad GCOMP_CODEC=topk:ratio=2
bad GCOMP_MIN_COUNT=many
bad GCOMP_EF=maybe
bad GCOMP_ALGORITHM=fastest
bad GCOMP_STATS=loud
bad GCOMP_STALL_SECONDS=soon
bad GCOMP_TIMEOUT_SECONDS=-1
# A low-rank codec needs shapes, which MPI_Allreduce does not give: refused at init, saying so.
bad GCOMP_CODEC=powersgd:rank=2
grep -q "needs each tensor's shape" err.txt || fail "powersgd: $(cat err.txt)"

# A rank that does not come (the last of 3 is 2 s late to the second taken call): with
# GCOMP_STALL_SECONDS each waiting rank names it once and the job completes; with
# GCOMP_TIMEOUT_SECONDS every rank fails the call, the late one too (it waits at most the
# timeout again), and none hangs: the job ends through the error handler (fatal by default), or
# every rank's MPI_Allreduce returns an error under MPI_ERRORS_RETURN.
run 3 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_STALL_SECONDS=0.5 "$CALLS" late 2 ||
  fail "late, stall: $(head -c 2000 err.txt)"
[ "$(grep -c '^late_status [0-2] ok$' out.txt)" -eq 3 ] || fail "late, stall: $(cat out.txt)"
for r in 0 1; do
  [ "$(grep -c "^gcomp: rank $r has waited" err.txt)" -eq 1 ] || fail "late, stall: rank $r: $(cat err.txt)"
done
grep "^gcomp: rank" err.txt | grep -v "taken call 2 on its communicator); not there: rank 2 (at no gcomp call)$" &&
  fail "late, stall: a report that does not name the call and rank 2 alone"
grep -q "^gcomp: rank 2 " err.txt && fail "late, stall: the late rank reported: $(cat err.txt)"
run 3 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_TIMEOUT_SECONDS=0.5 "$CALLS" late 2
rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "late, timeout: hung"
[ "$rc" -ne 0 ] || fail "late, timeout: exited 0"
# Ranks 0 and 1 both wait; whichever times out first aborts the job (the fatal handler), so the
# message may be either one's, never the late rank's.
grep -q "gcomp preload: rank \([01]\): MPI_Allreduce: rank \1 waited 0.5 s (the timeout) .*not there: rank 2 (at no gcomp call)" err.txt ||
  fail "late, timeout: $(head -c 3000 err.txt)"
run 3 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_TIMEOUT_SECONDS=0.5 "$CALLS" late 2 return ||
  fail "late, timeout, errors returned: $(head -c 2000 err.txt)"
[ "$(grep -c '^late_status [0-2] error$' out.txt)" -eq 3 ] ||
  fail "late, timeout, errors returned: not every rank failed: $(cat out.txt)"
grep -q "gcomp preload: rank 2: MPI_Allreduce: rank 2 waited 0.5 s (the timeout) .*gave up on this call" err.txt ||
  fail "late, timeout, errors returned: the late rank: $(head -c 3000 err.txt)"

# Settings that differ between ranks: every rank fails at the first taken call, none hangs.
timeout -k 10 120 "$M" -n 1 env LD_PRELOAD="$PRE" GCOMP_CODEC=topk:ratio=0.01 "$CALLS" : \
  -n 1 env LD_PRELOAD="$PRE" GCOMP_CODEC=fp16 "$CALLS" >out.txt 2>err.txt
rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "differing settings: hung"
[ "$rc" -ne 0 ] || fail "differing settings: exited 0"
[ "$(grep -c "settings differ" err.txt)" -eq 2 ] || fail "differing settings: not on both ranks: $(head -c 3000 err.txt)"
grep -q '^pass_intercomm' out.txt || fail "differing settings: the calls before the first taken one did not run"

if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "preload_test: no Fashion-MNIST in $DATA: the training runs are skipped" >&2
  exit 77
fi

# The plain program: 300 steps on 4 ranks.
run 4 "$TRAIN" "$DATA" 300 || fail "plain_train: $(head -c 2000 err.txt)"
plain=$(grep '^plain_train:' out.txt) || fail "plain_train printed $(cat out.txt)"
run 4 pre GCOMP_CODEC=none GCOMP_STATS=1 "$TRAIN" "$DATA" 300 || fail "plain_train, none: $(head -c 2000 err.txt)"
none=$(grep '^plain_train:' out.txt)
grep -q 'taken=300 ' err.txt || fail "none: not every step taken: $(cat err.txt)"
[ "${plain##*weights=}" = "${none##*weights=}" ] || fail "none changed the weights: $plain / $none"
# The same with the gradients summed (momentum applied after the sum), and a bad mode.
run 4 "$TRAIN" "$DATA" 100 gradient || fail "plain_train, gradient: $(head -c 2000 err.txt)"
plain=$(grep '^plain_train:' out.txt)
run 4 pre GCOMP_CODEC=none "$TRAIN" "$DATA" 100 gradient || fail "gradient, none: $(head -c 2000 err.txt)"
none=$(grep '^plain_train:' out.txt)
[ "${plain##*weights=}" = "${none##*weights=}" ] || fail "none changed the weights (gradient): $plain / $none"
[ "${plain##*sum=gradient }" != "$plain" ] || fail "the gradient mode did not say so: $plain"
run 2 "$TRAIN" "$DATA" 10 momentum && fail "plain_train accepted a bad mode"
grep -q 'velocity or gradient' err.txt || fail "bad mode: $(cat err.txt)"
# (The algorithm pinned: on an unshaped loopback auto may find the dense sum of the decoded
# contributions fastest, which applies the codec but sends float32.)
run 4 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_ALGORITHM=sparse_reduce_scatter GCOMP_STATS=1 \
  "$TRAIN" "$DATA" 300 ||
  fail "plain_train, top-k: $(head -c 2000 err.txt)"
topk=$(grep '^plain_train:' out.txt)
acc=$(sed 's/.*accuracy=\([0-9.]*\).*/\1/' <<<"$topk")
red=$(sed -n 's/.*reduction=\([0-9.]*\)x.*/\1/p' err.txt)
awk -v a="$acc" 'BEGIN { exit !(a > 0.70) }' || fail "top-k did not train: $topk"
awk -v r="$red" 'BEGIN { exit !(r >= 20) }' || fail "top-k sent only ${red}x fewer bytes: $(cat err.txt)"

# gcomp-train under the interposer: its allreduces are gcomp's own, none is taken.
if [ -x "$GTRAIN" ]; then
  args=(--data "$DATA" --codec topk:ratio=0.01 --epochs 1 --subset 2000 --test-subset 500 --seed 3)
  run 2 "$GTRAIN" "${args[@]}" || fail "gcomp-train: $(head -c 2000 err.txt)"
  # Each epoch's line without its seconds: loss, test accuracy, bytes.
  sed -n 's/^\(epoch .*\)  [0-9.]* s$/\1/p' out.txt >alone.txt
  [ -s alone.txt ] || fail "gcomp-train printed no epoch line: $(cat out.txt)"
  run 2 pre GCOMP_CODEC=topk:ratio=0.01 GCOMP_STATS=1 "$GTRAIN" "${args[@]}" ||
    fail "gcomp-train under the interposer: $(head -c 2000 err.txt)"
  grep -q 'gcomp preload: rank 0: taken=0 ' err.txt || fail "gcomp-train: calls taken: $(cat err.txt)"
  sed -n 's/^\(epoch .*\)  [0-9.]* s$/\1/p' out.txt >under.txt
  diff alone.txt under.txt >/dev/null ||
    fail "gcomp-train changed under the interposer: $(cat alone.txt) / $(cat under.txt)"
fi
echo "preload_test: ok"
