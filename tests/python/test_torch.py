"""gcomp.torch on every rank of `mpiexec.mpich -n P` (P = 2, 3; tests/python/torch_test.sh):
the DDP hook against DDP's own allreduce, identical parameters on every rank, error feedback
across DDP's bucket rebuild, warm-up, DistributedOptimizer against the hook, broadcasts, and
failures on one rank raising on all. Every test is collective: all ranks run them in order.
"""

import math
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gcomp
import gcomp.torch as gt
import gcomp.torch._pipeline as pipeline

U = 2.0 ** -24  # float32's unit roundoff


@pytest.fixture(scope="module", autouse=True)
def group():
    gt.init_process_group()
    yield


def rank():
    return dist.get_rank()


def size():
    return dist.get_world_size()


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48),
                               torch.nn.ReLU(), torch.nn.Linear(48, 5))


def batch(step, r=None):
    g = torch.Generator().manual_seed(1000 * step + (rank() if r is None else r))
    return torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)


def backward(m, step):
    x, y = batch(step)
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()


def gathered(t):
    """Every rank's copy of t (gloo)."""
    out = [torch.empty_like(t) for _ in range(size())]
    dist.all_gather(out, t.contiguous())
    return out


def same_on_every_rank(tensors):
    for t in tensors:
        for other in gathered(t.detach()):
            assert torch.equal(other, t.detach()), "ranks differ"


def gamma(n):
    """Higham's gamma_n for float32: the relative error bound of a sum of n + 1 terms."""
    return n * U / (1 - n * U)


def mean_bound(s, p):
    """How far a float32 mean of p terms (summed in any order, times 1/p) lies from the exact
    mean, S = sum_r |g_r| / p: (gamma_{p-1} + 3u) S (1 + u)^2, derived in
    test_the_none_hook_averages_as_ddps_own_allreduce."""
    return (gamma(p - 1) + 3 * U) * s * (1 + U) ** 2


def train(m, opt, steps, first=0):
    for s in range(first, first + steps):
        opt.zero_grad()
        backward(m, s)
        opt.step()


def test_the_none_hook_averages_as_ddps_own_allreduce():
    # DDP's default: each rank's g / P, summed by gloo in its order. The hook: the sum by MPI in
    # its order, times 1/P. With S = sum_r |g_r| / P, each sum of P terms is off the exact
    # sum by at most gamma_{P-1} S (1 + u) (Higham 4.4, terms already rounded once), each division
    # or product adds u per term or u of the result, so the two differ by at most
    # (2 gamma_{P-1} + 3u) S (1 + u)^2; 4u instead of 3u covers the second-order terms. Each is
    # also within half of that of the exact mean.
    plain = model()
    backward(plain, 0)  # this rank's own gradients, as both DDP models see them
    a, b = DDP(model()), DDP(model())
    b.register_comm_hook(gt.CompressionState("none"), gt.compression_hook)
    backward(a, 0)
    backward(b, 0)
    p = size()
    for q, pa, pb in zip(plain.parameters(), a.parameters(), b.parameters()):
        grads = [g.double() for g in gathered(q.grad)]
        s = sum(g.abs() for g in grads) / p
        exact = sum(grads) / p
        assert torch.all((pa.grad.double() - pb.grad.double()).abs()
                         <= (2 * gamma(p - 1) + 4 * U) * s)
        assert torch.all((pb.grad.double() - exact).abs() <= mean_bound(s, p))
    # The bound is not vacuous: the gradients are far from zero where it is tight.
    assert any(torch.any(q.grad != 0) for q in plain.parameters())


def check_time_split(st):
    """The stats' time split adds up: every job's library seconds lie within its job's time,
    the agreement within comm, and the tails (one a step) within the hand-offs and jobs."""
    assert st["jobs"] >= st["steps"] > 0
    assert st["hook_seconds"] > 0 and st["handoff_seconds"] >= 0 and st["tail_seconds"] > 0
    library = st["encode_seconds"] + st["comm_seconds"] + st["decode_seconds"]
    assert library <= st["job_seconds"]
    assert abs(st["python_seconds"] - (st["job_seconds"] - library)) < 1e-9
    assert 0 < st["agree_seconds"] <= st["comm_seconds"]
    assert st["tail_seconds"] <= st["handoff_seconds"] + st["job_seconds"] + 1e-9
    # The thread's CPU time in the jobs: some, and no more than their wall time (the two clocks
    # are read a few microseconds apart).
    assert 0 < st["cpu_seconds"] <= st["job_seconds"] + 1e-4 * st["jobs"]


def test_a_compressed_run_leaves_every_rank_with_the_same_parameters():
    m = DDP(model(), bucket_cap_mb=0.005)  # several buckets, rebuilt after the first step
    # Pinned: auto may find the uncompressed allreduce faster here, and send everything.
    state = gt.CompressionState("topk:ratio=0.1", algorithm="sparse_allgather", seed=3)
    m.register_comm_hook(state, gt.compression_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    train(m, opt, 5)
    same_on_every_rank(list(m.parameters()))
    st = state.stats()
    assert st["steps"] == 5 and st["calls"] >= 5 and st["compressed"] > 0
    assert st["bytes_sent"] > 0 and sum(st["algorithm"].values()) == st["calls"]
    check_time_split(st)
    # Error feedback held back most of each large weight (top-k sends 10% of a bucket).
    for p in m.parameters():
        if p.numel() >= 1024:
            r = state.residual(p)
            assert r is not None and r.size == p.numel() and np.mean(r != 0) > 0.5


class FakeBucket:
    """What DDP hands a hook (torch.distributed.GradBucket), over a buffer of our own."""

    def __init__(self, index, params, last):
        self._index, self._params, self._last = index, params, last
        self._buffer = torch.cat([p.grad.view(-1) for p in params])
        self._views, off = [], 0
        for p in params:
            self._views.append(self._buffer[off:off + p.numel()].view_as(p))
            off += p.numel()

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._views

    def parameters(self):
        return self._params

    def is_last(self):
        return self._last


def test_error_feedback_follows_the_parameters_when_buckets_are_rebuilt():
    # Whole buckets compressed as one tensor: the bucket's memory is laid out anew.
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 500, 2000)]
    state = gt.CompressionState("topk:ratio=0.05", algorithm="sparse_allgather", dense_below=10,
                                per_parameter=False)

    def step(layout, s):
        g = torch.Generator().manual_seed(10 * s + rank())
        for p in params:
            p.grad = torch.randn(p.numel(), generator=g)
        futs = [gt.compression_hook(state, FakeBucket(i, [params[j] for j in b],
                                                      i == len(layout) - 1))
                for i, b in enumerate(layout)]
        for f in futs:
            f.wait()

    step([[0, 1], [2]], 0)  # DDP's first layout
    before = [state.residual(p).copy() for p in params]
    assert all(np.any(b != 0) for b in before)
    rebuilt = [[2, 0], [1]]  # what DDP may rebuild into
    for i, b in enumerate(rebuilt):
        ef = state._feedback_for(FakeBucket(i, [params[j] for j in b], i == 1))
        off = 0
        for j in b:
            assert np.array_equal(ef.residual[off:off + params[j].numel()], before[j])
            off += params[j].numel()
    step(rebuilt, 1)
    # And the layout, once known, keeps its memory.
    ef = state._feedback_for(FakeBucket(0, [params[2], params[0]], False))
    assert ef is state._layout[0][1]


def test_each_parameters_memory_survives_the_rebuild():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 500, 2000)]
    state = gt.CompressionState("topk:ratio=0.05", algorithm="sparse_allgather", dense_below=10,
                                per_parameter=True)
    for s, layout in enumerate(([[0, 1], [2]], [[2, 0], [1]])):
        g = torch.Generator().manual_seed(10 * s + rank())
        for p in params:
            p.grad = torch.randn(p.numel(), generator=g)
        if s == 1:
            before = [state.residual(p).copy() for p in params]
            kept = [state._feedback_of(p) for p in params]
        futs = [gt.compression_hook(state, FakeBucket(i, [params[j] for j in b], i == 1))
                for i, b in enumerate(layout)]
        for f, b in zip(futs, layout):
            f.wait()
    # Each parameter's memory is its own object, whatever bucket it is in.
    assert all(state._feedback_of(p) is k for p, k in zip(params, kept))
    assert all(np.any(b != 0) for b in before)
    # Step 2 added step 1's residual: each parameter's sent values are g + e, so its new
    # residual is (g + e) where nothing was sent; top-k's 5% of 3000 leaves e's trace.
    g = torch.Generator().manual_seed(10 + rank())
    for p, b in zip(params, before):
        fresh = torch.randn(p.numel(), generator=g).numpy()
        r = state.residual(p)
        kept_where = r != 0
        assert np.allclose(r[kept_where], (fresh + b)[kept_where], rtol=0, atol=1e-6)


def test_which_codecs_go_per_parameter():
    split = lambda spec, pp=None: gt.CompressionState(spec, per_parameter=pp)._split  # noqa: E731
    assert split("sign") and split("terngrad")  # one scale per tensor
    assert not split("topk:ratio=0.01") and not split("qsgd") and not split("none")
    assert split("topk:ratio=0.01", True) and not split("sign", False)
    assert not split("fp16", True) and not split("none", True)  # element-wise: the same values
    with pytest.raises(ValueError, match="per_parameter"):
        gt.CompressionState("sign", per_parameter="yes")


def test_per_parameter_compression_scales_each_parameter_on_its_own():
    # The same gradients on every rank: the average of sign's C(g) = mean|g| sign(g) is C(g).
    # Two parameters 1000x apart in magnitude in one bucket. Per parameter, each keeps its own
    # scale; as one bucket, both share the bucket's mean, which makes the small one's values
    # 500x too large.
    g = torch.Generator().manual_seed(7)
    small, big = torch.randn(2000, generator=g) * 1e-3, torch.randn(2000, generator=g)
    params = [torch.nn.Parameter(torch.zeros(2000)) for _ in range(2)]
    results = {}
    for per_parameter in (True, False):
        params[0].grad, params[1].grad = small.clone(), big.clone()
        state = gt.CompressionState("sign", error_feedback=False, algorithm="allgather",
                                    per_parameter=per_parameter, allow_uncompressed=False)
        bucket = FakeBucket(0, params, True)
        results[per_parameter] = gt.compression_hook(state, bucket).wait().clone()
        assert state.stats()["compressed"] > 0
        assert state.stats()["calls"] == (2 if per_parameter else 1)
    own = torch.cat([small.abs().mean() * small.sign(), big.abs().mean() * big.sign()])
    assert torch.allclose(results[True], own, rtol=1e-5, atol=0)
    shared = torch.cat([small, big]).abs().mean() * torch.cat([small, big]).sign()
    assert torch.allclose(results[False], shared, rtol=1e-5, atol=0)
    assert results[False][:2000].abs().mean() > 100 * small.abs().mean()


def test_warmup_steps_are_averaged_uncompressed():
    a, b = DDP(model()), DDP(model())
    # (allow_uncompressed=False: after the warm-up, sign is applied whatever auto's model says)
    warm = gt.CompressionState("sign", warmup_steps=2, allow_uncompressed=False)
    a.register_comm_hook(warm, gt.compression_hook)
    b.register_comm_hook(gt.CompressionState("none", algorithm="dense"), gt.compression_hook)
    for s in range(2):
        for m in (a, b):
            for p in m.parameters():
                p.grad = None
            backward(m, s)
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa.grad, pb.grad)
    st = warm.stats()
    assert st["dense_calls"] == st["calls"] and st["compressed"] == 0
    backward(a, 2)
    assert warm.stats()["compressed"] > 0


@pytest.mark.parametrize("codec, ef", [("fp16", True), ("none", False)])
def test_the_optimizer_and_the_hook_give_the_same_parameters(codec, ef):
    # An element-wise codec and an algorithm that sums in rank order (allgather): the result of
    # each element does not depend on how the two paths group parameters into buckets. Nothing
    # goes dense for being small (dense_below=0), so the biases are compressed on both paths.
    a = DDP(model())
    a.register_comm_hook(gt.CompressionState(codec, error_feedback=ef, algorithm="allgather",
                                             dense_below=0, seed=5), gt.compression_hook)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    b = model()
    opt_b = gt.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=b.named_parameters(), codec=codec,
                                    error_feedback=ef, algorithm="allgather", seed=5,
                                    dense_below=0, bucket_bytes=4000)
    train(a, opt_a, 4)
    train(b, opt_b, 4)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert opt_b.stats()["steps"] == 4 and opt_b.stats()["calls"] >= 4


def test_the_optimizer_compresses_and_keeps_ranks_identical():
    m = model(rank())  # different on every rank, until the broadcast
    gt.broadcast_parameters(m.state_dict(), root_rank=0)
    same_on_every_rank(list(m.parameters()))
    opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=m.named_parameters(),
                                  codec="qsgd:bits=4", warmup_steps=1, bucket_bytes=10000,
                                  allow_uncompressed=False)
    train(m, opt, 4)
    same_on_every_rank(list(m.parameters()))
    st = opt.stats()
    assert st["dense_calls"] > 0 and st["compressed"] > 0 and st["bytes_sent"] > 0
    assert st["jobs"] > 0 and 0 < st["agree_seconds"] <= st["comm_seconds"]
    assert st["encode_seconds"] + st["comm_seconds"] + st["decode_seconds"] <= st["job_seconds"]
    assert st["tail_seconds"] > 0  # what step() waited for
    assert opt.param_groups[0]["lr"] == 0.1  # the wrapped optimizer's attributes


def test_broadcast_optimizer_state_and_objects():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1 * (rank() + 1), momentum=0.9)
    backward(m, rank())
    opt.step()  # momentum buffers differ between ranks
    gt.broadcast_optimizer_state(opt, root_rank=1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    same_on_every_rank([opt.state[p]["momentum_buffer"] for p in m.parameters()])
    obj = {"rank": rank(), "big": list(range(100000)), "s": "é" * 5} if rank() == 0 else None
    got = gt.broadcast_object(obj, root_rank=0)
    assert got["rank"] == 0 and got["big"][-1] == 99999 and got["s"] == "é" * 5


def expect_every_rank_fails(call, culprit, words):
    with pytest.raises(Exception) as e:
        call()
    text = str(e.value)
    if rank() == culprit:
        assert any(w in text for w in words), text
    else:
        assert "mismatch" in text or "rank" in text, text


def test_nan_on_one_rank_fails_every_rank():
    culprit = size() - 1
    m = DDP(model())
    m.register_comm_hook(gt.CompressionState("topk:ratio=0.1"), gt.compression_hook)

    def poisoned():
        x, y = batch(0)
        if rank() == culprit:
            x[0, 0] = float("nan")
        torch.nn.functional.cross_entropy(m(x), y).backward()

    expect_every_rank_fails(poisoned, culprit, ["nonfinite", "non-finite"])

    b = model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1),
                                  named_parameters=b.named_parameters(), codec="sign")

    def poisoned_step():
        opt.zero_grad()
        backward(b, 0)
        if rank() == culprit:
            next(b.parameters()).grad[0] = float("inf")
        opt.step()

    expect_every_rank_fails(poisoned_step, culprit, ["nonfinite", "non-finite"])
    train(b, opt, 1, first=1)  # and the next step works
    same_on_every_rank(list(b.parameters()))


def test_different_or_bad_specs_fail_every_rank():
    m = DDP(model())
    spec = "topk:ratio=0.1" if rank() == 0 else "topk:ratio=0.2"
    m.register_comm_hook(gt.CompressionState(spec), gt.compression_hook)
    expect_every_rank_fails(lambda: backward(m, 0), 0, ["mismatch"])

    b = model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1),
                                  named_parameters=b.named_parameters(),
                                  codec="nope" if rank() == 0 else "fp16")
    expect_every_rank_fails(lambda: train(b, opt, 1), 0, ["nope"])


def test_the_communicator_is_shared():
    assert gt.communicator().size == size() and gt.communicator().rank == rank()
    assert math.isfinite(gt.communicator().network["alpha"])


def test_error_feedback_is_for_the_codecs_whose_error_contracts():
    # QSGD's error has variance omega |x|^2 with omega >= 1 here: a residual would grow.
    assert gt.CompressionState("qsgd:bits=4").error_feedback is False
    assert gt.CompressionState("terngrad").error_feedback is False
    assert gt.CompressionState("randomk:ratio=0.1,scale=true").error_feedback is False
    assert gt.CompressionState("qsgd:bits=4", error_feedback="always").error_feedback is True
    for spec in ("topk:ratio=0.01", "sign", "fp16", "randomk:ratio=0.1", "threshold:tau=1"):
        assert gt.CompressionState(spec).error_feedback is True, spec
        assert gt.CompressionState(spec, error_feedback=False).error_feedback is False
    with pytest.raises(ValueError, match="error_feedback"):
        gt.CompressionState("sign", error_feedback="yes")


def test_momentum_correction_accumulates_velocities_and_masks_what_was_sent():
    # DGC: u = m u + g replaces g; the residual accumulates u; where a value was sent (its
    # residual is 0 after the call), u is zeroed. Checked bit for bit on every rank: top-k's
    # residual is (r + u) exactly where nothing was sent and 0 where it was.
    m = 0.5
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3000, 2000)]
    state = gt.CompressionState("topk:ratio=0.05", algorithm="sparse_allgather", dense_below=10,
                                per_parameter=False, allow_uncompressed=False, momentum=m)
    u_expected = [None, None]
    r_before = [np.zeros(p.numel(), np.float32) for p in params]
    for s in range(3):
        g = torch.Generator().manual_seed(10 * s + rank())
        grads = [torch.randn(p.numel(), generator=g) for p in params]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        for i, gr in enumerate(grads):
            u_expected[i] = gr.clone() if u_expected[i] is None else u_expected[i] * m + gr
        gt.compression_hook(state, FakeBucket(0, params, True)).wait()
        for i, p in enumerate(params):
            r = state.residual(p)
            v = r_before[i] + u_expected[i].numpy()  # what top-k selected from
            sent = r == 0
            assert 0 < np.count_nonzero(sent) < p.numel() // 2
            assert np.array_equal(r[~sent], v[~sent])
            # The velocity: zero where sent, untouched where kept.
            u = state.velocity(p)
            assert torch.equal(u[torch.from_numpy(sent)], torch.zeros(int(sent.sum())))
            assert torch.equal(u[torch.from_numpy(~sent)], u_expected[i][torch.from_numpy(~sent)])
            u_expected[i] = u.clone()
            r_before[i] = r.copy()


def test_momentum_correction_sent_whole_is_momentum_sgd():
    # Warm-up steps send everything: no delay, no masking, the velocity is momentum SGD's buffer.
    m = 0.9
    params = [torch.nn.Parameter(torch.zeros(500))]
    state = gt.CompressionState("topk:ratio=0.01", warmup_steps=3, momentum=m)
    u = None
    for s in range(3):
        g = torch.Generator().manual_seed(10 * s + rank())
        gr = torch.randn(500, generator=g)
        params[0].grad = gr.clone()
        u = gr.clone() if u is None else u * m + gr
        out = gt.compression_hook(state, FakeBucket(0, params, True)).wait()
        assert torch.equal(state.velocity(params[0]), u)
        # The average over ranks of their velocities: a sum of P float32 terms and a product
        # by 1/P, off by at most (gamma_{P-1} + 2u) S with S = sum_r |u_r| / P; 4Pu bounds that.
        us = [v.double() for v in gathered(u)]
        mean, s_abs = sum(us) / size(), sum(v.abs() for v in us) / size()
        assert torch.all((out.double() - mean).abs() <= 4 * size() * U * s_abs)
    assert state.stats()["compressed"] == 0


def test_momentum_correction_in_the_optimizer_keeps_ranks_identical():
    m = model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                  named_parameters=m.named_parameters(),
                                  codec="topk:ratio=0.05", bucket_bytes=10000, momentum=0.9,
                                  allow_uncompressed=False, algorithm="sparse_allgather")
    train(m, opt, 4)
    same_on_every_rank(list(m.parameters()))
    big = [p for p in m.parameters() if p.numel() >= 1024]
    for p in big:  # masked where sent, so partly zero, and not all
        u = opt.velocity(p)
        assert u is not None and 0 < int((u == 0).sum()) < p.numel()
    assert opt.stats()["compressed"] > 0


def test_momentum_correction_needs_error_feedback():
    with pytest.raises(ValueError, match="error feedback"):
        gt.CompressionState("qsgd:bits=4", momentum=0.9)
    with pytest.raises(ValueError, match="error feedback"):
        gt.CompressionState("topk:ratio=0.01", error_feedback=False, momentum=0.9)
    with pytest.raises(ValueError, match="momentum"):
        gt.CompressionState("topk:ratio=0.01", momentum=1.0)
    assert gt.CompressionState("topk:ratio=0.01", momentum=0.9).momentum == 0.9


def test_register_moves_sgd_momentum_and_weight_decay_into_the_hook():
    m = DDP(model(), bucket_cap_mb=0.005)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    state = gt.register(m, opt, "topk:ratio=0.05", algorithm="sparse_allgather",
                        allow_uncompressed=False)
    assert isinstance(state, gt.CompressionState)
    assert (state.momentum, state.weight_decay) == (0.9, 1e-3)
    assert state.moved == {"momentum": 0.9, "weight_decay": 1e-3}
    assert all(g["momentum"] == 0 and g["weight_decay"] == 0 for g in opt.param_groups)
    train(m, opt, 4)
    same_on_every_rank(list(m.parameters()))
    big = [p for p in m.parameters() if p.numel() >= 1024]
    for p in big:  # the velocities live in the hook, masked where sent
        u = state.velocity(p)
        assert u is not None and 0 < int((u == 0).sum()) < p.numel()
    # Checkpoint keys are the model's parameter names.
    assert set(state.state_dict()["residuals"]) == {n for n, _ in m.named_parameters()}


def test_register_leaves_a_codec_that_does_not_delay_and_its_optimizer_alone():
    for spec in ("qsgd:bits=4", "fp16", "powersgd:rank=2"):
        m = DDP(model())
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        state = gt.register(m, opt, spec)
        assert state.momentum == 0 and state.moved == {}
        assert opt.param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize("make, why", [
    (lambda ps: torch.optim.RMSprop(ps, lr=1e-3), "RMSprop is left as it is"),
    (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True), "Nesterov"),
    (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1), "dampening"),
])
def test_register_warns_and_changes_nothing_it_cannot_move(make, why):
    m = DDP(model())
    opt = make(m.parameters())
    before = [dict(g, params=None) for g in opt.param_groups]
    with pytest.warns(UserWarning, match=why):
        state = gt.register(m, opt, "topk:ratio=0.01")
    assert state.momentum == 0 and state.moved == {}
    assert [dict(g, params=None) for g in opt.param_groups] == before


def test_register_refuses_momentum_twice_and_a_model_without_hooks():
    m = DDP(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    with pytest.raises(ValueError, match="twice"):
        gt.register(m, opt, "topk:ratio=0.01", momentum=0.9)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        gt.register(model(), opt, "topk:ratio=0.01")
    # momentum=0 given: the caller keeps it in the optimizer.
    state = gt.register(m, opt, "topk:ratio=0.01", momentum=0.0)
    assert state.momentum == 0 and opt.param_groups[0]["momentum"] == 0.9


def test_weight_decay_in_the_hook_is_added_to_each_gradient_before_the_mean():
    # Sent whole (warm-up): the hook's result is the mean over ranks of g + wd p, within the
    # mean's rounding (mean_bound) plus one rounding of each sum g + wd p (u |g + wd p|).
    wd = 0.01
    p = torch.nn.Parameter(torch.linspace(-3, 3, 700))
    g = torch.Generator().manual_seed(5 + rank())
    grad = torch.randn(700, generator=g)
    p.grad = grad.clone()
    state = gt.CompressionState("topk:ratio=0.01", warmup_steps=1, weight_decay=wd)
    out = gt.compression_hook(state, FakeBucket(0, [p], True)).wait()
    terms = [t.double() + wd * p.detach().double() for t in gathered(grad)]
    s = sum(t.abs() for t in terms) / size()
    exact = sum(terms) / size()
    assert torch.all((out.double() - exact).abs() <= mean_bound(s, size()) + 2 * U * s)
    # And without it the result is another one (the test can fail).
    plain = sum(t.double() for t in gathered(grad)) / size()
    assert not torch.all((out.double() - plain).abs() <= mean_bound(s, size()) + 2 * U * s)


def test_the_optimizer_takes_momentum_from_the_sgd_it_wraps():
    m = model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=m.named_parameters(), codec="topk:ratio=0.05")
    assert opt.momentum == 0.9 and opt.moved["momentum"] == 0.9
    assert opt.param_groups[0]["momentum"] == 0
    keep = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=m.named_parameters(), codec="topk:ratio=0.05",
                                   momentum=0.0)
    assert keep.momentum == 0 and keep.param_groups[0]["momentum"] == 0.9
    q = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                                named_parameters=m.named_parameters(), codec="qsgd:bits=4")
    assert q.momentum == 0 and q.param_groups[0]["momentum"] == 0.9


def test_checkpoint_of_a_state_refuses_another_codec_or_momentum():
    a = gt.CompressionState("topk:ratio=0.01", momentum=0.9)
    sd = a.state_dict()
    assert sd["format"] == "gcomp.torch.CompressionState" and sd["step"] == 0
    gt.CompressionState("topk:ratio=0.01", momentum=0.9).load_state_dict(sd)
    with pytest.raises(ValueError, match="codec"):
        gt.CompressionState("topk:ratio=0.02", momentum=0.9).load_state_dict(sd)
    with pytest.raises(ValueError, match="momentum"):
        gt.CompressionState("topk:ratio=0.01").load_state_dict(sd)
    with pytest.raises(ValueError, match="format"):
        gt.CompressionState("topk:ratio=0.01", momentum=0.9).load_state_dict({"step": 3})


def test_stall_and_timeout_settings_are_checked():
    with pytest.raises(ValueError, match="stall_seconds"):
        gt.CompressionState("topk:ratio=0.01", stall_seconds=-1)
    with pytest.raises(ValueError, match="timeout_seconds"):
        gt.CompressionState("topk:ratio=0.01", timeout_seconds=float("nan"))
    comm = gt.communicator()
    assert comm.stall_seconds == 60.0 and comm.timeout_seconds == 0.0  # the defaults
    with pytest.raises(gcomp.Error, match="stall_seconds"):
        comm.stall_seconds = -2.0


def wide_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 96), torch.nn.ReLU(), torch.nn.Linear(96, 80),
                               torch.nn.ReLU(), torch.nn.Linear(80, 5))


@pytest.mark.parametrize("spec", ["powersgd:rank=2", "powersgd:rank=2,values=fp16",
                                  "powersgd:rank=1,alternate=true"])
def test_powersgd_hook_on_ddps_buckets_keeps_ranks_identical(spec):
    # Several buckets (and DDP's rebuild of them after the first step): each gradient goes as a
    # matrix of its own shape, its residual and Q in the parameter's ErrorFeedback.
    m = DDP(wide_model(), bucket_cap_mb=0.02)
    state = gt.CompressionState(spec, algorithm="low_rank", seed=5)
    m.register_comm_hook(state, gt.compression_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    train(m, opt, 6)
    same_on_every_rank(list(m.parameters()))
    st = state.stats()
    assert st["steps"] == 6 and st["algorithm"].get("low_rank", 0) >= 6
    # The matrices kept a residual; the biases went dense (nothing left).
    for p in m.parameters():
        r = state.residual(p)
        assert r is not None
        if p.dim() == 2 and p.numel() >= 1024:
            assert np.any(r != 0)
        if p.dim() == 1:
            assert not np.any(r != 0)


def test_powersgd_hook_is_a_rank_r_average():
    # One step from the same weights: what the hook returns for the 80 x 96 weight is of rank 2
    # at most, and the 1-D biases are DDP's own average.
    a, b = DDP(wide_model()), DDP(wide_model())
    b.register_comm_hook(gt.CompressionState("powersgd:rank=2", algorithm="low_rank"),
                         gt.compression_hook)
    backward(a, 0)
    backward(b, 0)
    pa, pb = list(a.parameters()), list(b.parameters())
    g = pb[2].grad.double()
    assert torch.linalg.matrix_rank(g, atol=1e-6 * g.abs().max().item()) <= 2
    for qa, qb in zip(pa, pb):
        if qa.dim() == 1:
            assert torch.allclose(qa.grad, qb.grad, atol=1e-6)


def test_powersgd_in_the_optimizer_keeps_ranks_identical():
    m = wide_model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                  named_parameters=m.named_parameters(),
                                  codec="powersgd:rank=2", algorithm="low_rank", seed=2)
    gt.broadcast_parameters(m.state_dict())
    train(m, opt, 4)
    same_on_every_rank(list(m.parameters()))
    assert opt.stats()["algorithm"].get("low_rank", 0) >= 4


# (a codec step's seconds, an uncompressed step's; rank 0's differ, so the ranks' times differ
# but their votes agree)
STEP_COSTS = {"uncompressed": ((2.0, 1.0), (3.0, 1.0)),  # uncompressed faster: switch
              "low_rank": ((1.0, 1.5), (1.0, 1.8)),  # low-rank faster: keep
              "low_rank_far": ((1.0, 4.0), (1.0, 5.0))}  # far faster: the check aborts


@pytest.mark.parametrize("case", sorted(STEP_COSTS))
def test_the_step_check_keeps_the_faster_way_on_every_rank(case):
    # Low-rank under auto with uncompressed allowed: whole steps compared (_StepCheck), on a
    # clock of the test's own. The first check probes the uncompressed way at step start +
    # window (2 + 8 = 10) for 5 steps (10-14), or one step where that step takes more than twice
    # the window's median; the ranks then keep the faster way until the next check, 64 steps on.
    m = DDP(wide_model(), bucket_cap_mb=0.02)
    state = gt.CompressionState("powersgd:rank=2,start=2", seed=3)
    m.register_comm_hook(state, gt.compression_hook)
    check = state._check
    assert check is not None and check.first == 10
    costs = STEP_COSTS[case][0 if rank() == 0 else 1]
    now = [0.0]

    def clock():  # called at each step's first bucket: the step before has ended
        before = check.modes[max(check.modes)] if check.modes else False
        now[0] += costs[1] if before else costs[0]
        return now[0]

    check.clock = clock
    votes = []
    real_vote = gt._step_check._vote

    def vote(local):  # a vote is a collective: once after the first probe step, once at the end
        votes.append(local)
        return real_vote(local)

    gt._step_check._vote = vote
    try:
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        train(m, opt, 30)
    finally:
        gt._step_check._vote = real_vote
    same_on_every_rank(list(m.parameters()))
    st = state.stats()
    assert st["step_checks"] == 1
    assert gt._step_check._StepCheck.probe == 5
    if case == "uncompressed":
        assert st["step_switches"] == 1 and st["uncompressed_steps"] == 30 - 10
        assert len(votes) == 2
        assert all(check.modes[s] for s in range(15, 30))
        # Uncompressed, the residuals were sent and zeroed.
        assert all(not np.any(state.residual(p) != 0) for p in m.parameters())
    else:
        aborted = case == "low_rank_far"
        assert st["step_switches"] == 0 and st["step_aborts"] == int(aborted)
        assert len(votes) == (1 if aborted else 2)
        assert st["uncompressed_steps"] == (1 if aborted else 5)
        assert not any(check.modes[s] for s in range(15, 30))
    # The uncompressed steps' bucket calls went by the dense algorithm without the codec, and
    # the stats count them as uncompressed; the low-rank steps' calls ran low_rank, none of
    # them uncompressed by auto (the check is where that way is weighed).
    per_step = st["calls"] // 30
    assert per_step * 30 == st["calls"]
    assert st["algorithm"].get("dense", 0) == per_step * st["uncompressed_steps"]
    assert st["calls"] - st["compressed"] == per_step * st["uncompressed_steps"]
    assert st["algorithm"].get("low_rank", 0) == per_step * (30 - st["uncompressed_steps"])


def test_the_step_check_is_only_for_low_rank_under_auto():
    assert gt.CompressionState("powersgd:rank=2")._check is not None
    assert gt.CompressionState("powersgd:rank=2", algorithm="low_rank")._check is None
    assert gt.CompressionState("powersgd:rank=2", allow_uncompressed=False)._check is None
    assert gt.CompressionState("topk:ratio=0.01")._check is None


@pytest.mark.parametrize("codec,allow", [("powersgd:rank=2", True), ("topk:ratio=0.1", True),
                                         ("topk:ratio=0.1", False)])
def test_the_hook_and_the_optimizer_choose_collectives_by_one_rule(monkeypatch, codec, allow):
    # Every bucket's collective in both paths comes from _pipeline.bucket_collective: the
    # warm-up's uncompressed (codec none, dense), then the codec, with allow_uncompressed unless
    # the owner's whole-step check weighs the uncompressed way (the hook's, for powersgd under
    # auto): the optimizer, which has none, lets auto choose.
    made = []
    real = pipeline.bucket_collective

    def spy(owner, *args, **kwargs):
        c = real(owner, *args, **kwargs)
        made.append((owner, c))
        return c

    monkeypatch.setattr(pipeline, "bucket_collective", spy)
    kw = dict(warmup_steps=1, allow_uncompressed=allow, dense_below=0)
    a = DDP(model(), bucket_cap_mb=1)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    state = gt.register(a, opt_a, codec, **kw)
    train(a, opt_a, 2)
    b = model()
    opt_b = gt.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1),
                                    named_parameters=b.named_parameters(), codec=codec, **kw)
    train(b, opt_b, 2)
    assert (state._check is not None) == (codec == "powersgd:rank=2" and allow)
    for owner in (state, opt_b):
        calls = [c for o, c in made if o is owner]
        assert {c.kwargs["step"] for c in calls} == {0, 1}
        for c in calls:
            if c.kwargs["step"] == 0:
                assert (c.codec, c.kwargs["algorithm"]) == ("none", "dense")
            else:
                assert c.codec == codec and c.kwargs["algorithm"] == "auto"
                assert c.kwargs["allow_uncompressed"] == (allow and owner._check is None)
                assert c.kwargs["average"] and c.kwargs["seed"] == 0


def uneven_steps(r):
    """Rank r's steps in the uneven-input tests: 3, 5, 7, ..."""
    return 3 + 2 * r


def test_joined_ranks_contribute_zeros_to_the_mean_over_every_rank():
    # DDP's join() with ranks that run out of data at different steps: the ranks that have
    # joined shadow the others' collectives through the hook with zero buckets, and the mean
    # still divides by every rank (as DDP's default divide_by_initial_world_size=True). With
    # lr = 0 the parameters stay put, so an active rank computes every rank's gradient at step
    # s itself (batch(s, r) on a plain copy of the model) and the hook's mean must be the sum of
    # the active ranks' g_r / P, within mean_bound of the exact one (the zeros add no error).
    p = size()
    plain = model()
    m = DDP(model())
    state = gt.CompressionState("none")
    m.register_comm_hook(state, gt.compression_hook)
    checked = 0
    with m.join():
        for s in range(uneven_steps(rank())):
            m.zero_grad()
            backward(m, s)
            grads = []
            for r in range(p):
                if uneven_steps(r) <= s:
                    continue  # rank r has joined: it sends zeros
                plain.zero_grad()
                x, y = batch(s, r)
                torch.nn.functional.cross_entropy(plain(x), y).backward()
                grads.append([q.grad.double().clone() for q in plain.parameters()])
            for i, q in enumerate(m.parameters()):
                exact = sum(g[i] for g in grads) / p
                bound = mean_bound(sum(g[i].abs() for g in grads) / p, p)
                assert torch.all((q.grad.double() - exact).abs() <= bound), (s, i)
            checked += int(len(grads) < p)
    # Every rank ran the hook for every step of the longest, its own and the shadowed ones.
    assert state.step == uneven_steps(p - 1)
    # The ranks that ran longest checked steps where others had joined.
    assert rank() < p - 1 or checked > 0


def test_uneven_inputs_with_error_feedback_end_identical_and_drain_the_joined_residuals():
    # Top-k with error feedback under join(): a joined rank's bucket is zeros, so what it sends
    # is the top-k of its residual, and its residual can only shrink (e - topk(e)). The job
    # completes on every rank, DDP's join ends with the same parameters on every rank, and each
    # rank's residual at the end is no larger than when it joined.
    m = DDP(model())
    # allow_uncompressed=False: auto may not send this small bucket whole (which zeroes residuals).
    state = gt.CompressionState("topk:ratio=0.1", allow_uncompressed=False)
    m.register_comm_hook(state, gt.compression_hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with m.join():
        for s in range(uneven_steps(rank())):
            opt.zero_grad()
            backward(m, s)
            opt.step()
        joined = [float(np.linalg.norm(state.residual(q))) for q in m.parameters()]
    assert sum(joined) > 0  # top-k 10% of these gradients leaves a residual
    ended = [float(np.linalg.norm(state.residual(q))) for q in m.parameters()]
    assert all(e <= j for e, j in zip(ended, joined)), (ended, joined)
    if rank() < size() - 1:
        assert sum(ended) < sum(joined)  # the shadowed steps sent some of it
    assert state.step == uneven_steps(size() - 1)
    same_on_every_rank(list(m.parameters()))


# ---- Adam and AdamW: 1-bit Adam's stages (warm-up, then the momentum with the variance frozen) ----


def int_model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4)


def int_backward(m, step):
    """Gradients of small positive integers (W: sum of y_i x_j over 6 samples, b: sum of y),
    exact in float32 and their sum over ranks too, and far from zero: Adam's normalized update
    then depends smoothly on them, and a few roundings in an average move it by as little."""
    g = torch.Generator().manual_seed(500 * step + rank())
    x = torch.randint(1, 4, (6, 8), generator=g).float()
    y = torch.randint(1, 4, (6, 4), generator=g).float()
    (m(x) * y).sum().backward()


def adam_reference(decoupled, warmup, steps, lr, wd):
    """1-bit Adam on every rank alone, in double from float32 state: the gradients' mean for
    the warm-up's exact steps, then the mean of the ranks' momenta with the variance frozen
    (each step within exact Adam's bound)."""
    ref = int_model()
    b1, b2, eps = 0.9, 0.99, 1e-8
    params = [p.detach().double().clone() for p in ref.parameters()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        for q in ref.parameters():
            q.grad = None
        with torch.no_grad():
            for q, p in zip(ref.parameters(), params):
                q.copy_(p.float())
        int_backward(ref, t - 1)
        for i, q in enumerate(ref.parameters()):
            g = q.grad.double()
            p = params[i]
            if decoupled:
                p *= 1 - lr * wd
            else:
                g = g + wd * p
            mine = b1 * m[i] + (1 - b1) * g  # this rank's momentum
            m[i] = sum(x.double() for x in gathered(mine.float())) / size()
            if t <= warmup:
                v[i] = b2 * v[i] + (1 - b2) * sum(x.double() for x in gathered(g.float())) ** 2 \
                    / size() ** 2
            mh = m[i] / (1 - b1 ** t)
            vh = v[i] / (1 - b2 ** min(t, warmup))
            q = mh / (vh.sqrt() + eps)
            if t > warmup:  # within exact Adam's bound, max(1, (1 - b1) / sqrt(1 - b2))
                bound = max(1.0, (1 - b1) / math.sqrt(1 - b2))
                q = q.clamp(-bound, bound).masked_fill(vh == 0, 0.0)
            p -= lr * q
    return params


@pytest.mark.parametrize("way", ["hook", "optimizer"])
@pytest.mark.parametrize("adam", [torch.optim.Adam, torch.optim.AdamW])
def test_adam_is_its_own_steps_then_the_averaged_momentum_with_the_frozen_variance(way, adam):
    lr, wd, warmup, steps = 0.01, 0.05, 2, 6
    if way == "hook":
        m = DDP(int_model())
        opt = adam(m.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=wd)
        state = gt.register(m, opt, "none", warmup_steps=warmup, dense_below=0,
                            algorithm="allgather")
    else:
        m = int_model()
        opt = gt.DistributedOptimizer(adam(m.parameters(), lr=lr, betas=(0.9, 0.99),
                                           weight_decay=wd),
                                      named_parameters=m.named_parameters(), codec="none",
                                      warmup_steps=warmup, dense_below=0, algorithm="allgather")
    inner = opt.optimizer if way == "optimizer" else opt
    frozen = None
    for s in range(steps):
        opt.zero_grad()
        int_backward(m, s)
        opt.step()
        if s == warmup - 1:
            frozen = [inner.state[p]["exp_avg_sq"].clone() for p in m.parameters()]
        if s >= warmup:  # the averaged momentum came back as the gradient, and is exp_avg
            for p in m.parameters():
                assert torch.equal(inner.state[p]["exp_avg"], p.grad)
    for p, v in zip(m.parameters(), frozen):
        assert torch.equal(inner.state[p]["exp_avg_sq"], v)  # frozen since the warm-up
        assert int(inner.state[p]["step"]) == steps
    want = adam_reference(adam is torch.optim.AdamW, warmup, steps, lr, wd)
    # The same state in float32, its means summed in another order: some 20 roundings of 2^-24
    # relative in each step's move (at most lr (1 - beta1) / sqrt(1 - beta2)), 1e-5 of it with a
    # margin of 8, and each step's rounding of p.
    bound = lr * 0.1 / math.sqrt(0.01)
    for p, w in zip(m.parameters(), want):
        ulp = torch.finfo(torch.float32).eps * w.abs()
        assert torch.all((p.detach().double() - w).abs() <= steps * (1e-5 * bound + ulp))
    same_on_every_rank(list(m.parameters()))


def check_resume(make, step_fn, n, k, path, load_state):
    """N + K steps against N, torch.save of every rank's model, optimizer and (load_state) gcomp
    state, new objects from make(), torch.load, K: the same parameters, bit for bit."""
    def run(m, opt, steps, first=0):
        for s in range(first, first + steps):
            opt.zero_grad()
            step_fn(m, s)
            opt.step()

    m, opt, _ = make()
    run(m, opt, n + k)
    straight = [p.detach().clone() for p in m.parameters()]
    m, opt, state = make()
    run(m, opt, n)
    torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(),
                "gcomp": state.state_dict()}, path)
    m, opt, state = make()
    saved = torch.load(path)
    m.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    if load_state:
        state.load_state_dict(saved["gcomp"])
    run(m, opt, k, first=n)
    for p, q in zip(m.parameters(), straight):
        assert torch.equal(p, q)


# 0/1 Adam's schedule for the tests: exact steps 1, 2, refreshes at 4 and 6 (3 and 5 compressed),
# local steps from 7 synchronized at 7, 8, 10, 12.
def zero_one():
    return gcomp.AdamSchedule.zero_one(6, kappa=2, max_local_steps=2, local_double_every=2)


def zero_one_reference(decoupled, steps, lr, wd):
    """0/1 Adam in double from float32 state, this rank's own: refreshes are exact steps on the
    mean gradient (v's bias correction by its refreshes, the step bounded after compressed ones),
    compressed steps take the mean of the ranks' momenta, local steps this rank's own, and a
    synchronization the mean of the ranks' ways from the anchor as momenta."""
    sc = zero_one()
    ref = int_model()
    b1, b2, eps = 0.9, 0.99, 1e-8
    bound = max(1.0, (1 - b1) / math.sqrt(1 - b2))
    mean = lambda x: sum(y.double() for y in gathered(x.float())) / size()  # noqa: E731
    params = [p.detach().double().clone() for p in ref.parameters()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    anchor, lr_sum, decay = None, 0.0, 1.0
    for t in range(1, steps + 1):
        for q in ref.parameters():
            q.grad = None
        with torch.no_grad():
            for q, p in zip(ref.parameters(), params):
                q.copy_(p.float())
        int_backward(ref, t - 1)
        tv = sc.variance_steps(t)
        local = sc.local(t)
        if local and t - 1 == sc.frozen_after():
            anchor, lr_sum, decay = [p.clone() for p in params], 0.0, 1.0
        if local:
            lr_sum += lr
            decay *= 1 - lr * wd if decoupled else 1.0
        for i, q in enumerate(ref.parameters()):
            g = q.grad.double()
            p = params[i]
            if decoupled:
                p *= 1 - lr * wd
            else:
                g = g + wd * p
            mine = b1 * m[i] + (1 - b1) * g
            m[i] = mine if local else mean(mine)
            if sc.refreshes(t):
                v[i] = b2 * v[i] + (1 - b2) * mean(g) ** 2
            vh = v[i] / (1 - b2 ** tv)
            q = m[i] / (1 - b1 ** t) / (vh.sqrt() + eps)
            if tv != t:
                q = q.clamp(-bound, bound).masked_fill(vh == 0, 0.0)
            p -= lr * q
        if local and sc.synchronizes(t):
            for i, p in enumerate(params):
                denom = (v[i] / (1 - b2 ** tv)).sqrt() + eps
                x = mean((decay * anchor[i] - p) * denom / lr_sum)
                q = (x / denom).clamp(-bound, bound).masked_fill(v[i] == 0, 0.0)
                anchor[i] = decay * anchor[i] - lr_sum * q
                p.copy_(anchor[i])
                m[i] = x * (1 - b1 ** t)
            lr_sum, decay = 0.0, 1.0
    return params


def zero_one_run(way, adam, codec, lr, wd, **options):
    if way == "hook":
        m = DDP(int_model())
        opt = adam(m.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=wd)
        state = gt.register(m, opt, codec, variance=zero_one(), **options)
    else:
        m = int_model()
        opt = state = gt.DistributedOptimizer(
            adam(m.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=wd),
            named_parameters=m.named_parameters(), codec=codec, variance=zero_one(), **options)
    return m, opt, state


@pytest.mark.parametrize("way", ["hook", "optimizer"])
@pytest.mark.parametrize("adam", [torch.optim.Adam, torch.optim.AdamW])
def test_zero_one_adam_refreshes_the_variance_and_steps_locally_as_its_reference(way, adam):
    lr, wd = 0.01, 0.05
    for steps in (5, 11):  # after a refresh that followed a compressed step; between two syncs
        m, opt, _ = zero_one_run(way, adam, "none", lr, wd, dense_below=0, algorithm="allgather")
        inner = opt.optimizer if way == "optimizer" else opt
        for s in range(steps):
            opt.zero_grad()
            int_backward(m, s)
            opt.step()
            synced = zero_one().synchronizes(s + 1)
            if s + 1 == 9:  # a local step: each rank's own parameters
                w = next(m.parameters()).detach()
                assert synced is False
                assert size() == 1 or not all(torch.equal(w, o) for o in gathered(w))
        for p in m.parameters():
            assert int(inner.state[p]["step"]) == steps
        want = zero_one_reference(adam is torch.optim.AdamW, steps, lr, wd)
        # As the 1-bit test's bound, twice: a synchronization's product and quotient by
        # sqrt(v^) + eps round the way from the anchor once more.
        bound = lr * 0.1 / math.sqrt(0.01)
        for p, w in zip(m.parameters(), want):
            ulp = torch.finfo(torch.float32).eps * w.abs()
            err = (p.detach().double() - w).abs()
            assert torch.all(err <= 2 * steps * (1e-5 * bound + ulp)), (steps, err.max())


@pytest.mark.parametrize("way", ["hook", "optimizer"])
def test_zero_one_adam_is_identical_on_every_rank_after_each_synchronization(way):
    m, opt, state = zero_one_run(way, torch.optim.AdamW, "sign", 2e-3, 0.01,
                                 algorithm="compressed_reduce_scatter", allow_uncompressed=False)
    for s in range(12):
        opt.zero_grad()
        int_backward(m, s)
        opt.step()
        if zero_one().synchronizes(s + 1):
            same_on_every_rank(list(m.parameters()))
    # Ahead of the schedule (step 13 of an interval that ends at 14): the same parameters, and
    # the next synchronization goes on from there.
    opt.zero_grad()
    int_backward(m, 12)
    opt.step()
    assert not zero_one().synchronizes(13)
    state.average_parameters()
    same_on_every_rank(list(m.parameters()))
    before = [p.detach().clone() for p in m.parameters()]
    state.average_parameters()  # the ranks agree: nothing moves
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    opt.zero_grad()
    int_backward(m, 13)
    opt.step()
    same_on_every_rank(list(m.parameters()))
    sd = state.state_dict()
    sd = sd["gcomp"] if way == "optimizer" else sd
    assert sd["adam"] == {"variance": "schedule", "schedule": zero_one().as_dict()}
    assert set(sd["adam_local"]["anchors"]) == {n for n, _ in m.named_parameters()}


@pytest.mark.parametrize("way", ["hook", "optimizer"])
def test_zero_one_adam_resumes_bit_for_bit_between_synchronizations(way, tmp_path):
    # 9 + 3 steps against 9 (a local step in an interval that ends at 10), save, new objects,
    # load, 3.
    def make():
        return zero_one_run(way, torch.optim.AdamW, "sign", 2e-3, 0.01,
                            algorithm="compressed_reduce_scatter", allow_uncompressed=False)

    check_resume(make, int_backward, 9, 3, tmp_path / f"zero_one.{rank()}.pt", way == "hook")


@pytest.mark.parametrize("way", ["hook", "optimizer"])
def test_one_bit_adam_keeps_every_rank_identical_with_both_residuals(way):
    if way == "hook":
        m = DDP(model())
        opt = torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.01)
        state = gt.register(m, opt, "sign", warmup_steps=2, algorithm="compressed_reduce_scatter",
                            allow_uncompressed=False)
    else:
        m = model()
        opt = state = gt.DistributedOptimizer(
            torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.01),
            named_parameters=m.named_parameters(), codec="sign", warmup_steps=2,
            algorithm="compressed_reduce_scatter", allow_uncompressed=False)
    train(m, opt, 6)
    same_on_every_rank(list(m.parameters()))
    st = state.stats()
    assert st["compressed"] > 0 and st["algorithm"].get("compressed_reduce_scatter", 0) > 0
    big = [p for p in m.parameters() if p.numel() >= 1024]
    assert big and all(np.any(state.residual(p) != 0) for p in big)  # each rank's residual


def test_adam_refuses_what_it_cannot_take():
    m = DDP(model())
    with pytest.raises(ValueError, match="amsgrad"):
        gt.register(m, torch.optim.Adam(m.parameters(), amsgrad=True), "sign", warmup_steps=5)
    with pytest.raises(ValueError, match="warmup_steps must be at least 1"):
        gt.register(m, torch.optim.AdamW(m.parameters()), "sign")
    with pytest.raises(ValueError, match="momentum=0.9 is SGD's"):
        gt.register(m, torch.optim.Adam(m.parameters()), "sign", warmup_steps=5, momentum=0.9)
    with pytest.raises(ValueError, match="variance must be"):
        gt.register(m, torch.optim.Adam(m.parameters()), "sign", warmup_steps=5, variance="x")
    with pytest.raises(ValueError, match="warmup_steps must be at least 1"):
        gt.DistributedOptimizer(torch.optim.Adam(m.parameters()), codec="sign")
    with pytest.raises(ValueError, match="say two things"):
        gt.register(m, torch.optim.Adam(m.parameters()), "sign", warmup_steps=5,
                    variance=gcomp.AdamSchedule.zero_one(100))
    # variance=None: the optimizer left as it is, its gradients compressed, said so.
    m = DDP(model())
    opt = torch.optim.Adam(m.parameters())
    with pytest.warns(UserWarning, match="Adam is left as it is"):
        state = gt.register(m, opt, "topk:ratio=0.01", variance=None)
    assert state._adam is None and "step" not in vars(opt)


@pytest.mark.parametrize("scheduler_first", [True, False])
def test_a_learning_rate_scheduler_keeps_counting_through_one_bit_adam(scheduler_first):
    m = DDP(model())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    make = lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)  # noqa: E731
    sched = make() if scheduler_first else None
    gt.register(m, opt, "sign", warmup_steps=2)
    sched = sched or make()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "optimizer.step() overridden" or order warning
        for s in range(6):
            opt.zero_grad()
            backward(m, s)
            opt.step()
            sched.step()
    assert opt._step_count == 6 and opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 8)


class Regrouped(torch.nn.Module):
    """Three layers registered in another order than the forward uses them, 1.7 MB: DDP's
    first layout is one bucket (its first bucket holds 1 MB, in reverse registration order),
    the one it rebuilds after the first step (the order the gradients came in) two."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.middle = torch.nn.Linear(640, 640)
        self.first = torch.nn.Linear(20, 640)
        self.last = torch.nn.Linear(640, 5)

    def forward(self, x):
        return self.last(torch.relu(self.middle(torch.relu(self.first(x)))))


@pytest.mark.parametrize("way, n", [("hook", 4), ("hook_buckets", 4), ("hook_layers", 4),
                                    ("optimizer", 4), ("hook", 1)])
def test_one_bit_adam_resumes_bit_for_bit_from_a_checkpoint(way, n, tmp_path):
    # N + M steps against N, torch.save of every rank's state, new objects, torch.load, M. The
    # new DDP model starts from DDP's first layout of its buckets: the hook's buckets sent whole
    # (one bucket; and two, which the resumed job's first step has as one), and per parameter on
    # the same two. N = 1: saved in the warm-up (2 exact steps), resumed across the freeze.
    def make():
        if way.startswith("hook"):
            layers = way == "hook_layers"
            m = DDP(model()) if way == "hook" else DDP(Regrouped(), bucket_cap_mb=0.25)
            opt = torch.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.01)
            state = gt.register(m, opt, "sign", warmup_steps=2, per_parameter=layers or None,
                                algorithm="compressed_reduce_scatter", allow_uncompressed=False)
            return m, opt, state
        m = model()
        opt = gt.DistributedOptimizer(torch.optim.AdamW(m.parameters(), lr=2e-3,
                                                        weight_decay=0.01),
                                      named_parameters=m.named_parameters(), codec="sign",
                                      warmup_steps=2, algorithm="compressed_reduce_scatter",
                                      allow_uncompressed=False)
        return m, opt, opt

    check_resume(make, backward, n, 3, tmp_path / f"ckpt.{rank()}.pt", way.startswith("hook"))


# ---- periodic model averaging (period=H from period_from=S): local steps, an average every H ----


def recorded(opt, params):
    """Wraps opt.step (before register or DistributedOptimizer wraps it) so that the parameters
    right after the optimizer's own step, before any average, are kept in a list (one entry a
    step)."""
    own, seen = opt.step, []

    def step(closure=None):
        loss = own(closure)
        seen.append([p.detach().clone() for p in params])
        return loss

    opt.step = step
    return seen


def average_bound(x_abs_mean, result, p):
    """How far p' = fl(a - fl(mean_r fl(a - p_r))) lies from mean_r p_r: the changes rounded
    once each (u S, S = mean_r |a - p_r|), their float32 mean (mean_bound of the rounded ones),
    the subtraction (u |p'| / (1 - u))."""
    return U * x_abs_mean + mean_bound(x_abs_mean * (1 + U), p) + U * result.abs() / (1 - U)


@pytest.mark.parametrize("way", ["hook", "optimizer"])
def test_periodic_averaging_steps_locally_then_averages_to_the_mean_on_every_rank(way):
    # period 3 from step 2: steps 0, 1 synchronized, 2..7 local, averages after 5 and 8 steps.
    # An average leaves every rank with the mean of the ranks' models (within average_bound of
    # the exact mean), the same bits on every rank; a local step leaves the ranks apart (each
    # its own batch); nothing is sent in the local steps.
    p = size()
    if way == "hook":
        m = DDP(model())
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        seen = recorded(opt, list(m.parameters()))
        state = gt.register(m, opt, "none", period=3, period_from=2)
    else:
        m = model()
        inner = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        seen = recorded(inner, list(m.parameters()))
        state = opt = gt.DistributedOptimizer(inner, named_parameters=m.named_parameters(),
                                              codec="none", period=3, period_from=2)
    anchor = [q.detach().clone() for q in m.parameters()]
    for s in range(8):
        opt.zero_grad()
        backward(m, s)
        opt.step()
        if s == 1:
            synchronized = state.stats()["calls"]  # the synchronized steps' collectives
        now = list(m.parameters())
        if s + 1 in (5, 8):
            for q, mine, a in zip(now, seen[-1], anchor):
                every = gathered(mine)
                exact = sum(t.double() for t in every) / p
                s_abs = sum((a.double() - t.double()).abs() for t in every) / p
                assert torch.all((q.double() - exact).abs()
                                 <= average_bound(s_abs, q.double(), p)), s
            same_on_every_rank(now)
            anchor = [q.detach().clone() for q in now]
        elif s >= 2 and p > 1:
            assert any(not torch.equal(t, now[0].detach()) for t in gathered(now[0].detach()))
        else:
            same_on_every_rank(now)
    st = state.stats()
    assert st["steps"] == 8 and st["local_steps"] == 6 and st["averages"] == 2
    # The local steps call nothing; an average is one collective.
    assert synchronized >= 2 and st["calls"] == synchronized + 2
    assert st["bytes_per_average"] == st["average_bytes_sent"] / 2
    assert 0 < st["average_bytes_sent"] < st["bytes_sent"] or p == 1


def test_periodic_options_are_checked():
    m = DDP(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for bad, words in [(dict(period=0), "period must"), (dict(period=2.5), "period must"),
                       (dict(period=2, period_from=-1), "period_from"),
                       (dict(period=2, outer_momentum=1.0), "outer_momentum"),
                       (dict(period=2, outer_lr=0.0), "outer_lr"),
                       (dict(period=2, momentum_at_average="mean"), "momentum_at_average"),
                       (dict(period=2, feedback_decay=-0.1), "feedback_decay"),
                       (dict(period=2, feedback_decay="0.9x"), "feedback_decay"),
                       (dict(feedback_decay=0.9), "without period"),
                       (dict(outer_lr=0.5), "without period")]:
        with pytest.raises(ValueError, match=words):
            gt.register(m, opt, "none", **bad)
    with pytest.raises(ValueError, match="needs the optimizer"):
        gt.register(m, None, "none", period=2)
    adam = torch.optim.Adam(m.parameters())
    with pytest.raises(ValueError, match="variance=None"):
        gt.register(m, adam, "sign", period=2, warmup_steps=1)
    with pytest.raises(ValueError, match="period must"):
        gt.DistributedOptimizer(opt, codec="none", period=-3)
    # A checkpoint of a periodic job goes to a periodic one with the same settings only.
    a = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=2)
    b = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=4)
    c = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none")
    with pytest.raises(ValueError, match="periodic averaging"):
        b.load_state_dict(a.state_dict())
    d = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=2, feedback_decay=0.9)
    with pytest.raises(ValueError, match="periodic averaging"):
        d.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="with periodic averaging"):
        c.load_state_dict(a.state_dict())


@pytest.mark.parametrize("codec", ["none", "topk:ratio=0.1"])
def test_the_optimizer_and_the_hook_average_periodically_alike(codec):
    # Both paths: the same synchronized steps (an element-wise or whole-model codec, summed in
    # rank order), the same local steps, the same averages: the same parameters, bit for bit.
    kw = dict(algorithm="allgather" if codec == "none" else "sparse_allgather", dense_below=0,
              seed=5, allow_uncompressed=False, period=2, period_from=1, per_parameter=False)
    a = DDP(model(), bucket_cap_mb=1)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    sa = gt.register(a, opt_a, codec, **kw)
    b = model()
    opt_b = gt.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=b.named_parameters(), codec=codec, **kw)
    train(a, opt_a, 5)  # step 0 synchronized, 1..4 local, averages after 3 and 5
    train(b, opt_b, 5)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    same_on_every_rank(list(b.parameters()))
    assert sa.stats()["averages"] == opt_b.stats()["averages"] == 2
    if codec != "none":  # error feedback of the changes: a residual where top-k left values
        assert any(np.any(sa._periodic.feedback[id(q)].residual != 0) for q in a.parameters())


@pytest.mark.parametrize("momentum_at_average", ["local", "reset", "average"])
def test_what_the_momentum_does_at_an_average(momentum_at_average):
    # SGD's momentum buffers (codec none: nothing moves into the hook) after an average: each
    # rank's own (local: apart), zeros (reset), or the mean of the ranks' (average: the same on
    # every rank, within mean_bound of the mean of the ranks' buffers before it).
    m = DDP(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    own = opt.step
    before = []

    def step(closure=None):
        loss = own(closure)
        before[:] = [opt.state[q]["momentum_buffer"].clone() for q in m.parameters()]
        return loss

    opt.step = step
    gt.register(m, opt, "none", period=2, period_from=1, momentum_at_average=momentum_at_average)
    train(m, opt, 3)  # step 0 synchronized, 1 and 2 local, the average after 3
    bufs = [opt.state[q]["momentum_buffer"] for q in m.parameters()]
    if momentum_at_average == "reset":
        assert all(not torch.any(b != 0) for b in bufs)
    elif momentum_at_average == "average":
        same_on_every_rank(bufs)
        for b, mine in zip(bufs, before):
            every = gathered(mine)
            exact = sum(t.double() for t in every) / size()
            s_abs = sum(t.double().abs() for t in every) / size()
            # The buffers' anchors start at 0: the mean of 0 - u_r, subtracted from 0 (exact).
            assert torch.all((b.double() - exact).abs() <= U * s_abs + mean_bound(
                s_abs * (1 + U), size())), momentum_at_average
    elif size() > 1:
        assert any(not torch.equal(t, bufs[0]) for t in gathered(bufs[0]))


def test_the_outer_nesterov_step_on_the_averaged_change():
    # DiLoCo's outer step: b = mu b + avg, d = avg + mu b, p = a - lr_o d, avg the mean of the
    # ranks' changes a - p_r (codec none). With parameters on a grid of 1/8, integer gradients,
    # lr 1/8 (SGD without momentum), lr_o = mu = 1/2 and P a power of two, every value is exact
    # in float32 and the parameters are the reference's bit for bit; for other P, the same bits
    # on every rank.
    p = size()
    m = int_model()
    with torch.no_grad():
        for q in m.parameters():
            q.copy_(torch.round(q * 8) / 8)
    m = DDP(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.125)
    seen = recorded(opt, list(m.parameters()))
    gt.register(m, opt, "none", period=2, period_from=0, outer_lr=0.5, outer_momentum=0.5)
    anchor = [q.detach().double().clone() for q in m.parameters()]
    b = [torch.zeros_like(a) for a in anchor]
    for s in range(6):
        opt.zero_grad()
        int_backward(m, s)
        opt.step()
        if (s + 1) % 2:
            continue
        for i, mine in enumerate(seen[-1]):
            avg = sum(anchor[i] - t.double() for t in gathered(mine)) / p
            b[i] = 0.5 * b[i] + avg
            anchor[i] = anchor[i] - 0.5 * (avg + 0.5 * b[i])
        same_on_every_rank(list(m.parameters()))
        if p & (p - 1) == 0:
            for q, a in zip(m.parameters(), anchor):
                assert torch.equal(q.detach().double(), a), s


@pytest.mark.parametrize("way", ["hook", "optimizer"])
@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_feedback_decay_fades_the_averages_residual_before_each_change(way, beta):
    # SparseLoCo's error feedback: at each average the codec sees v = x + beta e (x the change
    # since the anchor, e what the codec left of the earlier ones); with top-k (float32 values)
    # the new residual is 0 where v was sent and v elsewhere, bit for bit (beta = 1/2 scales
    # exactly). Every rank ends the average with the same parameters.
    kw = dict(algorithm="sparse_allgather", seed=3, allow_uncompressed=False, period=2,
              period_from=0, per_parameter=False, feedback_decay=beta)
    if way == "hook":
        m = DDP(model())
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        seen = recorded(opt, list(m.parameters()))
        periodic = gt.register(m, opt, "topk:ratio=0.1", **kw)._periodic
    else:
        m = model()
        inner = torch.optim.SGD(m.parameters(), lr=0.05)
        seen = recorded(inner, list(m.parameters()))
        opt = gt.DistributedOptimizer(inner, named_parameters=m.named_parameters(),
                                      codec="topk:ratio=0.1", **kw)
        periodic = opt._periodic
    params = list(m.parameters())
    for s in range(6):
        if s in (1, 3, 5):  # the step whose average follows: what the codec will see
            before = [periodic.feedback[id(q)].residual.copy() if id(q) in periodic.feedback
                      else np.zeros(q.numel(), np.float32) for q in params]
            anchors = [periodic.anchors[id(q)].clone() for q in params] if periodic.anchors \
                else [q.detach().reshape(-1).clone() for q in params]
        opt.zero_grad()
        backward(m, s)
        opt.step()
        if s not in (1, 3, 5):
            continue
        sent = 0
        for q, a, mine, e in zip(params, anchors, seen[-1], before):
            x = (a - mine.reshape(-1)).numpy()
            v = x + np.float32(beta) * e  # float32, as the codec forms it
            r = periodic.feedback[id(q)].residual
            assert np.all((r == 0) | (r == v)), (s, beta)
            sent += int(np.count_nonzero((r == 0) & (v != 0)))
        assert sent > 0
        same_on_every_rank(params)
    assert periodic.settings().get("feedback_decay", 1.0) == beta
    with pytest.raises(ValueError, match="feedback_decay"):
        gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=2, feedback_decay=1.5)


def periodic_job(codec, **options):
    """make() for check_resume: DDP's MLP, momentum SGD, register(codec, options) with the
    algorithm pinned (what auto learned is not in a checkpoint, and another choice would sum in
    another order)."""
    pinned = "sparse_allgather" if codec.startswith("topk") else "allgather"

    def make():
        m = DDP(model())
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        state = gt.register(m, opt, codec, allow_uncompressed=False, algorithm=pinned, **options)
        return m, opt, state

    return make


@pytest.mark.parametrize("codec, extra", [("topk:ratio=0.1", {}),
                                          ("none", dict(momentum_at_average="average",
                                                        outer_lr=0.7, outer_momentum=0.5)),
                                          ("topk:ratio=0.05,chunk=64,bits=2",
                                           dict(feedback_decay=0.9, outer_lr=1.0,
                                                outer_momentum=0.5))])
def test_periodic_averaging_resumes_bit_for_bit(codec, extra, tmp_path):
    # Saved in a period (after 5 steps: 2 synchronized, 3 local, an average after 4), resumed
    # across the next average (after 6) and into the next period: the anchors, the changes' and
    # the gradients' residuals, the velocities, the momenta's anchors and the outer momentum all
    # come back. The algorithm pinned: what auto learned is not in a checkpoint, and another
    # choice would sum in another order (docs/python.md, "Checkpoints").
    check_resume(periodic_job(codec, period=2, period_from=2, **extra), backward, 5, 4,
                 tmp_path / f"ckpt.{rank()}.pt", True)


def test_periodic_averaging_under_join_with_uneven_inputs():
    # DDP's join(): the ranks that run out of data shadow the others' steps and take part in
    # their averages, so every rank ends with the same parameters and the same count of
    # averages. Rank r takes 3 + 2 r steps; period 2 from step 1.
    m = DDP(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    state = gt.register(m, opt, "topk:ratio=0.1", period=2, period_from=1)
    with m.join():
        for s in range(uneven_steps(rank())):
            opt.zero_grad()
            backward(m, s)
            opt.step()
    longest = uneven_steps(size() - 1)
    assert state.step == longest
    assert state.stats()["averages"] == (longest - 1) // 2
    same_on_every_rank(list(m.parameters()))


# ---- streaming averages (fragments=F, overlap_steps=T) ----


def test_fragments_cut_the_parameters_in_order_at_rows_into_about_equal_parts():
    # Every element in exactly one piece, the pieces in registration order, each cut at a row's
    # edge, each fragment within a row (of the parameter cut there) of total / F on either side.
    from gcomp.torch._periodic import _fragments
    named = list(model().named_parameters())
    total = sum(p.numel() for _, p in named)
    for count in (1, 2, 3, 4, 7):
        frags = _fragments(named, count, "test")
        assert len(frags) == count
        flat = [pc for f in frags for pc in f]
        covered = [(pc.name, pc.lo, pc.hi) for pc in flat]
        expect = []
        for name, p in named:  # consecutive, whole rows, nothing missed or twice
            row = p.numel() // p.shape[0]
            mine = [(lo, hi) for n, lo, hi in covered if n == name]
            assert mine[0][0] == 0 and mine[-1][1] == p.numel(), (count, name)
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
            assert all(lo % row == 0 and hi % row == 0 for lo, hi in mine)
            expect += [(name, lo, hi) for lo, hi in mine]
        assert covered == expect
        widest_row = max(p.numel() // p.shape[0] for _, p in named)
        for f in frags:
            size_f = sum(pc.hi - pc.lo for pc in f)
            assert abs(size_f - total / count) <= widest_row, (count, size_f, total)
        if count == 1:
            assert all(pc.key == pc.name and pc.slot == id(pc.param) for pc in flat)
    with pytest.raises(ValueError, match="empty"):
        _fragments([("w", torch.nn.Parameter(torch.zeros(2, 3)))], 3, "test")


def test_pacing_cuts_each_fragment_into_parts_at_the_fragments_own_edges():
    # Pacing's cut (overlap_steps = T >= 2): the fragments cover what _fragments' do, piece for
    # piece in the same elements; each fragment's pieces numbered 0, 1, ... in order, every
    # part of about equal elements (within a row of total / (F T)).
    from gcomp.torch._periodic import _fragments, _paced
    named = list(model().named_parameters())
    total = sum(p.numel() for _, p in named)
    widest_row = max(p.numel() // p.shape[0] for _, p in named)
    for count, parts in ((1, 2), (2, 3), (4, 3), (3, 5)):
        plain = _fragments(named, count, "test")
        paced, part_of = _paced(named, count, parts, "test")
        assert len(paced) == count
        for f, (a, b) in enumerate(zip(plain, paced)):
            span = [(pc.name, pc.lo, pc.hi) for pc in a]
            cut = [(pc.name, pc.lo, pc.hi) for pc in b]
            merged = []  # b's pieces joined where one parameter's continue
            for name, lo, hi in cut:
                if merged and merged[-1][0] == name and merged[-1][2] == lo:
                    merged[-1] = (name, merged[-1][1], hi)
                else:
                    merged.append((name, lo, hi))
            assert merged == span, (count, parts, f)
            numbers = [part_of[pc.slot] for pc in b]
            assert numbers == sorted(numbers) and numbers[0] == 0
            assert set(numbers) == set(range(numbers[-1] + 1))
            assert numbers[-1] + 1 <= parts
            for j in set(numbers):
                size_j = sum(pc.hi - pc.lo for pc, n in zip(b, numbers) if n == j)
                assert abs(size_j - total / (count * parts)) <= widest_row, (count, parts, j)
        assert max(part_of.values()) + 1 == parts  # the model has rows enough here
    with pytest.raises(ValueError, match="empty"):
        _paced([("w", torch.nn.Parameter(torch.zeros(2, 3)))], 3, 2, "test")


def test_pacing_in_time_spreads_the_parts_over_the_overlapped_step():
    # overlap_steps=1, pacing=3: every part of an average handed on at its start, part j to
    # leave D / 3 seconds after part j - 1 is done (D: the mean of the last steps' lengths; each
    # step here sleeps 30 ms first, so D >= 30 ms): each part done at least 10 ms after the one
    # before it, in order.
    handed = []  # (part, not_before, [when its job was done])
    real = pipeline.Bucket.submit

    def submit(self, collective, *args, not_before=None, **kwargs):
        fut = real(self, collective, *args, not_before=not_before, **kwargs)
        if self.plain:
            done = []
            handed.append((collective.kwargs["index"] // 1000, not_before, done))
            fut.then(lambda _: done.append(time.perf_counter()))
        return fut

    pipeline.Bucket.submit = submit
    try:
        m = model()
        opt = gt.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                      named_parameters=m.named_parameters(),
                                      codec="topk:ratio=0.1", period=4, fragments=2,
                                      overlap_steps=1, pacing=3)
        for s in range(10):
            time.sleep(0.03)
            opt.zero_grad()
            backward(m, s)
            opt.step()
        opt.average_parameters()
    finally:
        pipeline.Bucket.submit = real
    timed = opt._periodic
    assert timed.timed and timed.parts == 3 and min(timed.lengths) >= 0.03
    flights = []
    for part, not_before, done in handed:
        if part == 0:
            flights.append([])
        flights[-1].append((part, not_before, done))
    paced = [f for f in flights if len(f) > 1]
    assert len(paced) >= 4  # after steps 2, 4, 6, 8 (the last whole average: one part)
    for flight in paced:
        assert [p for p, _, _ in flight] == list(range(len(flight)))
        assert flight[0][1] is None and all(callable(nb) for _, nb, _ in flight[1:])
        for (_, _, da), (_, _, db) in zip(flight, flight[1:]):
            assert db[0] - da[0] >= 0.01
    same_on_every_rank(list(m.parameters()))


def test_streaming_options_are_checked():
    m = DDP(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for bad, words in [(dict(period=4, fragments=0), "fragments must"),
                       (dict(period=4, fragments=1.5), "fragments must"),
                       (dict(period=4, fragments=5), "more than period"),
                       (dict(period=4, overlap_steps=-1), "overlap_steps must"),
                       (dict(period=4, overlap_steps=4), "less than period"),
                       (dict(period=4, overlap_steps=True), "overlap_steps must"),
                       (dict(fragments=2), "without period"),
                       (dict(overlap_steps=1), "without period"),
                       (dict(period=4, pacing=2), "needs overlap_steps"),
                       (dict(period=4, overlap_steps=2, pacing=3), "one a step"),
                       (dict(period=4, overlap_steps=1, pacing=0), "pacing must"),
                       (dict(overlap_steps=1, pacing=2), "without period"),
                       (dict(period=4, overlap_steps=1, merge="before"), "merge must"),
                       (dict(period=4, merge="before_update"), "needs overlap_steps"),
                       (dict(overlap_steps=1, merge="before_update"),
                        "without period")]:
        with pytest.raises(ValueError, match=words):
            gt.register(m, opt, "none", **bad)
    with pytest.raises(ValueError, match="less than period"):
        gt.DistributedOptimizer(opt, codec="none", period=2, overlap_steps=2)
    # A checkpoint of another streaming schedule is refused.
    a = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=4, fragments=2)
    b = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=4, fragments=2, overlap_steps=1)
    with pytest.raises(ValueError, match="periodic averaging"):
        b.load_state_dict(a.state_dict())
    c = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=4, fragments=2, overlap_steps=1, pacing=2)
    with pytest.raises(ValueError, match="periodic averaging"):
        c.load_state_dict(b.state_dict())
    d = gt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), codec="none",
                                period=4, fragments=2, overlap_steps=1, merge="before_update")
    with pytest.raises(ValueError, match="periodic averaging"):
        d.load_state_dict(b.state_dict())


@pytest.mark.parametrize("way", ["hook", "optimizer"])
def test_a_merge_before_the_update_leaves_the_ranks_apart_and_average_parameters_joins_them(way):
    # The whole model (one fragment), period 2 from step 1, overlap 1, merged before the update:
    # averages start after steps 3, 5, ... and are merged inside steps 4, 6, ... before their
    # updates, so after step 4 each rank holds the merged values moved by its own update (the
    # ranks apart, as after any local step), and average_parameters() must still average
    # rather than take the merge for an agreement.
    m = model()
    m, opt, state = wrapped(way, m, torch.optim.SGD(m.parameters(), lr=0.05), period=2,
                            period_from=1, overlap_steps=1, merge="before_update")
    train(m, opt, 4)
    st = state.stats()
    assert st["averages"] == 1 and st["averages_in_flight"] == 0
    if size() > 1:
        flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        assert not all(torch.equal(flat, other) for other in gathered(flat)), "no update after"
    state.average_parameters()
    same_on_every_rank(list(m.parameters()))
    assert state.stats()["averages"] == 2


@pytest.mark.parametrize("codec", ["none", "topk:ratio=0.1"])
def test_streaming_defaults_are_the_periodic_average_bit_for_bit(codec):
    # fragments=1, overlap_steps=0 given against not given, through an average_parameters()
    # between two of the schedule's averages: the same parameters, bit for bit, one collective
    # an average, the same bytes.
    kw = dict(algorithm="allgather" if codec == "none" else "sparse_allgather", seed=5,
              allow_uncompressed=False, period=3, period_from=2)
    runs = []
    for extra in ({}, dict(fragments=1, overlap_steps=0)):
        m = DDP(model())
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        state = gt.register(m, opt, codec, **kw, **extra)
        train(m, opt, 7)
        state.average_parameters()
        train(m, opt, 4, first=7)
        runs.append(([p.detach().clone() for p in m.parameters()], state.stats()))
    (pa, sa), (pb, sb) = runs
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    for key in ("calls", "averages", "average_bytes_sent", "local_steps"):
        assert sa[key] == sb[key], key
    assert sa["averages"] == 4  # after 5 and 8 steps, average_parameters() after 7, after 11


def streaming_setup(way, **kw):
    """SGD (no momentum, lr 1/8) on the int model with parameters on a grid of 1/8, period 4
    from step 1 (codec none, summed in rank order), streaming options kw: (model, optimizer,
    state, the parameters after each of the optimizer's own steps, before any average)."""
    m = int_model()
    with torch.no_grad():
        for q in m.parameters():
            q.copy_(torch.round(q * 8) / 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.125)
    seen = recorded(opt, list(m.parameters()))
    m, opt, state = wrapped(way, m, opt, period=4, period_from=1, **kw)
    return m, opt, state, seen


def wrapped(way, m, opt, **kw):
    """m and opt under gcomp with codec none on the allgather: way "hook" (DDP and register) or
    "optimizer" (DistributedOptimizer, which is then the optimizer too): (model, optimizer,
    state)."""
    kw = dict(algorithm="allgather", **kw)
    if way == "hook":
        m = DDP(m)
        return m, opt, gt.register(m, opt, "none", **kw)
    opt = gt.DistributedOptimizer(opt, named_parameters=m.named_parameters(), codec="none", **kw)
    return m, opt, opt


@pytest.mark.parametrize("way", ["hook", "optimizer"])
@pytest.mark.parametrize("fragments, overlap, pacing, rule",
                         [(2, 0, None, "after_step"), (4, 0, None, "after_step"),
                          (2, 1, None, "after_step"), (4, 2, None, "after_step"),
                          (2, 2, None, "after_step"), (2, 1, 2, "after_step"),
                          (2, 1, None, "before_update"), (4, 2, None, "before_update"),
                          (2, 1, 2, "before_update")])
def test_streaming_averages_each_fragment_at_its_offset_and_merges_it_overlap_steps_later(
        way, fragments, overlap, pacing, rule):
    # The reference, in double from every rank's values after each of its optimizer's steps:
    # fragment f starts after the local steps k = f H // F, + H, ... with x_r = a - v_r + c_r;
    # T steps later its pieces become a - mean_r x_r (outer_lr 1) on every rank, the anchor
    # with them, and c_r = v_r(start) - v_r(merge) (none without overlap: merged at once); the
    # rest of the model keeps each rank's own values, bit for bit. With parameters on a grid
    # of 1/8, integer gradients (independent of the parameters) and lr 1/8 every value is exact
    # in float32 for P a power of two: the reference bit for bit. For other P, within one
    # average's roundings of it: x_r = fl(fl(a - v_r) + c_r) (2u M, M the largest of |a - v_r|,
    # |c_r|, |x_r|), their float32 mean (mean_bound of M), the subtraction (u |result|, twice
    # for the slack of 1 / (1 - u)); the reference's anchors are set to the merged values
    # (the same on every rank), so no error carries over to the next average.
    # merge="before_update": the average due at step s + T is merged on the values before that
    # step's update (the carry v_r(start) - v_r(s + T - 1): none at T = 1), and the update, -lr
    # times the rank's gradient, lands on the merged values (one more rounding, u |result|, off
    # the exact case); the merged values themselves are the state's anchors, the same on every
    # rank.
    p, H, S, steps = size(), 4, 1, 15
    before = rule == "before_update"
    kw = dict(merge=rule) if before else {}
    m, opt, state, seen = streaming_setup(way, fragments=fragments, overlap_steps=overlap,
                                          pacing=pacing, **kw)
    periodic = state._periodic
    pieces = [(f, pc) for f, frag in enumerate(periodic.pieces) for pc in frag]
    params = list(m.parameters())
    slot = {id(q): j for j, q in enumerate(params)}
    exact = p & (p - 1) == 0
    anchor, carry, flights, starts, merges, most_parts = None, {}, [], 0, 0, 1
    flight_m = {}  # piece index -> M of its average in flight, element-wise (the bound's)

    def merge(flight, vals, keep_carry):
        _, chosen, xbar, begun = flight
        for i, x, v0 in zip(chosen, xbar, begun):
            pc = pieces[i][1]
            j = slot[id(pc.param)]
            anchor[j][pc.lo:pc.hi] -= x
            if keep_carry:
                carry[i] = v0 - vals[j][:, pc.lo:pc.hi]
            vals[j][:, pc.lo:pc.hi] = anchor[j][pc.lo:pc.hi]
            bound[j][pc.lo:pc.hi] = (3 * U * flight_m[i] + mean_bound(flight_m[i], p)
                                     + 2 * U * anchor[j][pc.lo:pc.hi].abs())
            merged[j][pc.lo:pc.hi] = True

    prev = None  # every rank's values after the last step and its averages (P x n each)
    for s in range(steps):
        opt.zero_grad()
        int_backward(m, s)
        grads = [torch.stack(gathered(q.grad.reshape(-1))).double() for q in params]
        opt.step()
        taken = s + 1
        vals = [torch.stack(gathered(v.reshape(-1))).double() for v in seen[-1]]  # P x n
        bound = [torch.zeros(v.shape[1], dtype=torch.float64) for v in vals]
        merged = [torch.zeros(v.shape[1], dtype=torch.bool) for v in vals]
        if taken <= S:  # synchronized: the same model on every rank, the anchor of the first
            anchor = [v[0].clone() for v in vals]
            same_on_every_rank(params)
            prev = vals
            continue
        for flight in [f for f in flights if f[0] == taken]:
            flights.remove(flight)
            if before:  # on the values before the update, then the update on the merged ones
                merge(flight, prev, True)
                for i in flight[1]:
                    pc = pieces[i][1]
                    j = slot[id(pc.param)]
                    new = prev[j][:, pc.lo:pc.hi] - 0.125 * grads[j][:, pc.lo:pc.hi]
                    vals[j][:, pc.lo:pc.hi] = new
                    bound[j][pc.lo:pc.hi] += U * new.abs().amax(0)
            else:
                merge(flight, vals, True)
            merges += 1
        k = taken - S
        due = [f for f in range(fragments) if k > 0 and (k - (f * H) // fragments) % H == 0]
        if due:
            chosen = [i for i, (f, _) in enumerate(pieces) if f in due]
            xbar, begun = [], []
            for i in chosen:
                pc = pieces[i][1]
                j = slot[id(pc.param)]
                v = vals[j][:, pc.lo:pc.hi]
                c = carry.pop(i, torch.zeros_like(v))
                x = anchor[j][pc.lo:pc.hi] - v + c
                flight_m[i] = torch.stack([(anchor[j][pc.lo:pc.hi] - v).abs(), c.abs(),
                                           x.abs()]).amax(dim=(0, 1))
                xbar.append(x.mean(0))
                begun.append(v.clone())
            starts += 1
            flights.append((taken + overlap, chosen, xbar, begun))
            if overlap == 0:
                merge(flights.pop(), vals, False)
                merges += 1
        now = [torch.stack(gathered(q.detach().reshape(-1))).double() for q in params]
        for j, (got, want) in enumerate(zip(now, vals)):
            assert torch.equal(got[:, ~merged[j]], want[:, ~merged[j]]), (taken, j)
            if exact:
                assert torch.equal(got, want), (taken, j)
            else:
                assert torch.all((got - want).abs() <= bound[j]), (taken, j)
            if before:  # the merged values: the anchors, the same on every rank
                a = torch.stack(gathered(periodic.anchors[id(params[j])])).double()
                assert torch.equal(a[:, merged[j]], a[:1, merged[j]].expand(p, -1)), (taken, j)
                merged_values = a[0]
            else:  # the merged values are the parameters, the same on every rank
                assert torch.equal(got[:, merged[j]], got[:1, merged[j]].expand(p, -1)), (
                    taken, j)
                merged_values = got[0]
            anchor[j][merged[j]] = merged_values[merged[j]]  # the reference's, where merged
        prev = now
        for flight in periodic.inflight:  # paced (T >= 2): part j handed on after step s + j
            assert 1 <= len(flight.parts) <= max(1, overlap, pacing or 1)
            if pacing and overlap == 1:  # in time: every part handed on at the start
                assert flight.sent == len(flight.parts), taken
            else:
                assert flight.sent == min(len(flight.parts), taken - flight.taken + 1), taken
            most_parts = max(most_parts, len(flight.parts))
    # Paced where the rows allow: at F = 2 each fragment's rows cut into two parts, at F = 4
    # the last fragment's (a row of the weight and the bias).
    assert most_parts == (2 if overlap >= 2 or (pacing or 1) > 1 else 1)
    st = state.stats()
    assert starts > fragments and merges == st["averages"]
    assert st["averages_in_flight"] == len(flights) == len(periodic.inflight)


@pytest.mark.parametrize("codec, extra", [
    ("topk:ratio=0.1", dict(fragments=3, overlap_steps=2)),
    ("none", dict(fragments=2, overlap_steps=1, momentum_at_average="average", outer_lr=0.7,
                  outer_momentum=0.5)),
    ("topk:ratio=0.05,chunk=64,bits=2", dict(fragments=4, overlap_steps=3, feedback_decay=0.9)),
    ("topk:ratio=0.1", dict(fragments=2, overlap_steps=1, pacing=2)),
    ("topk:ratio=0.1", dict(fragments=3, overlap_steps=2, merge="before_update"))])
def test_streaming_resumes_bit_for_bit_with_averages_in_flight(codec, extra, tmp_path):
    # Period 4 from step 2, saved after 4 steps with averages started and not merged (waited
    # for and saved with the values at their start), resumed across their merges and the next
    # starts: the same parameters as the run that went straight on, bit for bit.
    path = tmp_path / f"ckpt.{rank()}.pt"
    check_resume(periodic_job(codec, period=4, period_from=2, **extra), backward, 4, 6, path,
                 True)
    saved = torch.load(path)["gcomp"]["periodic"]
    assert saved["inflight"] and all(f["merge_at"] > 4 for f in saved["inflight"])
    assert saved["settings"]["fragments"] == extra["fragments"]
    t = extra["overlap_steps"]
    if t >= 2:  # paced: an average saved with parts not yet sent (sent by the resumed job)
        assert saved["settings"]["parts"] == t
        assert any(f["sent"] < t for f in saved["inflight"])


def test_average_parameters_merges_the_averages_in_flight_and_join_takes_part():
    # Under DDP's join with uneven inputs (rank r takes 3 + 2 r steps) the ranks that ran out
    # take part in the others' starts and merges; average_parameters() then merges what is in
    # flight and averages the whole model: every rank the same, nothing in flight.
    m = DDP(model())
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    state = gt.register(m, opt, "topk:ratio=0.1", period=4, period_from=1, fragments=2,
                        overlap_steps=2)
    with m.join():
        for s in range(uneven_steps(rank())):
            opt.zero_grad()
            backward(m, s)
            opt.step()
    longest = uneven_steps(size() - 1)
    assert state.step == longest
    before = state.stats()
    state.average_parameters()
    same_on_every_rank(list(m.parameters()))
    st = state.stats()
    assert st["averages_in_flight"] == 0
    assert st["averages"] == before["averages"] + before["averages_in_flight"] + 1
