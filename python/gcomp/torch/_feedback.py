"""Per-parameter state, shared by CompressionState and DistributedOptimizer: each parameter's
error-feedback residual and momentum-correction velocity, weight decay and momentum correction
before a collective and momentum factor masking after it, and their checkpoints."""

import numpy as np
import torch

import gcomp

from . import _cuda
from ._options import _spec_of


class _PerParameterFeedback:
    """Where each parameter's error-feedback residual lives: _home maps a parameter's id to
    (ErrorFeedback, offset, numel), its own ErrorFeedback (offset 0) or its share of a
    bucket's. _keys names each parameter met for checkpoints (its name where known, else its
    place in the order first met); _loaded holds a loaded checkpoint's values until each
    parameter is met again."""

    _format = None  # the checkpoint's "format" (set by each subclass)
    _adam = None  # 1-bit Adam's stages (_adam._Adam), where the optimizer is Adam or AdamW
    _periodic = None  # periodic averaging (_periodic._Periodic), where a period > 1 was given

    def _init_feedback(self, names=None):
        self._velocity = {}  # parameter id -> its velocity (momentum correction)
        self._home = {}  # parameter id -> (ErrorFeedback, offset, numel): where its residual is
        # parameter id -> its name (checkpoint keys), from (name, parameter) pairs
        self._names = {id(q): n for n, q in (names or [])}
        self._keys = {}  # parameter id -> its checkpoint key, in the order first met
        self._met = {}  # parameter id -> its place in that order (0 for the first)
        self._params = {}  # parameter id -> the parameter (kept for state_dict)
        self._loaded = {"residuals": {}, "kept": {}, "velocities": {}, "buckets": {}}

    def _meet(self, params):
        """Gives each parameter not met before its checkpoint key."""
        keys = self._keys
        for p in params:
            if id(p) not in keys:
                self._met[id(p)] = len(keys)
                keys[id(p)] = self._names.get(id(p), f"#{len(keys)}")
                self._params[id(p)] = p

    def average_parameters(self):
        """Local steps (a period > 1, or 0/1 Adam's variance=gcomp.AdamSchedule with
        max_local_steps > 1): averages the ranks' parameters now, an average ahead of the
        schedule, so that every rank has the same model to evaluate or save; the schedule's
        averages go on as before (a period's counted from its start, not from this one);
        with streaming, the averages in flight are merged first.
        Collective: every rank calls it between the same two steps. Nothing is sent where the
        ranks already agree (before the local steps, or right after an average) or without
        local steps."""
        taken = self._steps_taken()
        periodic = self._periodic
        if periodic is not None:
            if taken > periodic.period_from and periodic.agreed_after != taken:
                periodic.average(taken, index=4)
        elif self._adam is not None:
            self._adam.average_now(taken)

    def _check_periodic(self, sd):
        """A checkpoint of periodic averaging goes to a state or optimizer with a period, and
        only such a checkpoint."""
        if (self._periodic is None) != (sd.get("periodic") is None):
            raise ValueError("load_state_dict: the checkpoint is of a job " + (
                "with" if self._periodic is None else "without") + " periodic averaging "
                "(period=), this one " + ("without" if self._periodic is None else "with"))
        if self._periodic is not None:  # before anything is loaded: the same settings
            self._periodic.check_settings(sd["periodic"], "load_state_dict")

    def _label(self, kind, index, step, params):
        """A call's name in a stall report: "DDP bucket 2 of step 17 (fc.weight, fc.bias)"."""
        names = [self._names[id(p)] for p in params if id(p) in self._names]
        if len(names) > 3:
            names = names[:3] + [f"{len(names) - 3} more"]
        return f"{kind} {index} of step {step}" + (f" ({', '.join(names)})" if names else "")

    def residual(self, param):
        """The error-feedback residual of one parameter, or None: a float32 numpy view (CPU
        parameters) or a torch tensor view on the parameter's device (CUDA parameters)."""
        home = self._home.get(id(param))
        if home is None:
            return None
        ef, offset, numel = home
        r = ef.residual if ef.device == "cpu" else _cuda._residual_of(ef)
        return r[offset:offset + numel]

    def _feedback_of(self, p):
        """A parameter's own ErrorFeedback, made once (not a throwaway one every step), with a
        loaded checkpoint's residual and kept state where there is one."""
        home = self._home.get(id(p))
        if home is None:
            ef = _cuda._new_feedback(p.numel(), p)
            key = self._keys.get(id(p))
            r = self._loaded["residuals"].pop(key, None)
            if r is not None and r.numel() == p.numel():
                _cuda._residual_of(ef).copy_(r)
            k = self._loaded["kept"].pop(key, None)
            if k is not None:
                ef.kept = k.numpy()
            home = self._home[id(p)] = (ef, 0, p.numel())
        return home[0]

    def velocity(self, param):
        """The momentum-correction velocity of one parameter (a float32 tensor), or None."""
        return self._velocity.get(id(param))

    def _decay(self, params, grads):
        """Weight decay before compression (where register() moved it from SGD, as DGC adds it
        before momentum correction): g += weight_decay * p, in place."""
        with torch.no_grad():
            for p, g in zip(params, grads):
                g.add_(p.detach().reshape(g.shape), alpha=self.weight_decay)

    def _accumulate_momentum(self, params, grads):
        """Momentum correction (Lin et al., DGC), before compression: each parameter's velocity
        u = momentum * u + g replaces its gradient g (in place), so that the error-feedback
        residual accumulates velocities and top-k selects on them. Returns [(param, u)]."""
        pairs = []
        with torch.no_grad():
            for p, g in zip(params, grads):
                u = self._velocity.get(id(p))
                if u is None:
                    u = self._loaded["velocities"].pop(self._keys.get(id(p)), None)
                    if u is not None and u.numel() == g.numel():
                        u = self._velocity[id(p)] = u.to(g.device, copy=True)
                    else:
                        u = self._velocity[id(p)] = g.detach().reshape(-1).clone()
                        pairs.append((p, u))
                        continue
                if g.is_contiguous() and not _cuda.cuda.on_device(g):
                    gcomp.momentum_correct(u, g.view(-1), self.momentum)  # in place, no GIL
                else:  # the same two roundings, by torch (on the device, on its stream)
                    u.mul_(self.momentum).add_(g.reshape(-1))
                    g.copy_(u.view_as(g))
                pairs.append((p, u))
        return pairs

    def _mask_momentum(self, pairs):
        """Momentum factor masking, after the allreduce: a parameter's velocity is zeroed where
        its accumulated value was sent (the residual is 0 there), so that a gradient already
        applied late does not go on pushing. A parameter sent whole (its residual all zero:
        warm-up, a tensor auto or dense_below sent uncompressed) keeps its velocity: nothing of it
        was delayed, and the update is plain momentum SGD."""
        for p, u in pairs:
            r = self.residual(p)
            if r is None:
                continue
            if isinstance(r, np.ndarray):
                gcomp.mask_momentum(u, r)
            else:  # on the device, without a host sync: the same zeros as mask_momentum's
                sent = r == 0
                u.masked_fill_(sent & ~sent.all(), 0.0)

    # ---- checkpoints ----

    def _feedback_state(self):
        """The per-parameter part of state_dict(): residuals, kept states and velocities by
        checkpoint key (float32 tensors, copies), and the shared buckets' kept states."""
        out = {"residuals": {}, "kept": {}, "velocities": {}, "buckets": {}}
        for pid, key in self._keys.items():
            home = self._home.get(pid)
            if home is not None:
                ef, off, numel = home
                out["residuals"][key] = _cuda._residual_of(ef)[off:off + numel].to("cpu",
                                                                                   copy=True)
                if numel == ef.size:  # its own memory: what the collectives keep beside it
                    kept = ef.kept
                    if kept.size:
                        out["kept"][key] = torch.from_numpy(kept)
            u = self._velocity.get(pid)
            if u is not None:
                out["velocities"][key] = u.clone()
        # Not yet met since a load: carried on as loaded.
        for part in ("residuals", "kept", "velocities", "buckets"):
            for key, v in self._loaded[part].items():
                out[part].setdefault(key, v)
        return out

    def _checkpoint(self, steps_key, steps, fb):
        """The checkpoint's gcomp part: format, version, codec, the step count (under
        steps_key), momentum and the per-parameter state fb."""
        out = {"format": self._format, "version": 1, "codec": _spec_of(self.codec),
               steps_key: steps, "momentum": self.momentum, **fb}
        if self._adam is not None:  # 1-bit Adam: its moments are in the optimizer's state_dict
            out["adam"] = self._adam.checkpoint()
            local = self._adam.local_state()
            if local is not None:  # 0/1 Adam's local steps: the anchors
                out["adam_local"] = local
        if self._periodic is not None:  # the anchors, residuals and counts of the averages
            out["periodic"] = self._periodic.state_dict()
        return out

    def _check_format(self, sd):
        if not isinstance(sd, dict) or sd.get("format") != self._format:
            raise ValueError(f"load_state_dict: not a {self._format} state_dict "
                             f"(format {sd.get('format') if isinstance(sd, dict) else type(sd)!r})")
        if sd.get("version") != 1:
            raise ValueError(f"load_state_dict: version {sd.get('version')!r} is not known "
                             "(this gcomp reads version 1)")
        spec = _spec_of(self.codec)
        if sd.get("codec") != spec:
            raise ValueError(f"load_state_dict: the checkpoint is of codec {sd.get('codec')!r}, "
                             f"this state's is {spec!r}")
        mine = self._adam.checkpoint() if self._adam is not None else None
        if sd.get("adam") != mine:
            raise ValueError(f"load_state_dict: the checkpoint's 1-bit Adam {sd.get('adam')} is "
                             f"not this one's {mine}")
        self._check_periodic(sd)
        if float(sd.get("momentum", 0.0)) != self.momentum:
            raise ValueError(f"load_state_dict: the checkpoint's momentum {sd.get('momentum')} "
                             f"is not this state's {self.momentum}")

    def _load_feedback(self, sd):
        """Forgets this rank's residuals and velocities and holds the checkpoint's until each
        parameter is met (by its key)."""
        self._velocity.clear()
        self._home.clear()
        if self._adam is not None:
            self._adam.load_local_state(sd.get("adam_local"))
        if self._periodic is not None:
            self._periodic.load_state_dict(sd["periodic"], "load_state_dict")
        self._loaded = {part: {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1)
                                if part != "buckets" else v
                                for k, v in dict(sd.get(part, {})).items()}
                         for part in ("residuals", "kept", "velocities", "buckets")}
