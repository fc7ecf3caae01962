"""course_utils.labs.fsdp_wrapping: wrapping granularity, FSDP1 -> FSDP2, seed 001's common issues.

Three launches, shared by the tests through module-scoped fixtures: the granularity run
(2 ranks, four wrappings), the ShardingStrategy table with FULL_SHARD under both FSDP1
auto-wrap policies (4 ranks: the 101-row embedding, 50- and 200-row weights and FSDP1's flat units of
6,750 / 30,650 elements are not multiples of 4) and the seeding issue (2 ranks).

What the tests pin (fp32, course GPT): every measured peak of unsharded bytes equals the
replayed FSDP2 schedule (predict_unsharded_peak), per-block < root-only; every measured
call count, byte count and rank-0 state byte count equals predict_strategy's for both
FSDP1 (flat padding) and FSDP2 (per-parameter dim-0 padding). FSDP1 and FSDP2 issue the
same calls for every strategy; their bytes are equal only where no padding differs
(NO_SHARD: nothing is sharded); elsewhere FSDP2 sends more, exactly what its padding
predicts. Losses: 1e-6 relative to "single" (fp32, another summation order).
"""
import math

import pytest
from torch import nn

from course_utils.runtime import compat
from course_utils.labs import fsdp_wrapping as fw
from course_utils.theory.layout import dim0_padded_numel
from course_utils.harness.model import build_model

pytestmark = pytest.mark.usefixtures("no_leftover_children")

REL = 1e-6
ALL = tuple(fw.GRANULARITIES)


@pytest.fixture(scope="module")
def granularity():
    return fw.measure_granularity(2, granularities=ALL, steps=3)


@pytest.fixture(scope="module")
def strategies():
    return fw.strategy_table(4, steps=2)


@pytest.fixture(scope="module")
def seeding():
    return fw.issue_inconsistent_init(2, steps=2)


def _padded_model_bytes(world_size):
    return 4 * sum(dim0_padded_numel(p.shape, world_size) for p in build_model(device="meta").parameters())


# ----------------------------------------------------------------- 1. granularity

def test_per_block_unsharded_peak_is_below_root_only(granularity):
    root, block = granularity.row("root-only"), granularity.row("per-block")
    assert block["peak_params"] < root["peak_params"]
    assert block["peak_total"] < root["peak_total"]
    # root-only holds the whole (padded) model, twice while its all-gather buffer lives
    assert root["peak_params"] == _padded_model_bytes(2)
    assert root["peak_total"] == 2 * _padded_model_bytes(2)


def test_measured_peaks_equal_the_replayed_schedule(granularity):
    for r in granularity.rows:
        assert (r["peak_params"], r["peak_total"]) == (r["predicted_params"], r["predicted_total"]), r["granularity"]
        assert r["forward_order"] == r["predicted_forward_order"]
    assert [granularity.row(n)["units"] for n in ALL] == [1, 5, 34, 5]
    # per-block: the root plus one block; with buffers, plus a second block's all-gather buffer
    pred = fw.predict_unsharded_peak("per-block", 2)
    root, block = 4 * 6_800, 4 * 30_650
    assert (pred["params"], pred["total"]) == (root + block, root + 2 * block)
    # reshard_after_forward=False keeps every block gathered until its backward
    assert granularity.row("per-block-zero2")["peak_params"] == _padded_model_bytes(2)


def test_granularity_collectives_and_losses(granularity):
    for r in granularity.rows:
        assert r["every_step_same"], r["granularity"]
        assert r["calls"] == r["predicted_calls"], r["granularity"]
        assert r["bytes"] == r["predicted_bytes"], r["granularity"]
        assert r["max_rel_loss_diff"] <= REL, r["granularity"]
        assert r["step_time_s"] > 0 and r["cuda_peak_allocated"] is None
    leaf, block = granularity.row("per-leaf"), granularity.row("per-block")
    assert (leaf["calls"]["all_gather"], block["calls"]["all_gather"]) == (67, 9)
    assert "gloo on CPU" in granularity.where
    text = granularity.table()
    assert "per-block" in text and "step ms" not in text
    assert "step ms (varies)" in granularity.table(include_time=True)


def test_prediction_on_an_uneven_world_and_validation():
    # 3 ranks: the 101-row embedding and 50-row weights are padded per parameter
    assert fw.predict_unsharded_peak("root-only", 3)["params"] == _padded_model_bytes(3)
    assert fw.predict_unsharded_peak("per-block", 3)["params"] == 4 * (6_852 + 31_110)
    with pytest.raises(ValueError, match="granularity"):
        fw.predict_unsharded_peak("per-layer")
    with pytest.raises(ValueError, match="world_size"):
        fw.predict_unsharded_peak("per-block", 0)
    with pytest.raises(ValueError, match="steps"):
        fw.measure_granularity(2, steps=2)
    with pytest.raises(ValueError, match="cannot be split evenly over 5 ranks"):
        fw.measure_granularity(5)
    with pytest.raises(ValueError, match="fully_shard"):
        fw.UnshardedProbe(nn.Linear(2, 2))
    with pytest.raises(TypeError):
        fw.UnshardedProbe("model")


# ----------------------------------------------------------- 2. FSDP1 auto-wrap

def test_fsdp1_auto_wrap_equals_fsdp2_per_block(strategies):
    row = strategies.row("FULL_SHARD")
    fsdp2 = row["fsdp2"]
    for key in ("fsdp1", "fsdp1-transformer"):          # ModuleWrapPolicy, transformer_auto_wrap_policy
        m = row[key]
        assert m["units"] == fsdp2["units"] == 5
        assert m["max_rel_loss_diff"] <= REL and fsdp2["max_rel_loss_diff"] <= REL and m["replicas_agree"]
        assert m["calls"] == fsdp2["calls"] == {"all_reduce": 0, "reduce_scatter": 5, "all_gather": 9}
        # the ledger saw every FSDP1 collective: exactly the bytes of its flat units
        assert m["bytes"] == fw.predict_strategy("FULL_SHARD", 4, flavour="fsdp1")["bytes"]
        assert set(m["functions"]) <= {"all_gather", compat.ALL_GATHER_NAME, compat.REDUCE_SCATTER_NAME}
    assert fsdp2["bytes"] == fw.predict_strategy("FULL_SHARD", 4)["bytes"]
    kw, no_partial = strategies.errors.values()
    assert kw.startswith("TypeError") and "transformer_layer_cls" in kw
    assert no_partial.startswith("TypeError") and "transformer_layer_cls" in no_partial
    assert "fsdp1-transformer" in strategies.table()


# ----------------------------------------------------- 3. ShardingStrategy table

def test_strategy_table_matches_predictions_for_both_apis(strategies):
    for name in fw.STRATEGY_MAP:
        r = strategies.row(name)
        for api in ("fsdp1", "fsdp2"):
            m = r[api]
            assert m["every_step_same"], (name, api)
            for k in ("calls", "bytes", "state_bytes"):
                assert m[k] == m["predicted"][k], (name, api, k)
            assert m["max_rel_loss_diff"] <= REL and m["replicas_agree"], (name, api)
            assert m["units"] == 5
        # same collectives, call for call
        assert r["fsdp1"]["calls"] == r["fsdp2"]["calls"], name
    assert strategies.row("FULL_SHARD")["fsdp1"]["calls"]["all_gather"] == 9
    assert strategies.row("SHARD_GRAD_OP")["fsdp1"]["calls"]["all_gather"] == 5
    assert strategies.row("HYBRID_SHARD")["fsdp2"]["calls"] == {"all_reduce": 5, "reduce_scatter": 5,
                                                                "all_gather": 9}


def test_where_fsdp1_and_fsdp2_bytes_differ_and_why(strategies):
    """Equal where nothing is padded differently (NO_SHARD: no sharding); otherwise FSDP2
    sends more, exactly the difference between padding each parameter's dim 0 and padding
    each unit's flat parameter once."""
    no_shard = strategies.row("NO_SHARD")
    assert no_shard["fsdp1"]["bytes"] == no_shard["fsdp2"]["bytes"] == no_shard["replicate"]["bytes"]
    assert no_shard["replicate"]["calls"] == no_shard["fsdp2"]["calls"]
    for name in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        r = strategies.row(name)
        one, two = (sum(r[api]["bytes"].values()) for api in ("fsdp1", "fsdp2"))
        p1, p2 = (sum(fw.predict_strategy(name, 4, flavour=f)["bytes"].values()) for f in ("fsdp1", "fsdp2"))
        assert two > one and two - one == p2 - p1, name
    # 4 ranks: FSDP1 keeps 1/4 of each flat unit (6,752 and 30,652 elements padded)
    assert strategies.row("FULL_SHARD")["fsdp1"]["state_bytes"]["params"] == \
        4 * (math.ceil(6_750 / 4) + 4 * math.ceil(30_650 / 4))


def test_hybrid_shard_without_a_mesh(strategies):
    r = strategies.row("HYBRID_SHARD (no mesh)")["fsdp1"]
    if "gloo" in strategies.where:
        # torch.cpu.device_count() == 1: a shard group of one rank, NO_SHARD on it
        assert any("NO_SHARD" in w for w in r["warnings"])
        assert r["group_sizes"] == [("all_reduce", 1)] and sum(r["bytes"].values()) == 0
        assert not r["replicas_agree"] and r["max_rel_loss_diff"] > 1e-3
    else:   # one node with a GPU per rank: sharded over the node (FULL_SHARD-like)
        assert r["calls"]["all_gather"] == 9 and r["max_rel_loss_diff"] <= REL
    assert "HYBRID_SHARD (no mesh)" in strategies.table()


def test_strategy_validation():
    with pytest.raises(ValueError, match="even"):
        fw.strategy_table(6 + 1)
    with pytest.raises(ValueError, match="strategies"):
        fw.strategy_table(4, strategies=("ZERO_3",))
    with pytest.raises(ValueError, match="flavour"):
        fw.predict_strategy("FULL_SHARD", 4, flavour="fsdp3")
    with pytest.raises(ValueError, match="strategy"):
        fw.predict_strategy("FULL", 4)


# ----------------------------------------------------------- 4. common issues

def test_issue_oom(granularity):
    rep = fw.issue_oom(granularity)
    assert rep.before["fits"] is False and rep.after["fits"] is True
    assert rep.before["first event over budget"] == "copied out (root)"
    assert rep.after["first event over budget"] is None
    tight = fw.issue_oom(granularity, budget_bytes=granularity.row("per-block")["peak_total"] - 1)
    assert tight.after["fits"] is False
    assert rep.brief().splitlines() == [       # what notebook 07 prints
        f"root-only: peak {granularity.row('root-only')['peak_total']:,} B of unsharded parameters + "
        f"buffers, budget {rep.before['budget (B)']:,} B: out of memory at 'copied out (root)'",
        f"per-block: peak {granularity.row('per-block')['peak_total']:,} B: fits"]
    with pytest.raises(TypeError):
        fw.issue_oom({"rows": []})
    partial = fw.GranularityReport([granularity.row("per-block")], 2, 3, granularity.where, [])
    with pytest.raises(ValueError, match="root-only"):
        fw.issue_oom(partial)


def test_issue_slow(granularity, strategies):
    rep = fw.issue_slow(granularity, strategies)
    assert rep.before["calls"]["all_gather"] == 67 and rep.after["calls"]["all_gather"] == 9
    assert rep.before["calls"]["reduce_scatter"] == 34 and rep.after["calls"]["reduce_scatter"] == 5
    assert rep.after["SHARD_GRAD_OP"]["calls"]["all_gather"] == 5
    assert rep.after["FSDP1 all-gathers/step, FULL_SHARD and SHARD_GRAD_OP"] == (9, 5)
    brief = rep.brief().splitlines()
    assert len(brief) == 3 and "= 101 calls/step" in brief[0] and "= 14 calls/step" in brief[1]
    assert brief[2].startswith("per-block-zero2 (SHARD_GRAD_OP): 5 all-gathers")


def test_issue_inconsistent_init(seeding):
    for key in ("seed+rank, FSDP2", "seed+rank, FSDP1"):
        assert seeding.before[key]["= single"] is False
        assert seeding.before[key]["max rel. diff from single"].endswith(" %")   # 4.4 %, 2.7 %
    for key in ("same seed for the model, FSDP2", "seed+rank, broadcast_from_rank0, FSDP2",
                "seed+rank, FSDP1 sync_module_states=True"):
        assert seeding.after[key]["= single"] is True, key
    assert seeding.after["sync_module_states broadcasts"] == 5      # one per FSDP1 unit
    # the gathered embedding: rank 0's rows 0-50 and rank 1's rows 51-100
    assert seeding.before["tok_emb rows each rank's init supplies"] == "rank 0: 51, rank 1: 50 (of 101)"
    assert seeding.after["sync_module_states=True on CPU modules"].startswith("ValueError")
    brief = seeding.brief().splitlines()
    assert len(brief) == 3 and brief[0].endswith(" %)") and " % off " in brief[0]
    assert all(line.count("≤ 1e-6 ✓") == want for line, want in zip(brief[1:], (1, 2)))


def test_notebook_07s_reshard_arithmetic_is_fsdp2s_ring_model():
    """07 §3's "the peak rises from 149,800 to 517,600 B ... backward's 4 block all-gathers disappear, 9 → 5
    per step ... those 4 took 41 ms of link time": the granularity table's peaks, and the all-gather bytes
    reshard_after_forward=False drops on 2 ranks, at the clock's default link."""
    from course_utils.harness.model import build_model
    from course_utils.labs.clock import NETWORK
    from course_utils.theory import sharding
    from course_utils.theory.comm import collective_calls
    from notebook_text import cell_output, cell_source
    text = cell_source("07_fsdp.ipynb", "**Memory against time.**")
    m, bw = build_model(device="meta"), NETWORK["bandwidth"]
    gathers = float(sharding.comm_bytes_per_step(m, 2)["all_gather"])
    kept = float(sharding.comm_bytes_per_step(m, 2, reshard_after_forward=False)["all_gather"])
    blocks, dropped = len(m.blocks), gathers - kept
    calls = collective_calls(3, num_blocks=blocks)["all_gather"]
    table = cell_output("07_fsdp.ipynb", "granularity = fsdp_wrapping.measure_granularity(2)")
    peaks = {line.split()[0]: line.split()[2] for line in table.split("peak B")[1].splitlines() if line[:1].isalpha()}
    for figure in (f"the peak rises from {peaks['per-block']} to {peaks['per-block-zero2']} B",
                   f"backward's {blocks} block all-gathers disappear, {calls} → {calls - blocks} per step",
                   f"({bw / 1e6:g} MB/s per rank, 2 ranks) those {blocks} took {dropped / bw * 1e3:.0f} ms of link time",
                   f"about {dropped / bw * 1e3:.0f} ms less, or about as long as before",
                   f"each sends half a block, {dropped / blocks:,.0f} B, in {dropped / blocks / bw * 1e3:.1f} ms"):
        assert figure in text, figure
    assert dropped / blocks == 4 * sum(p.numel() for p in m.blocks[0].parameters()) / 2


def test_notebook_07s_per_leaf_counts_are_the_tables():
    """07 §3's per-leaf line: 33 leaves plus the root, 2·33 + 1 all-gathers and 34 reduce-scatters, as
    the granularity table printed them and as 06's 2L + 1 counts them."""
    from torch import nn
    from course_utils.harness.model import build_model
    from course_utils.theory.comm import collective_calls
    from notebook_text import cell_output, cell_source
    leaves = sum(isinstance(x, (nn.Linear, nn.LayerNorm)) for x in build_model(device="meta").modules())
    row = next(l for l in cell_output("07_fsdp.ipynb", "granularity = fsdp_wrapping.measure_granularity(2)").splitlines()
               if l.startswith("per-leaf")).split()
    ag, rs = 2 * leaves + 1, leaves + 1
    assert row[1] == str(leaves + 1) and row[3:] == [str(ag), "+", str(rs)]
    assert collective_calls(3, num_blocks=leaves) == {"all_reduce": 0, "reduce_scatter": rs, "all_gather": ag}
    text = cell_source("07_fsdp.ipynb", "- **per-leaf**")
    assert (f"{leaves} leaves, plus the root): lower still, but 2·{leaves} + 1 = {ag} all-gathers (notebook 06's 2L + 1) "
            f"and {rs} reduce-scatters, {ag + rs} calls per step") in text


def test_notebook_07s_accumulation_paragraph_is_fsdp2s_bytes():
    """07 §5.5: with set_requires_gradient_sync(False) a rank holds the whole model's gradient, 4 B × Ψ,
    where its FSDP2 shard (rows padded to a multiple of 2) is fsdp_state_bytes' 258,800 B on 2 ranks."""
    from course_utils.harness.model import build_model
    from course_utils.theory import sharding
    from course_utils.theory.config import COURSE_CONFIG
    from notebook_text import cell_source
    text = cell_source("07_fsdp.ipynb", "### 5.5 Gradient accumulation")
    psi, shard = COURSE_CONFIG.num_params(), sharding.fsdp_state_bytes(build_model(device="meta"), 2, 0)["grads"]
    assert f"the whole model's {4 * psi:,} B (4 B × {psi:,}) where its shard is {shard:,} B" in text
