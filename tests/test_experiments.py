"""course_utils.harness.experiments: "ddp" (from scratch) and "torch-ddp" give the losses of
"single", hold identical parameters on every rank, and send exactly the ring volume.

Tolerance for losses: 1e-6 relative. Not bitwise, because the sum that forms a gradient
is done in a different order: each rank sums over its own rows, then the all-reduce
sums the ranks (and "single"'s matmuls block differently with another thread count);
fp32 rounding differs at ~1e-7 relative, measured up to 2e-7 here. Parameters are compared
bitwise *across ranks*: every rank gets the same all-reduced gradient and does the same
AdamW step, so they must stay bit-identical.
"""
import pickle
from fractions import Fraction

import pytest
import torch
from torch import nn

from course_utils.theory.comm import comm_volume
from course_utils.runtime.ledger import CommLedger
from course_utils.harness.experiments import (GLOBAL_BATCH, RunResult, full_parameters, global_loss, make_adamw, run,
                                             state_bytes, train, wrap)
from course_utils.harness.strategies import STRATEGIES, register_strategy, strategies
from course_utils.impl.common import DEFAULT_BUCKET_BYTES
from course_utils.impl.ddp import DataParallel, unwrap
from course_utils.runtime.launch import launch
from course_utils.harness.model import SyntheticData, build_model, num_params
from toys import DIM, TOY_TRAINABLE, Toy, toy_batch, toy_optimizer

pytestmark = pytest.mark.usefixtures("no_leftover_children")

REL = 1e-6          # loss tolerance vs "single", relative (see the module docstring)
STEPS = 3


def _expected_all_reduce(num_params_, world_size, steps):
    """comm_volume(...) x steps, and the exact value as a fraction."""
    float_value = comm_volume(num_params_, world_size=world_size, stage=0, bytes_per_elem=4)["all_reduce"] * steps
    return float_value, Fraction(2 * (world_size - 1) * 4 * num_params_ * steps, world_size)


def _assert_bytes(measured, num_params_, world_size, steps):
    approx_value, exact = _expected_all_reduce(num_params_, world_size, steps)
    if exact.denominator == 1:
        assert measured == approx_value == exact            # an int, exactly
    else:   # N=3: (N-1)/N is not a binary fraction; the ledger sums exactly, then rounds once
        assert measured == float(exact) and measured == pytest.approx(approx_value, rel=1e-15)


# ------------------------------------------------------------------------ the course model

@pytest.fixture(scope="module")
def single():
    return run("single", 1, steps=STEPS)[0]


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("strategy", ["ddp", "torch-ddp"])
def test_course_model_matches_single(strategy, world_size, single):
    out = run(strategy, world_size, steps=STEPS, quiet=True)
    psi = num_params(build_model())
    assert len(out) == world_size and [r.rank for r in out] == list(range(world_size))
    for r in out:
        assert r.losses == out[0].losses                    # the global loss, same on every rank
        assert r.losses == pytest.approx(single.losses, rel=REL)
        assert r.param_digest == out[0].param_digest       # bit-identical parameters
        _assert_bytes(r.comm_bytes["all_reduce"], psi, world_size, STEPS)
        assert r.comm_bytes["reduce_scatter"] == r.comm_bytes["all_gather"] == 0
        # the course model (517 KB of gradients) fits one 25 MiB bucket; torch DDP also
        # uses one bucket in its first iteration
        assert r.comm_calls["all_reduce"] == STEPS
        assert r.state_bytes == single.state_bytes == {
            "params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi + 4 * 68}  # + 68 step counters
        assert r["losses"] is r.losses and r.step_time_s > 0        # a clock reading, no bound
    assert out[0].param_digest != single.param_digest      # close, not bitwise: see docstring
    assert single.comm_bytes == {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}


# Bytes each rank held after one step, as each strategy's own counter found them before
# experiments.state_bytes replaced them all (2 gloo ranks; "torch-hsdp": 4, a 2 x 2 mesh).
_FP32, _SHARDED = (517400, 517400, 1035072), (258700, 258700, 517672)
_FSDP = [(258800, 258800, 517872), (258800, 258800, 517472)]
STATE_BYTES = {
    ("single", ()): [_FP32], ("ddp", ()): [_FP32] * 2, ("torch-ddp", ()): [_FP32] * 2,
    ("zero1", ()): [(517400, 517400, 517404)] * 2, ("zero2", ()): [(517400, 258700, 517404)] * 2,
    ("zero1", ("mixed",)): [(258700, 258700, 776104)] * 2,
    ("zero2", ("mixed",)): [(258700, 129350, 776104)] * 2,
    ("zero3", ()): [_SHARDED] * 2,
    ("torch-zero1", ()): [(517400, 517400, 517772), (517400, 517400, 517300)],
    ("torch-fsdp", ()): _FSDP, ("torch-fsdp-zero2", ()): _FSDP, ("torch-hsdp", ()): _FSDP * 2,
}


@pytest.mark.parametrize("strategy, flags", list(STATE_BYTES))
def test_one_state_byte_counter_for_every_strategy(strategy, flags):
    want = STATE_BYTES[strategy, flags]
    out = run(strategy, len(want), steps=1, quiet=True, **{f: True for f in flags})
    assert [tuple(r.state_bytes.values()) for r in out] == want
    assert all(list(r.state_bytes) == ["params", "grads", "optimizer"] for r in out)


def test_the_loop_yields_after_step_before_zero_grad_and_resumes(single):
    model = build_model()
    optimizer, data = make_adamw(model.parameters()), SyntheticData(global_batch=GLOBAL_BATCH)
    losses, held = [], []
    for step, loss, seconds in train(model, optimizer, data, 2):
        losses.append(loss)
        held.append(state_bytes(model, optimizer)["grads"])     # the step's gradients, still there
        assert seconds > 0 and isinstance(loss, float)
    assert all(p.grad is None for p in model.parameters())       # zero_grad ran after the last
    losses += [loss for _, loss, _ in train(model, optimizer, data, range(2, STEPS))]
    assert losses == single.losses and held == [4 * num_params(model)] * 2


def test_tiny_buckets_issue_more_calls_for_the_same_bytes():
    n_tensors = len(list(build_model().parameters()))
    default = run("ddp", 2, steps=2, quiet=True)[0]
    per_param = run("ddp", 2, steps=2, quiet=True, bucket_bytes=0)[0]
    small = run("ddp", 2, steps=2, quiet=True, bucket_bytes=64 * 1024)[0]
    late = run("ddp", 2, steps=2, quiet=True, bucket_bytes=0, overlap=False)[0]
    torch_small = run("torch-ddp", 2, steps=2, quiet=True, bucket_bytes=64 * 1024)[0]
    assert default.comm_calls["all_reduce"] == 2
    assert per_param.comm_calls["all_reduce"] == late.comm_calls["all_reduce"] == 2 * n_tensors
    assert 2 < small.comm_calls["all_reduce"] < 2 * n_tensors
    # torch DDP: one bucket in iteration 1, then buckets of the requested size
    assert torch_small.comm_calls["all_reduce"] == 1 + small.comm_calls["all_reduce"] // 2
    for r in (per_param, small, late, torch_small):
        assert r.comm_bytes == default.comm_bytes
        assert r.losses == default.losses                   # 2 ranks: a + b, same in any bucket


# --------------------------------------------------------- a toy with frozen and tied weights

TOY_STEPS = 4


def _toy(seed):
    torch.manual_seed(seed)
    model = Toy()
    with torch.no_grad():
        model.shift.normal_()
    return model


def _toy_train(strategy, rank=0, world_size=1):
    model = _toy(seed=rank)                 # ranks start different: wrap must broadcast rank 0's
    model, opt = wrap(strategy, model, toy_optimizer)
    snapshots = [full_parameters(model)]
    buffers = dict(unwrap(model).named_buffers())
    b = GLOBAL_BATCH // world_size
    losses = []
    with CommLedger() as ledger:
        for step in range(TOY_STEPS):
            x, y = (t[rank * b:(rank + 1) * b] for t in toy_batch(step))
            loss = model(x, y, use_extra=True)
            loss.backward()
            opt.step()
            opt.zero_grad()
            with ledger.pause():
                losses.append(global_loss(loss))
            snapshots.append(full_parameters(model))
    tied = unwrap(model).head.weight is unwrap(model).emb.weight
    return losses, snapshots, buffers, ledger.totals(), ledger.counts(), tied


@pytest.fixture(scope="module")
def toy_single():
    return _toy_train("single")


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("strategy", ["ddp", "torch-ddp"])
def test_toy_with_frozen_and_tied_weights(strategy, world_size, toy_single):
    ref_losses, ref_snaps, ref_buffers, *_ = toy_single
    out = launch(_toy_train, world_size, strategy, quiet=True)
    for rank, (losses, snaps, buffers, totals, counts, tied) in enumerate(out):
        assert tied
        assert list(snaps[0]) == ["extra", "emb.weight", "hidden.weight", "hidden.bias",
                                  "frozen.weight", "frozen.bias"]  # head.weight is emb.weight
        for name in snaps[0]:                                      # rank 0's start everywhere
            assert torch.equal(snaps[0][name], ref_snaps[0][name])
        assert torch.equal(buffers["shift"], ref_buffers["shift"])
        for step in range(TOY_STEPS + 1):                          # bit-identical across ranks
            for name, t in out[0][1][step].items():
                assert torch.equal(snaps[step][name], t), (step, name)
            assert torch.equal(snaps[step]["frozen.weight"], ref_snaps[0]["frozen.weight"])
        assert losses == pytest.approx(ref_losses, rel=REL)
        for name, t in snaps[-1].items():
            torch.testing.assert_close(t, ref_snaps[-1][name], rtol=1e-5, atol=1e-6)
        _assert_bytes(totals["all_reduce"], TOY_TRAINABLE, world_size, TOY_STEPS)
        assert counts["all_reduce"] == TOY_STEPS
        # torch DDP also broadcasts the buffers from rank 0 before every forward
        # (broadcast_buffers=True, for e.g. BatchNorm statistics); "ddp" only at wrap time
        if strategy == "torch-ddp":
            assert counts["broadcast"] == TOY_STEPS
            last_in_ring = rank == world_size - 1            # forwards nothing (see CommLedger)
            assert totals["broadcast"] == (0 if last_in_ring else DIM * 4 * TOY_STEPS)
        else:
            assert "broadcast" not in counts


# ----------------------------------------------------- accumulation, unused params, errors

def _accumulate_and_unused(rank, world_size):
    model, opt = wrap("ddp", _toy(0), lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert isinstance(opt, torch.optim.SGD)             # the real optimizer: DDP syncs in backward
    x, y = (t[rank * 6:(rank + 1) * 6] for t in toy_batch(0))
    # this rank's gradient on its whole shard, for comparison (no communication, no step)
    with model.no_sync():
        model(x, y).backward()
    whole = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
    model.zero_grad()
    # gradient accumulation: two micro-batches of 3 rows, the all-reduce at the end of the last backward
    with CommLedger() as ledger:
        with model.no_sync():
            (model(x[:3], y[:3]) / 2).backward()
        calls_in_no_sync = ledger.counts()["all_reduce"]
        (model(x[3:], y[3:]) / 2).backward()
        calls_after_backward = ledger.counts()["all_reduce"]
        averaged = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
        opt.step()
        calls_in_step = ledger.counts()["all_reduce"] - calls_after_backward
    opt.zero_grad()
    # "extra" used on rank 0 only: the bucket is still sent by every rank (zeros on rank 1)
    with model.no_sync():
        model(x, y, use_extra=(rank == 0)).backward()
    extra_local = None if model.module.extra.grad is None else model.module.extra.grad.clone()
    model.zero_grad()
    model(x, y, use_extra=(rank == 0)).backward()
    extra_after = model.module.extra.grad.clone()
    opt.step()
    opt.zero_grad()
    # two backwards without no_sync: the second adds its average to the first's, as torch DDP
    with model.no_sync():
        model(x, y).backward()
    local = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(x, y).backward()
    model(x, y).backward()
    twice = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
    opt.zero_grad()
    return ((calls_in_no_sync, calls_after_backward, calls_in_step), averaged, whole, extra_local,
            extra_after, full_parameters(model), twice, len(model.buckets), local)


def test_gradient_accumulation_unused_parameters_and_double_backward():
    out = launch(_accumulate_and_unused, 2, quiet=True)
    for r, (calls, averaged, whole, extra_local, extra_after, params, twice, buckets, _) in enumerate(out):
        assert calls == (0, buckets, 0)           # nothing in no_sync, all at backward's end, none in step
        for name in whole:                        # averaged over the ranks when backward returns
            mean = (out[0][2][name] + out[1][2][name]) / 2
            torch.testing.assert_close(averaged[name], mean, rtol=1e-5, atol=1e-7)
            twice_mean = out[0][8][name] + out[1][8][name]      # 2 x the mean over the 2 ranks
            torch.testing.assert_close(twice[name], twice_mean, rtol=1e-5, atol=1e-6)
        assert averaged["hidden.weight"].equal(out[0][1]["hidden.weight"])
        assert (extra_local is None) == (r == 1), (r, extra_local)
        assert torch.equal(extra_after, out[0][3] / 2)       # (g + 0) / 2 on both ranks
        for name, t in params.items():
            assert torch.equal(t, out[0][5][name])


# ------------------------------------------------------------------------------ validation

def test_validation_messages():
    with pytest.raises(ValueError, match="known strategies: single, ddp, torch-ddp"):
        run("zero9", 2)
    with pytest.raises(ValueError, match="world_size=1"):
        run("single", 2)
    with pytest.raises(ValueError, match=r"cannot be split evenly over 5 ranks.*\[1, 2, 3, 4, 6, 12\]"):
        run("ddp", 5)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        run("ddp", 2, steps=0)
    with pytest.raises(TypeError, match="strategy must be a str"):
        run(3, 2)
    with pytest.raises(TypeError, match="world_size must be an int"):
        run("ddp", 2.0)
    with pytest.raises(ValueError, match="bucket_bytes"):
        run("ddp", 2, bucket_bytes=-1)
    with pytest.raises(RuntimeError, match="launch"):
        wrap("ddp", nn.Linear(2, 2), make_adamw)           # no process group in this process
    with pytest.raises(TypeError, match="nn.Module"):
        wrap("single", "model", make_adamw)
    with pytest.raises(TypeError, match="make_optimizer"):
        wrap("single", nn.Linear(2, 2), None)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        wrap("single", frozen, make_adamw)
    with pytest.raises(ValueError, match="already registered"):
        register_strategy("ddp", lambda m, mk, **o: (m, mk(m.parameters())))
    with pytest.raises(TypeError, match="nn.Module"):
        full_parameters(42)


def test_single_wrap_registry_and_results_pickle(single):
    model = _toy(0)
    wrapped, opt = wrap("single", model, make_adamw)
    assert wrapped is model and isinstance(opt, torch.optim.AdamW)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters() if p.requires_grad}   # frozen left out
    assert {"single", "ddp", "torch-ddp", "zero1", "zero2", "zero3", "torch-zero1"} <= set(strategies())
    assert STRATEGIES["ddp"].notebook == "02_data_parallelism"
    assert DEFAULT_BUCKET_BYTES == 25 * 2**20
    copy = pickle.loads(pickle.dumps(single))
    assert isinstance(copy, RunResult) and copy == single and copy["comm_bytes"] == single.comm_bytes
    with pytest.raises(KeyError):
        single["nope"]
    assert "losses" in single and single.get("nope", 1) == 1
    assert issubclass(DataParallel, nn.Module)


def test_a_learners_ddp_class_is_unwrapped_by_its_object_mark():
    """``wrap("ddp", impl=...)`` marks the object it builds, not a registry of classes: running a
    learner's class again (a re-run cell defines a new one each time) leaves nothing behind."""
    from course_utils.harness import strategies as table
    from course_utils.impl import ddp

    class MyDDP(nn.Module):
        def __init__(self, module, bucket_bytes):
            super().__init__()
            self.module = module

    model = _toy(0)
    for _ in range(3):
        wrapped, _ = table.wrap_ddp(model, make_adamw, impl=MyDDP)
        assert unwrap(wrapped) is model and DataParallel.wraps_module
    plain = MyDDP(model, 0)                       # not built by wrap: a model like any other
    assert unwrap(plain) is plain
    assert not hasattr(table, "WRAPPERS") and not hasattr(ddp, "WRAPPERS")


class _Wraps(torch.optim.Optimizer):
    """A learner's ZeRO-1 shape: a torch Optimizer whose states live in an inner one, named freely."""

    def __init__(self, params, name, as_list=False):
        params = list(params)
        super().__init__(params, {})
        self.adamw = torch.optim.AdamW(params, lr=1e-3)
        setattr(self, name, [self.adamw] if as_list else self.adamw)
        if name != "adamw":
            del self.adamw


@pytest.mark.parametrize("name, as_list", [("inner", False), ("opt", False), ("optimizers", True)])
def test_state_bytes_finds_the_inner_optimizer_whatever_its_name(name, as_list):
    """04 measures the learner's MyZero1: its inner optimizer may be self.opt or a list, not only
    .inner; the bytes must not fall silently to 0."""
    from course_utils.harness.experiments import state_bytes
    model = torch.nn.Linear(6, 5)
    wrapped = _Wraps(model.parameters(), name, as_list)
    inner = getattr(wrapped, name)[0] if as_list else getattr(wrapped, name)
    model(torch.ones(2, 6)).sum().backward()
    inner.step()
    expected = state_bytes(model, inner)["optimizer"]
    assert expected == 2 * 4 * 35 + 2 * 4       # m and v of 35 elements, a step counter per tensor
    assert state_bytes(model, wrapped)["optimizer"] == expected
