#!/usr/bin/env bash
# gcomp.torch's tests with P ranks, bounded (a hang fails the test), launched either way a job
# starts: under mpiexec (gcomp over MPI, torch.distributed's gloo rendezvous on a port of this
# test's own), or under torch's launcher without mpiexec (gcomp over Gloo on torch's store).
#   torch_test.sh P MPIEXEC PYTHON PORT [mpiexec|torchrun]
set -euo pipefail
p=$1 mpiexec=$2 python=$3 port=$4 launcher=${5:-mpiexec}
here=$(cd "$(dirname "$0")" && pwd)
case "$launcher" in
  mpiexec)
    export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
    exec timeout -k 10 600 "$mpiexec" -n "$p" "$python" -m pytest -q -p no:cacheprovider \
      "$here/test_torch.py" ;;
  torchrun)
    # Debian's torch 1.13 fails at start with torchrun's default --redirects 0 --tee 0.
    logs=$(mktemp -d)
    trap 'rm -rf "$logs"' EXIT
    timeout -k 10 600 "$python" -m torch.distributed.run --nproc_per_node "$p" \
      --master_port "$port" --redirects 1 --tee 1 --log_dir "$logs" \
      -m pytest -q -p no:cacheprovider "$here/test_torch.py" ;;
  *) echo "torch_test.sh: unknown launcher $launcher" >&2; exit 2 ;;
esac
