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
(post-local SGD). Streaming (fragments=F, overlap_steps=T; docs/python.md, "Streaming"): the
parameters are cut into F fragments of about equal elements, fragment f averaged after the local
steps k = o_f, o_f + H, ... (o_f = f H // F); with T > 0 its collective runs on the communication
thread while T more local steps go on, and is merged after them: the fragment's parameters become
the averaged ones (the same on every rank) and what this rank moved them in those T steps is
added to the fragment's next change (nothing of it is lost), or with merge="before_update" merged
inside the T-th step before its update (the owner calls merge_due first); pacing=N sends each average in up to
N parts (one a step at T >= 2, spread over the step in time at T = 1). What the optimizer's
momentum does at an average (momentum_at_average): "local" keeps each rank's own (torch's
post-local SGD), "reset" zeroes it, "average" averages it over the ranks: its change since its
own anchor (zeros at first) in the same collective as the parameters', through the codec with
residuals of its own. feedback_decay beta (SparseLoCo's error feedback in place of an outer
momentum): each parameter's residual is multiplied by beta before the next change is added to it
(1, the default, keeps all of it; 0 keeps none)."""

import collections
import statistics
import time

import torch
from gcomp import timeline

from . import _cuda, _timeline
from ._pipeline import _MASK, Bucket, Collective

MOMENTA = ("local", "reset", "average")
# When an overlapped average is merged at step s + T: "after_step", after that step's update (its
# progress on the fragment carried into the next change), or "before_update", inside the step
# after its gradients and before its update (nothing to carry at T = 1; the update lands on the
# merged values).
MERGES = ("after_step", "before_update")


def _whole_number(value, least, what, who):
    """value as an int >= least (ValueError naming what otherwise; bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value \
            or int(value) < least:
        raise ValueError(f"{who}: {what} must be an integer >= {least}, not {value!r}")
    return int(value)


def _check(period, period_from, outer_lr, outer_momentum, momentum_at_average, feedback_decay,
           who, fragments=1, overlap_steps=0, pacing=None, merge="after_step"):
    """The periodic options, checked: (period, period_from, outer_lr, outer_momentum,
    feedback_decay, fragments, overlap_steps, pacing, merge)."""
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
    f = _whole_number(fragments, 1, "fragments", who)
    t = _whole_number(overlap_steps, 0, "overlap_steps", who)
    if f > int(period) and int(period) > 1:
        raise ValueError(f"{who}: fragments={f} is more than period={int(period)}: each fragment "
                         "is averaged at its own step of the period")
    if t >= int(period) > 1:
        raise ValueError(f"{who}: overlap_steps={t} must be less than period={int(period)} (a "
                         "fragment's average is merged before its next one starts)")
    n = None if pacing is None else _whole_number(pacing, 1, "pacing", who)
    if n is not None and n > 1 and t == 0:
        raise ValueError(f"{who}: pacing={n} needs overlap_steps >= 1 (the parts leave while "
                         "the overlapped steps run)")
    if n is not None and n > 1 and t >= 2 and n != t:
        raise ValueError(f"{who}: pacing={n} with overlap_steps={t}: with two or more "
                         f"overlapped steps the parts leave one a step (pacing={t}, the "
                         "default, or 1 for none)")
    if merge not in MERGES:
        raise ValueError(f"{who}: merge must be one of {', '.join(MERGES)}, not {merge!r}")
    if merge != "after_step" and t == 0:
        raise ValueError(f"{who}: merge={merge!r} needs overlap_steps >= 1 (without overlap an "
                         "average is merged at once, after its step)")
    return int(period), int(period_from), lr, mu, beta, f, t, n, merge


def _periodic_of(options, who):
    """Pops the periodic options from options (register's or DistributedOptimizer's): a dict of
    checked ones, or None where period is 1 and nothing else periodic is asked."""
    given = {k: options.pop(k) for k in ("period", "period_from", "outer_lr", "outer_momentum",
                                         "momentum_at_average", "feedback_decay", "fragments",
                                         "overlap_steps", "pacing", "merge") if k in options}
    period, period_from, lr, mu, beta, fragments, overlap, pacing, merge = _check(
        given.get("period", 1), given.get("period_from", 0), given.get("outer_lr", 1.0),
        given.get("outer_momentum", 0.0), given.get("momentum_at_average", "local"),
        given.get("feedback_decay", 1.0), who, given.get("fragments", 1),
        given.get("overlap_steps", 0), given.get("pacing"), given.get("merge", "after_step"))
    if period == 1:
        defaults = {"period_from": 0, "outer_lr": 1.0, "outer_momentum": 0.0,
                    "momentum_at_average": "local", "feedback_decay": 1.0, "fragments": 1,
                    "overlap_steps": 0, "pacing": None, "merge": "after_step"}
        extra = sorted(k for k in given if k != "period" and given[k] != defaults[k])
        if extra:
            raise ValueError(f"{who}: {', '.join(extra)} without period > 1 (every step "
                             "synchronized) mean nothing")
        return None
    return {"period": period, "period_from": period_from, "outer_lr": lr, "outer_momentum": mu,
            "momentum_at_average": given.get("momentum_at_average", "local"),
            "feedback_decay": beta, "fragments": fragments, "overlap_steps": overlap,
            "pacing": pacing, "merge": merge}


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


# One fragment's part of a parameter: its flat elements [lo, hi) (whole rows), its key in a
# checkpoint (the name; "name[lo:hi]" for a part), its slot in the per-piece tables (id(param) for
# a whole parameter, (id(param), lo) for a part) and its shape for a codec that takes shapes.
Piece = collections.namedtuple("Piece", "name param lo hi key slot shape")


def _fragments(named, count, who, allow_empty=False):
    """named's (name, parameter) pairs cut into count fragments of about equal elements, in their
    order, between rows (a row: a parameter's elements for one index of its first dimension):
    a list of count lists of Pieces. ValueError where some fragment would be empty (unless
    allow_empty)."""
    total = sum(p.numel() for _, p in named)
    cuts = [(f * total) // count for f in range(1, count)]  # where fragment f + 1 starts
    out = [[] for _ in range(count)]
    pos, f = 0, 0
    for name, p in named:
        n = p.numel()
        if n == 0:
            continue
        if count > 1 and not p.is_contiguous():
            raise ValueError(f"{who}: fragments={count} needs contiguous parameters; {name} is not")
        row = n // p.shape[0] if p.dim() > 0 else n
        lo = 0

        def add(a, b):
            whole = a == 0 and b == n
            shape = tuple(p.shape) if whole else ((b - a) // row,) + tuple(p.shape[1:])
            out[f].append(Piece(name, p, a, b, name if whole else f"{name}[{a}:{b}]",
                                id(p) if whole else (id(p), a), shape))

        while f < count - 1 and cuts[f] < pos + n:  # a cut in this parameter: at a row's edge
            c = min(n, (cuts[f] - pos + row // 2) // row * row)
            if c > lo:
                add(lo, c)
                lo = c
            f += 1
        if lo < n:
            add(lo, n)
        pos += n
    empty = sum(1 for frag in out if not frag)
    if empty and not allow_empty:
        raise ValueError(f"{who}: fragments={count} leaves {empty} of them empty: the parameters "
                         f"have too few rows ({total} elements) to cut so")
    return out


def _paced(named, count, parts, who):
    """Pacing's cut: named cut into count fragments as _fragments cuts them (the same edges),
    each fragment's elements cut again into up to parts parts of about equal elements, between
    rows. Returns (the fragments' Pieces, each piece's part in its fragment by slot: 0, 1, ...
    over the parts that hold something)."""
    cut = _fragments(named, count * parts, who, allow_empty=True)
    out, part_of = [], {}
    for f in range(count):
        held = [c for c in cut[f * parts:(f + 1) * parts] if c]
        if not held:
            raise ValueError(f"{who}: fragments={count} leaves fragment {f} empty: the "
                             "parameters have too few rows to cut so")
        for number, part in enumerate(held):
            for pc in part:
                part_of[pc.slot] = number
        out.append([pc for part in held for pc in part])
    return out, part_of


class _Periodic:
    """Periodic averaging for owner (a CompressionState or DistributedOptimizer, whose codec,
    algorithm, seed, error_feedback, weight decay, momentum correction, statistics and
    communication thread it uses) and optimizer (the torch optimizer that steps the
    parameters). named: (name, parameter) pairs, the order of every average's collective and
    the checkpoint's keys; fragments and overlap_steps: streaming (the module's docstring)."""

    def __init__(self, owner, optimizer, named, period, period_from, outer_lr, outer_momentum,
                 momentum_at_average, feedback_decay=1.0, fragments=1, overlap_steps=0,
                 pacing=None, merge="after_step"):
        self.owner, self.optimizer = owner, optimizer
        self.named = [(n, p) for n, p in named if p.requires_grad]
        self.period, self.period_from = period, period_from
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.momentum_at_average = momentum_at_average
        self.feedback_decay = feedback_decay
        self.fragments, self.overlap_steps = fragments, overlap_steps
        self.merge = merge  # MERGES: "before_update" has the owner call merge_due first
        # Pacing: each fragment's average sent in up to N parts of about equal elements, so that
        # the link carries 1/(F N) of the model at a time rather than 1/F in a burst. By steps
        # (overlap_steps = T >= 2, N = T by default): part j after the j-th step from its start.
        # In time (T = 1, pacing N > 1): part j D / N seconds after part j - 1 is done, D the
        # median length of the last steps (self.lengths; the median, so that the steps that
        # waited for a merge do not lengthen the gaps, and the waits with them).
        if pacing is None:
            pacing = overlap_steps if overlap_steps >= 2 else 1
        self.parts = pacing
        self.timed = overlap_steps == 1 and pacing > 1
        self.lengths = collections.deque(maxlen=8)  # the last steps' lengths, seconds
        self._stepped = None  # (taken, perf_counter) at the last maybe_average
        if self.parts > 1:
            self.pieces, self.part_of = _paced(self.named, fragments, self.parts,
                                               "periodic averaging")
        else:
            self.pieces = _fragments(self.named, fragments, "periodic averaging")
            self.part_of = {}
        self.anchors = {}  # parameter id -> its flat anchor (the parameters at the last average)
        self.feedback = {}  # piece slot -> the ErrorFeedback of its changes
        self.outer = {}  # parameter id -> the outer Nesterov momentum buffer
        # momentum_at_average "average": each momentum's anchor (zeros at first, on every rank
        # alike, by parameter id) and the ErrorFeedback of its changes (by piece slot).
        self.momentum_anchors, self.momentum_feedback = {}, {}
        # overlap_steps > 0: piece slot -> what this rank moved the piece (its momentum) while
        # its last average was in flight, added to its next change.
        self.carry, self.momentum_carry = {}, {}
        self.inflight = []  # the averages started and not merged, oldest first (_Flight)
        self.folded = set()  # parameter ids whose gradient residual went into a local step
        self.averaged_after = None  # the step count of the last average started or merged
        self.agreed_after = None  # the step count after which every rank had the same model
        self.averages, self.bytes_sent, self.bytes_received, self.seconds = 0, 0, 0, 0.0
        self.local_steps = 0
        self._mark = None  # the statistics when the oldest average in flight started
        self._loaded = {}  # a checkpoint's anchors, residuals, outer buffers until first used

    # ---- the schedule ----

    def local(self, step):
        """Whether step (counted from 0) is a local one."""
        return step >= self.period_from

    def offset(self, f):
        """Fragment f's place in the period: it is averaged after the local steps offset(f),
        offset(f) + period, ... (fragment 0: period, 2 period, ...)."""
        return (f * self.period) // self.fragments

    def due_fragments(self, taken):
        """The fragments whose average starts after the taken-th step (taken counted from 1)."""
        k = taken - self.period_from
        if k <= 0:
            return []
        return [f for f in range(self.fragments) if (k - self.offset(f)) % self.period == 0]

    def due(self, taken):
        """Whether an average starts after the taken-th step (taken counted from 1)."""
        return bool(self.due_fragments(taken))
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

    # ---- an average: started, then merged (at once, or overlap_steps later) ----

    def maybe_average(self, taken):
        """After the optimizer's step (taken steps so far), once per step count: merges the
        averages in flight whose overlap has run out, then starts those of the fragments due
        (and with overlap_steps 0 merges them at once)."""
        now = time.perf_counter()
        if self._stepped is not None and self._stepped[0] == taken - 1:
            self.lengths.append(now - self._stepped[1])
        if self._stepped is None or self._stepped[0] != taken:
            self._stepped = (taken, now)
        if self.averaged_after == taken:
            return
        ran = False
        for flight in [f for f in self.inflight if f.merge_at <= taken]:
            self._merge(flight, taken)
            ran = True
        for flight in self.inflight:  # pacing: the parts due after this step
            while flight.sent < len(flight.parts) and flight.taken + flight.sent <= taken:
                entered = time.perf_counter()
                self._send(flight, entered)
                self.seconds += time.perf_counter() - entered
                ran = True
        due = self.due_fragments(taken)
        if due:
            flight = self._start(due, taken, 2, self.overlap_steps)
            if self.overlap_steps == 0:
                self._merge(flight, taken)
            ran = True
        if ran:
            self.averaged_after = taken

    def merge_due(self, taken):
        """Inside the taken-th step, its gradients computed and before the optimizer's update
        (merge="before_update"): merges the averages in flight due at it, so that the update
        lands on the merged values; maybe_average after the update then starts what is due."""
        if self.averaged_after == taken:
            return
        for flight in [f for f in self.inflight if f.merge_at <= taken]:
            self._merge(flight, taken, agreed=False)  # the update comes after: ranks apart

    def average(self, taken, index=2):
        """The ranks' whole models averaged now (collective: every rank calls it after the same
        step): the averages in flight merged first, then every fragment's change since its
        anchor in one collective, merged at once."""
        for flight in list(self.inflight):
            self._merge(flight, taken)
        self._merge(self._start(range(self.fragments), taken, index, 0), taken)
        self.averaged_after = taken

    def _start(self, fragments, taken, index, overlap):
        """Starts the average of fragments (collective): each piece's change since its anchor
        (with its carry), with momentum_at_average "average" each momentum's change since its
        own anchor too, handed to the communication thread through the codec with error
        feedback (residuals of their own, faded by feedback_decay), to be merged overlap steps later
        (0: at once); returns the _Flight."""
        entered, began = time.perf_counter(), timeline.now()
        owner = self.owner
        if not self.anchors:
            self._make_anchors()
        pieces = [pc for f in fragments for pc in self.pieces[f]]
        keep = overlap > 0  # the values at the start, for the carry at the merge
        with torch.no_grad():
            xs, starts = [], []
            for pc in pieces:
                v = pc.param.detach().reshape(-1)[pc.lo:pc.hi]
                x = self.anchors[id(pc.param)][pc.lo:pc.hi] - v
                self._add_carry(x, self.carry, "carry", pc)
                xs.append(x)
                if keep:
                    starts.append(v.clone())
            moms = []  # the pieces whose momentum is averaged (those that have one now)
            if self.momentum_at_average == "average":
                for pc in pieces:
                    u = self._momentum_of(pc.param)
                    if u is None:
                        continue
                    moms.append(pc)
                    a = self._anchor_of("momentum_anchors", self.momentum_anchors, pc.name,
                                        pc.param, zero=True)
                    x = a[pc.lo:pc.hi] - u[pc.lo:pc.hi]
                    self._add_carry(x, self.momentum_carry, "momentum_carry", pc)
                    xs.append(x)
                    if keep:
                        starts.append(u[pc.lo:pc.hi].clone())
        if owner.error_feedback and self.feedback_decay != 1.0:
            with torch.no_grad():
                for pc in pieces:  # SparseLoCo's: what the codec left of earlier changes fades
                    ef = self._feedback_of(self.feedback, "residuals", pc)
                    _cuda._residual_of(ef).mul_(self.feedback_decay)
        if not self.inflight:
            self._mark = owner._stats.snapshot()
        flight = _Flight(sorted(set(fragments)), taken, taken + overlap, pieces, moms,
                         xs, starts, index, self._layout(pieces, moms, overlap))
        self._send(flight, entered)
        if self.timed and overlap:  # in time: every part handed on now, each to leave D / N
            # after the one before it is done (on this rank: its bytes are out), so that no
            # two parts of it cross the link within D / N of each other
            gap = statistics.median(self.lengths) / self.parts if self.lengths else 0.0
            done = [entered]

            def mark(_):
                done[0] = time.perf_counter()

            flight.futures[-1].then(mark)
            while flight.sent < len(flight.parts):
                self._send(flight, entered, not_before=lambda: done[0] + gap)
                flight.futures[-1].then(mark)
        self.inflight.append(flight)
        self.seconds += time.perf_counter() - entered
        if timeline.on():  # from its start to its merge, and the start's own time
            flight.event = _timeline.next_id()
            name = f"average of fragments {flight.fragments}"
            timeline.begin(name, "average", flight.event, t=began, step=taken,
                           elements=sum(x.numel() for x in xs))
            timeline.span("average start", "average", began, timeline.now(), step=taken)
        return flight

    def _layout(self, pieces, moms, overlap):
        """The parts of an average of pieces (and the momenta of moms): lists of indices into its
        changes (the pieces', then the momenta's), in order; one part (all) unless paced."""
        n = len(pieces)
        if self.parts == 1 or overlap == 0:
            return [list(range(n + len(moms)))]
        count = 1 + max(self.part_of[pc.slot] for pc in pieces)
        out = [[] for _ in range(count)]
        for i, pc in enumerate(pieces):
            out[self.part_of[pc.slot]].append(i)
        for i, pc in enumerate(moms):
            out[self.part_of[pc.slot]].append(n + i)
        return [part for part in out if part]

    def _send(self, flight, entered=None, not_before=None):
        """Hands flight's next part (collective) to the communication thread: its changes
        through the codec with their error feedback (the residuals of their own pieces); with
        not_before (a function of no arguments giving perf_counter seconds, called on the
        thread when the part's turn comes) the thread starts it no sooner."""
        entered = time.perf_counter() if entered is None else entered
        began = timeline.now()
        owner = self.owner
        j = flight.sent
        chosen = flight.parts[j]
        n = len(flight.pieces)
        of = [flight.pieces[i] if i < n else flight.moms[i - n] for i in chosen]
        xs = [flight.xs[i] for i in chosen]
        efs = None
        if owner.error_feedback:
            efs = [self._feedback_of(self.feedback if i < n else self.momentum_feedback,
                                     "residuals" if i < n else "momentum_residuals", pc)
                   for i, pc in zip(chosen, of)]
        whole = max(4 * sum(x.numel() for x in xs), 1)
        shaped = owner._shaped
        params = [pc.param for pc in of]
        index = flight.index + 1000 * j  # part 0: the index of an unpaced average
        collective = Collective("allreduce_buckets", xs, owner.codec, {
            "efs": efs, "average": True, "seed": owner.seed & _MASK,
            "algorithm": owner.algorithm, "allow_uncompressed": owner.allow_uncompressed,
            "step": flight.taken, "index": index,
            "bucket_bytes": 1 if owner._split and not shaped else whole,
            "dense_below": owner.dense_below if owner._split else 0,
            "shapes": [pc.shape for pc in of] if shaped else None})
        flight.futures.append(Bucket(owner, "model average", flight.taken, index, params, xs, xs,
                                     False, entered, plain=True).submit(
                                         collective, False, not_before=not_before))
        flight.sent += 1
        if j and timeline.on():
            timeline.span("average part", "average", began, timeline.now(), step=flight.taken,
                          part=j, elements=sum(x.numel() for x in xs))

    def _add_carry(self, x, table, part, pc):
        """Adds to x (in place) what table holds for pc (a checkpoint's where loaded), spent."""
        c = table.pop(pc.slot, None)
        if c is None:
            c = self._loaded.get(part, {}).pop(pc.key, None)
        if c is not None:
            x.add_(c.to(x.device))

    def _wait(self, flight):
        """Waits for flight's collective; its bytes (and those of the averages that ran before
        it) go into the counts."""
        if flight.futures:
            for future in flight.futures:
                future.wait()
            flight.futures = []
            after = self.owner._stats.snapshot()
            if self._mark is not None:
                self.bytes_sent += after["bytes_sent"] - self._mark["bytes_sent"]
                self.bytes_received += after["bytes_received"] - self._mark["bytes_received"]
            self._mark = after

    def _merge(self, flight, taken, agreed=True):
        """Merges flight after the taken-th step (merge_due's: inside it, before its update, and
        agreed False: the ranks are apart again after that update): the outer step on each
        piece's averaged change
        d (Nesterov: b = mu b + d, d + mu b), anchor -= outer_lr d, the piece's parameters =
        the anchor, the same on every rank; with overlap, what this rank moved the piece since
        the start kept as its carry; the momenta averaged ("average") or zeroed ("reset")."""
        entered, began = time.perf_counter(), timeline.now()
        while flight.sent < len(flight.parts):  # pacing: what is left sent now
            self._send(flight)
        self._wait(flight)
        mu, lr = self.outer_momentum, self.outer_lr
        starts = iter(flight.starts)
        with torch.no_grad():
            for pc, x in zip(flight.pieces, flight.xs):
                d = x
                if mu:
                    b = self._anchor_of("outer", self.outer, pc.name, pc.param,
                                        zero=True)[pc.lo:pc.hi]
                    b.mul_(mu).add_(x)
                    d = x.add(b, alpha=mu)  # Nesterov: the step looks ahead along b
                a = self.anchors[id(pc.param)][pc.lo:pc.hi]
                a.sub_(d, alpha=lr)
                if flight.starts:
                    v = pc.param.detach().reshape(-1)[pc.lo:pc.hi]
                    self.carry[pc.slot] = next(starts) - v
                if pc.lo == 0 and pc.hi == pc.param.numel():
                    pc.param.copy_(a.view_as(pc.param))
                else:
                    pc.param.detach().view(-1)[pc.lo:pc.hi].copy_(a)
            for pc, x in zip(flight.moms, flight.xs[len(flight.pieces):]):
                u = self._momentum_of(pc.param)
                a = self._anchor_of("momentum_anchors", self.momentum_anchors, pc.name,
                                    pc.param, zero=True)[pc.lo:pc.hi]
                a.sub_(x)
                if flight.starts:
                    self.momentum_carry[pc.slot] = next(starts) - u[pc.lo:pc.hi]
                u[pc.lo:pc.hi].copy_(a)
            if self.momentum_at_average == "reset":
                for pc in flight.pieces:
                    u = self._momentum_of(pc.param)
                    if u is not None:
                        u[pc.lo:pc.hi].zero_()
        self.inflight.remove(flight)
        self.averages += 1
        if agreed and len(flight.fragments) == self.fragments and not self.inflight:
            self.agreed_after = taken  # (not under an update still to come: merge_due's)
        self.seconds += time.perf_counter() - entered
        if timeline.on():
            ended = timeline.now()
            timeline.span("average merge", "average", began, ended, step=taken,
                          started_after=flight.taken)
            if flight.event is not None:
                timeline.end(f"average of fragments {flight.fragments}", "average", flight.event,
                             t=ended)

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

    def _feedback_of(self, table, part, pc):
        """Piece pc's ErrorFeedback in table (the changes' or the momenta's), made once, with a
        loaded checkpoint's residual and kept state where it has them."""
        ef = table.get(pc.slot)
        if ef is None:
            n = pc.hi - pc.lo
            ef = table[pc.slot] = _cuda._new_feedback(n, pc.param)
            r = self._loaded.get(part, {}).pop(pc.key, None)
            if r is not None and r.numel() == n:
                _cuda._residual_of(ef).copy_(r)
            k = self._loaded.get("kept_" + part, {}).pop(pc.key, None)
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
                "average_seconds": self.seconds, "averages_in_flight": len(self.inflight)}

    def settings(self):
        """What a checkpoint says of the schedule (a resumed job must have the same); the
        feedback decay, fragments and overlap only where they are not 1, 1 and 0, so that
        checkpoints from before them load."""
        out = {"period": self.period, "period_from": self.period_from,
               "outer_lr": self.outer_lr, "outer_momentum": self.outer_momentum,
               "momentum_at_average": self.momentum_at_average}
        if self.feedback_decay != 1.0:
            out["feedback_decay"] = self.feedback_decay
        if self.fragments != 1:
            out["fragments"] = self.fragments
        if self.overlap_steps:
            out["overlap_steps"] = self.overlap_steps
        if self.parts > 1:
            out["parts"] = self.parts
        if self.merge != "after_step":
            out["merge"] = self.merge
        return out

    # (checkpoint part, table, kind, keyed by): the per-parameter and per-piece state, "tensor"
    # (flat tensors) or "feedback" (ErrorFeedback objects: their residuals; their kept states
    # under "kept_" + part).
    _TABLES = (("anchors", "anchors", "tensor", "parameter"),
               ("outer", "outer", "tensor", "parameter"),
               ("momentum_anchors", "momentum_anchors", "tensor", "parameter"),
               ("residuals", "feedback", "feedback", "piece"),
               ("momentum_residuals", "momentum_feedback", "feedback", "piece"),
               ("carry", "carry", "tensor", "piece"),
               ("momentum_carry", "momentum_carry", "tensor", "piece"))

    _PARTS = ("anchors", "outer", "momentum_anchors", "residuals", "momentum_residuals",
              "kept_residuals", "kept_momentum_residuals", "carry", "momentum_carry")

    def _entries(self, keyed):
        """(key, slot) of every parameter ("parameter": name, id) or piece ("piece")."""
        if keyed == "parameter":
            return [(n, id(p)) for n, p in self.named]
        return [(pc.key, pc.slot) for frag in self.pieces for pc in frag]

    def state_dict(self):
        """The anchors, the outer momentum, the momenta's anchors, the changes' residuals and
        kept states, the carries (float32 copies, by parameter name, or "name[lo:hi]" for a
        fragment's part of one), the averages in flight (waited for, not merged: each one's
        averaged changes and the values at its start, merged at its step by the job that
        loads it), which parameters' gradient residuals went into a local step, and the
        counts."""
        out = {part: {} for part in self._PARTS}
        out.update(settings=self.settings(), folded=[], averaged_after=self.averaged_after,
                   agreed_after=self.agreed_after, averages=self.averages,
                   bytes_sent=self.bytes_sent, bytes_received=self.bytes_received,
                   local_steps=self.local_steps, inflight=[])
        for flight in self.inflight:
            self._wait(flight)
            out["inflight"].append(flight.saved())
        for part, attr, kind, keyed in self._TABLES:
            table = getattr(self, attr)
            for key, slot in self._entries(keyed):
                v = table.get(slot)
                if v is None:
                    continue
                if kind == "tensor":
                    out[part][key] = v.to("cpu", copy=True)
                else:
                    out[part][key] = _cuda._residual_of(v).to("cpu", copy=True)
                    if v.kept.size:
                        out["kept_" + part][key] = torch.from_numpy(v.kept.copy())
        out["folded"] = [n for n, p in self.named if id(p) in self.folded]
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
        for _, attr, _, _ in self._TABLES:
            getattr(self, attr).clear()
        self._loaded = {part: {k: torch.as_tensor(v, dtype=torch.float32).reshape(-1)
                               for k, v in dict(sd.get(part, {})).items()}
                        for part in self._PARTS}
        names = set(sd.get("folded", []))
        self.folded = {id(p) for n, p in self.named if n in names}
        self.averaged_after = sd.get("averaged_after")
        self.agreed_after = sd.get("agreed_after", self.averaged_after)
        self.averages = int(sd.get("averages", 0))
        self.bytes_sent = int(sd.get("bytes_sent", 0))
        self.bytes_received = int(sd.get("bytes_received", 0))
        self.local_steps = int(sd.get("local_steps", 0))
        self.inflight = [_Flight.loaded(saved, self.pieces, self._layout, who)
                         for saved in sd.get("inflight", [])]
        self._mark = None
        if self._loaded["anchors"]:
            self._make_anchors()


class _Flight:
    """An average started and not merged: its fragments, the step count after which it started
    and the one after which it is merged, its pieces (and those whose momentum it averages),
    the changes (the averages once done), the values at the start (overlap only: the pieces',
    then the momenta's), its call index, its parts (lists of indices into the changes: one
    collective each; several where paced), how many of them were handed on, and the futures of
    those not yet waited for."""

    __slots__ = ("fragments", "taken", "merge_at", "pieces", "moms", "xs", "starts", "index",
                 "parts", "sent", "futures", "event")

    def __init__(self, fragments, taken, merge_at, pieces, moms, xs, starts, index, parts,
                 sent=0):
        self.fragments, self.taken, self.merge_at = fragments, taken, merge_at
        self.pieces, self.moms, self.xs, self.starts = pieces, moms, xs, starts
        self.index, self.parts, self.sent = index, parts, sent
        self.futures = []
        self.event = None  # its id on the timeline, where one was on at its start

    def saved(self):
        """A checkpoint's record of it (its parts handed on waited for): float32 copies by piece
        key; the changes of the parts handed on are their averages, those of the others (paced,
        not yet sent) this rank's changes, sent by the job that loads it at their steps."""
        n = len(self.pieces)

        def by_key(pieces, tensors):
            return {pc.key: t.to("cpu", copy=True) for pc, t in zip(pieces, tensors)}

        starts = self.starts or [None] * (n + len(self.moms))
        out = {"fragments": list(self.fragments), "taken": self.taken,
               "merge_at": self.merge_at, "results": by_key(self.pieces, self.xs[:n]),
               "momentum_results": by_key(self.moms, self.xs[n:]),
               "starts": by_key(self.pieces, starts[:n]) if self.starts else {},
               "momentum_starts": by_key(self.moms, starts[n:]) if self.starts else {}}
        if len(self.parts) > 1:
            out.update(index=self.index, sent=self.sent)
        return out

    @classmethod
    def loaded(cls, saved, fragments, layout, who):
        """The flight a checkpoint's record describes, on the parameters' devices; layout(pieces,
        moms, overlap) gives its parts."""
        pieces = [pc for f in saved["fragments"] for pc in fragments[f]]
        moms = [pc for pc in pieces if pc.key in saved["momentum_results"]]

        def tensors(table, of):
            try:
                return [torch.as_tensor(table[pc.key], dtype=torch.float32).reshape(-1).to(
                    pc.param.device) for pc in of]
            except KeyError as e:
                raise ValueError(f"{who}: the checkpoint's average in flight lacks {e}") from None

        xs = tensors(saved["results"], pieces) + tensors(saved["momentum_results"], moms)
        starts = (tensors(saved["starts"], pieces) + tensors(saved["momentum_starts"], moms)
                  if saved["starts"] else [])
        parts = layout(pieces, moms, saved["merge_at"] - saved["taken"])
        sent = int(saved.get("sent", len(parts)))
        if not 1 <= sent <= len(parts):
            raise ValueError(f"{who}: the checkpoint's average in flight says {sent} of its "
                             f"{len(parts)} parts were sent")
        return cls(list(saved["fragments"]), saved["taken"], saved["merge_at"], pieces, moms,
                   xs, starts, int(saved.get("index", 2)), parts, sent)


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
