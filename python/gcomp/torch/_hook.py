"""The DDP communication hook: CompressionState (the hook's state for one model),
compression_hook, and register (the one line)."""

import time
import types

import torch
from gcomp import timeline
from torch.distributed.algorithms.join import Join, _JoinConfig


from . import _cuda, _options, _step_check, _timeline
from ._adam import _Adam
from ._engine import _Stats, _check_world, _engine
from ._feedback import _PerParameterFeedback
from ._periodic import _JoinHook, _Periodic, _periodic_allowed, _periodic_of
from . import _pipeline
from ._pipeline import Bucket
from ._step_check import _StepCheck, _start_steps


class CompressionState(_PerParameterFeedback):
    """CompressionState(codec, error_feedback=True, warmup_steps=0, algorithm="auto",
    dense_below=1024, seed=0, synchronous=False, per_parameter=None, allow_uncompressed=True,
    momentum=0.0, weight_decay=0.0, stall_seconds=None, timeout_seconds=None, names=None)

    The state of compression_hook for one DDP model.

    Args:
        codec: a spec or gcomp.Codec. A low-rank codec ("powersgd:rank=4", docs/python.md)
            takes each gradient's shape from bucket.gradients() and sends the bucket's
            matrices as their factors in one collective, its vectors and small matrices dense
            in the same one (per_parameter and dense_below do not apply; the bucket is reduced
            where DDP holds it, without a copy); its state (residual and warm-start Q) is per
            parameter, so it works with DDP's default buckets and their rebuild. Without error
            feedback it keeps no Q: every step starts cold.
        error_feedback: keep what the codec did not send, per parameter, and add it to the next
            step's gradient (it follows the parameters when DDP rebuilds its buckets after the
            first step). True applies it to the codecs whose error contracts (top-k, threshold,
            sign, fp16, bf16, random-k), not to QSGD, TernGrad and scaled random-k, whose
            residual would grow without bound; "always" to every codec, False to none.
        warmup_steps: the first steps are averaged uncompressed.
        algorithm, allow_uncompressed: as gcomp.Communicator.allreduce (auto may send a tensor
            uncompressed when that is faster, unless allow_uncompressed is False; even then auto
            may choose dense, which sends each rank's decode as float32: algorithm=
            "fewest_bytes" sends the codec's bytes). Under auto with allow_uncompressed, a
            low-rank codec's whole steps are compared too (_StepCheck, docs/python.md): where
            the uncompressed steps measure faster, the hook sends whole steps uncompressed.
        dense_below: parameters (whole buckets, where not per parameter) of fewer elements go
            uncompressed.
        seed: mixed with the step and the bucket into each call's seed.
        synchronous: wait for each bucket's allreduce in the hook (no overlap with backward;
            for measuring overlap).
        per_parameter: True compresses each parameter's gradient in the bucket on its own (one
            collective each, parameters under dense_below fused into one uncompressed), as
            layer-wise compression does: a codec's scale or top-k's selection then follows each
            layer. False compresses the whole bucket as one tensor (fewer collectives; a top-k
            over the bucket's layers together). None: True for the codecs with one scale per
            tensor (sign, TernGrad), False for the others. The element-wise codecs (none, fp16,
            bf16, threshold) always send the bucket whole: their values are the same either way.
        momentum: DGC's momentum correction (0 = off). The hook keeps a velocity per parameter,
            u = momentum * u + g, and compresses u with error feedback instead of g: the
            residual accumulates velocities, top-k selects on them, and where a value is sent
            its velocity is zeroed (momentum factor masking). Train with an optimizer without
            momentum (SGD with momentum=0): the momentum is here. Needs error feedback.
            register() sets it (and weight_decay) from the optimizer.
        weight_decay: added to each gradient before momentum correction and compression,
            g += weight_decay * p (SGD's weight decay, moved here).
        stall_seconds, timeout_seconds: for this hook's calls, the Communicator's (None: its
            own, from GCOMP_STALL_SECONDS, default 60, and GCOMP_TIMEOUT_SECONDS, default never;
            0: never): a rank that waits that long for another at a bucket's call names the call
            and the missing ranks on stderr, or with the timeout raises gcomp.Error("timeout")
            from backward on every rank (docs/python.md, "A rank that does not come").
        names: (name, parameter) pairs (register() passes model.named_parameters()), the keys
            of state_dict() and the names in a stall report.

    state_dict() / load_state_dict(): checkpoints (docs/python.md).
    """

    def __init__(self, codec, error_feedback=True, warmup_steps=0, algorithm="auto",
                 dense_below=1024, seed=0, synchronous=False, per_parameter=None,
                 allow_uncompressed=True, momentum=0.0, weight_decay=0.0, stall_seconds=None,
                 timeout_seconds=None, names=None):
        _options.apply(self, codec, error_feedback=error_feedback, warmup_steps=warmup_steps,
                       algorithm=algorithm, dense_below=dense_below, seed=seed,
                       synchronous=synchronous, per_parameter=per_parameter,
                       allow_uncompressed=allow_uncompressed, momentum=momentum,
                       weight_decay=weight_decay, stall_seconds=stall_seconds,
                       timeout_seconds=timeout_seconds)
        self._init_feedback(names)
        self.step = 0  # completed backward passes (a bucket with is_last() ends one)
        self._layout = {}  # bucket index -> (layout key, ErrorFeedback)
        self._stats = _Stats()
        self._new_step = True  # the next hook call is a step's first
        self._world_ok = False  # gcomp's world checked against torch's (the first call)
        self._adam = None  # register() with Adam or AdamW: 1-bit Adam's stages (_adam._Adam)
        self._periodic = None  # register(period=H > 1): periodic averaging (_periodic._Periodic)
        self._steps = _timeline.Steps()  # the optimizer's steps on the timeline
        self._join_config = _JoinConfig.construct_disabled_join_config()  # torch's Joinable
        self._join_group = None  # the DDP model's process group (register() with a period)
        # 1-bit Adam with whole buckets: this step's (parameter, momentum view) pairs held
        # until its last bucket (_whole_model).
        self._held, self._held_step = [], None
        # Low-rank under auto, uncompressed allowed: whole steps compared too (_StepCheck).
        self._check = (_StepCheck(self.warmup_steps + _start_steps(codec) + _StepCheck.window)
                       if self._shaped and algorithm == "auto" and self.allow_uncompressed
                       else None)

    def stats(self):
        """stats() -> dict: calls, dense_calls (warm-up; small whole buckets), compressed,
        bytes_sent, bytes_received, encode/comm/decode_seconds, algorithm (calls per
        algorithm) and steps, summed over this rank's hook calls so far; and where the time
        goes: hook_seconds (in the hook, on the training thread), handoff_seconds (submitted
        to started on the communication thread), job_seconds (the jobs there: encode, comm,
        decode and python_seconds, the rest; agree_seconds is comm's agreement), tail_seconds
        (from each step's last bucket handed over to its result: what the end of backward
        waits for), cpu_seconds (the communication thread's CPU time in the jobs), jobs; for a
        low-rank codec under auto (whole steps compared, docs/python.md), step_checks,
        step_switches, step_aborts and uncompressed_steps; with a period (register(period=H)),
        local_steps, averages, average_bytes_sent, average_bytes_received (the averages' part
        of bytes_sent and bytes_received), bytes_per_average and average_seconds."""
        extra = self._check.stats() if self._check else {}
        if self._periodic is not None:
            extra.update(self._periodic.stats())
        return self._stats.snapshot(steps=self.step, **extra)

    def _steps_taken(self):
        return self.step

    def _whole_step(self, step, index, first_call, dense):
        """(plain, bare) for a bucket of `step`: plain, the step goes uncompressed where the
        step check found whole steps faster that way (x + e summed with codec none: the
        residual sent and zeroed, as auto's own uncompressed choice does); bare, past the
        bucket's first uncompressed step its residuals are zero: the plain allreduce."""
        check = self._check
        plain = not dense and check is not None and check.mode(step, first_call,
                                                               _step_check._vote)
        bare = plain and index in check.zeroed
        if check is not None:
            if plain:
                check.zeroed.add(index)
            elif not dense:
                check.zeroed.clear()
        return plain, bare

    def _collective(self, bucket, tensor, step, index, dense, plain, bare):
        """(the bucket's Collective, its gradients' views or None): dense (warm-up, a small
        whole bucket) or bare, the bucket uncompressed; plain, its views with their residuals,
        uncompressed; else with the codec: a low-rank codec's matrices in one collective, or
        each parameter on its own (per_parameter), or the bucket whole, with error feedback
        per parameter as the state keeps it."""
        views = efs = ef = shapes = None
        if not dense and (self._shaped or self._split):
            views = [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
            if self._shaped:  # low-rank: the bucket's gradients as matrices
                shapes = [tuple(g.shape) for g in bucket.gradients()]
            if self.error_feedback:
                efs = [self._feedback_of(p) for p in bucket.parameters()]
        elif self.error_feedback and not dense:
            ef = self._feedback_for(bucket)
        if dense or bare:
            return _pipeline.bucket_collective(self, tensor, step, index, uncompressed=True), views
        whole_bytes = max(4 * tensor.numel(), 1)
        if plain:
            return _pipeline.bucket_collective(self, views, step, index, plain=True, efs=efs,
                                               bucket_bytes=whole_bytes, dense_below=0), views
        if self._shaped:
            # dense_below=0: the low-rank algorithm sends the small tensors dense in its first
            # collective (one collective a bucket, not two), and the views, which lie in the
            # bucket's buffer in order, are reduced there.
            return _pipeline.bucket_collective(self, views, step, index, efs=efs, shapes=shapes,
                                               bucket_bytes=whole_bytes, dense_below=0), views
        if self._split:
            # bucket_bytes=1: each parameter is a bucket of its own, compressed on its own.
            return _pipeline.bucket_collective(self, views, step, index, efs=efs, bucket_bytes=1,
                                               dense_below=self.dense_below), views
        return _pipeline.bucket_collective(self, tensor, step, index, ef=ef), views

    def _feedback_for(self, bucket):
        """The bucket's ErrorFeedback (per_parameter=False); when DDP has laid out this bucket
        anew (its rebuild after the first step), a new one filled with each parameter's residual
        from where it was (or from a loaded checkpoint)."""
        entries = _layout_of(bucket)
        key = tuple(entries)
        known = self._layout.get(bucket.index())
        if known is not None and known[0] == key:
            return known[1]
        ef = _cuda._new_feedback(bucket.buffer().numel(), bucket.buffer())
        residual = _cuda._residual_of(ef)
        pending = self._loaded["residuals"]
        for pid, off, numel in entries:
            home = self._home.get(pid)
            if home is not None:
                old, old_off, old_numel = home
                if old_numel == numel:
                    residual[off:off + numel] = _cuda._residual_of(old)[old_off:old_off + numel]
            else:
                r = pending.pop(self._keys.get(pid), None)
                if r is not None and r.numel() == numel:
                    residual[off:off + numel] = r
        # What the collectives kept beside the bucket's residual, where a checkpoint has it for
        # this very layout.
        kept = self._loaded["buckets"].pop(self._bucket_key(entries), None)
        if kept is not None:
            ef.kept = torch.as_tensor(kept, dtype=torch.float32).numpy()
        for pid, off, numel in entries:
            self._home[pid] = (ef, off, numel)
        self._layout[bucket.index()] = (key, ef)
        return ef

    # torch's Joinable (DDP's join with uneven inputs, where register() made a period): a
    # joined rank takes part in the averages the others run.

    def join_hook(self, **kwargs):
        return _JoinHook(self)

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return self._join_group

    def _bucket_key(self, entries):
        return tuple((self._keys.get(pid), off, numel) for pid, off, numel in entries)

    _format = "gcomp.torch.CompressionState"

    def state_dict(self):
        """state_dict() -> dict: what a resumed job needs to go on exactly where this one is
        (for torch.save): the step count, every parameter's error-feedback residual and
        momentum-correction velocity, and what the collectives keep beside a residual (the
        low-rank warm-start factors), each parameter by its name (register(), names=) or else
        by its place in the order the hook first met it; float32 tensors, copies. Not in it:
        what auto learned and the whole-step check, which a resumed job learns again
        (docs/python.md, "Checkpoints"). Call it between steps (no bucket in flight)."""
        fb = self._feedback_state()
        for (layout, ef) in self._layout.values():
            kept = ef.kept
            if kept.size:
                fb["buckets"][self._bucket_key(layout)] = torch.from_numpy(kept)
        return self._checkpoint("step", self.step, fb)

    def load_state_dict(self, state_dict):
        """load_state_dict(state_dict): goes on from a state_dict() of a state with the same
        codec and momentum (ValueError otherwise), before the hook's first call or between
        steps: the step count as saved, and each parameter's residual and velocity when the hook
        next meets it (by its key), whatever buckets DDP has laid it out in."""
        self._check_format(state_dict)
        self._load_feedback(state_dict)
        self._layout.clear()
        self.step = int(state_dict["step"])
        self._new_step = True
        if self._check is not None:  # the whole-step check measures afresh
            self._check = _StepCheck(max(self.warmup_steps + _start_steps(self.codec),
                                         self.step) + _StepCheck.window)


def _layout_of(bucket):
    """[(parameter id, offset in the bucket's buffer, numel)] in the bucket's order."""
    buffer = bucket.buffer()
    base, size = buffer.data_ptr(), buffer.element_size()
    entries, offset = [], 0
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        if g.data_ptr() >= base and g.data_ptr() < base + buffer.numel() * size:
            offset = (g.data_ptr() - base) // size  # a view into the bucket
        entries.append((id(p), offset, p.numel()))
        offset += p.numel()
    return entries


def compression_hook(state, bucket):
    """compression_hook(state, bucket) -> torch.futures.Future[torch.Tensor]

    A DDP communication hook (torch's contract: register it with
    ``model.register_comm_hook(state, compression_hook)``): averages the bucket over the ranks
    through gcomp with state's codec, on the communication thread, and returns a future of the
    averaged bucket, as DDP's default hook does.
    """
    entered = time.perf_counter()
    tensor = bucket.buffer()
    step, index, last = state.step, bucket.index(), bucket.is_last()
    params = bucket.parameters()
    state._meet(params)
    adam = state._adam
    stage = _pipeline.bucket_stage(state, step)
    warm = stage == "warm"
    dense = warm or (not state._split and not state._shaped and tensor.numel() < state.dense_below)
    first_call, state._new_step = state._new_step, last
    if stage in ("local", "adam_local"):
        grads = [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
        if stage == "local":
            # A local step (register(period=H)): this rank's gradients, its own momentum; the
            # optimizer's step() averages the models where a period ends.
            state._periodic.local_step(params, grads, last)
        else:
            # 0/1 Adam's local step: this rank's momentum stays here (the optimizer's step()
            # moves on it, and synchronizes where an interval ends).
            adam.local_momentum(params, grads)
        if last:
            state.step += 1
        return _done(tensor)
    if adam is not None and not warm and not (state._shaped or state._split):
        return _whole_model(state, bucket, tensor, params, step, last, entered)
    plain, bare = state._whole_step(step, index, first_call, dense)
    collective, views = state._collective(bucket, tensor, step, index, dense, plain, bare)
    grads = None
    if state.momentum or state.weight_decay or (state._adam is not None and not warm):
        grads = views or [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
    if state._adam is not None and not warm:  # 1-bit Adam: this rank's momentum is sent
        state._adam.local_momentum(params, grads)
    call = Bucket(state, "DDP bucket", step, index, params, grads, [tensor], dense, entered)
    if last:
        state.step += 1
    fut = call.submit(collective, dense or plain, result=tensor, tail=last,
                      world_check="gcomp.torch.compression_hook",
                      errors=f"gcomp compression_hook, bucket {index}")
    if state.synchronous:
        try:
            fut.wait()
        except Exception:  # noqa: BLE001 - the future holds it; DDP raises it from backward
            pass
    return fut


def _done(tensor):
    """A future complete with tensor, as it is now (a CUDA tensor's: a CUDA-aware future, whose
    waiters wait for the current stream's work on it)."""
    cuda = _cuda.cuda
    fut = (cuda.future(cuda.device(tensor)) if cuda.on_device(tensor)
           else torch.futures.Future())
    fut.set_result(tensor)
    return fut


def _whole_model(state, bucket, tensor, params, step, last, entered):
    """1-bit Adam's compressed step with whole buckets: every bucket's momentum in one
    collective at the step's last bucket, its parameters in the order the state first met them,
    each with its own residual (and owner's share under compressed_reduce_scatter). The chunks
    an owner keeps then do not depend on how DDP groups the parameters into buckets (which it
    changes after a job's first step, and a resumed job starts from its first layout again), so
    a checkpoint resumes exactly on any layout. The earlier buckets' futures are complete at
    once and their buffers reduced in place when the last bucket's hook returns (it waits for
    the collective): DDP reads the buffers after the last hook, when backward ends, which is
    also when its own wait for the last bucket would end (the momentum's payload is small)."""
    views = [tensor[off:off + n] for _, off, n in _layout_of(bucket)]
    state._adam.local_momentum(params, views)
    if state._held_step != step:
        state._held, state._held_step = [], step
    state._held += list(zip(params, views))
    if not last:
        return _done(tensor)
    ordered = sorted(state._held, key=lambda pv: state._met[id(pv[0])])
    state._held, state._held_step = [], None
    ps, vs = [p for p, _ in ordered], [v for _, v in ordered]
    efs = [state._feedback_of(p) for p in ps] if state.error_feedback else None
    collective = _pipeline.bucket_collective(state, vs, step, 0, efs=efs, dense_below=0,
                                             bucket_bytes=max(4 * sum(v.numel() for v in vs), 1))
    call = Bucket(state, "DDP buckets", step, 0, ps, vs, [tensor], False, entered)
    state.step += 1
    fut = call.submit(collective, False, result=tensor, tail=True,
                      world_check="gcomp.torch.compression_hook",
                      errors="gcomp compression_hook, the model's buckets")
    try:
        fut.wait()
    except Exception:  # noqa: BLE001 - the future holds it; DDP raises it from backward
        pass
    return fut


def register(model, optimizer, codec, **options):
    """register(model, optimizer, codec, **options) -> CompressionState

    The one line for a DistributedDataParallel script:

    1. makes a CompressionState(codec, **options) (options as CompressionState's; its
       checkpoint keys are model's parameter names);
    2. moves what the optimizer must not do itself into the hook (below);
    3. registers compression_hook with it on model, and returns it.

    Args:
        model: the DistributedDataParallel model. model.join() then joins the state too
            (uneven inputs).
        optimizer: its optimizer, or None (nothing moves).
            SGD: for the codecs that send much of a gradient late through error feedback (the
            sparsifiers top-k, random-k, threshold; sign), momentum SGD amplifies the delay and
            loses accuracy, so register moves the optimizer's momentum (and weight decay) into
            the hook as DGC's momentum correction: the state gets momentum= and weight_decay= of
            the optimizer's param groups, and the groups get 0 (a bucket sent whole is then
            plain momentum SGD, bit for bit the same update). What it cannot move (an optimizer
            other than SGD, Nesterov momentum, dampening, maximize, groups with different
            momentum or weight decay) it leaves as it is, with a warning saying so. momentum=
            among the options is taken as given (nothing moves; a momentum in both places is a
            ValueError).
            torch.optim.Adam or AdamW: 1-bit Adam (variance="frozen", the default;
            docs/python.md, "Adam and AdamW"): warmup_steps (at least 1) exact steps of the
            optimizer on gradients averaged uncompressed, then the variance frozen and each
            rank's momentum sent through the codec with error feedback, the optimizer's step()
            applying the averaged momentum with the frozen variance (register takes over
            optimizer.step for that). What it cannot take (amsgrad, maximize, capturable,
            differentiable, fused; momentum= or weight_decay= among the options, which are
            SGD's) is a ValueError.
        codec: a spec or gcomp.Codec.
        variance: for Adam: "frozen"; None leaves the optimizer as it is and compresses its
            gradients, with a warning; gcomp.AdamSchedule.zero_one(freeze_step, ...) runs 0/1
            Adam: the variance refreshed on the schedule (exact steps on gradients averaged
            uncompressed) until freeze_step, then local steps, each rank on its own momentum,
            synchronized on the schedule by optimizer.step() (docs/python.md, "0/1 Adam").
        period=H (> 1), period_from=S: periodic model averaging (docs/python.md, "Periodic
            averaging"). Steps before S are synchronized as above; from S on each rank steps on
            its own (the hook sends nothing) and optimizer.step() averages the models after
            every H-th local step: each parameter's change since the last average through the
            codec, with error feedback of its own, so that every rank ends the average with the
            same parameters.
        outer_lr, outer_momentum: an outer Nesterov step on the averaged change (DiLoCo's; 1.0
            and 0.0, the defaults, are plain averaging).
        momentum_at_average: "local" (each rank keeps its optimizer's momentum, as torch's
            post-local SGD), "reset" or "average" (averaged with the parameters, through the
            codec).
        feedback_decay: beta in [0, 1]: each parameter's residual of the averages is multiplied
            by beta before the next change is added (SparseLoCo's error feedback in place of an
            outer momentum; 1.0, the default, keeps it whole).
        fragments=F (1 to period): streaming averages (docs/python.md, "Streaming"): the
            parameters cut into F fragments of about equal bytes, in registration order,
            fragment f averaged after the local steps f H // F, + H, ...
        overlap_steps=T (0 to period - 1): a fragment's average runs while T more steps go on
            and is merged after them (every rank's fragment then the same); what the rank moved
            it meanwhile goes into the fragment's next change.
        pacing=N: each fragment's average sent in up to N parts (docs/python.md, "Streaming"):
            by default T with T >= 2 (part j after the j-th overlapped step), else 1 (none);
            with overlap_steps=1, N > 1 spreads the parts over the overlapped step in time
            (part j D / N seconds after part j - 1 is done, D the median of the last 8 steps'
            lengths).
        merge: when an overlapped average is merged at its step s + T: "after_step" (the
            default; after that step's update, the rank's progress on the fragment since the
            start carried into its next change) or "before_update" (inside that step, after
            its gradients and before the optimizer's update, which then lands on the merged
            values: nothing to carry at T = 1).
        timeline=FILE: this rank's calls, steps, buckets and averages written to FILE's rank
            file as Chrome trace events (gcomp.timeline, docs/timeline.md; GCOMP_TIMELINE=FILE
            does the same for any program).
    """
    if not hasattr(model, "register_comm_hook"):
        raise TypeError("register: model must be a torch.nn.parallel.DistributedDataParallel "
                        f"model (it has register_comm_hook), not {type(model).__name__}")
    options = dict(options)
    who = "gcomp.torch.register"
    variance = options.pop("variance", "frozen")
    timeline_file = options.pop("timeline", None)
    periodic = _periodic_of(options, who)
    adam = _options._adam_of(optimizer, variance, options, who)
    if periodic is not None:
        _periodic_allowed(optimizer, adam, who)
    # Periodic from step 0: no gradient goes through the codec, so nothing of the optimizer's
    # momentum is delayed (each rank's own is its local heavy-ball momentum): nothing to move.
    local_only = periodic is not None and periodic["period_from"] == 0
    moved = {} if adam or local_only else _options._take_momentum(optimizer, codec, options, who)
    if adam and options.get("per_parameter") is None:
        options["per_parameter"] = False  # 1-bit Adam: the momentum of a bucket whole
    options.setdefault("names", list(model.named_parameters()))
    _timeline.open_for(timeline_file, who)
    state = CompressionState(codec, **options)
    _engine().run(lambda comm: _check_world(comm, who))
    state.moved = moved
    if adam:
        state._adam = _Adam(optimizer, variance, state.warmup_steps, who, state)
        state.warmup_steps = state._adam.warmup_steps
        # The optimizer's step() after a backward (the hook has counted it in state.step) is
        # the schedule's: the optimizer's own in the warm-up.
        state._adam.take_step(lambda: state.step)
    if periodic is not None:
        state._periodic = _Periodic(state, optimizer, options["names"], **periodic)
        state._join_group = model.process_group
        _average_after_step(optimizer, state._periodic, lambda: state.step)
        _join_with(model, state)
    if optimizer is not None and timeline.on():
        # The timeline's steps (outermost: the averages are in them); without a timeline the
        # optimizer stays as it is.
        _timeline.trace_steps(optimizer, state._steps)
    model.register_comm_hook(state, compression_hook)
    return state


def _average_after_step(optimizer, periodic, taken):
    """Makes optimizer.step() average the models after the steps where a period ends (taken()
    says how many steps the owner has counted, this one's included). A learning-rate scheduler
    keeps its count, whether it wrapped step() before this or after (as _Adam.take_step)."""
    own = optimizer.step
    counted = getattr(own, "_with_counter", False)

    def step(self, closure=None):
        if periodic.merge == "before_update":  # the averages due merged under this update
            periodic.merge_due(taken())
        loss = own(closure)
        periodic.maybe_average(taken())
        return loss

    step._with_counter = counted
    optimizer.step = types.MethodType(step, optimizer)


def _join_with(model, state):
    """Makes model.join() (DDP's uneven inputs) join state too, so that a rank that has run
    out of data takes part in the averages the others run."""
    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        return Join([self, state], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    model.join = types.MethodType(join, model)
