#!/usr/bin/env bash
# The timeline (docs/timeline.md) of every kind of program, each rank's file merged by
# scripts/timeline and checked by it (well formed, the spans of each thread nested, every async
# event ended, every call holding its agreement, one span a call):
# - Python's Communicator under GCOMP_TIMELINE, 3 ranks: calls of several codecs and algorithms
#   (auto among them), a call of buckets, and one that fails on every rank (tests/timeline/calls.py);
# - the interposer under GCOMP_TIMELINE (a C program's MPI_Allreduce taken; the program's own
#   gcomp_allreduce beside them), 2 ranks;
# - gcomp.torch, 3 ranks: register(timeline=FILE) and DistributedOptimizer under GCOMP_TIMELINE,
#   with streaming averages: besides the calls, an optimizer step span a step and an average from
#   start to merge for each one the statistics count, on every rank;
# - the checker itself fails on a file that breaks each rule (tests/timeline/test_check.py).
#   timeline_test.sh MPIEXEC PYTHON SOURCE_DIR PRELOAD CALLS SCRATCH [all|calls]
# (PRELOAD "none": not built; "calls": the library's part only, without gcomp.torch's jobs.)
set -euo pipefail
M=$1 PY=$2 SRC=$3 PRE=$4 CALLS=$5 S=$6 PARTS=${7:-all}
mkdir -p "$S" && cd "$S"
rm -f ./*.json
fail() { echo "timeline_test: FAIL: $*" >&2; exit 1; }
check() { "$PY" "$SRC/scripts/timeline" merge "$1" && "$PY" "$SRC/scripts/timeline" check "$@"; }

out=$(GCOMP_TIMELINE=calls.json timeout -k 10 300 "$M" -n 3 "$PY" "$SRC/tests/timeline/calls.py")
n=$(sed -n 's/^calls \([0-9]*\)$/\1/p' <<<"$out")
[ -n "$n" ] || fail "calls.py printed no count: $out"
check calls.json --calls "$n" || fail "the calls' timeline"

if [ "$PRE" != none ]; then
  GCOMP_TIMELINE=preload.json LD_PRELOAD=$PRE GCOMP_CODEC=topk:ratio=0.01 \
    GCOMP_ALGORITHM=sparse_allgather GCOMP_STATS=1 timeout -k 10 300 "$M" -n 2 "$CALLS" \
    >preload.out 2>preload.err || fail "the interposer's calls: $(head -c 2000 preload.err)"
  taken=$(sed -n 's/.*rank 0: taken=\([0-9]*\) .*/\1/p' preload.err)
  [ "$taken" = 2 ] || fail "the interposer took '$taken' calls: $(cat preload.err)"
  # The two taken calls and the program's own gcomp_allreduce that it compares them with.
  check preload.json --calls 3 || fail "the interposer's timeline"
  named=$("$PY" -c "import json, sys; print(sum(e.get('cat') == 'call' and
    e['name'].startswith(\"the program's MPI_Allreduce, taken call\") for e in json.load(open(sys.argv[1]))))" preload.json)
  [ "$named" = 4 ] || fail "the taken calls' spans on 2 ranks: $named, not 4"
fi

ways=(register optimizer)
[ "$PARTS" = calls ] && ways=()
for way in "${ways[@]}"; do
  if [ "$way" = register ]; then
    out=$(timeout -k 10 300 "$M" -n 3 "$PY" "$SRC/tests/timeline/torch_job.py" register torch.json)
  else
    out=$(GCOMP_TIMELINE=torch.json timeout -k 10 300 "$M" -n 3 "$PY" \
      "$SRC/tests/timeline/torch_job.py" optimizer unused)
  fi
  read -r calls steps averages < <(sed -n 's/^calls \([0-9]*\) steps \([0-9]*\) averages \([0-9]*\)$/\1 \2 \3/p' <<<"$out")
  [ -n "${averages:-}" ] || fail "$way: torch_job.py printed no counts: $out"
  check torch.json --calls "$calls" || fail "$way: the timeline"
  "$PY" - torch.json "$steps" "$averages" "$way" <<'PY' || fail "$way: the steps and averages"
import json, sys
from collections import Counter
events = json.load(open(sys.argv[1]))
steps, averages, way = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for rank in sorted({e["pid"] for e in events}):
    mine = [e for e in events if e["pid"] == rank]
    kinds = Counter((e["ph"], e.get("cat"), e["name"]) for e in mine)
    assert kinds[("X", "step", "optimizer step")] == steps, (rank, kinds)
    assert kinds[("X", "step", "forward+backward")] == steps - 1, (rank, kinds)
    began = sum(n for (ph, cat, _), n in kinds.items() if ph == "b" and cat == "average")
    assert began == averages, (rank, began, averages)
    buckets = sum(n for (ph, cat, _), n in kinds.items() if ph == "b" and cat == "bucket")
    assert buckets >= 4 + averages, (rank, buckets)  # the synchronized steps' and averages'
    names = {e["args"]["name"] for e in mine if e["name"] == "thread_name"}
    assert names == {"training", "gcomp communication"}, (rank, names)
print(f"timeline_test: {way}: {steps} steps, {averages} averages on every rank")
PY
  rm -f torch*.json
done

"$PY" -m pytest -q -p no:cacheprovider "$SRC/tests/timeline/test_check.py"
echo "timeline_test: passed"
