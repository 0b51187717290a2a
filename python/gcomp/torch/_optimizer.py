"""The optimizer wrapper (Horovod's way, without torch.distributed): DistributedOptimizer."""

import time

from . import _options, _pipeline, _timeline
from ._adam import _Adam
from ._engine import _Stats, _check_world, _engine
from ._feedback import _PerParameterFeedback
from ._periodic import _Periodic, _periodic_allowed, _periodic_of
from ._pipeline import Bucket


class DistributedOptimizer(_PerParameterFeedback):
    """DistributedOptimizer(optimizer, named_parameters=None, codec="none", error_feedback=True,
    warmup_steps=0, algorithm="auto", dense_below=1024, bucket_bytes=25 << 20, seed=0,
    synchronous=False, per_parameter=None, allow_uncompressed=True, momentum=None,
    weight_decay=None, stall_seconds=None, timeout_seconds=None, variance="frozen", period=1,
    period_from=0, outer_lr=1.0, outer_momentum=0.0, momentum_at_average="local",
    feedback_decay=1.0)

    Wraps a torch optimizer so that step() applies gradients averaged over the ranks through
    gcomp, without torch.distributed:

    1. a hook on each parameter's gradient accumulator collects the ready gradients into
       buckets of bucket_bytes (float32) and hands each to the communication thread as backward
       produces them;
    2. step() sends the last bucket, waits for all, and steps the wrapped optimizer.

    Every other attribute (param_groups, state_dict, ...) is the wrapped optimizer's.

    Args:
        optimizer: the torch optimizer. A torch.optim.Adam or AdamW runs as 1-bit Adam, as
            register() runs it (variance="frozen"; warmup_steps at least 1): its warm-up's steps
            are its own on the averaged gradients, then each rank's momentum is what is sent
            and step() applies the averaged momentum with the frozen variance (docs/python.md,
            "Adam and AdamW").
        named_parameters: (name, parameter) pairs, as CompressionState's names.
        codec, error_feedback, warmup_steps, algorithm, dense_below, seed, synchronous,
        allow_uncompressed, stall_seconds, timeout_seconds: as CompressionState's (a low-rank
            codec, "powersgd:rank=4", gets each gradient's shape). There is no whole-step check
            here: auto may send any bucket uncompressed unless allow_uncompressed is False.
        bucket_bytes: the float32 bytes of a bucket.
        per_parameter: as CompressionState's: True, each gradient of a bucket compressed on its
            own (one collective each); False, the bucket's gradients fused and compressed as one
            tensor; None, True for sign and TernGrad only.
        momentum, weight_decay: DGC's momentum correction, as CompressionState's; None takes the
            wrapped SGD's momentum and weight decay for the codecs that send much of a gradient
            late (top-k, random-k, threshold, sign), as register() does, and sets the SGD's to
            0; a number is taken as given.
        variance: "frozen" (1-bit Adam) or gcomp.AdamSchedule.zero_one(...) (0/1 Adam), as
            register()'s.
        period, period_from, outer_lr, outer_momentum, momentum_at_average, feedback_decay:
            periodic model averaging, as register()'s (docs/python.md, "Periodic averaging"):
            from step period_from on, step() takes each rank's own step and averages the models
            after every period-th.
        fragments, overlap_steps: streaming averages, as register()'s (docs/python.md,
            "Streaming"): the parameters in fragments averaged at staggered steps, each average
            merged overlap_steps steps after it starts.
        pacing: each fragment's average in up to N parts, by steps or (overlap_steps=1) in
            time, as register()'s.
        merge: "after_step" (the default) or "before_update": when an overlapped average is
            merged at its step, as register()'s.
        timeline: FILE: this rank's calls, steps, buckets and averages as Chrome trace events,
            as register()'s (gcomp.timeline, docs/timeline.md).

    state_dict() / load_state_dict(): as CompressionState's.
    """

    def __init__(self, optimizer, named_parameters=None, codec="none", error_feedback=True,
                 warmup_steps=0, algorithm="auto", dense_below=1024, bucket_bytes=25 << 20,
                 seed=0, synchronous=False, per_parameter=None, allow_uncompressed=True,
                 momentum=None, weight_decay=None, stall_seconds=None, timeout_seconds=None,
                 variance="frozen", period=1, period_from=0, outer_lr=1.0, outer_momentum=0.0,
                 momentum_at_average="local", feedback_decay=1.0, fragments=1, overlap_steps=0,
                 pacing=None, merge="after_step", timeline=None):
        self.optimizer = optimizer
        if named_parameters is None:
            named = [(f"param{i}", p) for i, p in
                     enumerate(p for g in optimizer.param_groups for p in g["params"])]
        else:
            named = list(named_parameters)
        seen = set()
        for name, p in named:
            if id(p) in seen:
                raise ValueError(f"parameter {name} is given twice in named_parameters")
            seen.add(id(p))
        who = "gcomp.torch.DistributedOptimizer"
        _timeline.open_for(timeline, who)
        self._steps = _timeline.Steps()  # step() on the timeline
        periodic = _periodic_of({"period": period, "period_from": period_from,
                                 "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                                 "momentum_at_average": momentum_at_average,
                                 "feedback_decay": feedback_decay, "fragments": fragments,
                                 "overlap_steps": overlap_steps, "pacing": pacing,
                                 "merge": merge}, who)
        adam = _options._adam_of(optimizer, variance, {"momentum": momentum,
                                                       "weight_decay": weight_decay}, who)
        if periodic is not None:
            _periodic_allowed(optimizer, adam, who)
        if adam:  # nothing of SGD's to move; the momentum of a bucket whole (per_parameter)
            momentum, weight_decay = 0.0, 0.0
            per_parameter = False if per_parameter is None else per_parameter
        # momentum and weight_decay None: the wrapped SGD's move here for the codecs that delay
        # (register()'s rule); self.moved says what moved.
        _options.apply(self, codec, error_feedback=error_feedback, warmup_steps=warmup_steps,
                       algorithm=algorithm, dense_below=dense_below, bucket_bytes=bucket_bytes,
                       seed=seed, synchronous=synchronous, per_parameter=per_parameter,
                       allow_uncompressed=allow_uncompressed, momentum=momentum,
                       weight_decay=weight_decay, stall_seconds=stall_seconds,
                       timeout_seconds=timeout_seconds, optimizer=optimizer, who=who,
                       moves=periodic is None or periodic["period_from"] > 0)
        # 1-bit Adam's stages (_adam._Adam) for an Adam or AdamW, else None.
        self._adam = _Adam(optimizer, variance, self.warmup_steps, who, self) if adam else None
        if adam:
            self.warmup_steps = self._adam.warmup_steps
        self.steps = 0
        self._periodic = _Periodic(self, optimizer, named, **periodic) if periodic else None
        # The whole-step check is the hook's (it sees whole steps): every bucket here may let
        # auto send it uncompressed, as allow_uncompressed says (_pipeline.bucket_collective).
        self._check = None
        self._init_feedback(named)  # parameter id -> (its ErrorFeedback, 0, numel) in _home
        self._meet(p for _, p in named)
        self._ready, self._ready_bytes = [], 0
        self._pending, self._buckets = [], 0
        self._stats = _Stats()
        self._accumulators = []  # kept alive: their hooks must stay registered
        # The Communicator, made now on every rank alike, and its world checked against
        # torch.distributed's where that is initialized.
        _engine().run(lambda comm: _check_world(comm, "gcomp.torch.DistributedOptimizer"))
        for _, p in named:
            if p.requires_grad:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._ready_hook(p))
                self._accumulators.append(acc)

    def __getattr__(self, name):
        return getattr(self.__dict__["optimizer"], name)

    def stats(self):
        """stats() -> dict, as CompressionState.stats(), with steps (tail_seconds: what
        step() waited for, from handing over the last bucket to every result); with a period,
        the averages' keys as CompressionState's."""
        extra = self._periodic.stats() if self._periodic is not None else {}
        return self._stats.snapshot(steps=self.steps, **extra)

    def _ready_hook(self, p):
        def hook(*_):
            self._ready.append(p)
            self._ready_bytes += 4 * p.numel()
            if self._ready_bytes >= self.bucket_bytes:
                self._submit()
        return hook

    def _submit(self):
        entered = time.perf_counter()
        params, self._ready, self._ready_bytes = self._ready, [], 0
        if not params:
            return
        adam = self._adam
        stage = _pipeline.bucket_stage(self, self.steps)
        dense = stage == "warm"
        grads = []
        for p in params:
            g = p.grad
            if g is None or not g.is_contiguous():
                raise ValueError(f"the gradient of {self._names.get(id(p), 'a parameter')} is "
                                 f"{'missing' if g is None else 'not contiguous'}")
            grads.append(g.view(-1))
        if stage == "local":
            self._periodic.local_step(params, grads, False)  # a local step: nothing is sent
            return
        if adam is not None and not dense:  # 1-bit Adam: this rank's momentum is sent
            adam.local_momentum(params, grads)
            if stage == "adam_local":  # 0/1 Adam's local step: it stays here (step() moves on it)
                return
        efs = None
        if self.error_feedback and not dense:
            efs = [self._feedback_of(p) for p in params]
        step, index = self.steps, self._buckets
        call = Bucket(self, "bucket", step, index, params, grads, grads, dense, entered)
        self._buckets += 1
        # Per parameter, bucket_bytes=1 makes each gradient a collective of its own; a low-rank
        # codec gets the gradients' shapes. Adam's momenta all go through the codec (dense_below
        # 0), small tensors included, as the hook's whole-model collective sends them: one
        # collective a bucket, not two.
        shaped = self._shaped and not dense
        collective = _pipeline.bucket_collective(
            self, grads, step, index, uncompressed=dense, efs=efs,
            dense_below=0 if adam is not None else self.dense_below,
            bucket_bytes=1 if self._split and not dense and not shaped else self.bucket_bytes,
            shapes=[tuple(p.shape) for p in params] if shaped else None)
        self._pending.append(call.submit(collective, dense))
        if self.synchronous:
            self._wait()

    def _wait(self):
        pending, self._pending = self._pending, []
        failure = None
        for fut in pending:  # every one, so that nothing of this step is still in flight
            try:
                fut.wait()
            except Exception as e:  # noqa: BLE001
                failure = failure or e
        if failure is not None:
            raise failure

    def synchronize(self):
        """Sends the gradients still waiting and waits until every allreduce of this step is
        done: the parameters' .grad then hold the averages."""
        entered = time.perf_counter()
        self._submit()
        self._buckets = 0
        try:
            self._wait()
        finally:
            self._stats.add_tail(time.perf_counter() - entered)

    def step(self, closure=None):
        """Averages the gradients (synchronize()) and steps the wrapped optimizer (1-bit Adam's
        compressed stage: applies the averaged momentum with the frozen variance)."""
        return self._steps.around(self._step, closure)

    def _step(self, closure):
        try:
            self.synchronize()
        finally:
            self.steps += 1
        adam, t = self._adam, self.steps
        if adam is None or (adam.schedule.refreshes(t) and adam.schedule.variance_steps(t) == t):
            periodic = self._periodic
            if periodic is not None and periodic.merge == "before_update":
                periodic.merge_due(t)  # the averages due merged under this update
            loss = self.optimizer.step(closure)
            if periodic is not None:
                if periodic.local(t - 1):
                    periodic.local_steps += 1
                periodic.maybe_average(t)
            return loss
        return adam.refresh(closure, t) if adam.schedule.refreshes(t) else adam.step(closure, t)

    def _steps_taken(self):
        return self.steps

    def zero_grad(self, *args, **kwargs):
        return self.optimizer.zero_grad(*args, **kwargs)

    _format = "gcomp.torch.DistributedOptimizer"

    def state_dict(self):
        """state_dict() -> dict: the wrapped optimizer's state_dict ("optimizer") and what
        gcomp keeps ("gcomp": the step count, every parameter's residual, velocity and kept
        state, by its name in named_parameters), for torch.save; a resumed job loads it with
        load_state_dict and goes on exactly. Call it between steps."""
        fb = self._feedback_state()
        fb.pop("buckets")
        return {"optimizer": self.optimizer.state_dict(),
                "gcomp": self._checkpoint("steps", self.steps, fb)}

    def load_state_dict(self, state_dict):
        """load_state_dict(state_dict): the wrapped optimizer's part into it, gcomp's (same
        codec and momentum, else ValueError) here. A plain torch optimizer state_dict (without
        gcomp's part) goes to the wrapped optimizer alone."""
        if isinstance(state_dict, dict) and "gcomp" not in state_dict:
            self.optimizer.load_state_dict(state_dict)
            return
        ours = state_dict["gcomp"]
        self._check_format(ours)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._load_feedback(ours)
        self.steps = int(ours["steps"])
