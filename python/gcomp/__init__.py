"""gcomp: gradient compression and compressed allreduce, from Python.

Codecs turn a float32 gradient into a compact payload and back::

    import numpy as np, gcomp
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    c = gcomp.Codec("topk:ratio=0.01")       # specs: gcomp.codecs(), or `gcomp list`
    p = c.encode(x, seed=0)                  # numpy uint8, c.max_bytes(len(x)) at most
    acc = np.zeros_like(x)
    gcomp.decode_add(p, acc)                 # acc += decode(p), in place
    ef = gcomp.ErrorFeedback(len(x))         # what a codec did not send, carried over
    p = c.encode(x, seed=1, ef=ef)

The Communicator sums tensors over MPI ranks with any codec on the wire
(``mpiexec.mpich -n 4 /usr/bin/python3 script.py``)::

    comm = gcomp.Communicator()
    comm.allreduce(x, c, ef=ef, average=True)    # in place
    print(comm.last_stats)

Arrays are 1-D float32 numpy arrays or torch tensors (payloads: uint8), used in place:
nothing is copied or converted, and anything else raises TypeError or ValueError saying what
is needed. CUDA tensors (any array with DLPack or __cuda_array_interface__) run gcomp's CUDA
kernels on the stream= given, with their payloads as gcomp.DeviceArray (docs/python.md, "GPUs";
gcomp.device_status() says whether this build and machine can). The GIL is released while the library works. Errors of the library raise
gcomp.Error, whose ``status`` names the kind. Reference: docs/python.md.
"""

from ._gcomp import (
    __version__,
    adam_frozen_update,
    adam_local_momentum,
    adam_step,
    adam_sync_momentum,
    adam_sync_update,
    AdamSchedule,
    Codec,
    Communicator,
    DeviceArray,
    Error,
    ErrorFeedback,
    TotalStats,
    codecs,
    decode_add,
    device_status,
    have_gloo,
    inspect,
    mask_momentum,
    momentum_correct,
    num_threads,
    set_num_threads,
    set_wait_policy,
    simd_level,
    step_seed,
    wait_policy,
)

Error.__module__ = "gcomp"
for _cls in (AdamSchedule, Codec, Communicator, DeviceArray, ErrorFeedback, TotalStats):
    _cls.__module__ = "gcomp"
del _cls

__all__ = [
    "Codec",
    "Communicator",
    "DeviceArray",
    "Error",
    "ErrorFeedback",
    "TotalStats",
    "codecs",
    "decode_add",
    "device_status",
    "have_gloo",
    "inspect",
    "mask_momentum",
    "momentum_correct",
    "num_threads",
    "set_num_threads",
    "set_wait_policy",
    "simd_level",
    "step_seed",
    "wait_policy",
    "adam_frozen_update",
    "adam_local_momentum",
    "adam_step",
    "adam_sync_momentum",
    "adam_sync_update",
    "AdamSchedule",
]

from . import timeline  # noqa: E402 - after the module's names, which it imports
