"""course_utils.impl.zero3: ZeRO-3 from scratch gives the losses of "single", keeps every rank's
full parameters bit-identical, holds exactly its shards, sends exactly the predicted
bytes, and never has more than root + 1 (root + 2 with prefetch) units gathered.

Loss tolerance: 1e-6 relative, as for "ddp" (tests/test_experiments.py): the gradient
sums run in another order (per rank, then the reduce-scatter), fp32 rounding ~1e-7.
Across ranks the full parameters must be bitwise equal: every rank gathers the same shards.
"""
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_utils.theory.comm import collective_bytes, collective_calls, comm_volume
from course_utils.runtime.ledger import CommLedger
from course_utils.harness.experiments import GLOBAL_BATCH, global_loss, make_adamw, run, wrap
from course_utils.harness.experiments import full_parameters
from course_utils.harness.strategies import STRATEGIES
from course_utils.runtime.launch import launch
from course_utils.harness.model import SyntheticData, build_model, num_params
from course_utils.impl.zero3 import Zero3
from course_utils.labs.zero3_timeline import record_timeline
from course_utils.theory.layout import padded_numel
from course_utils.theory.timeline import max_alive
from toys import DIM, VOCAB, toy_batch, toy_optimizer

pytestmark = pytest.mark.usefixtures("no_leftover_children")

REL = 1e-6
STEPS = 3
PSI = 129_350
BLOCK, ROOT, LAYERS = 30_650, 6_750, 4          # numels: 4 blocks + root (tok_emb, pos_emb, norm_f)
UNITS = LAYERS + 1
N_TENSORS = len([p for p in build_model().parameters() if p.requires_grad])   # AdamW: a step counter each


def _pads(n):
    return [padded_numel(ROOT, n)] + [padded_numel(BLOCK, n)] * LAYERS


def _owned(n, rank):
    """Elements of real parameters (padding excluded) in rank ``rank``'s shards."""
    total = 0
    for numel, padded in zip([ROOT] + [BLOCK] * LAYERS, _pads(n)):
        size = padded // n
        total += max(0, min(numel, (rank + 1) * size) - rank * size)
    return total


def test_course_model_unit_sizes():
    m = build_model()
    assert num_params(m) == PSI == ROOT + LAYERS * BLOCK
    assert sum(p.numel() for p in m.blocks[0].parameters()) == BLOCK


# ------------------------------------------------------------------ run("zero3", N)

@pytest.fixture(scope="module")
def single():
    return run("single", 1, steps=STEPS)[0]


def _exact_ag_rs(n, steps, reshard_root=False):
    """Exact bytes one rank sends: per unit collective_bytes(padded * 4), times its calls."""
    f = Fraction(n - 1, n)
    pads = _pads(n)
    root_gathers = 2 if reshard_root else 1
    ag = f * 4 * (root_gathers * pads[0] + 2 * sum(pads[1:])) * steps
    rs = f * 4 * sum(pads) * steps
    return ag, rs


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_course_model_matches_single_bytes_and_state(world_size, single):
    n = world_size
    out = run("zero3", n, steps=STEPS, quiet=True)
    ag, rs = _exact_ag_rs(n, STEPS)
    pads = _pads(n)
    calls = collective_calls(3, num_layers=UNITS, skip_last_regather=True)
    assert calls == {"all_reduce": 0, "reduce_scatter": 5, "all_gather": 9}
    for r in out:
        assert r.losses == out[0].losses
        assert r.losses == pytest.approx(single.losses, rel=REL)
        # exact bytes: the ledger sums exact fractions and rounds once
        assert r.comm_bytes["all_gather"] == float(ag) and r.comm_bytes["reduce_scatter"] == float(rs)
        assert r.comm_bytes["all_reduce"] == 0
        # ... = the per-unit collective_bytes formula
        per_step_ag = collective_bytes("all_gather", pads[0] * 4, n) + sum(
            2 * collective_bytes("all_gather", p * 4, n) for p in pads[1:])
        assert r.comm_bytes["all_gather"] == pytest.approx(per_step_ag * STEPS, rel=1e-15)
        assert r.comm_calls == {k: v * STEPS for k, v in calls.items()}
        # state: exactly the shards (padding included); AdamW's 2 states of the Parameters'
        # pieces (padding belongs to no Parameter, so it has no state) and a step counter each
        shard = sum(pads) // n
        assert r.state_bytes == {"params": 4 * shard, "grads": 4 * shard,
                                 "optimizer": 8 * _owned(n, r.rank) + 4 * N_TENSORS}
    # against DDP: 3 (N-1)/N Psi·4 minus one root gather, plus padding
    ddp = 2 * Fraction(n - 1, n) * 4 * PSI * STEPS
    ratio = (ag + rs) / ddp
    assert ratio == Fraction(3 * sum(pads) - pads[0], 2 * PSI)
    assert 1.47 < ratio < 1.48                                     # 2L-1: not quite 1.5


# ------------------------------------------------------------------ on ranks, course GPT

def _train_course(prefetch, reshard_root=False, steps=STEPS):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(seed=0)
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=0)
    z = Zero3(model, prefetch=prefetch, reshard_root=reshard_root)
    timeline = record_timeline(z)
    opt = make_adamw(z.shard_parameters())
    at_rest = [p.numel() for p in model.parameters()]
    snaps, losses, timelines = [full_parameters(z)], [], []
    with CommLedger() as ledger:
        for step in range(steps):
            x, y = data.shard(step, rank, world)
            loss = z(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            timelines.append(list(timeline))
            with ledger.pause():
                losses.append(global_loss(loss))
                snaps.append(full_parameters(z))
    return {"rank": rank, "losses": losses, "snaps": snaps, "timelines": timelines, "counts": ledger.counts(),
            "totals": ledger.totals(), "at_rest": at_rest,
            "after": [p.numel() for p in model.parameters()]}


def _single_params(steps=STEPS):
    model = build_model(seed=0)
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=0)
    opt = make_adamw(list(model.parameters()))
    for step in range(steps):
        model(*data.batch(step)).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("world_size", [2, 4])
def test_bitwise_across_ranks_timeline_and_prefetch(world_size, single):
    on = launch(_train_course, world_size, True, quiet=True)
    off = launch(_train_course, world_size, False, quiet=True)
    ref = _single_params()
    pads = _pads(world_size)
    for res in (on, off):
        for r in res:
            # at rest each Parameter is its piece of this rank's shard: only the shard is stored
            assert r["at_rest"] == r["after"] and sum(r["at_rest"]) == _owned(world_size, r["rank"])
            assert r["losses"] == pytest.approx(single.losses, rel=REL)
            for step, snap in enumerate(r["snaps"]):                      # bitwise across ranks
                assert list(snap) == list(ref)
                for name, t in snap.items():
                    assert torch.equal(t, res[0]["snaps"][step][name]), (step, name)
            for name, t in r["snaps"][-1].items():
                torch.testing.assert_close(t, ref[name], rtol=1e-5, atol=1e-5)  # Adam: ~1e-6 noise on ~0 biases
    # prefetch changes when the gathers start, not what is computed
    assert [r["losses"] for r in on] == [r["losses"] for r in off]
    for a, b in zip(on[0]["snaps"], off[0]["snaps"]):
        assert all(torch.equal(a[k], b[k]) for k in a)
    pads = _pads(world_size)
    for res, extra in ((off, 1), (on, 2)):
        for tl in res[0]["timelines"]:
            # root + 1 block alive at most without prefetch, root + 2 with
            assert max_alive(tl, "forward") == max_alive(tl, "backward") == 1 + extra
            gathers = [e for e in tl if e["event"] == "gather"]
            assert len(gathers) == 2 * UNITS - 1
            assert sum(e["event"] == "free" for e in tl) == 2 * UNITS - 1
            assert tl[-1]["alive_units"] == 0 and tl[-1]["unit"] == "root"   # all freed
            assert max(e["alive_bytes"] for e in tl) == 4 * (pads[0] + extra * pads[1])
            order = [e["unit"] for e in gathers]
            fwd = ["root"] + [f"blocks.{i}" for i in range(LAYERS)]
            assert order == fwd + fwd[:0:-1]           # forward 0..3, backward 3..0
        counts = {k: v for k, v in res[0]["counts"].items() if v}
        assert counts == {"all_gather": 9 * STEPS, "reduce_scatter": 5 * STEPS}


def test_reshard_root_gives_2L_gathers_and_comm_volume_exactly():
    n = 2
    out = launch(_train_course, n, False, True, 2, quiet=True)
    for r in out:
        counts = {k: v for k, v in r["counts"].items() if v}
        assert counts == {k: v * 2 for k, v in collective_calls(3, num_layers=UNITS).items() if v}
        expected = comm_volume(sum(_pads(n)), world_size=n, stage=3, bytes_per_elem=4)
        assert r["totals"]["all_gather"] == 2 * expected["all_gather"]
        assert r["totals"]["reduce_scatter"] == 2 * expected["reduce_scatter"]
        ddp = comm_volume(PSI, world_size=n, stage=0, bytes_per_elem=4)["total"]
        assert expected["total"] / ddp == 1.5          # N=2: no padding, every unit gathered twice
        assert max_alive(r["timelines"][-1], "backward") == 2


# ------------------------------------------------------- a toy: frozen, tied, odd, unused

TOY_STEPS = 4


class Layer(nn.Module):
    def __init__(self, frozen=False):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.odd = nn.Parameter(torch.linspace(0.5, 1.5, 7))      # 7 elements: odd-sized
        self.extra = nn.Parameter(torch.ones(3))                  # used only when asked
        if frozen:
            self.lin.requires_grad_(False)

    def forward(self, h, use_extra=False):
        h = torch.tanh(self.lin(h)) * self.odd[:DIM].mean() + h
        return h * self.extra.sum() / 3 if use_extra else h


class Toy(nn.Module):
    """tok embedding tied to the output layer (root), layers 1 and 2 sharing one Linear
    weight (tied across units -> the root), a frozen Linear in layer 0, odd numels."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Layer(frozen=True), Layer(), Layer()])
        self.layers[2].lin.weight = self.layers[1].lin.weight
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx, targets, use_extra=False):
        h = self.emb(idx)
        for layer in self.layers:
            h = layer(h, use_extra=use_extra)
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), targets.reshape(-1))


def _toy(seed):
    torch.manual_seed(seed)
    return Toy()


def _toy_train(strategy, rank=0, world_size=1):
    model = _toy(seed=rank)                           # different starts: rank 0's must win
    options = {"overlap": world_size != 3} if "overlap" in STRATEGIES[strategy].options else {}  # prefetch off on 3 ranks
    model, opt = wrap(strategy, model, toy_optimizer, **options)
    snaps = [full_parameters(model)]
    b = GLOBAL_BATCH // world_size
    losses, units = [], None
    with CommLedger() as ledger:
        for step in range(TOY_STEPS):
            x, y = (t[rank * b:(rank + 1) * b] for t in toy_batch(step))
            loss = model(x, y, use_extra=True)
            loss.backward()
            opt.step()
            opt.zero_grad()
            with ledger.pause():
                losses.append(global_loss(loss))
                snaps.append(full_parameters(model))
        counts = ledger.counts()
        extra = None
        if world_size > 1:
            names = {m: n for n, m in model.module.named_modules()}
            units = [(names[u.module], u.numel, u.padded) for u in model.units]
            # "extra" used on rank 0 only: collectives stay matched, rank 1 sends zeros
            x, y = (t[rank * b:(rank + 1) * b] for t in toy_batch(0))
            model(x, y, use_extra=(rank == 0)).backward()
            extra = [u.shard.grad.clone() for u in model.units]
            opt.step()
            opt.zero_grad()
            snaps.append(full_parameters(model))
    m = model.module if world_size > 1 else model
    tied = m.head.weight is m.emb.weight and m.layers[2].lin.weight is m.layers[1].lin.weight
    counts = {k: v for k, v in counts.items() if v}
    return losses, snaps, counts, tied, units, extra


def test_toy_frozen_tied_odd_unused():
    ref_losses, ref_snaps, *_ = _toy_train("single")
    for n in (2, 3, 4):
        out = launch(_toy_train, n, "zero3", quiet=True)
        for rank, (losses, snaps, counts, tied, units, extra) in enumerate(out):
            assert tied
            # units: the root owns emb (tied to head) and the Linear shared by layers 1-2;
            # layer 0's frozen Linear is not in any flat buffer
            assert units == [("", VOCAB * DIM + DIM * DIM, padded_numel(VOCAB * DIM + DIM * DIM, n)),
                             ("layers.0", 10, padded_numel(10, n)),
                             ("layers.1", 16, padded_numel(16, n)),
                             ("layers.2", 16, padded_numel(16, n))]
            assert list(snaps[0]) == list(ref_snaps[0])
            for name in snaps[0]:
                assert torch.equal(snaps[0][name], ref_snaps[0][name])     # rank 0's start
            for step, snap in enumerate(snaps):                            # bitwise across ranks
                for name, t in out[0][1][step].items():
                    assert torch.equal(snap[name], t), (step, name)
                assert torch.equal(snap["layers.0.lin.weight"], ref_snaps[0]["layers.0.lin.weight"])
            assert losses == pytest.approx(ref_losses, rel=REL)
            for name, t in snaps[TOY_STEPS].items():
                torch.testing.assert_close(t, ref_snaps[-1][name], rtol=1e-5, atol=1e-6)
            assert counts == {"all_gather": (2 * 4 - 1) * TOY_STEPS, "reduce_scatter": 4 * TOY_STEPS}
            # the step with "extra" used on rank 0 only still averaged over all ranks
            assert all(torch.isfinite(g).all() for g in extra)


# ------------------------------------------------------- ignored_params: left to the caller

class Normed(nn.Module):
    """Two units (the ModuleList's children), the first ending in a LayerNorm, and a root
    LayerNorm: both norms replicated through ``ignored_params``."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(DIM, 5), nn.LayerNorm(5)), nn.Linear(5, DIM)])
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return F.mse_loss(self.norm(x), y)


def _normed_batch(step):
    g = torch.Generator().manual_seed(200 + step)
    return torch.randn(12, DIM, generator=g), torch.randn(12, DIM, generator=g)


def _normed_train(rank=0, world_size=1):
    torch.manual_seed(0)
    model = Normed()
    with torch.no_grad():                                 # norms away from their 1, 0 start
        for p in [*model.norm.parameters(), *model.layers[0][1].parameters()]:
            p.add_(torch.linspace(-0.5, 0.5, p.numel()))
    norms = [*model.norm.parameters(), *model.layers[0][1].parameters()]
    if world_size > 1:
        model = Zero3(model, ignored_params=norms)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    b = 12 // world_size
    losses = []
    for step in range(3):
        x, y = (t[rank * b:(rank + 1) * b] for t in _normed_batch(step))
        loss = model(x, y)
        loss.backward()
        if world_size > 1:                                # the caller averages the replicated ones
            for p in norms:
                dist.all_reduce(p.grad)
                p.grad /= world_size
        opt.step()
        opt.zero_grad()
        losses.append(global_loss(loss))
    sizes = [u.numel for u in model.units] if world_size > 1 else None
    return losses, [p.detach().clone() for p in norms], sizes


@pytest.mark.parametrize("world_size", [2, 3])
def test_ignored_params_stay_whole_and_are_left_to_the_caller(world_size):
    ref_losses, ref_norms, _ = _normed_train()
    for losses, norms, sizes in launch(_normed_train, world_size, quiet=True):
        assert losses == pytest.approx(ref_losses, rel=REL)
        assert sizes == [DIM * 5 + 5, 5 * DIM + DIM]     # no unit holds a norm (the root: none left)
        for got, want in zip(norms, ref_norms):           # whole, and trained as one process trains them
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _bad_ignored():
    model = Normed()
    for bad in ([nn.Parameter(torch.ones(2))], [model.norm.weight.detach()]):
        with pytest.raises(ValueError, match="ignored_params"):
            Zero3(model, ignored_params=bad)
    return True


def test_ignored_params_must_be_parameters_of_the_module():
    assert launch(_bad_ignored, 2, quiet=True) == [True, True]


def test_the_reference_holds_no_measurement():
    """What notebook 06 prints is the algorithm: the timeline is recorded from outside
    (labs.zero3_timeline), nothing in impl/zero3.py logs, times or keeps peaks."""
    import inspect
    import re

    import course_utils.impl.zero3 as z3

    source = inspect.getsource(z3)
    assert not re.search(r"timeline|_log\b|\blog\(|observer|peak|ledger|record|print\(|\btime\.[a-z]", source, re.I)


# ------------------------------------------------------------------ registry

def test_registry_and_errors():
    assert "zero3" in STRATEGIES and STRATEGIES["zero3"].notebook == "06_zero3"
    with pytest.raises(RuntimeError, match="torch.distributed"):
        Zero3(build_model())
    assert padded_numel(30_650, 3) == 30_651 and padded_numel(6_750, 4) == 6_752


def _async_reduce(world_size_unused=None):
    """Zero3 with async_reduce: the same shard gradients as without, bitwise; at most one
    reduce-scatter in flight during backward; none left once backward returns; accumulation and
    clipping work on what it leaves."""
    rank, world = dist.get_rank(), dist.get_world_size()
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=0)
    out = {}
    for flag in (False, True):
        z = Zero3(build_model(seed=0), prefetch=True, async_reduce=flag)
        in_flight = []
        for u in z.units:
            u._hooks.append(u.params[0].register_post_accumulate_grad_hook(
                lambda p, z=z: in_flight.append(sum(v.reducing is not None for v in z.units))))
        for step in range(2):                         # two backwards, one step: accumulation
            x, y = data.shard(step, rank, world)
            z(x, y).backward()
        left = sum(u.reducing is not None for u in z.units)
        norm = z.clip_grad_norm_(1.0)
        out[flag] = ([u.shard.grad.clone() for u in z.units], max(in_flight), left, float(norm),
                     [p.grad is not None for p in z.shard_parameters()])
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_async_reduce_gives_the_same_gradients_one_in_flight(world_size):
    for r in launch(_async_reduce, world_size, quiet=True):
        (g_sync, _, _, n_sync, has_sync), (g_async, most, left, n_async, has_async) = r[False], r[True]
        assert all(torch.equal(a, b) for a, b in zip(g_sync, g_async))
        assert n_sync == n_async and has_sync == has_async and all(has_async)
        assert most == 1 and left == 0


def test_notebook_06s_ratio_is_the_roots_share_skipping_a_pass():
    """06 §7: "(3 − 0.052)/2 ≈ 1.474": the root's 5.2 % of the parameters is gathered once, not twice,
    and the ratio is what the ledger printed on 2 and 4 ranks (padding moves it in the fourth decimal)."""
    from course_utils.theory.config import COURSE_CONFIG
    from notebook_text import cell_output, cell_source
    from course_utils.harness.model import build_model
    m = build_model(device="meta")
    root = COURSE_CONFIG.num_params() - sum(p.numel() for b in m.blocks for p in b.parameters())
    share = root / COURSE_CONFIG.num_params()
    assert f"{share:.3f}" == "0.052"                      # the figure the text uses
    text = cell_source("06_zero3.ipynb", "In bytes (ring model), each collective")
    assert f"(3 − {share:.3f})/2 ≈ {(3 - share) / 2:.3f}" in text
    printed = [float(line.split("= ")[1].split()[0]) for line in
               cell_output("06_zero3.ipynb", "ring = (z.comm_bytes").splitlines() if "ZeRO-3 / DDP" in line]
    assert len(printed) == 2 and all(abs(r - (3 - share) / 2) < 5e-4 for r in printed)


def test_notebook_06s_two_rank_figures_are_the_units():
    """06 §5's sentence under the units' run: the root plus one block gathered, and 9 all-gathers of
    half a unit each on 2 ranks, as the model's sizes give them and as the run printed them."""
    from notebook_text import cell_output, cell_source
    text = cell_source("06_zero3.ipynb", "At rest: 1/N of the model plus padding")
    out = cell_output("06_zero3.ipynb", "mine = {n: launch(units_on_rank")
    peak, ag = 4 * (ROOT + BLOCK), 4 * ROOT // 2 + 2 * LAYERS * 4 * BLOCK // 2
    assert f"{4 * ROOT:,} + {4 * BLOCK:,} = {peak:,} B" in text and f"at most {peak:,} B gathered" in out
    assert f"{4 * ROOT // 2:,} + {2 * LAYERS} × {4 * BLOCK // 2:,} = {ag:,} B" in text
    assert f"9 all-gathers, {ag:,} B" in out
