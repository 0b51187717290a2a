"""gcomp.torch across whole jobs (each an `mpiexec.mpich` run of torch_job.py, bounded): a
checkpoint saved after step N of a run of N + M steps and loaded by a new job goes on bit for
bit as that run; a rank that sleeps past the stall time is named and the job completes; a rank
that skips a call under a timeout makes every rank raise, and none hangs; a torch.distributed
world that is not gcomp's makes every rank raise wherever gcomp.torch meets it.

    MPIEXEC=mpiexec.mpich /usr/bin/python3 -m pytest tests/python/test_torch_jobs.py
"""

import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "torch_job.py")
MPIEXEC = os.environ.get("MPIEXEC", "mpiexec.mpich")
PORT = int(os.environ.get("GCOMP_JOBS_PORT", "29700"))


def job(ranks, *args, env=None, limit=180, launcher="mpiexec"):
    """Runs torch_job.py on `ranks` ranks, started by mpiexec (gcomp over MPI) or by torch's
    launcher (no mpiexec: gcomp over Gloo on torch's store); returns (returncode, stdout,
    stderr). Under torch's launcher each rank's stdout lines carry a "[defaultR]:" prefix."""
    e = dict(os.environ)
    e.update(env or {})
    if launcher == "mpiexec":
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT + ranks))
        cmd = ["timeout", "-k", "10", str(limit), MPIEXEC, "-n", str(ranks), sys.executable,
               JOB, *args]
        p = subprocess.run(cmd, env=e, capture_output=True, text=True)
        return p.returncode, p.stdout, p.stderr
    # Debian's torch 1.13 needs --redirects and --tee other than 0.
    with tempfile.TemporaryDirectory() as logs:
        cmd = ["timeout", "-k", "10", str(limit), sys.executable, "-m", "torch.distributed.run",
               "--nproc_per_node", str(ranks), "--master_port", str(PORT + 10 + ranks),
               "--redirects", "1", "--tee", "1", "--log_dir", logs, JOB, *args]
        p = subprocess.run(cmd, env=e, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def params(path, ranks):
    return [torch.load(f"{path}.rank{r}") for r in range(ranks)]


# The hook's rows: top-k on one DDP bucket (one ErrorFeedback for the bucket); top-k per
# parameter and PowerSGD (one per parameter) on several buckets, which DDP lays out anew after
# the first step of each job (the resumed job's first step has DDP's first layout, the one run's
# step N the rebuilt one: the residuals follow the parameters by name). 0/1 Adam (AdamW, sign on
# compressed_reduce_scatter: each rank's residual and each owner's) saved between two
# synchronizations of its local steps (zero_one(2, kappa=1, max_local_steps=2,
# local_double_every=1): exact step 1, compressed 2, local from 3, synchronized at 3, 4, 6, 8;
# saved after 5, its anchors in the checkpoint). (1-bit Adam's compressed stage through the hook
# and DistributedOptimizer, the hook's whole buckets that DDP regroups, and a save in the warm-up:
# test_torch.py's test_one_bit_adam_resumes_bit_for_bit_from_a_checkpoint, in one process.) All
# under mpiexec: a checkpoint holds the same state whatever the transport, and test_torch.py's
# resumes run under torchrun (Gloo) too.
@pytest.mark.parametrize("form, codec, more", [
    ("hook", "topk:ratio=0.05", ["--buckets", "one"]),
    ("hook", "topk:ratio=0.05", ["--per-parameter"]),
    ("hook", "powersgd:rank=2,start=2", []),
    ("optimizer", "topk:ratio=0.05", []),
    ("optimizer", "powersgd:rank=2", []),
    ("hook", "sign", ["--optimizer", "adamw", "--zero-one", "2,1,2,1", "--buckets", "one"])])
def test_a_resumed_job_goes_on_as_one_run_bit_for_bit(tmp_path, form, codec, more):
    # One job of N + M steps saves its checkpoint after step N and goes on (as a job that
    # checkpoints every N steps does); a second job loads it and runs the M steps.
    ranks, n, m = 2, 5, 3
    common = ["train", "--form", form, "--codec", codec, *more]
    one = job(ranks, *common, "--first", "0", "--count", str(n + m), "--save", f"{tmp_path}/ck",
              "--save-at", str(n), "--out", f"{tmp_path}/one")
    assert one[0] == 0, one[2]
    rest = job(ranks, *common, "--first", str(n), "--count", str(m), "--load", f"{tmp_path}/ck",
               "--out", f"{tmp_path}/rest")
    assert rest[0] == 0, rest[2]
    whole, resumed, before = (params(f"{tmp_path}/{k}", ranks) for k in ("one", "rest",
                                                                          "ck.params"))
    for r in range(ranks):
        assert all(torch.equal(a, b) for a, b in zip(whole[r], resumed[r])), f"rank {r} differs"
        assert all(torch.equal(a, b) for a, b in zip(resumed[0], resumed[r]))
    # The M steps moved the parameters (the comparison is not of the saved ones).
    assert not all(torch.equal(a, b) for a, b in zip(before[0], resumed[0]))
    # And the residuals mattered: a job that loads the model and optimizer but not gcomp's state
    # (a fresh residual) ends elsewhere.
    saved = torch.load(f"{tmp_path}/ck.rank0")
    key = "gcomp" if form == "hook" else None
    ours = saved[key] if key else saved["optimizer"]["gcomp"]
    assert any(torch.any(v != 0) for v in ours["residuals"].values())
    if "--zero-one" in more:  # 0/1 Adam between synchronizations: the anchors are in it
        assert ours["adam"]["variance"] == "schedule"
        assert ours["adam_local"]["anchors"] and ours["adam_local"]["lr_sum"]
        assert not all(torch.equal(a, b) for a, b in zip(before[0], before[1]))  # own models
    assert ours["step" if form == "hook" else "steps"] == n


def test_a_checkpoint_without_the_residuals_does_not_resume_exactly(tmp_path):
    # The negative control of the test above: the model and optimizer alone (the state left
    # fresh) do not give the one run's parameters.
    ranks = 2
    common = ["train", "--form", "hook", "--codec", "topk:ratio=0.05", "--buckets", "one"]
    assert job(ranks, *common, "--count", "8", "--save", f"{tmp_path}/ck", "--save-at", "5",
               "--out", f"{tmp_path}/one")[0] == 0
    for r in range(ranks):
        saved = torch.load(f"{tmp_path}/ck.rank{r}")
        del saved["gcomp"]["residuals"], saved["gcomp"]["velocities"]
        saved["gcomp"]["residuals"], saved["gcomp"]["velocities"] = {}, {}
        torch.save(saved, f"{tmp_path}/bare.rank{r}")
    rc, _, err = job(ranks, *common, "--first", "5", "--count", "3", "--load",
                     f"{tmp_path}/bare", "--out", f"{tmp_path}/rest")
    assert rc == 0, err
    whole, resumed = params(f"{tmp_path}/one", ranks), params(f"{tmp_path}/rest", ranks)
    assert not all(torch.equal(a, b) for a, b in zip(whole[0], resumed[0]))


@pytest.mark.parametrize("form, how, launcher, period", [("hook", "state", "mpiexec", 1),
                                                        ("optimizer", "env", "mpiexec", 1),
                                                        ("hook", "state", "torchrun", 1),
                                                        ("hook", "state", "mpiexec", 2)])
def test_a_rank_late_past_the_stall_time_is_named_and_the_job_completes(form, how, launcher,
                                                                         period):
    # Rank 1 sleeps before step 2. Period 2 (from step 1): steps 1..3 local, the models averaged
    # after step 3 (index 2); the others, whose local steps wait for nobody, wait at the average.
    ranks = 3
    args = ["stall", "--form", form, "--late-rank", "1", "--sleep", "2.5", "--period",
            str(period)]
    env = {}
    if how == "state":
        args += ["--stall", "1"]
    else:
        env["GCOMP_STALL_SECONDS"] = "1"
    rc, out, err = job(ranks, *args, env=env, launcher=launcher)
    assert rc == 0, err
    assert out.count("completed") == ranks, out
    reports = [l for l in err.splitlines() if l.startswith("gcomp: rank ")]
    # Each waiting rank (0 and 2) once, naming rank 1 as not there and no other rank.
    waiting = sorted(int(re.match(r"gcomp: rank (\d+)", l).group(1)) for l in reports)
    assert waiting == [0, 2], err
    for line in reports:
        assert "not there: rank 1 (at no gcomp call)" in line, line
        assert "rank 2 (" not in line and "rank 0 (" not in line, line
        assert re.search(r"allreduce of \d+ floats, codec topk", line), line
        if period > 1:
            assert re.search(r"model average 2 of step 3 \(module\.", line), line
        elif form == "hook":
            assert re.search(r"DDP bucket \d+ of step 2 \(module\.", line), line
        else:
            assert re.search(r"bucket \d+ of step 2 \(\d\.(weight|bias)", line), line


@pytest.mark.parametrize("sleep, launcher", [(0, "mpiexec"), (4, "mpiexec"), (0, "torchrun"),
                                             (4, "torchrun")])
def test_a_rank_that_skips_a_call_under_a_timeout_makes_every_rank_raise(sleep, launcher):
    # Rank 1 skips one call and comes to its next. At once (sleep 0): its agreement meets the
    # others' of the call it skipped, and every rank raises mismatch (their calls differ). After
    # the timeout (sleep 4 > 1.5): the others have raised timeout, naming rank 1 as not there;
    # rank 1 then meets what is left of their call, or times out itself. Either way, no hang.
    ranks = 3
    rc, out, err = job(ranks, "skip", "--late-rank", "1", "--sleep", str(sleep),
                       env={"GCOMP_TIMEOUT_SECONDS": "1.5", "GCOMP_STALL_SECONDS": "0"},
                       limit=120, launcher=launcher)
    assert rc == 0, err
    raised = dict(re.findall(r"rank (\d+): raised (\w+)", out))
    assert sorted(raised) == ["0", "1", "2"], out + err
    if sleep == 0:
        assert set(raised.values()) == {"mismatch"}, out
        # Rank 1's next call (bucket 1) met the others' bucket 0: their sizes differ, and the
        # message names each rank's own call.
        assert re.search(r"rank 1: raised mismatch: .*ranks disagree.*n=2016.*\(DDP bucket 1 "
                         r"of step 1\)", out), out
        assert re.search(r"rank 0: raised mismatch: .*n=8165.*\(DDP bucket 0 of step 1\)", out), out
        return
    for r in ("0", "2"):
        assert raised[r] == "timeout", out
    assert re.search(r"rank 0: raised timeout: .*waited 1\.\d s \(the timeout\).*not there: "
                     r"rank 1 \(at no gcomp call\)", out), out
    assert raised["1"] in ("timeout", "mismatch"), out


def assert_every_rank_refused(ranks, out, err, gcomp_world, torch_world):
    raised = dict(re.findall(r"rank (\d+): raised (\w+)", out))
    assert sorted(raised) == [str(r) for r in range(ranks)], out + err
    assert set(raised.values()) == {"mismatch"}, out
    for line in re.findall(r"rank \d+: raised .*", out):
        assert f"gcomp's world ({gcomp_world}" in line, line
        assert f"is not torch.distributed's ({torch_world}" in line, line
        assert "mpiexec.mpich -n" in line, line


@pytest.mark.parametrize("entry", ["register", "hook", "optimizer"])
def test_torch_ranks_in_another_order_than_gcomps_make_every_rank_raise(entry):
    # Same size, torch's ranks the reverse of mpiexec's: every rank learns the whole order.
    ranks = 3
    rc, out, err = job(ranks, "world", "--entry", entry, "--init", "reversed")
    assert rc == 0, err
    assert_every_rank_refused(ranks, out, err, "3 ranks", "3 ranks")
    assert "gcomp's ranks 0.. are torch's 2, 1, 0" in out, out


@pytest.mark.parametrize("entry", ["register", "init"])
def test_a_world_of_another_size_makes_every_rank_raise(entry):
    # Launched by torch's launcher with MPI forced on gcomp (GCOMP_TRANSPORT=mpi): gcomp's MPI
    # world is each process alone (a singleton).
    ranks = 3
    init = "none" if entry == "init" else "env"
    rc, out, err = job(ranks, "world", "--entry", entry, "--init", init,
                       env={"GCOMP_TRANSPORT": "mpi"}, launcher="torchrun")
    assert rc == 0, err
    for r in range(ranks):
        assert f"rank {r}: raised mismatch: " in out, out + err
    assert_every_rank_refused(ranks, out, err, "1 rank, this process rank 0", "3 ranks")


@pytest.mark.parametrize("entry", ["register", "init"])
def test_under_torchs_launcher_gcomp_runs_on_torchs_world(entry):
    # Without mpiexec: gcomp over Gloo on torch's store, whatever way torch's world was made
    # (DistributedOptimizer's under torchrun: test_torch.py in python_torch_torchrun_3).
    ranks = 3
    init = "none" if entry == "init" else "env"
    rc, out, err = job(ranks, "world", "--entry", entry, "--init", init, launcher="torchrun")
    assert rc == 0, err
    for r in range(ranks):
        assert f"rank {r}: no error, gcomp on gloo, 3 ranks" in out, out + err
