#!/usr/bin/env bash
# The Python MPI tests with P ranks: test_mpi.py under mpiexec on every rank, then the same
# collectives in C++ (gcomp_python_reference) compared bit for bit. Each run is bounded: a hang
# fails the test instead of waiting for CTest's limit.
#   mpi_test.sh P MPIEXEC PYTHON REFERENCE SCRATCH
set -euo pipefail
p=$1 mpiexec=$2 python=$3 reference=$4 scratch=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
export GCOMP_PYTHON_MPI_DIR=$scratch/out
timeout -k 10 600 "$mpiexec" -n "$p" "$python" -m pytest -q -p no:cacheprovider \
  "$here/test_mpi.py"
timeout -k 10 300 "$mpiexec" -n "$p" "$reference" allreduce "$GCOMP_PYTHON_MPI_DIR"
