"""The options CompressionState and DistributedOptimizer share, checked in one place (apply),
and what they mean for a codec, read from its properties (codec.properties: no codec is known
here by its name)."""

import math
import warnings

import torch

import gcomp

from ._adam import _is_adam


def _codec_or_none(codec):
    """The gcomp.Codec of a spec (or the Codec given), None for a bad spec."""
    if isinstance(codec, gcomp.Codec):
        return codec
    try:
        return gcomp.Codec(codec)
    except gcomp.Error:
        return None


def _spec_of(codec):
    """The codec's spec as checkpoints name it: the library's spelling, or the text given where
    it is not a codec."""
    c = _codec_or_none(codec)
    return c.spec if c is not None else str(codec)


def _feedback_wanted(codec, setting):
    """Whether error feedback applies: setting False, True (the codecs whose error is a
    contraction, |x - C(x)|^2 <= (1 - delta) |x|^2, which error feedback's theory asks for: the
    codec's properties["contraction"], as the library's other users read it) or "always". The
    stochastic quantizers (QSGD, TernGrad) and scaled random-k are not: their error's variance
    is omega |x|^2 with omega >= 1 at useful compression, a residual fed back grows instead of
    shrinking, and training diverges (4-bit QSGD on the MLP of
    python_examples/horovod_style.py does within 120 steps on 4 ranks). They are averaged
    without it unless setting is "always". Top-k, threshold, sign, fp16/bf16 and unscaled
    random-k get it."""
    if setting == "always":
        return True
    if setting is not True and setting is not False:
        raise ValueError(f"error_feedback must be True, False or \"always\", not {setting!r}")
    if not setting:
        return False
    c = _codec_or_none(codec)
    if c is None:
        return True  # a bad spec: the first allreduce reports it, on every rank
    return c.properties["contraction"]


def _splits(codec, per_parameter):
    """Whether to compress each parameter on its own. None (the default): for the codecs with
    one scale per call (properties' split_per_tensor: sign's mean |x|, TernGrad's max), which
    must follow each layer's magnitude; the others compress the bucket whole, in one collective
    (top-k and random-k then select over the bucket's layers together; QSGD has a norm per 512
    elements anyway). True: every codec but the element-wise ones (properties' elementwise:
    none, fp16, bf16, threshold), whose values are the same either way. False: none."""
    if per_parameter not in (None, True, False):
        raise ValueError(f"per_parameter must be None, True or False, not {per_parameter!r}")
    if per_parameter is False:
        return False
    c = _codec_or_none(codec)
    if c is None:
        return False  # a bad spec: the first allreduce reports it, on every rank
    props = c.properties
    if per_parameter is None:
        return props["split_per_tensor"]
    return not props["elementwise"]


def _needs_shapes(codec):
    """Whether the codec needs each gradient's shape (powersgd, a low-rank codec): the
    bucket then goes to allreduce_buckets as one bucket of its parameters' views, with their
    shapes and one ErrorFeedback each (which holds the residual and the warm-start Q, and so
    follows the parameter through DDP's rebuild of its buckets)."""
    c = _codec_or_none(codec)
    return c is not None and c.properties["needs_shapes"]


def _momentum_of(momentum, error_feedback):
    """The momentum-correction factor, checked: 0 <= momentum < 1, and only with error
    feedback (the residual is where the velocities accumulate)."""
    m = float(momentum)
    if not 0.0 <= m < 1.0:
        raise ValueError(f"momentum must be in [0, 1), not {momentum!r}")
    if m > 0.0 and not error_feedback:
        raise ValueError("momentum correction needs error feedback (error_feedback=True for a "
                         "codec whose error contracts, or \"always\")")
    return m


def _weight_decay_of(weight_decay):
    wd = float(weight_decay)
    if not wd >= 0.0 or math.isinf(wd):
        raise ValueError(f"weight_decay must be finite and >= 0, not {weight_decay!r}")
    return wd


def _waits_of(stall_seconds, timeout_seconds):
    """The stall report's and the timeout's seconds, checked (None: the Communicator's, from
    GCOMP_STALL_SECONDS and GCOMP_TIMEOUT_SECONDS; 0: never)."""
    out = []
    for name, v in (("stall_seconds", stall_seconds), ("timeout_seconds", timeout_seconds)):
        if v is not None:
            v = float(v)
            if not v >= 0.0 or math.isinf(v):
                raise ValueError(f"{name} must be finite and >= 0 (0: never), not {v!r}")
        out.append(v)
    return tuple(out)


def _delays(codec, error_feedback):
    """Whether the codec sends much of each gradient late, through error feedback (properties'
    sends_late: the sparsifiers top-k, random-k, threshold; and sign): the codecs whose delay
    plain momentum amplifies, and whose momentum belongs in the hook (DGC's momentum
    correction)."""
    c = _codec_or_none(codec)
    return c is not None and bool(error_feedback) and c.properties["sends_late"]


def _take_momentum(optimizer, codec, options, who, stacklevel=3):
    """register's and DistributedOptimizer's move of the optimizer's momentum (and weight decay)
    into momentum correction, for the codecs that delay (_delays): options gains momentum and
    weight_decay and the optimizer's groups lose them (SGD with one momentum and weight decay
    over its groups, no Nesterov, no dampening, not maximizing). Where it cannot move them, a
    warning says why and that the optimizer is left as it is. Returns what moved (a dict, empty
    when nothing did). A momentum given in options is the caller's choice: nothing moves.
    stacklevel: the warnings' (the caller's caller is the user's code at 3)."""
    given = options.get("momentum")
    if optimizer is None or not _delays(codec, _feedback_wanted(codec, options.get(
            "error_feedback", True))):
        return {}
    groups = getattr(optimizer, "param_groups", [])
    held = sorted({float(g.get("momentum", 0.0)) for g in groups})
    if given is not None:
        if float(given) > 0 and any(held):
            raise ValueError(f"{who}: momentum={given} in the hook and momentum {held[-1]} in "
                             f"{type(optimizer).__name__} would apply momentum twice; give one")
        return {}
    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.SGD):
        warnings.warn(f"{who}: {name} is left as it is: momentum correction moves SGD's momentum "
                      f"only, so {codec} compresses the gradient and {name} applies its update "
                      "to the delayed sum (docs/python.md, \"The one line\")",
                      stacklevel=stacklevel)
        return {}
    if not any(held):
        return {}
    why = []
    if any(g.get("nesterov") for g in groups):
        why.append("Nesterov momentum (momentum correction is heavy-ball momentum)")
    if any(float(g.get("dampening", 0.0)) for g in groups):
        why.append("dampening")
    if any(g.get("maximize") for g in groups):
        why.append("maximize=True")
    if len(held) > 1:
        why.append(f"different momentum in its groups ({', '.join(map(str, held))})")
    decays = {float(g.get("weight_decay", 0.0)) for g in groups}
    if len(decays) > 1:
        why.append("different weight decay in its groups")
    if why:
        warnings.warn(f"{who}: SGD keeps its momentum ({'; '.join(why)} cannot move into the "
                      f"hook): {codec} then sends each gradient late and momentum amplifies the "
                      "delay, which costs accuracy (docs/python.md, \"The one line\")",
                      stacklevel=stacklevel)
        return {}
    moved = {"momentum": held[0], "weight_decay": decays.pop()}
    for g in groups:
        g["momentum"] = 0.0
        g["weight_decay"] = 0.0
    options.update(moved)
    return moved


def _adam_of(optimizer, variance, options, who):
    """Whether optimizer runs as 1-bit Adam (an Adam or AdamW, variance "frozen" or a
    gcomp.AdamSchedule); checks what
    goes with that: options (register's or DistributedOptimizer's) without SGD's momentum and
    weight decay, which Adam has of its own. variance None: the optimizer left as it is (its
    gradients compressed), said by a warning."""
    if not (variance is None or isinstance(variance, gcomp.AdamSchedule)
            or (isinstance(variance, str) and variance == "frozen")):
        raise ValueError(f"{who}: variance must be \"frozen\" (1-bit Adam), a "
                         "gcomp.AdamSchedule (0/1 Adam's: gcomp.AdamSchedule.zero_one(...)) or "
                         f"None (the optimizer left as it is), not {variance!r}")
    if variance is None or not _is_adam(optimizer):
        return False
    for key in ("momentum", "weight_decay"):
        if options.get(key):
            raise ValueError(f"{who}: {key}={options[key]} is SGD's (moved into the hook); "
                             f"{type(optimizer).__name__} keeps its own {key.replace('_', ' ')}")
    return True


def apply(target, codec, *, error_feedback, warmup_steps, algorithm, dense_below, seed,
          synchronous, per_parameter, allow_uncompressed, momentum, weight_decay, stall_seconds,
          timeout_seconds, bucket_bytes=None, optimizer=None, who=None, moves=True):
    """Checks the options both CompressionState and DistributedOptimizer take and sets them on
    target, in the one order both check them (so that of several wrong options the same one is
    reported): codec, error_feedback, warmup_steps, algorithm, dense_below, bucket_bytes (the
    optimizer's, where not None), seed, synchronous, per_parameter (and _split, _shaped, what
    it and the codec mean), allow_uncompressed, momentum, weight_decay, stall_seconds and
    timeout_seconds. who (DistributedOptimizer's name): momentum and weight_decay may be None,
    and then the wrapped optimizer's move here as register() moves them (_take_momentum; what
    moved is target.moved), unless moves is False (periodic averaging from step 0: no gradient is
    delayed)."""
    target.codec = codec
    target.error_feedback = _feedback_wanted(codec, error_feedback)
    target.warmup_steps = int(warmup_steps)
    target.algorithm = algorithm
    target.dense_below = int(dense_below)
    if bucket_bytes is not None:
        target.bucket_bytes = int(bucket_bytes)
    target.seed = int(seed)
    target.synchronous = bool(synchronous)
    target.per_parameter = per_parameter
    target._split = _splits(codec, per_parameter)
    target._shaped = _needs_shapes(codec)
    target.allow_uncompressed = bool(allow_uncompressed)
    if who is not None:
        # The wrapped SGD's momentum and weight decay move here for the codecs that delay
        # (register()'s rule), unless momentum is given. stacklevel 4: the warnings point at the
        # code that made the DistributedOptimizer.
        options = {"error_feedback": error_feedback}
        if momentum is not None:
            options["momentum"] = momentum
        if weight_decay is not None:
            options["weight_decay"] = weight_decay
        target.moved = _take_momentum(optimizer, codec, options, who, stacklevel=4) \
            if moves else {}
        momentum = options.get("momentum", 0.0)
        weight_decay = options.get("weight_decay", 0.0)
    target.momentum = _momentum_of(momentum, target.error_feedback)
    target.weight_decay = _weight_decay_of(weight_decay)
    target.stall_seconds, target.timeout_seconds = _waits_of(stall_seconds, timeout_seconds)
