"""gcomp.torch: compressed gradient averaging for PyTorch data-parallel training (CPU and CUDA).

Two ways in, both averaging gradients over the MPI ranks of ``mpiexec.mpich -n P``:

* An existing DistributedDataParallel script adds one line::

      import gcomp.torch as gt
      gt.init_process_group()          # torch.distributed (gloo) from mpiexec's rank and size
      model = torch.nn.parallel.DistributedDataParallel(model)
      model.register_comm_hook(gt.CompressionState("topk:ratio=0.01"), gt.compression_hook)

* A script without torch.distributed wraps its optimizer (Horovod's way)::

      opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                    named_parameters=model.named_parameters(),
                                    codec="qsgd:bits=4")
      gt.broadcast_parameters(model.state_dict(), root_rank=0)

Communication runs on one background thread that owns the gcomp Communicator, so it overlaps
backward: the hook returns a future that thread completes; the optimizer's gradient hooks hand
each bucket over as backward produces it and ``step()`` waits for the last. Calls reach that
thread in the same order on every rank (DDP and autograd order the buckets alike), which is what
the collectives need. A failure on any rank (NaN in a gradient, ranks with different codecs, a bad
spec) raises on every rank, from backward (the hook) or from ``step()``, never a hang.

CUDA models work the same: buckets and gradients are compressed by gcomp's CUDA kernels on a
side stream of this module's, ordered after the current stream by an event, and only payloads
cross to host memory for MPI (docs/python.md, "GPUs").
Reference: docs/python.md, "PyTorch".
"""

# The package's modules: _options (the options, checked once), _cuda (CUDA tensors), _engine
# (the communication thread, gcomp's world against torch's, init_process_group, statistics and
# waits), _feedback (per-parameter residuals, velocities and checkpoints), _step_check (the
# whole-step check), _pipeline (one bucket's way, the hook's and the optimizer's), _hook
# (CompressionState, compression_hook, register), _optimizer (DistributedOptimizer),
# _broadcast.

from ._broadcast import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from ._engine import communicator, init_process_group
from ._hook import CompressionState, compression_hook, register
from ._optimizer import DistributedOptimizer

__all__ = [
    "CompressionState",
    "DistributedOptimizer",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "communicator",
    "compression_hook",
    "init_process_group",
    "register",
]
