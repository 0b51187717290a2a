"""A timeline of gcomp's calls as Chrome trace events, the JSON that Perfetto
(ui.perfetto.dev) and chrome://tracing open (docs/timeline.md).

Off by default. ``GCOMP_TIMELINE=FILE`` turns it on for any program when its first
Communicator is made; ``open(FILE, rank)`` (or gcomp.torch's ``timeline=FILE``) from Python.
Each rank writes ``FILE`` without ``.json`` plus ``.RANK.json``; ``scripts/timeline merge``
puts the ranks' files into one, one track a rank, and ``scripts/timeline png`` draws a window.

Every call of the library is a span (its label, or "allreduce") holding its agreement, encode,
wire and decode, with what it ran in its args: the algorithm, the bytes, each phase's seconds and,
where auto chose, every option's predicted seconds beside the call's measured ones. gcomp.torch
adds each step's forward and backward and optimizer step, each bucket from submit to done, and
each model average from its start to its merge. Events are held in a buffer of at most 1 MiB,
written out when it fills and at exit.
"""

import json

from ._gcomp import (_timeline_async, _timeline_close, _timeline_events, _timeline_now,
                     _timeline_on, _timeline_open, _timeline_path, _timeline_pause,
                     _timeline_resume, _timeline_span, _timeline_thread_name)

__all__ = ["open", "close", "pause", "resume", "on", "path", "now", "span", "begin", "end",
           "thread_name", "events"]


def open(file, rank):  # noqa: A001 - the module's verb, as gcomp.timeline.open
    """Starts writing this process's events to FILE's rank file (rank: the events' process,
    this rank's number). A second open of the same file does nothing; of another, gcomp.Error."""
    _timeline_open(str(file), int(rank))


def close():
    """Writes what is held and ends the file; the timeline is off after it (also at exit)."""
    _timeline_close()


def pause():
    """Stops recording without closing the file (a window of a job: the steps after warm-up)."""
    _timeline_pause()


def resume():
    """Records again after pause()."""
    _timeline_resume()


def on():
    """Whether a timeline is being written (open and not paused)."""
    return _timeline_on()


def path():
    """The rank's file being written, or "" when off."""
    return _timeline_path()


def now():
    """Seconds on the events' clock: CLOCK_MONOTONIC, as time.monotonic()."""
    return _timeline_now()


def events():
    """Events written since open."""
    return _timeline_events()


def _args(args):
    return json.dumps(args, separators=(",", ":"), default=str)[1:-1] if args else ""


def span(name, category, start, end, **args):
    """A complete event on this thread from start to end (now()'s seconds); args become its
    args. Spans on one thread must nest. Nothing when off."""
    if _timeline_on():
        _timeline_span(name, category, start, end, _args(args))


def begin(name, category, id, t=None, **args):  # noqa: A002 - the trace format's word
    """An asynchronous event begins (it may end on another thread and overlap others), matched
    with its end() by category and id. Nothing when off."""
    if _timeline_on():
        _timeline_async("b", name, category, id, now() if t is None else t, _args(args))


def end(name, category, id, t=None, **args):  # noqa: A002
    """The end of begin()'s event of the same category and id. Nothing when off."""
    if _timeline_on():
        _timeline_async("e", name, category, id, now() if t is None else t, _args(args))


def thread_name(name):
    """Names this thread's track. Nothing when off."""
    if _timeline_on():
        _timeline_thread_name(name)
