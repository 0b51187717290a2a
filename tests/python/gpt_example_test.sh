#!/usr/bin/env bash
# python_examples/ddp_gpt.py end to end, briefly: 40 steps of the byte-level GPT on 3 ranks with
# the one line, an average every 4 steps from step 8 through top-k per chunk (1% of 4096, 2-bit
# codes) with error feedback decayed by 0.9, on the algorithm of the fewest bytes. The result
# line must say every rank ends with the same parameters, 8 averages, and an average far below
# the float32 model's bytes.
#   gpt_example_test.sh MPIEXEC PYTHON
set -euo pipefail
mpiexec=$1 python=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$(timeout -k 10 600 "$mpiexec" -n 3 "$python" "$here/../../python_examples/ddp_gpt.py" \
  --codec topk:ratio=0.01,chunk=4096,bits=2 --period 4 --period-from 8 --feedback-decay 0.9 \
  --algorithm fewest_bytes --steps 40 --eval-every 20 </dev/null)
echo "$out"
line=$(grep "^result:" <<<"$out")
"$python" - "$line" <<'PY'
import re, sys
line = sys.argv[1]
assert "same parameters on every rank: True" in line, line
m = re.search(r"(\d+) averages of ([0-9.]+) kB \((\d+)x less", line)
assert m and int(m.group(1)) == 8, line
# 366,432 floats (1.47 MB); 1% of each chunk at under 15 bits an entry is under 6.9 kB a
# payload, and the allgather (the fewest bytes at 3 ranks) sends two, with the agreement's 192
# bytes: under 14.5 kB, over 100 times less than the float32 model.
assert float(m.group(2)) < 14.5 and int(m.group(3)) > 100, line
loss = float(re.search(r"validation loss ([0-9.]+)", line).group(1))
assert 0 < loss < 5.6, line  # below a uniform guess over 256 bytes, ln 256 = 5.55
PY
# Streaming: 2 fragments, each merged a step after it starts, over the same 40 steps: fragment 0
# starts after the local steps 4, 8, ..., 32 (8 starts), fragment 1 after 2, 6, ..., 30 (8); all
# but the last merged in the loop, that one by average_parameters() at the end, which then
# averages the whole model once more (17 averages): every rank the same parameters.
out=$(timeout -k 10 600 "$mpiexec" -n 3 "$python" "$here/../../python_examples/ddp_gpt.py" \
  --codec topk:ratio=0.01,chunk=4096,bits=2 --period 4 --period-from 8 --fragments 2 \
  --overlap-steps 1 --algorithm fewest_bytes --steps 40 --eval-every 0 </dev/null)
echo "$out"
line=$(grep "^result:" <<<"$out")
"$python" - "$line" <<'PY'
import re, sys
line = sys.argv[1]
assert "fragments 2, overlap 1" in line and "same parameters on every rank: True" in line, line
m = re.search(r"(\d+) averages of ([0-9.]+) kB", line)
assert m and int(m.group(1)) == 17, line  # 16 fragment averages and the final whole one
loss = float(re.search(r"validation loss ([0-9.]+)", line).group(1))
assert 0 < loss < 5.6, line
PY
# A GPT shape the heads cannot split is refused before any rank starts.
if err=$("$python" "$here/../../python_examples/ddp_gpt.py" --width 98 2>&1 </dev/null); then
  echo "ddp_gpt.py accepted --width 98" >&2; exit 1
fi
grep -q -- "--width must be a positive multiple of 4" <<<"$err" || { echo "$err" >&2; exit 1; }
echo "gpt_example_test: passed"
