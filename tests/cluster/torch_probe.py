"""One process per host of the testbed, started as PyTorch's launcher starts a job on a cluster
(scripts/cluster run --launcher torchrun: one torchrun agent per host, no mpiexec): gcomp.torch
on Gloo through torch's store. Prints what tests/cluster/cluster_test.sh checks: the transport,
how many hosts gcomp told apart, an exact sum, and the link as gcomp's measurement saw it."""

import os

import numpy as np
import torch.distributed as dist

import gcomp.torch as gt

rank, size = gt.init_process_group()
comm = gt.communicator()
x = np.full(1 << 20, rank + 1, np.float32)
comm.allreduce(x, "none", algorithm="dense")  # nothing else runs: no need of the module's thread
exact = bool(np.all(x == size * (size + 1) / 2))
print(f"torch rank={rank} size={size} transport={comm.transport} hosts={len(set(comm.hosts))} "
      f"exact={int(exact)} link_mbit={8 / comm.network['beta'] / 1e6:.1f} "
      f"local_rank={os.environ['LOCAL_RANK']}", flush=True)
dist.barrier()
dist.destroy_process_group()
