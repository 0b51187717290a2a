"""scripts/timeline's check finds each kind of broken file (and passes a sound one): a test of
the test's own judge."""

import importlib.machinery
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
_loader = importlib.machinery.SourceFileLoader(
    "timeline_script", os.path.join(HERE, "..", "..", "scripts", "timeline"))
_spec = importlib.util.spec_from_loader("timeline_script", _loader)
timeline = importlib.util.module_from_spec(_spec)
_loader.exec_module(timeline)


def x(name, cat, ts, dur, tid=1, pid=0, **args):
    e = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        e["args"] = args
    return e


def call(ts, dur, **extra):
    """A sound call: its span, an agreement, an encode and a wire inside it."""
    return [x("allreduce", "call", ts, dur, n=4, algorithm="dense", **extra),
            x("agreement", "agreement", ts + 1, 2), x("wire", "wire", ts + 1.5, 0.5),
            x("encode", "encode", ts + 4, 2), x("wire", "wire", ts + 7, 2)]


def sound():
    return (call(100, 20) + call(200, 20)
            + [{"name": "b1", "cat": "bucket", "ph": "b", "ts": 90, "pid": 0, "tid": 2, "id": 7},
               {"name": "b1", "cat": "bucket", "ph": "e", "ts": 125, "pid": 0, "tid": 1, "id": 7},
               {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "t"}}])


def test_a_sound_file_passes_and_counts_its_calls():
    bad, summary = timeline.problems(sound(), calls=2)
    assert bad == [] and summary["calls_per_rank"] == {0: 2}


def test_each_broken_rule_is_found():
    cases = {
        "overlaps": sound() + [x("decode", "decode", 115, 10)],  # out of its call's end
        "outside any call": sound() + [x("encode", "encode", 150, 5)],
        "holds no agreement": [e for e in sound() if e.get("cat") != "agreement"],
        "does not end": [e for e in sound() if e.get("ph") != "e"],
        "ends before it begins": [e for e in sound() if e.get("ph") != "b"],
        "no dur": [{k: v for k, v in e.items() if k != "dur"} for e in sound()],
        "not one of": sound() + [{"name": "?", "ph": "Q", "pid": 0}],
        "says no algorithm": sound() + [x("allreduce", "call", 300, 5)],
        "calls on the timeline, not 3": sound(),
    }
    for words, events in cases.items():
        bad, _ = timeline.problems(events, calls=3 if "not 3" in words else None)
        assert any(words in b for b in bad), (words, bad)


def test_a_file_cut_short_loads(tmp_path):
    p = tmp_path / "cut.0.json"
    p.write_text('[\n{"name":"w","cat":"wire","ph":"X","ts":1,"dur":1,"pid":0,"tid":1},\n')
    assert len(timeline.load(str(p))) == 1
