#!/usr/bin/env bash
# gcomp.torch's tests with P ranks under mpiexec (torch.distributed's gloo rendezvous on a port of
# this test's own), bounded: a hang fails the test.
#   torch_test.sh P MPIEXEC PYTHON PORT
set -euo pipefail
p=$1 mpiexec=$2 python=$3 port=$4
here=$(cd "$(dirname "$0")" && pwd)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
timeout -k 10 600 "$mpiexec" -n "$p" "$python" -m pytest -q -p no:cacheprovider \
  "$here/test_torch.py"
