"""The whole-step check of a low-rank codec under auto (_StepCheck), its start steps, and the
ranks' vote on it (_vote: the hook looks it up here at call time, so a test can swap it)."""

import time

import numpy as np

from ._engine import _engine
from ._options import _codec_or_none


class _StepCheck:
    """Whole steps compared, for a low-rank codec under auto with allow_uncompressed (the hook's
    defaults): auto weighs each call, but what a low-rank step costs beyond its calls (the
    products' CPU time and memory traffic, which backward loses where training and the hook share
    the cores) is not in any call. After the codec's start steps and a `window` of steps, and
    every `interval` steps after (doubling up to `max_interval`), the hook runs up to `probe`
    steps the other way (uncompressed: each bucket's x + e summed as auto's own uncompressed
    choice does, the residual zeroed; or the codec again) and compares their median step time
    with the `window` steps before it; the ranks vote (one allreduce of the votes) and where
    most find the other way faster by more than `margin`, the steps until the next check go that
    way. A first probe step more than `abort` times the window's median (the uncompressed
    allreduce on a slow link) ends the check at once, on the ranks' vote, so a check costs a slow
    link one step. A step's time is from its first bucket's hook call to the next step's. The low-rank
    steps' calls run without allow_uncompressed: the check weighs the uncompressed way, and a call
    trying it inside a low-rank step would blur the step times compared."""

    window, probe, interval, max_interval, margin, abort = 8, 5, 64, 1024, 0.03, 2.0

    def __init__(self, first):
        self.first = first  # the first check's step
        self.uncompressed = False  # the way the steps go between checks
        self.next_check = first
        self.interval = type(self).interval
        self.starts = {}  # step -> its first hook call's time
        self.modes = {}  # step -> True where it went uncompressed
        self.checks = self.switches = self.aborted = self.uncompressed_steps = 0
        self.zeroed = set()  # buckets whose residuals an uncompressed step sent (and zeroed)
        # (step, uncompressed before, this rank's medians: the way kept and the other, how many
        # ranks voted for the other (or to abort), ranks, "switch" / "keep" / "abort")
        self.history = []
        self.clock = time.perf_counter  # a test may give its own

    def mode(self, step, first_call, vote):
        """Whether `step` goes uncompressed. first_call: this is the step's first hook call (its
        time is taken, and within a check the ranks vote through vote(local) -> (ranks, how many
        voted 1)); every rank comes to the same answer."""
        if first_call:
            self.starts[step] = self.clock()
            c = self.next_check
            if step == c + self.probe:
                self._decide(step, vote)
            elif step == c + 1:
                # Once, on the first probe step's time: a vote is a collective, which lines the
                # ranks up and so costs the step it falls in; one in the probe keeps the
                # probe's median free of it.
                self._maybe_abort(step, vote)
            probing = self.next_check <= step < self.next_check + self.probe
            self.modes[step] = self.uncompressed != probing
            self.uncompressed_steps += self.modes[step]
            for old in [k for k in self.starts if k < step - self.window - self.probe - 1]:
                del self.starts[old]
                self.modes.pop(old, None)
        return self.modes.get(step, self.uncompressed)

    def _median(self, steps):
        times = sorted(self.starts[k + 1] - self.starts[k] for k in steps
                       if k in self.starts and k + 1 in self.starts)
        return times[len(times) // 2] if times else None

    def _maybe_abort(self, step, vote):
        c = self.next_check
        ours, last = self._median(range(c - self.window, c)), self._median([step - 1])
        slow = ours is not None and last is not None and last > self.abort * ours
        ranks, yes = vote(1 if slow else 0)
        if 2 * yes > ranks:
            self.history.append((step, self.uncompressed, ours, last, yes, ranks, "abort"))
            self.checks += 1
            self.aborted += 1
            self._schedule(step)

    def _decide(self, step, vote):
        c = self.next_check
        ours = self._median(range(c - self.window, c))
        other = self._median(range(c, c + self.probe))
        faster = ours is not None and other is not None and other < (1 - self.margin) * ours
        self.checks += 1
        ranks, yes = vote(1 if faster else 0)
        switch = 2 * yes > ranks
        self.history.append((step, self.uncompressed, ours, other, yes, ranks,
                             "switch" if switch else "keep"))
        if switch:
            self.uncompressed = not self.uncompressed
            self.switches += 1
        self._schedule(step)

    def _schedule(self, step):
        self.next_check = step + self.interval
        self.interval = min(2 * self.interval, self.max_interval)

    def stats(self):
        return {"step_checks": self.checks, "step_switches": self.switches,
                "step_aborts": self.aborted, "uncompressed_steps": self.uncompressed_steps}


def _start_steps(codec):
    """The steps the codec sends uncompressed first (properties' start_steps: powersgd's
    start=N), or 0."""
    return _codec_or_none(codec).properties["start_steps"]


def _vote(local):
    """(ranks, how many voted 1): one small allreduce on the communication thread."""
    def job(comm):
        v = np.array([float(local), 1.0], dtype=np.float32)
        comm.allreduce(v, "none", algorithm="dense")
        return int(round(float(v[1]))), int(round(float(v[0])))
    return _engine().run(job)
