"""Periodic model averaging (local SGD, post-local SGD, DiLoCo's outer step) for register() and
DistributedOptimizer: period=H, period_from=S.

Steps 0 .. S-1 (counted from 0, as the owner counts them) are synchronized as without a period
(every gradient averaged through the codec). From step S on each rank steps on its own: its
gradients are not sent (the owner's weight decay and momentum correction still apply, so a
momentum moved into the hook goes on as this rank's own heavy-ball momentum), and what error
feedback still held of the synchronized steps is added to the first local step's gradient, so
nothing of it is lost. After every H-th local step (steps S+H, S+2H, ... taken) the models are
averaged: each rank's change since the last average, anchor - p (a pseudo-gradient), goes
through the codec with error feedback of its own (a residual per parameter, apart from the
gradients'), averaged over the ranks by the owner's algorithm; then p = anchor - outer_lr * d,
d the average (with outer_momentum, Nesterov's: b = mu b + avg, d = avg + mu b, DiLoCo's outer
step), and anchor = p. Every rank computes the same d from the same bits, so the parameters are
identical on every rank after an average. outer_lr 1 and no outer momentum is plain averaging
(post-local SGD). What the optimizer's momentum does at an average (momentum_at_average):
"local" keeps each rank's own (torch's post-local SGD), "reset" zeroes it, "average" averages it
over the ranks: its change since its own anchor (zeros at first) in the same collective as
the parameters', through the codec with residuals of its own. feedback_decay beta (SparseLoCo's
error feedback in place of an outer momentum): each parameter's residual is multiplied by beta
before the next change is added to it (1, the default, keeps all of it; 0 keeps none)."""

import time

import torch

from . import _cuda
from ._pipeline import _MASK, Bucket, Collective

MOMENTA = ("local", "reset", "average")


def _check(period, period_from, outer_lr, outer_momentum, momentum_at_average, feedback_decay,
           who):
    """The periodic options, checked: (period, period_from, outer_lr, outer_momentum,
    feedback_decay)."""
    if isinstance(period, bool) or int(period) != period or int(period) < 1:
        raise ValueError(f"{who}: period must be an integer >= 1 (1: every step synchronized), "
                         f"not {period!r}")
    if isinstance(period_from, bool) or int(period_from) != period_from or int(period_from) < 0:
        raise ValueError(f"{who}: period_from must be an integer >= 0, not {period_from!r}")
    lr, mu = float(outer_lr), float(outer_momentum)
    if not lr > 0.0 or lr != lr or lr == float("inf"):
        raise ValueError(f"{who}: outer_lr must be finite and > 0, not {outer_lr!r}")
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"{who}: outer_momentum must be in [0, 1), not {outer_momentum!r}")
    if momentum_at_average not in MOMENTA:
        raise ValueError(f"{who}: momentum_at_average must be one of {', '.join(MOMENTA)}, not "
                         f"{momentum_at_average!r}")
    try:
        beta = None if isinstance(feedback_decay, bool) else float(feedback_decay)
    except (TypeError, ValueError):
        beta = None
    if beta is None or not 0.0 <= beta <= 1.0:
        raise ValueError(f"{who}: feedback_decay must be a number in [0, 1] (1: the residual "
                         f"kept whole), not {feedback_decay!r}")
    return int(period), int(period_from), lr, mu, beta


def _periodic_of(options, who):
    """Pops the periodic options from options (register's or DistributedOptimizer's): a dict of
    checked ones, or None where period is 1 and nothing else periodic is asked."""
    given = {k: options.pop(k) for k in ("period", "period_from", "outer_lr", "outer_momentum",
                                         "momentum_at_average", "feedback_decay") if k in options}
    period, period_from, lr, mu, beta = _check(
        given.get("period", 1), given.get("period_from", 0), given.get("outer_lr", 1.0),
        given.get("outer_momentum", 0.0), given.get("momentum_at_average", "local"),
        given.get("feedback_decay", 1.0), who)
    if period == 1:
        defaults = {"period_from": 0, "outer_lr": 1.0, "outer_momentum": 0.0,
                    "momentum_at_average": "local", "feedback_decay": 1.0}
        extra = sorted(k for k in given if k != "period" and given[k] != defaults[k])
        if extra:
            raise ValueError(f"{who}: {', '.join(extra)} without period > 1 (every step "
                             "synchronized) mean nothing")
        return None
    return {"period": period, "period_from": period_from, "outer_lr": lr, "outer_momentum": mu,
            "momentum_at_average": given.get("momentum_at_average", "local"),
            "feedback_decay": beta}


def _periodic_allowed(optimizer, adam, who):
    """Periodic averaging needs the optimizer (its step() is where the averages run), and not
    1-bit Adam (whose compressed stage sends the momentum every step)."""
    if optimizer is None:
        raise ValueError(f"{who}: period > 1 needs the optimizer: its step() is where the models "
                         "are averaged")
    if adam:
        raise ValueError(f"{who}: period > 1 with {type(optimizer).__name__} as 1-bit Adam: "
                         "pass variance=None (the optimizer's own local steps, averaged every "
                         "period) or no period")


class _Periodic:
    """Periodic averaging for owner (a CompressionState or DistributedOptimizer, whose codec,
    algorithm, seed, error_feedback, weight decay, momentum correction, statistics and
    communication thread it uses) and optimizer (the torch optimizer that steps the
    parameters). named: (name, parameter) pairs, the order of every average's collective and
    the checkpoint's keys."""

    def __init__(self, owner, optimizer, named, period, period_from, outer_lr, outer_momentum,
                 momentum_at_average, feedback_decay=1.0):
        self.owner, self.optimizer = owner, optimizer
        self.named = [(n, p) for n, p in named if p.requires_grad]
        self.period, self.period_from = period, period_from
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.momentum_at_average = momentum_at_average
        self.feedback_decay = feedback_decay
        self.anchors = {}  # parameter id -> its flat anchor (the parameters at the last average)
        self.feedback = {}  # parameter id -> the ErrorFeedback of its changes
        self.outer = {}  # parameter id -> the outer Nesterov momentum buffer
        # momentum_at_average "average": each momentum's anchor (zeros at first, on every rank
        # alike) and the ErrorFeedback of its changes.
        self.momentum_anchors, self.momentum_feedback = {}, {}
        self.folded = set()  # parameter ids whose gradient residual went into a local step
        self.averaged_after = None  # the step count of the last average
        self.averages, self.bytes_sent, self.bytes_received, self.seconds = 0, 0, 0, 0.0
        self.local_steps = 0
        self._loaded = {}  # a checkpoint's anchors, residuals, outer buffers until first used

    # ---- the schedule ----

    def local(self, step):
        """Whether step (counted from 0) is a local one."""
        return step >= self.period_from

    def due(self, taken):
        """Whether an average follows the taken-th step (taken counted from 1)."""
        return taken > self.period_from and (taken - self.period_from) % self.period == 0

    # ---- a local step, before the optimizer's ----

    def local_step(self, params, grads, last):
        """One bucket of a local step, in place on grads (views of the gradients): the owner's
        weight decay and momentum correction (this rank's heavy-ball velocity, not masked:
        nothing is sent) and, once per parameter, what its error feedback held of the
        synchronized steps. Makes the anchors at the first local step (the parameters are the
        same on every rank then: the last synchronized step left them so)."""
        if not self.anchors:
            self._make_anchors()
        owner = self.owner
        if owner.weight_decay:
            owner._decay(params, grads)
        if owner.momentum:
            owner._accumulate_momentum(params, grads)
        with torch.no_grad():
            for p, g in zip(params, grads):
                if id(p) in self.folded:
                    continue
                self.folded.add(id(p))
                r = owner.residual(p)
                if r is None:  # not met since a checkpoint's load: its residual as loaded
                    r = owner._loaded["residuals"].pop(owner._keys.get(id(p)), None)
                    if r is None:
                        continue
                r = torch.as_tensor(r)
                g.view(-1).add_(r.to(g.device))
                r.zero_()
        if last:
            self.local_steps += 1

    def _make_anchors(self):
        """Every parameter's anchor: a loaded checkpoint's, else the parameter as it is."""
        loaded = self._loaded.get("anchors", {})
        with torch.no_grad():
            for name, p in self.named:
                a = loaded.pop(name, None)
                self.anchors[id(p)] = (a.to(p.device, copy=True) if a is not None and
                                       a.numel() == p.numel() else p.detach().reshape(-1).clone())

    # ---- an average ----

    def maybe_average(self, taken):
        """After the optimizer's step (taken steps so far): the average, where one is due and
        has not run after this step yet."""
        if self.due(taken) and self.averaged_after != taken:
            self.average(taken)

    def average(self, taken, index=2):
        """The ranks' models averaged now (collective: every rank calls it after the same
        step): each parameter's change since its anchor through the codec with its error
        feedback, in one collective (with momentum_at_average "average", each momentum's
        change since its own anchor too, with residuals of their own), then the outer step and
        new anchors; with "reset", the momenta zeroed."""
        entered = time.perf_counter()
        owner = self.owner
        if not self.anchors:
            self._make_anchors()
        named = self.named
        with torch.no_grad():
            xs = [self.anchors[id(p)] - p.detach().reshape(-1) for _, p in named]
            moms = []  # (name, parameter, its flat momentum)
            if self.momentum_at_average == "average":
                moms = [(n, p, u) for n, p in named for u in [self._momentum_of(p)]
                        if u is not None]
                for n, p, u in moms:
                    xs.append(self._anchor_of("momentum_anchors", self.momentum_anchors, n, p,
                                              zero=True) - u)
        efs = None
        if owner.error_feedback:
            efs = [self._feedback_of(self.feedback, "residuals", n, p) for n, p in named]
            if self.feedback_decay != 1.0:
                with torch.no_grad():
                    for ef in efs:  # SparseLoCo's: what the codec left of earlier changes fades
                        _cuda._residual_of(ef).mul_(self.feedback_decay)
            efs += [self._feedback_of(self.momentum_feedback, "momentum_residuals", n, p)
                    for n, p, _ in moms]
        whole = max(4 * sum(x.numel() for x in xs), 1)
        shaped = owner._shaped
        params = [p for _, p in named] + [p for _, p, _ in moms]
        collective = Collective("allreduce_buckets", xs, owner.codec, {
            "efs": efs, "average": True, "seed": owner.seed & _MASK,
            "algorithm": owner.algorithm, "allow_uncompressed": owner.allow_uncompressed,
            "step": taken, "index": index,
            "bucket_bytes": 1 if owner._split and not shaped else whole,
            "dense_below": owner.dense_below if owner._split else 0,
            "shapes": [tuple(p.shape) for p in params] if shaped else None})
        before = owner._stats.snapshot()
        Bucket(owner, "model average", taken, index, params, xs, xs, False, entered,
               plain=True).submit(collective, False).wait()
        after = owner._stats.snapshot()
        mu, lr = self.outer_momentum, self.outer_lr
        with torch.no_grad():
            for (name, p), x in zip(named, xs):
                d = x
                if mu:
                    b = self._anchor_of("outer", self.outer, name, p, zero=True)
                    b.mul_(mu).add_(x)
                    d = x.add(b, alpha=mu)  # Nesterov: the step looks ahead along b
                a = self.anchors[id(p)]
                a.sub_(d, alpha=lr)
                p.copy_(a.view_as(p))
            for (name, p, u), x in zip(moms, xs[len(named):]):
                a = self.momentum_anchors[id(p)]
                a.sub_(x)
                u.copy_(a)
            if self.momentum_at_average == "reset":
                for _, p in named:
                    u = self._momentum_of(p)
                    if u is not None:
                        u.zero_()
        self.averaged_after = taken
        self.averages += 1
        self.bytes_sent += after["bytes_sent"] - before["bytes_sent"]
        self.bytes_received += after["bytes_received"] - before["bytes_received"]
        self.seconds += time.perf_counter() - entered

    def _anchor_of(self, part, table, name, p, zero):
        """The flat tensor of p in table (momentum anchors, outer buffers): made at first use
        from a loaded checkpoint's part, else zeros (the same on every rank)."""
        a = table.get(id(p))
        if a is None:
            loaded = self._loaded.get(part, {}).pop(name, None)
            a = (loaded.to(p.device, copy=True) if loaded is not None and
                 loaded.numel() == p.numel() else torch.zeros(p.numel(), dtype=torch.float32,
                                                              device=p.device))
            table[id(p)] = a
        return a

    def _feedback_of(self, table, part, name, p):
        """p's ErrorFeedback in table (the changes' or the momenta's), made once, with a loaded
        checkpoint's residual and kept state where it has them."""
        ef = table.get(id(p))
        if ef is None:
            ef = table[id(p)] = _cuda._new_feedback(p.numel(), p)
            r = self._loaded.get(part, {}).pop(name, None)
            if r is not None and r.numel() == p.numel():
                _cuda._residual_of(ef).copy_(r)
            k = self._loaded.get("kept_" + part, {}).pop(name, None)
            if k is not None:
                ef.kept = k.numpy()
        return ef

    def _momentum_of(self, p):
        """p's flat momentum: the hook's velocity (momentum moved there), or the optimizer's
        momentum_buffer (SGD) or exp_avg (Adam, AdamW); None before it has one."""
        u = self.owner._velocity.get(id(p)) if self.owner.momentum else None
        if u is None and self.optimizer is not None:
            state = self.optimizer.state.get(p, {})
            u = state.get("momentum_buffer")
            if u is None:
                u = state.get("exp_avg")
        return None if u is None else u.view(-1)

    # ---- statistics and checkpoints ----

    def stats(self):
        return {"local_steps": self.local_steps, "averages": self.averages,
                "average_bytes_sent": self.bytes_sent,
                "average_bytes_received": self.bytes_received,
                "bytes_per_average": self.bytes_sent / self.averages if self.averages else 0.0,
                "average_seconds": self.seconds}

    def settings(self):
        """What a checkpoint says of the schedule (a resumed job must have the same); the
        feedback decay only where it is not 1, so that checkpoints from before it load."""
        out = {"period": self.period, "period_from": self.period_from,
               "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
               "momentum_at_average": self.momentum_at_average}
        if self.feedback_decay != 1.0:
            out["feedback_decay"] = self.feedback_decay
        return out

    def _tables(self):
        """(checkpoint part, table, kind): the per-parameter state, "tensor" (flat tensors) or
        "feedback" (ErrorFeedback objects: their residuals; their kept states under "kept_"
        + part)."""
        return [("anchors", self.anchors, "tensor"), ("outer", self.outer, "tensor"),
                ("momentum_anchors", self.momentum_anchors, "tensor"),
                ("residuals", self.feedback, "feedback"),
                ("momentum_residuals", self.momentum_feedback, "feedback")]

    _PARTS = ("anchors", "outer", "momentum_anchors", "residuals", "momentum_residuals",
              "kept_residuals", "kept_momentum_residuals")

    def state_dict(self):
        """The anchors, the outer momentum, the momenta's anchors, the changes' residuals and
        kept states (float32 copies, by parameter name), which parameters' gradient residuals
        went into a local step, and the counts."""
        out = {part: {} for part in self._PARTS}
        out.update(settings=self.settings(), folded=[], averaged_after=self.averaged_after,
                   averages=self.averages, bytes_sent=self.bytes_sent,
                   bytes_received=self.bytes_received, local_steps=self.local_steps)
        for name, p in self.named:
            for part, table, kind in self._tables():
                v = table.get(id(p))
                if v is None:
                    continue
                if kind == "tensor":
                    out[part][name] = v.to("cpu", copy=True)
                else:
                    out[part][name] = _cuda._residual_of(v).to("cpu", copy=True)
                    if v.kept.size:
                        out["kept_" + part][name] = torch.from_numpy(v.kept.copy())
            if id(p) in self.folded:
                out["folded"].append(name)
        for part in self._PARTS:  # not used since a load: carried on as loaded
            for k, v in self._loaded.get(part, {}).items():
                out[part].setdefault(k, v)
        return out

    def check_settings(self, sd, who):
        """ValueError unless sd (a state_dict()) has this schedule's settings."""
        if sd is None or sd.get("settings") != self.settings():
            theirs = None if sd is None else sd.get("settings")
            raise ValueError(f"{who}: the checkpoint's periodic averaging {theirs} is not this "
                             f"one's {self.settings()}")

    def load_state_dict(self, sd, who):
        """Goes on from a state_dict() of the same settings (ValueError otherwise)."""
        self.check_settings(sd, who)
        for _, table, _ in self._tables():
            table.clear()
        self._loaded = {part: {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1)
                               for k, v in dict(sd.get(part, {})).items()}
                        for part in self._PARTS}
        names = set(sd.get("folded", []))
        self.folded = {id(p) for n, p in self.named if n in names}
        self.averaged_after = sd.get("averaged_after")
        self.averages = int(sd.get("averages", 0))
        self.bytes_sent = int(sd.get("bytes_sent", 0))
        self.bytes_received = int(sd.get("bytes_received", 0))
        self.local_steps = int(sd.get("local_steps", 0))
        if self._loaded["anchors"]:
            self._make_anchors()


class _JoinHook:
    """A joined rank's part of the averages (DDP's join with uneven inputs): after DDP's hook
    has shadowed the others' backward (the state's step count goes on), the average those ranks
    run after that step, with this rank's unchanged parameters."""

    def __init__(self, state):
        self.state = state

    def main_hook(self):
        periodic = self.state._periodic
        periodic.maybe_average(self.state.step)

    def post_hook(self, is_last_joiner):
        pass
