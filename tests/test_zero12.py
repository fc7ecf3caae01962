"""course_utils.impl.zero: ZeRO-1 and ZeRO-2 from scratch, and torch's ZeroRedundancyOptimizer.

Losses are compared with "single" to 1e-6 relative (fp32; the gradient sums are done in
a different order, as for "ddp": see tests/test_experiments.py). Parameters are compared
*bitwise across ranks*: every parameter is written by exactly one rank (its owner's
optimizer step) and copied to the others by the all-gather.

Byte counts are exact. With Ψ_b the elements of bucket b and P_b = ceil(Ψ_b/N)·N:
state = model_states(Σ P_b, world_size=N, stage=s, recipe="fp32") + 4 bytes per bucket
(AdamW's float32 step counter, one per shard parameter); comm per step and bucket =
one reduce-scatter and one all-gather of 4·P_b bytes.
"""
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
from torch import nn

import course_utils.impl.zero as zero
from course_utils.impl.common import flatten_and_pad
from course_utils.theory.layout import padded_numel, shard_bounds
from course_utils.harness.experiments import state_bytes
from course_utils.harness.probes import grad_bytes
from course_utils.theory.zero import expected_comm_bytes, expected_state_bytes
from course_utils.theory.comm import collective_bytes
from course_utils.runtime.ledger import CommLedger
from course_utils.harness.experiments import GLOBAL_BATCH, full_parameters, global_loss, run, wrap
from course_utils.impl.ddp import unwrap
from course_utils.runtime.launch import launch
from course_utils.harness.strategies import STRATEGIES
from course_utils.theory.memory import model_states
from course_utils.harness.model import build_model, num_params
from toys import DIM, TOY_TRAINABLE, Toy, toy_batch, toy_optimizer

pytestmark = pytest.mark.usefixtures("no_leftover_children")

REL = 1e-6
STEPS = 3
PSI = 129_350


@pytest.fixture(scope="module")
def single():
    return run("single", 1, steps=STEPS)[0]


# ------------------------------------------------------------------ pure functions

def test_padding_and_shards():
    assert num_params(build_model()) == PSI
    assert padded_numel(PSI, 2) == PSI and padded_numel(PSI, 3) == PSI + 1
    assert padded_numel(PSI, 4) == PSI + 2
    for numel, n in ((10, 4), (7, 3), (PSI, 3), (1, 8), (12, 4)):
        bounds = [shard_bounds(numel, n, r) for r in range(n)]
        assert bounds[0][0] == 0 and bounds[-1][1] == padded_numel(numel, n)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))          # contiguous
        assert len({hi - lo for lo, hi in bounds}) == 1                        # equal sizes
    flat = flatten_and_pad([torch.ones(2, 2), torch.full((3,), 2.0)], 3)
    assert flat.tolist() == [1, 1, 1, 1, 2, 2, 2, 0, 0]
    with pytest.raises(ValueError, match="rank must be < world_size"):
        shard_bounds(10, 4, 4)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        padded_numel(10, 0)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        zero.zero_optimizer(nn.Linear(2, 2).parameters(), torch.optim.SGD)


# ------------------------------------------------------------------ the course model

@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("stage", [1, 2])
def test_course_model_matches_single_with_exact_bytes(stage, world_size, single):
    out = run(f"zero{stage}", world_size, steps=STEPS, quiet=True)
    n, padded = world_size, padded_numel(PSI, world_size)
    analytic = model_states(padded, world_size=n, stage=stage, recipe="fp32")
    for r in out:
        assert r.losses == out[0].losses
        assert r.losses == pytest.approx(single.losses, rel=REL)
        assert r.param_digest == out[0].param_digest                       # bitwise on all ranks
        # one bucket (25 MiB default): one shard parameter, one 4-byte step counter
        assert r.state_bytes == {"params": 4 * padded, "grads": int(analytic.grads),
                                 "optimizer": int(analytic.optimizer) + 4}
        assert r.state_bytes["optimizer"] == 8 * padded // n + 4
        assert r.state_bytes["grads"] == (4 * padded if stage == 1 else 4 * padded // n)
        rs = STEPS * collective_bytes("reduce_scatter", 4 * padded, n)
        assert r.comm_bytes["reduce_scatter"] == pytest.approx(rs, rel=1e-15)
        assert r.comm_bytes["all_gather"] == r.comm_bytes["reduce_scatter"]
        assert r.comm_bytes["all_reduce"] == 0
        assert r.comm_calls == {"all_reduce": 0, "reduce_scatter": STEPS, "all_gather": STEPS}
        # the same as DDP's all-reduce, plus the padding, exactly (fractions: N=3)
        total = Fraction(r.comm_bytes["reduce_scatter"]) + Fraction(r.comm_bytes["all_gather"])
        ddp = Fraction(2 * (n - 1) * 4 * PSI * STEPS, n)
        pad = Fraction(2 * (n - 1) * 4 * (padded - PSI) * STEPS, n)
        assert abs(total - (ddp + pad)) <= 1e-6
        assert (padded == PSI) == (n == 2) and (total == ddp) == (n == 2)
    assert out[0].state_bytes == expected_state_bytes([PSI], n, stage)


@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_zero_redundancy_optimizer_matches_single(world_size, single):
    out = run("torch-zero1", world_size, steps=STEPS, quiet=True)
    for r in out:
        assert r.losses == pytest.approx(single.losses, rel=REL)
        assert r.param_digest == out[0].param_digest
    # whole parameters are assigned to ranks: optimizer bytes roughly 1/N, not exactly
    total = sum(r.state_bytes["optimizer"] for r in out)
    assert total == 8 * PSI + 4 * 68                         # 68 tensors, each owned once
    assert all(r.state_bytes["optimizer"] < 8 * PSI for r in out)


def test_variants_mixed_and_peak_gradient_memory():
    ref = run("zero1", 2, steps=STEPS, quiet=True)
    allreduce = run("zero1", 2, steps=STEPS, variant="allreduce", quiet=True)
    assert [r.param_digest for r in allreduce] == [r.param_digest for r in ref]  # same result
    assert allreduce[0].comm_bytes["all_reduce"] == 2 * ref[0].comm_bytes["reduce_scatter"]
    assert allreduce[0].comm_bytes == expected_comm_bytes([PSI], 2, STEPS, variant="allreduce")
    # ZeRO-1 always holds the flat gradient buffer, 4·P bytes
    assert ref[0].extra["peak_grad_bytes"] == 4 * PSI
    # ZeRO-2 with one bucket per parameter: the shard + at most the biggest bucket's gradients and message
    small = run("zero2", 2, steps=STEPS, bucket_bytes=0, quiet=True)
    biggest = 4 * max(padded_numel(k, 2) for k in small[0].extra["bucket_numels"])
    shard = 4 * sum(padded_numel(k, 2) for k in small[0].extra["bucket_numels"]) // 2
    for r in small:
        assert shard < r.extra["peak_grad_bytes"] <= shard + 2 * biggest
        assert ref[0].extra["peak_grad_bytes"] - r.extra["peak_grad_bytes"] >= 4 * PSI // 2 - 2 * biggest
        buckets = len(r.extra["bucket_numels"])
        assert r.state_bytes == expected_state_bytes(r.extra["bucket_numels"], 2, 2)
        assert r.state_bytes["optimizer"] == 8 * PSI // 2 + 4 * buckets
        assert r.comm_bytes == expected_comm_bytes(r.extra["bucket_numels"], 2, STEPS)
        assert r.comm_calls["reduce_scatter"] == buckets * STEPS
        assert r.losses == pytest.approx(ref[0].losses, rel=REL)
    # mixed precision: bf16 model, fp32 master shard: the paper's 2 + 2 + 12 bytes
    mixed = run("zero2", 2, steps=STEPS, mixed=True, quiet=True)
    assert mixed[0].state_bytes == expected_state_bytes([PSI], 2, 2, mixed=True)
    assert mixed[0].state_bytes == {"params": 2 * PSI, "grads": PSI, "optimizer": 6 * PSI + 4}
    assert mixed[0].comm_bytes == expected_comm_bytes([PSI], 2, STEPS, bytes_per_elem=2)
    assert mixed[0].losses == pytest.approx(ref[0].losses, rel=1e-3)


# ------------------------------------- a toy with frozen, tied, odd-sized and unused params

TOY_STEPS = 3


def _toy_train(strategy, rank=0, world_size=1, bucket_bytes=64):
    torch.manual_seed(rank)                      # ranks start different: wrap broadcasts rank 0's
    model = Toy()
    options = {"bucket_bytes": bucket_bytes} if "bucket_bytes" in STRATEGIES[strategy].options else {}
    model, opt = wrap(strategy, model, toy_optimizer, **options)
    b = GLOBAL_BATCH // world_size
    losses, snaps, after_backward = [], [full_parameters(model)], []
    with CommLedger() as ledger:
        for step in range(TOY_STEPS):
            x, y = (t[rank * b:(rank + 1) * b] for t in toy_batch(step))
            loss = model(x, y, use_extra=True)
            loss.backward()
            after_backward.append(sum(p.grad.numel() for p in unwrap(model).parameters()
                                      if p.grad is not None))
            opt.step()
            opt.zero_grad()
            with ledger.pause():
                losses.append(global_loss(loss))
            snaps.append(full_parameters(model))
        # unused on some ranks only: "extra" used on rank 0 alone; collectives stay matched.
        # Like "ddp", ZeRO's flat buffers give an unused parameter a zero gradient (AdamW
        # still decays it and applies its momentum), where "single" would skip it: compare
        # this step with "ddp", not with "single".
        x, y = (t[rank * b:(rank + 1) * b] for t in toy_batch(9))
        model(x, y, use_extra=rank == 0).backward()
        opt.step()
        opt.zero_grad()
    snaps.append(full_parameters(model))
    state = None
    if strategy.startswith("zero"):
        state = ([bk.numel for bk in opt.buckets], state_bytes(model, opt))
    return losses, snaps, ledger.totals(), after_backward, state


def _toy_all(rank, world_size):
    return {s: _toy_train(s, rank, world_size) for s in ("zero1", "zero2", "ddp")}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_toy_frozen_tied_odd_unused(world_size):
    ref_losses, ref_snaps, *_ = _toy_train("single")
    out = launch(_toy_all, world_size, quiet=True)
    for rank, per in enumerate(out):
        for strategy in ("zero1", "zero2"):
            losses, snaps, totals, after_backward, (bucket_numels, state) = per[strategy]
            assert list(snaps[0]) == ["extra", "emb.weight", "hidden.weight", "hidden.bias",
                                      "frozen.weight", "frozen.bias"]
            for step, snap in enumerate(snaps):                  # bitwise across ranks
                for name, t in snap.items():
                    assert torch.equal(t, out[0][strategy][1][step][name]), (strategy, step, name)
            assert torch.equal(snaps[-1]["frozen.weight"], ref_snaps[0]["frozen.weight"])
            assert losses == pytest.approx(ref_losses, rel=REL)
            for name, t in snaps[TOY_STEPS].items():
                torch.testing.assert_close(t, ref_snaps[TOY_STEPS][name], rtol=1e-5, atol=1e-6)
            for name, t in snaps[-1].items():                  # the rank-0-only step, vs DDP
                torch.testing.assert_close(t, per["ddp"][1][-1][name], rtol=1e-5, atol=1e-6)
            assert sum(bucket_numels) == TOY_TRAINABLE and len(bucket_numels) > 1
            stage = int(strategy[-1])
            frozen = 4 * (DIM * DIM + DIM)
            assert state == expected_state_bytes(bucket_numels, world_size, stage,
                                                      frozen_bytes=frozen)
            assert totals == expected_comm_bytes(bucket_numels, world_size, TOY_STEPS + 1)
            if stage == 2:                     # no full gradient survives backward
                assert after_backward == [0] * TOY_STEPS
            else:
                assert after_backward == [TOY_TRAINABLE] * TOY_STEPS


def _zero2_after_backward():
    model = build_model(seed=0)
    from course_utils.harness.experiments import LR, clip_grad_norm_
    from course_utils.harness.model import SyntheticData

    opt = zero.zero_optimizer(model.parameters(), torch.optim.AdamW, stage=2, bucket_bytes=16 * 1024, lr=LR)
    x, y = SyntheticData(global_batch=12, seed=0).shard(0, dist.get_rank(), dist.get_world_size())
    model(x, y).backward()
    held = [n for n, p in model.named_parameters() if p.grad is not None]
    now = [grad_bytes(opt)]
    model(x, y).backward()                      # accumulation: a second backward adds to the shards
    now.append(grad_bytes(opt))
    clip_grad_norm_(model, 1.0)
    try:
        model(x, y).backward()                  # after a clip: refused
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    return held, now, sum(4 * (b.hi - b.lo) for b in opt.buckets), error


def test_zero2_frees_full_gradients_during_backward():
    for held, now, shard_bytes, error in launch(_zero2_after_backward, 3, quiet=True):
        assert held == []
        assert now == [shard_bytes, shard_bytes]          # every message finished when backward ends
        assert "clip after the last backward" in error


# ------------------------------------------------------------------ gradient accumulation

ACC_BATCH, ACC_STEPS, ACC_LR, ACC_TOL = 24, 2, 0.1, 1e-6


def _sgd_params(model):
    return {n: p.detach().clone() for n, p in unwrap(model).named_parameters()}


def _accumulate(stage, micro_batches, overlap):
    """ZeRO-1/2 (16 KiB buckets) with SGD, ``ACC_STEPS`` steps of k micro-batches (loss / k each)."""
    from course_utils.harness.model import SyntheticData

    rank, n = dist.get_rank(), dist.get_world_size()
    data = SyntheticData(global_batch=ACC_BATCH, seed=0)
    model = build_model(seed=0)
    opt = zero.zero_optimizer(model.parameters(), torch.optim.SGD, stage=stage, bucket_bytes=16 * 1024,
                             overlap=overlap, lr=ACC_LR)
    held = []
    with CommLedger() as ledger:
        for step in range(ACC_STEPS):
            x, y = data.shard(step, rank, n)
            for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
                (model(xm, ym) / micro_batches).backward()
                held.append(grad_bytes(opt))
            opt.step()
            opt.zero_grad()
    return {"params": _sgd_params(model), "counts": ledger.counts(), "totals": ledger.totals(),
            "buckets": [b.numel for b in opt.buckets], "held": held,
            "shard_bytes": sum(4 * (b.hi - b.lo) for b in opt.buckets)}


def _accumulate_all():
    return {key: _accumulate(*key) for key in ((2, 1, True), (2, 2, True), (2, 4, True), (2, 2, False),
                                                (1, 2, True))}


def _sgd_single():
    from course_utils.harness.model import SyntheticData

    data = SyntheticData(global_batch=ACC_BATCH, seed=0)
    model = build_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=ACC_LR)
    for step in range(ACC_STEPS):
        model(*data.shard(step, 0, 1)).backward()
        opt.step()
        opt.zero_grad()
    return _sgd_params(model)


@pytest.mark.parametrize("world_size", [2, 3])
def test_zero_gradient_accumulation_matches_one_process(world_size):
    """ZeRO-2 with k = 1, 2, 4 micro-batches per step (k = 2 with overlap=False, and ZeRO-1 with
    k = 2): the parameters of one process on the global batch after 2 steps, |diff| <= 1e-6
    (fp32 sums in another order; SGD, lr 0.1, so no Adam step amplifies a near-zero gradient's
    rounding); ZeRO-2 reduce-scatters every bucket in every micro-batch (overlap=False and
    ZeRO-1: once per step) and holds only its shard between micro-batches."""
    ref = _sgd_single()
    out = launch(_accumulate_all, world_size, quiet=True)
    for (stage, k, overlap), r in out[0].items():
        for other in out[1:]:                              # every rank: the same parameters, bitwise
            theirs = other[(stage, k, overlap)]["params"]
            assert all(torch.equal(t, theirs[n]) for n, t in r["params"].items())
        worst = max((t - ref[n]).abs().max().item() for n, t in r["params"].items())
        assert worst <= ACC_TOL, (stage, k, overlap, worst)
        buckets = len(r["buckets"])
        assert buckets > 1
        sends = k if overlap and stage == 2 else 1         # ZeRO-1 reduces in step() only
        assert r["counts"] == {"all_reduce": 0, "reduce_scatter": sends * buckets * ACC_STEPS,
                               "all_gather": buckets * ACC_STEPS}
        assert r["totals"] == expected_comm_bytes(r["buckets"], world_size, ACC_STEPS,
                                                       micro_batches=sends)
        if stage == 1:                                     # the flat gradient buffers, always
            assert r["held"] == [r["shard_bytes"] * world_size] * (k * ACC_STEPS)
        elif overlap:                                      # only the shard, after every backward
            assert r["held"] == [r["shard_bytes"]] * (k * ACC_STEPS)
        else:                                              # full gradients wait for step()
            assert min(r["held"]) > 4 * PSI


def test_expected_comm_bytes_with_micro_batches():
    one = expected_comm_bytes([PSI], 2)
    four = expected_comm_bytes([PSI], 2, micro_batches=4)
    assert four == {"all_reduce": 0, "reduce_scatter": 4 * one["reduce_scatter"],
                    "all_gather": one["all_gather"]}
    with pytest.raises(ValueError, match="micro_batches"):
        expected_comm_bytes([PSI], 2, micro_batches=0)
    with pytest.raises(ValueError, match="leave micro_batches=1"):
        expected_comm_bytes([PSI], 2, variant="allreduce", micro_batches=2)


@pytest.mark.parametrize("bucket_bytes", [0, 64 * 1024, 25 * 2**20])
def test_zero2s_peak_is_the_shard_plus_its_largest_bucket_twice(bucket_bytes):
    """05 §4's rule, exactly: the gradient bytes a rank holds at its peak are its shard's gradient
    plus the largest bucket's ``.grad``s and that bucket's padded message, both alive when it is sent."""
    from course_utils.theory.zero import expected_peak_grad_bytes
    r = run("zero2", 2, steps=2, bucket_bytes=bucket_bytes, quiet=True)[0]
    numels = r.extra["bucket_numels"]
    shard = sum(4 * padded_numel(k, 2) // 2 for k in numels)
    m = max(numels)
    assert r.extra["peak_grad_bytes"] == expected_peak_grad_bytes(numels, 2) == shard + 4 * m + 4 * padded_numel(m, 2)
    with pytest.raises(ValueError, match="bucket_numels is empty"):
        expected_peak_grad_bytes([], 2)
