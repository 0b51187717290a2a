"""gcomp.torch's events on the timeline (gcomp.timeline, docs/timeline.md): each step's forward
and backward and optimizer step on the training thread's track, each bucket from submit to done
(an asynchronous event) and its job on the communication thread's track, around the library's
own spans of the call, and each model average from its start to its merge."""

import itertools
import types

from gcomp import timeline

_ids = itertools.count(1)


def next_id():
    """An id for an asynchronous event (begin/end), unique in the process."""
    return next(_ids)


class Track:
    """Names a thread's track once per timeline file."""

    def __init__(self, name):
        self.name, self.named = name, None

    def name_once(self):
        here = timeline.path()
        if self.named != here:
            timeline.thread_name(self.name)
            self.named = here


class Steps:
    """An owner's steps on the training thread's track: "forward+backward" from the end of the
    last step to the start of this one (the batch, zero_grad, forward and backward: what runs
    between two optimizer steps) and "optimizer step" (the wait for the gradients, the
    optimizer's step and any average)."""

    def __init__(self):
        self.last = None  # when the last step ended (timeline.now()), or None
        self.track = Track("training")

    def around(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) as one step."""
        if not timeline.on():
            self.last = None
            return fn(*args, **kwargs)
        start = timeline.now()
        try:
            return fn(*args, **kwargs)
        finally:
            end = timeline.now()
            self.track.name_once()
            if self.last is not None:
                timeline.span("forward+backward", "step", self.last, start)
            timeline.span("optimizer step", "step", start, end)
            self.last = end


def trace_steps(optimizer, steps):
    """Makes optimizer.step() one of steps' steps (the outermost wrapper, so that what register
    added to step() is inside it); a learning-rate scheduler keeps its count."""
    own = optimizer.step
    counted = getattr(own, "_with_counter", False)

    def step(self, closure=None):
        return steps.around(own, closure)

    step._with_counter = counted
    optimizer.step = types.MethodType(step, optimizer)


def open_for(file, who):
    """timeline=FILE of register or DistributedOptimizer: this rank's file opened (None: as the
    environment says)."""
    if file is None:
        return
    import torch.distributed as dist
    if not dist.is_initialized():
        raise ValueError(f"{who}: timeline= needs torch.distributed's process group first "
                         "(gt.init_process_group())")
    timeline.open(file, dist.get_rank())
