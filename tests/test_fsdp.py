"""course_utils.impl.fsdp: torch FSDP2 (fully_shard) gives the losses of "single" and "zero3",
sends exactly the bytes its per-parameter dim-0 padding predicts, and holds exactly its
local shards.

What FSDP2 sends per step (torch 2.13, fp32, measured here on gloo): one all-gather and one
reduce-scatter message per unit of M_unit = 4·Σ_p ceil(d0_p/N)·N·prod(rest_p) bytes (every
parameter's dim 0 padded to a multiple of N; the course's "zero3" pads the flat unit once,
ceil(Σ numel/N)·N). The root (embeddings + final norm) is gathered once per step (kept
gathered from forward to backward), each of the 4 blocks twice with
reshard_after_forward=True (9 all-gathers, as "zero3") and once with False (5); one
reduce-scatter per unit (5). Bytes one rank sends per step (ring convention):
    all_gather     = (N-1)/N · (M_root + g·4·M_block),   g = 2 ("torch-fsdp"), 1 ("-zero2")
    reduce_scatter = (N-1)/N · (M_root + 4·M_block)
With M in elements: root 6800/6852/6904, block 30650/31110/31468 for N = 2/3/4.

State bytes per rank (after optimizer.step()): params = grads = 4·Σ_p ceil(d0_p/N)·rest_p
(padded local shards, the same on every rank); optimizer = 4·(2·Σ_p rows_r(p)·rest_p + P)
with rows_r = this rank's real rows (exp_avg/exp_avg_sq are zeros_like the unpadded local
DTensor) and P = 68 step counters.

Loss tolerance: 1e-6 relative (fp32, another summation order), as for "zero3".
"""
from fractions import Fraction

import pytest
import torch.distributed as dist

from course_utils.runtime.ledger import CommLedger
from course_utils.harness.experiments import GLOBAL_BATCH, make_adamw, run, state_bytes
from course_utils.harness.strategies import STRATEGIES
from course_utils.harness.strategies import wrap_torch_fsdp
from course_utils.theory.sharding import calls_per_step, comm_bytes_per_step, fsdp_state_bytes, message_numels
from course_utils.runtime.launch import launch
from course_utils.harness.model import SyntheticData, build_model
from course_utils.theory.layout import padded_numel as zero3_padded

pytestmark = pytest.mark.usefixtures("no_leftover_children")

REL = 1e-6
STEPS = 3
LAYERS, PARAMS = 4, 68                   # blocks; Parameters (root 4 + 4 blocks x 16)
ROOT, BLOCK = 6_750, 30_650              # unpadded numels
# FSDP2's per-unit messages in elements: dim 0 of each parameter padded to a multiple of N
M_ROOT = {2: 6_800, 3: 6_852, 4: 6_904}
M_BLOCK = {2: 30_650, 3: 31_110, 4: 31_468}
# exact bytes one rank sends per step, derived by hand from the formula in the docstring
PER_STEP = {  # N: (all_gather "torch-fsdp", all_gather "torch-fsdp-zero2", reduce_scatter)
    2: (504_000, 258_800, 258_800),
    3: (681_952, 350_112, 350_112),
    4: (775_944, 398_328, 398_328),
}
# local shard elements: Σ ceil(d0/N)·rest; and the real rows the last rank lacks
SHARD = {2: 64_700, 3: 43_764, 4: 33_194}


@pytest.fixture(scope="module")
def single():
    return run("single", 1, steps=STEPS)[0]


def test_registered_and_formulas():
    assert {"torch-fsdp", "torch-fsdp-zero2"} <= set(STRATEGIES)
    assert STRATEGIES["torch-fsdp"].notebook == "07_fsdp"
    m = build_model()
    for n in (2, 3, 4):
        assert message_numels(m, n) == [M_ROOT[n]] + [M_BLOCK[n]] * LAYERS
        f = Fraction(n - 1, n) * 4
        ag3, ag2, rs = PER_STEP[n]
        assert comm_bytes_per_step(m, n) == {"all_reduce": 0, "reduce_scatter": rs, "all_gather": ag3}
        assert comm_bytes_per_step(m, n, reshard_after_forward=False)["all_gather"] == ag2
        assert ag3 == f * (M_ROOT[n] + 2 * LAYERS * M_BLOCK[n])
        assert rs == ag2 == f * (M_ROOT[n] + LAYERS * M_BLOCK[n])
        # never smaller than the course's flat padding; equal only without padding
        assert M_ROOT[n] >= zero3_padded(ROOT, n) and M_BLOCK[n] >= zero3_padded(BLOCK, n)
        st = fsdp_state_bytes(m, n, 0)
        assert st == {"params": 4 * SHARD[n], "grads": 4 * SHARD[n],
                      "optimizer": 4 * (2 * SHARD[n] + PARAMS)}
    assert M_BLOCK[2] == zero3_padded(BLOCK, 2)          # 50 and 200 rows: even
    assert M_ROOT[2] - zero3_padded(ROOT, 2) == 50       # tok_emb: 101 -> 102 rows
    assert calls_per_step(LAYERS) == {"all_reduce": 0, "reduce_scatter": 5, "all_gather": 9}
    assert calls_per_step(LAYERS, reshard_after_forward=False)["all_gather"] == 5
    assert calls_per_step(LAYERS, reshard_root=True)["all_gather"] == 10


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_course_model_matches_single_and_zero3_exact_bytes_and_state(world_size, single):
    n = world_size
    m = build_model()
    zero3 = run("zero3", n, steps=STEPS, quiet=True)
    for strategy, ag_index, gathers in (("torch-fsdp", 0, 9), ("torch-fsdp-zero2", 1, 5)):
        out = run(strategy, n, steps=STEPS, quiet=True)
        ag, rs = PER_STEP[n][ag_index] * STEPS, PER_STEP[n][2] * STEPS
        for r in out:
            assert r.losses == out[0].losses
            assert r.losses == pytest.approx(single.losses, rel=REL)
            assert r.losses == pytest.approx(zero3[0].losses, rel=REL)
            assert r.param_digest == out[0].param_digest
            assert r.comm_bytes == {"all_reduce": 0, "reduce_scatter": rs, "all_gather": ag}
            assert r.comm_calls == {"all_reduce": 0, "reduce_scatter": 5 * STEPS,
                                    "all_gather": gathers * STEPS}
            assert r.state_bytes == fsdp_state_bytes(m, n, r.rank)
            assert r.state_bytes["params"] == r.state_bytes["grads"] == 4 * SHARD[n]
        # the last rank owns fewer real rows (tok_emb 101 rows; blocks for N = 3, 4)
        assert out[-1].state_bytes["optimizer"] < out[0].state_bytes["optimizer"] == \
            4 * (2 * SHARD[n] + PARAMS)
        # against the course's zero3: same calls for "torch-fsdp"; bytes differ by padding only
        z = zero3[0]
        assert z.comm_calls == out[0].comm_calls or strategy == "torch-fsdp-zero2"
        f = Fraction(n - 1, n) * 4 * STEPS
        if strategy == "torch-fsdp":
            extra_ag = f * ((M_ROOT[n] - zero3_padded(ROOT, n))
                            + 2 * LAYERS * (M_BLOCK[n] - zero3_padded(BLOCK, n)))
            assert out[0].comm_bytes["all_gather"] - z.comm_bytes["all_gather"] == \
                pytest.approx(float(extra_ag), abs=1e-6)
        extra_rs = f * ((M_ROOT[n] - zero3_padded(ROOT, n)) + LAYERS * (M_BLOCK[n] - zero3_padded(BLOCK, n)))
        assert out[0].comm_bytes["reduce_scatter"] - z.comm_bytes["reduce_scatter"] == \
            pytest.approx(float(extra_rs), abs=1e-6)


def _train_reshard_root():
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = wrap_torch_fsdp(build_model(seed=0), make_adamw, reshard_root=True)
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=0)
    with CommLedger() as ledger:
        x, y = data.shard(0, rank, world)
        model(x, y).backward()
        opt.step()
        state = state_bytes(model, opt)
        opt.zero_grad()
    return ledger.counts(), ledger.totals(), state


def test_reshard_root_gathers_the_root_twice():
    m = build_model()
    for counts, totals, state in launch(_train_reshard_root, 2, quiet=True):
        assert counts["all_gather"] == 10 and counts["reduce_scatter"] == 5
        expected = comm_bytes_per_step(m, 2, reshard_root=True)
        assert totals["all_gather"] == expected["all_gather"] == PER_STEP[2][0] + 2 * M_ROOT[2]
        assert totals["reduce_scatter"] == PER_STEP[2][2]
        assert state["params"] == 4 * SHARD[2]
