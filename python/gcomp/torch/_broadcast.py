"""Broadcasts (root's values to every rank), through the communication thread: parameters,
any picklable object, an optimizer's state."""

import pickle

import numpy as np
import torch

from ._engine import _engine
from ._optimizer import DistributedOptimizer


def _broadcast_floats(comm, t, root):
    flat = t.view(-1)
    if comm.rank != root:
        flat.zero_()
    # root's values plus zeros: exact (a -0.0 on the root arrives as +0.0).
    comm.allreduce(flat, "none", algorithm="dense")


def broadcast_parameters(params, root_rank=0):
    """broadcast_parameters(params, root_rank=0)

    Sets every rank's tensors to root_rank's, in place: params is a state_dict, a list of
    (name, tensor) or a list of tensors. Float32 tensors go as they are; others by value
    through broadcast_object. Collective: every rank calls it with the same tensors."""
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = [(f"tensor{i}", p) if isinstance(p, torch.Tensor) else tuple(p)
                 for i, p in enumerate(params)]

    def job(comm):
        for name, t in items:
            with torch.no_grad():
                if t.dtype == torch.float32 and t.is_contiguous():
                    _broadcast_floats(comm, t, root_rank)
                else:
                    value = _broadcast_object_on(comm, t.detach().clone() if comm.rank == root_rank
                                                 else None, root_rank)
                    t.copy_(value)

    _engine().run(job)


def _broadcast_object_on(comm, obj, root):
    # Bytes travel as float32 values below 2^24 (three bytes each): sums with zeros, exact.
    if comm.rank == root:
        data = pickle.dumps(obj)
        head = np.array([len(data) & 0xFFFFFF, len(data) >> 24], np.float32)
    else:
        data, head = b"", np.zeros(2, np.float32)
    comm.allreduce(head, "none", algorithm="dense")
    n = int(head[0]) + (int(head[1]) << 24)
    words = (n + 2) // 3
    body = np.zeros(words, np.float32)
    if comm.rank == root:
        raw = np.frombuffer(data + b"\0" * (3 * words - n), np.uint8).reshape(-1, 3).astype(np.uint32)
        body[:] = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
    if words:
        comm.allreduce(body, "none", algorithm="dense")
    if comm.rank == root:
        return obj
    v = body.astype(np.uint32)
    raw = np.stack([v & 0xFF, (v >> 8) & 0xFF, v >> 16], axis=1).astype(np.uint8).tobytes()[:n]
    return pickle.loads(raw)


def broadcast_object(obj, root_rank=0):
    """broadcast_object(obj, root_rank=0) -> obj

    root_rank's obj (any picklable object) on every rank. Collective."""
    return _engine().run(lambda comm: _broadcast_object_on(comm, obj, root_rank))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """broadcast_optimizer_state(optimizer, root_rank=0)

    Loads root_rank's optimizer state (state_dict: buffers such as momentum, and the param
    groups' settings) into every rank's optimizer (a torch optimizer or a
    DistributedOptimizer). Collective."""
    inner = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    state = broadcast_object(inner.state_dict(), root_rank)
    if _engine().comm.rank != root_rank:
        inner.load_state_dict(state)
