#!/usr/bin/env bash
# pip install from the sources into a fresh venv made with --system-site-packages (Debian's numpy
# and torch seen through it), as docs/python.md says, then the installed package used from
# outside the sources: the module (a codec, a Gloo Communicator of two processes on a file store)
# and gcomp.torch; then pip uninstall. Bounded; the work folder is removed on success.
#   pip_test.sh SOURCE_DIR PYTHON WORK
set -euo pipefail
src=$1 python=$2 work=$3
rm -rf "$work"
mkdir -p "$work/src"
# What a clone has: the tracked files (and any not yet committed that git does not ignore).
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$work/src")
else
  tar -C "$src" --exclude='./build*' --exclude='./results' -cf - . | tar -C "$work/src" -xf -
fi
"$python" -m venv --system-site-packages "$work/venv"
py="$work/venv/bin/python"
# The module compiled without optimization (GCOMP_CMAKE_ARGS, as a user may pass): what this test
# checks is the packaging (setup.py's CMake build, the files installed, the module and
# gcomp.torch used from them), not the code, which the Release build compiles and tests; -O2
# took 139 s of CI's 40 minutes.
GCOMP_BUILD_JOBS=$(nproc) GCOMP_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0" \
  timeout -k 10 1500 "$py" -m pip install --no-build-isolation --no-index -q "$work/src"

cd "$work"  # the sources are not on the path: only the installed package can be imported
"$py" - "$work/venv" <<'PY'
import sys
import numpy as np
import gcomp
import gcomp.torch as gt
venv = sys.argv[1]
assert gcomp.__file__.startswith(venv), gcomp.__file__
assert gt.__file__.startswith(venv), gt.__file__
assert gcomp.have_gloo()
x = np.linspace(-1, 1, 1000, dtype=np.float32)
p = gcomp.Codec("topk:ratio=0.1").encode(x, seed=0)
acc = np.zeros_like(x)
gcomp.decode_add(p, acc)
assert np.count_nonzero(acc) == 100
print("installed:", gcomp.__file__, gcomp.__version__)
PY
# Two processes meet through a file store (no MPI) and sum.
cat > "$work/pair.py" <<'PY'
import sys
import numpy as np
import gcomp
rank, store = int(sys.argv[1]), sys.argv[2]
c = gcomp.Communicator(store, rank=rank, size=2, prefix="pip-test")
x = np.full(4096, rank + 1.0, np.float32)
c.allreduce(x, "fp16")
assert c.transport == "gloo" and np.all(x == 3.0), (c.transport, x[:4])
print(f"rank {rank}: gloo sum ok", flush=True)
PY
timeout -k 5 120 "$py" "$work/pair.py" 0 "$work/store" &
first=$!
timeout -k 5 120 "$py" "$work/pair.py" 1 "$work/store"
wait "$first"
"$py" -m pip uninstall -y -q gcomp
if "$py" -c "import gcomp" 2>/dev/null; then
  echo "FAIL: gcomp still imports after pip uninstall"; exit 1
fi
echo "pip install, use and uninstall: ok"
rm -rf "$work"
