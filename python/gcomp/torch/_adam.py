"""Adam and AdamW through gcomp.torch: 1-bit Adam's stages (Tang et al., ICML 2021) and 0/1
Adam's schedule (Lu et al., ICML 2022) around the user's torch.optim.Adam or AdamW, for the hook
(register) and DistributedOptimizer alike.

The first warmup_steps steps are the optimizer's own: the gradients averaged uncompressed, then
torch's exact Adam step. From then on the variance is frozen (variance="frozen") or refreshed on
a gcomp.AdamSchedule (variance=gcomp.AdamSchedule.zero_one(...)): a refreshing step averages the
gradients uncompressed and takes an exact step (gcomp.adam_step with the variance's own count).
On the other steps, before the collective each rank's gradient is replaced by its momentum
m_r = beta1 m + (1 - beta1) g_r (gcomp.adam_local_momentum), which goes through the codec with
error feedback (each rank's residual, and each owner's under compressed_reduce_scatter); after
it, the averaged momentum comes back as the gradient and the step is gcomp.adam_frozen_update:
m = the average, the parameter moved with the variance as last refreshed. A schedule's local
steps send nothing: each rank steps on its own momentum, and where an interval ends step()
averages the ranks' ways since the last synchronization, compressed the same way
(gcomp.adam_sync_momentum and adam_sync_update). The moments stay in the optimizer's state
(exp_avg, exp_avg_sq, step), so the optimizer's state_dict keeps them; the anchors of local
steps are in the gcomp state's. Every step that is not torch's own runs the library's functions:
on CPU tensors the host loop, on CUDA tensors its kernels on the current stream (docs/python.md,
"Adam and AdamW").
"""

import time
import types

import torch

import gcomp

from . import _cuda
from ._pipeline import _MASK, Bucket, Collective


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


def _schedule_of(variance, warmup_steps, who):
    """The gcomp.AdamSchedule of register's or DistributedOptimizer's variance= and
    warmup_steps= ("frozen": 1-bit Adam's after warmup_steps; a schedule: as it is, and
    warmup_steps 0 or its own)."""
    if isinstance(variance, gcomp.AdamSchedule):
        if int(warmup_steps) not in (0, variance.warmup_steps):
            raise ValueError(f"{who}: warmup_steps={warmup_steps} and variance={variance!r} "
                             "say two things; the schedule's warmup_steps is the warm-up")
        return variance
    if int(warmup_steps) < 1:
        raise ValueError(f"{who}: with Adam or AdamW warmup_steps must be at least 1: the "
                         "variance is frozen after the warm-up's exact steps, which estimate it "
                         "(1-bit Adam runs 15-25% of the steps so)")
    return gcomp.AdamSchedule.one_bit(int(warmup_steps))


class _Adam:
    """The stages of 1-bit or 0/1 Adam around one torch Adam or AdamW (optimizer) on the
    schedule of variance= and warmup_steps= (_schedule_of); owner: the CompressionState or
    DistributedOptimizer whose codec, residuals and communication thread a synchronization of
    local steps uses. Steps are counted from 1, as the owner counts them (t: the step being
    taken)."""

    def __init__(self, optimizer, variance, warmup_steps, who, owner):
        if not _is_adam(optimizer):
            raise TypeError(f"{who}: {type(optimizer).__name__} is not torch.optim.Adam or AdamW")
        why = _refusals(optimizer)
        if why:
            raise ValueError(f"{who}: {type(optimizer).__name__} with {'; '.join(why)} cannot run "
                             "as 1-bit Adam; pass variance=None to compress its gradient and "
                             "leave it as it is (docs/python.md, \"Adam and AdamW\")")
        schedule = _schedule_of(variance, warmup_steps, who)
        self.optimizer = optimizer
        self.decoupled = isinstance(optimizer, torch.optim.AdamW)
        self.schedule = schedule
        self.warmup_steps = schedule.warmup_steps
        self._owner = owner
        self._groups = {}  # parameter id -> its param group
        # Local steps: each parameter's anchor (as the last synchronization left it), and per
        # param group the learning rates summed and the AdamW factors multiplied since.
        self._anchors = {}
        self._loaded_anchors = {}  # checkpoint key -> anchor, until the parameter is met
        self._lr_sum, self._decay = {}, {}

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
                _run(gcomp.adam_local_momentum, p.detach().view(-1), flat, m.view(-1), flat,
                     beta1=s["beta1"], weight_decay=s["weight_decay"], decoupled=self.decoupled)

    def _each(self, closure, t, move, local=False):
        """Runs closure (its loss returned, None without one), then for every parameter with a
        gradient: the optimizer's step count on, and move(p, m, v, lr, step, variance_steps,
        settings). local: the local stage's sums go on too, and each parameter's anchor is made
        before it first moves."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        tv = self.schedule.variance_steps(t)
        with torch.no_grad():
            for gi, group in enumerate(self.optimizer.param_groups):
                s = self._settings(group)
                lr = float(group["lr"])
                if local:
                    self._lr_sum[gi] = self._lr_sum.get(gi, 0.0) + lr
                    if self.decoupled:
                        self._decay[gi] = self._decay.get(gi, 1.0) * (1 - lr * s["weight_decay"])
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self._moments(p)
                    if local:
                        self._anchor_of(p)
                    state["step"] += 1
                    ts = int(state["step"])
                    move(p, state["exp_avg"], state["exp_avg_sq"], lr, ts, min(tv, ts), s)
        return loss

    def step(self, closure, t):
        """Step t of the compressed stage or a local step, after the collective (or none):
        every parameter with a gradient (the averaged momentum, or this rank's own on a local
        step) takes it as its exp_avg and moves with the variance as last refreshed; the
        optimizer's step count goes on. A local step that ends an interval then synchronizes
        the ranks. Returns closure()'s loss (None without one), as torch's step does."""
        local = self.schedule.local(t)
        if local and t - 1 == self.schedule.frozen_after():
            self._anchors, self._loaded_anchors = {}, {}  # the local stage begins: anchors now
            self._lr_sum, self._decay = {}, {}

        def move(p, m, v, lr, ts, tv, s):
            _run(gcomp.adam_frozen_update, p.detach().view(-1), p.grad.view(-1), m.view(-1),
                 v.view(-1), lr=lr, step=ts, variance_steps=tv, **s)

        loss = self._each(closure, t, move, local)
        if local and self.schedule.synchronizes(t):
            self._synchronize(t)
        return loss

    def refresh(self, closure, t):
        """A refreshing step t after compressed ones (the gradients averaged uncompressed): the
        exact step, v's bias correction by its own updates (gcomp.adam_step's
        variance_steps)."""
        def move(p, m, v, lr, ts, tv, s):
            _run(gcomp.adam_step, p.detach().view(-1), p.grad.view(-1), m.view(-1), v.view(-1),
                 lr=lr, step=ts, variance_steps=tv, **s)

        return self._each(closure, t, move)

    def _anchor_of(self, p):
        a = self._anchors.get(id(p))
        if a is None:
            key = self._owner._keys.get(id(p))
            loaded = self._loaded_anchors.pop(key, None)
            if loaded is not None and loaded.numel() == p.numel():
                a = loaded.to(p.device, copy=True).view(-1)
            else:
                a = p.detach().reshape(-1).clone()
            self._anchors[id(p)] = a
        return a

    def average_now(self, t):
        """A synchronization ahead of the schedule after step t, where the ranks are in the
        local stage and have moved since the last (else nothing is sent)."""
        if self.schedule.local(t) and any(v > 0 for v in self._lr_sum.values()):
            self._synchronize(t, index=1)

    def _synchronize(self, t, index=0):
        """The ranks' ways since the last synchronization averaged, as momenta through the
        owner's codec with each parameter's residual (in the order the owner first met them,
        the same on every rank), one collective on the communication thread; every rank then
        has the same parameters and anchors. A group whose learning rates summed to 0 has not
        moved and sends nothing."""
        entered = time.perf_counter()
        owner = self._owner
        tv = self.schedule.variance_steps(t)
        group_of = {id(q): gi for gi, g in enumerate(self.optimizer.param_groups)
                    for q in g["params"]}
        params = [owner._params[pid] for pid in owner._keys
                  if pid in self._anchors and self._lr_sum.get(group_of.get(pid), 0.0) > 0]
        if params:
            xs = []
            with torch.no_grad():
                for p in params:
                    gi = group_of[id(p)]
                    s = self._settings(self.optimizer.param_groups[gi])
                    v = self._moments(p)["exp_avg_sq"].view(-1)
                    x = torch.empty_like(v)
                    lr_sum, decay = self._lr_sum[gi], self._decay.get(gi, 1.0)
                    _run(gcomp.adam_sync_momentum, p.detach().view(-1), self._anchors[id(p)], v,
                         x, lr_sum=lr_sum, decay=decay, variance_steps=tv, beta2=s["beta2"],
                         eps=s["eps"])
                    xs.append(x)
            efs = [owner._feedback_of(p) for p in params] if owner.error_feedback else None
            call = Bucket(owner, "0/1 Adam synchronization", t, 0, params, xs, xs, False, entered)
            collective = Collective("allreduce_buckets", xs, owner.codec, {
                "efs": efs, "bucket_bytes": max(4 * sum(x.numel() for x in xs), 1),
                "dense_below": 0, "average": True, "seed": owner.seed & _MASK,
                "algorithm": owner.algorithm, "allow_uncompressed": owner.allow_uncompressed,
                "step": t, "index": index})
            call.submit(collective, False).wait()
            with torch.no_grad():
                for p, x in zip(params, xs):
                    gi = group_of[id(p)]
                    s = self._settings(self.optimizer.param_groups[gi])
                    state = self._moments(p)
                    ts = int(state["step"])
                    m, v = state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1)
                    lr_sum, decay = self._lr_sum[gi], self._decay.get(gi, 1.0)
                    _run(gcomp.adam_sync_update, p.detach().view(-1), self._anchors[id(p)], x, m,
                         v, lr_sum=lr_sum, decay=decay, step=ts, variance_steps=min(tv, ts),
                         beta1=s["beta1"], beta2=s["beta2"], eps=s["eps"])
        self._lr_sum, self._decay = {}, {}

    def checkpoint(self):
        """What a checkpoint says of the stages (a resumed job must have the same)."""
        sc = self.schedule
        if sc == gcomp.AdamSchedule.one_bit(sc.warmup_steps):
            return {"variance": "frozen", "warmup_steps": self.warmup_steps}
        return {"variance": "schedule", "schedule": sc.as_dict()}

    def local_state(self):
        """The local stage's state for a checkpoint (None without local steps): each
        parameter's anchor by its checkpoint key, and per param group the learning rates summed
        and the AdamW factors multiplied since the last synchronization."""
        if self.schedule.max_local_steps <= 1:
            return None
        keys = self._owner._keys
        anchors = {keys[pid]: a.to("cpu", copy=True) for pid, a in self._anchors.items()
                   if pid in keys}
        for key, a in self._loaded_anchors.items():
            anchors.setdefault(key, a)
        return {"anchors": anchors, "lr_sum": dict(self._lr_sum), "decay": dict(self._decay)}

    def load_local_state(self, state):
        """Goes on from local_state()'s (None: the local stage not begun)."""
        self._anchors = {}
        state = state or {}
        self._loaded_anchors = {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1)
                                for k, v in dict(state.get("anchors", {})).items()}
        self._lr_sum = {int(k): float(v) for k, v in dict(state.get("lr_sum", {})).items()}
        self._decay = {int(k): float(v) for k, v in dict(state.get("decay", {})).items()}

    def take_step(self, steps):
        """Makes optimizer.step() the schedule's after each backward pass (steps() says how many
        the owner has counted, this one's included): the optimizer's own on the contiguous
        warm-up, an exact step with the variance's own count on a later refresh, 1-bit Adam's
        or a local step otherwise. A learning-rate scheduler keeps its count whether it wrapped
        step() before this (its wrapper is then what runs in the warm-up, and its count is kept
        here after it) or after."""
        optimizer, adam = self.optimizer, self
        own = optimizer.step  # the optimizer's, or a scheduler's counting wrapper of it
        counted = getattr(own, "_with_counter", False)

        def step(self, closure=None):
            t = steps()
            if adam.schedule.refreshes(t) and adam.schedule.variance_steps(t) == t:
                return own(closure)
            loss = adam.refresh(closure, t) if adam.schedule.refreshes(t) else adam.step(closure, t)
            if counted:
                optimizer._step_count += 1
            return loss

        step._with_counter = counted  # a scheduler made later wraps this one only if not
        optimizer.step = types.MethodType(step, optimizer)


def _run(function, *arrays, **kwargs):
    """One of the library's Adam functions (gcomp.adam_step, ...) on flat tensors: CPU tensors as
    they are; CUDA tensors (all on one device) as the module's CUDA arrays, the library's kernel
    queued on their device's current stream, where torch's own step would have run."""
    cuda = _cuda.cuda
    if cuda.on_device(arrays[0]):
        kwargs["stream"] = cuda.handle(cuda.current_stream(cuda.device(arrays[0])))
        arrays = [cuda.array(a) for a in arrays]
    function(*arrays, **kwargs)
