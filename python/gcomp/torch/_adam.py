"""Adam and AdamW through gcomp.torch: 1-bit Adam's stages (Tang et al., ICML 2021) around the
user's torch.optim.Adam or AdamW, for the hook (register) and DistributedOptimizer alike.

The first warmup_steps steps are the optimizer's own: the gradients averaged uncompressed, then
torch's exact Adam step. From then on the variance is frozen: before the collective each rank's
gradient is replaced by its momentum m_r = beta1 m + (1 - beta1) g_r (gcomp.adam_local_momentum),
which goes through the codec with error feedback (each rank's residual, and each owner's under
compressed_reduce_scatter); after it, the averaged momentum comes back as the gradient and the
step is gcomp.adam_frozen_update: m = the average, the parameter moved with the variance as the
warm-up left it. The moments stay in the optimizer's state (exp_avg, exp_avg_sq, step), so the
optimizer's state_dict keeps them. CPU tensors go through the library's functions; CUDA tensors
through the same formulas in torch ops on the current stream (docs/python.md, "Adam and AdamW").
"""

import math
import types

import torch

import gcomp

from . import _cuda


def _is_adam(optimizer):
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))


def _refusals(optimizer):
    """What about an Adam or AdamW this module cannot take, as text (empty: nothing)."""
    why = []
    for g in optimizer.param_groups:
        if g.get("amsgrad"):
            why.append("amsgrad=True (its running maximum of the variance is not frozen)")
        if g.get("maximize"):
            why.append("maximize=True")
        if g.get("capturable"):
            why.append("capturable=True (CUDA graphs)")
        if g.get("differentiable"):
            why.append("differentiable=True")
        if g.get("fused"):
            why.append("fused=True")
    return sorted(set(why))


class _Adam:
    """The stages of 1-bit Adam around one torch Adam or AdamW (optimizer), after warmup_steps
    exact steps (>= 1: the frozen variance is what they estimated). steps: the optimizer's steps
    taken so far, as the caller counts them (its hook's or its own)."""

    def __init__(self, optimizer, warmup_steps, who):
        if not _is_adam(optimizer):
            raise TypeError(f"{who}: {type(optimizer).__name__} is not torch.optim.Adam or AdamW")
        why = _refusals(optimizer)
        if why:
            raise ValueError(f"{who}: {type(optimizer).__name__} with {'; '.join(why)} cannot run "
                             "as 1-bit Adam; pass variance=None to compress its gradient and "
                             "leave it as it is (docs/python.md, \"Adam and AdamW\")")
        if int(warmup_steps) < 1:
            raise ValueError(f"{who}: with {type(optimizer).__name__} warmup_steps must be at "
                             "least 1: the variance is frozen after the warm-up's exact steps, "
                             "which estimate it (1-bit Adam runs 15-25% of the steps so)")
        self.optimizer = optimizer
        self.decoupled = isinstance(optimizer, torch.optim.AdamW)
        self.warmup_steps = int(warmup_steps)
        self._groups = {}  # parameter id -> its param group

    def _group_of(self, p):
        g = self._groups.get(id(p))
        if g is None:  # a group added since (add_param_group), or the first call
            self._groups = {id(q): grp for grp in self.optimizer.param_groups
                            for q in grp["params"]}
            g = self._groups.get(id(p))
            if g is None:
                raise ValueError(f"a parameter of shape {tuple(p.shape)} is not in "
                                 f"{type(self.optimizer).__name__}'s param groups")
        return g

    def _settings(self, group):
        beta1, beta2 = group["betas"]
        return {"beta1": float(beta1), "beta2": float(beta2), "eps": float(group["eps"]),
                "weight_decay": float(group["weight_decay"]), "decoupled": self.decoupled}

    def _moments(self, p):
        state = self.optimizer.state[p]
        if "exp_avg" not in state:
            raise RuntimeError("1-bit Adam's compressed stage met a parameter without Adam's "
                               "moments: it took no step in the warm-up (a parameter without a "
                               "gradient then, or added since)")
        return state

    def local_momentum(self, params, grads):
        """Before the collective, in place: each gradient g becomes this rank's momentum
        beta1 m + (1 - beta1) (g + wd p for Adam's L2 decay)."""
        with torch.no_grad():
            for p, g in zip(params, grads):
                s = self._settings(self._group_of(p))
                m = self._moments(p)["exp_avg"]
                flat = g.view(-1)
                if _cuda.cuda.on_device(g):
                    if s["weight_decay"] and not self.decoupled:
                        flat.add_(p.detach().reshape(-1), alpha=s["weight_decay"])
                    flat.mul_(1 - s["beta1"]).add_(m.view(-1) * s["beta1"])
                else:
                    gcomp.adam_local_momentum(p.detach().view(-1), flat, m.view(-1), flat,
                                              beta1=s["beta1"],
                                              weight_decay=s["weight_decay"],
                                              decoupled=self.decoupled)

    def step(self, closure=None):
        """The compressed stage's step, after the collective: every parameter with a gradient
        (the averaged momentum) takes it as its exp_avg and moves with the frozen variance; the
        optimizer's step count goes on. Returns closure()'s loss (None without one), as
        torch's step does."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.optimizer.param_groups:
                s = self._settings(group)
                lr = float(group["lr"])
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self._moments(p)
                    state["step"] += 1
                    t = int(state["step"])
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                    if _cuda.cuda.on_device(p):
                        _frozen_update_torch(p, p.grad, m, v, lr, t, self.warmup_steps, s)
                    else:
                        gcomp.adam_frozen_update(p.detach().view(-1), p.grad.view(-1), m.view(-1),
                                                 v.view(-1), lr=lr, step=t,
                                                 variance_steps=self.warmup_steps, **s)
        return loss

    def checkpoint(self):
        """What a checkpoint says of the stages (a resumed job must have the same)."""
        return {"variance": "frozen", "warmup_steps": self.warmup_steps}

    def take_step(self, compressed):
        """Makes optimizer.step() 1-bit Adam's after the backward passes of the compressed stage
        (compressed() says so) and the optimizer's own otherwise. A learning-rate scheduler keeps
        its count whether it wrapped step() before this (its wrapper is then what runs in the
        warm-up, and its count is kept here after it) or after."""
        optimizer, adam = self.optimizer, self
        own = optimizer.step  # the optimizer's, or a scheduler's counting wrapper of it
        counted = getattr(own, "_with_counter", False)

        def step(self, closure=None):
            if not compressed():
                return own(closure)
            loss = adam.step(closure)
            if counted:
                optimizer._step_count += 1
            return loss

        step._with_counter = counted  # a scheduler made later wraps this one only if not
        optimizer.step = types.MethodType(step, optimizer)


def _frozen_update_torch(p, momentum, m, v, lr, t, tv, s):
    """gcomp.adam_frozen_update's formula in torch ops (CUDA tensors), on the current stream."""
    m.copy_(momentum)
    if s["decoupled"] and s["weight_decay"]:
        p.mul_(1 - lr * s["weight_decay"])
    bias1 = 1 - s["beta1"] ** t
    limit = max(1.0, (1 - s["beta1"]) / math.sqrt(1 - s["beta2"])) * bias1
    q = m / (v.sqrt() / math.sqrt(1 - s["beta2"] ** tv)).add_(s["eps"])
    q.clamp_(-limit, limit).masked_fill_(v == 0, 0.0)
    p.add_(q, alpha=-lr / bias1)
