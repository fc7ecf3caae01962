"""course_utils.labs.accumulation: one step of k = 4 micro-batches on 2 ranks, per setup.

Calls and ring-model bytes (the ledger) and gradient bytes held between micro-batches
(storages) are exact. The wire (the kernel's socket counters) is within 2 % of what gloo's
algorithms send for the same calls: gloo adds its own headers and control messages
(tests/test_wire.py)."""
import pytest

from course_utils.labs import accumulation as acc
from course_utils.runtime import wire

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PSI, K = 129_350, 4
RS_RING = 258_700                    # (N-1)/N x 4 B x PSI on 2 ranks (no padding: PSI is even)


@pytest.fixture(scope="module")
def result():
    return acc.measure_accumulation(world_size=2, micro_batches=K)


def test_every_setup_equals_its_prediction(result):
    assert list(result["setups"]) == list(acc.SETUPS)
    for name, r in result["setups"].items():
        want = r["predicted"]
        assert r["calls"] == want["calls"], name
        assert r["ring_bytes"] == want["ring_bytes"], name
        assert r["gloo_bytes"] == want["gloo_bytes"], name              # from the records
        assert r["grad_bytes"][:K - 1] == [want["grad_bytes_between"]] * (K - 1), name
        if wire.wire_available():
            assert abs(r["wire_bytes"] - r["gloo_bytes"]) <= acc.WIRE_TOL * r["gloo_bytes"], name


def test_the_trade_in_numbers(result):
    s = result["setups"]
    # ZeRO-2: a reduce-scatter per micro-batch, nothing in between held but the shard
    assert [m["reduce_scatter"] for m in s["zero2"]["calls_per_micro_batch"]] == [1] * K
    assert s["zero2"]["ring_bytes"] == {"all_reduce": 0, "reduce_scatter": K * RS_RING, "all_gather": RS_RING}
    assert s["zero2"]["grad_bytes"] == [4 * PSI // 2] * K
    # DDP's no_sync: one all-reduce (2 x the reduce-scatter's ring bytes), full gradients held
    assert s["ddp-no_sync"]["ring_bytes"]["all_reduce"] == 2 * RS_RING
    assert s["ddp-no_sync"]["grad_bytes"] == [4 * PSI] * K
    assert s["ddp"]["ring_bytes"]["all_reduce"] == K * 2 * RS_RING
    # ZeRO-3: 9 gathers and 5 reduce-scatters in every micro-batch, none in step()
    assert s["zero3"]["calls_per_micro_batch"] == [{"all_reduce": 0, "reduce_scatter": 5, "all_gather": 9}] * K
    assert s["zero3"]["calls_in_step"] == {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    # FSDP2 without sync: reduce-scatters only in the last micro-batch, full gradients between
    assert [m["reduce_scatter"] for m in s["fsdp2-no_sync"]["calls_per_micro_batch"]] == [0] * (K - 1) + [5]
    assert [m["reduce_scatter"] for m in s["fsdp2"]["calls_per_micro_batch"]] == [5] * K
    assert s["fsdp2-no_sync"]["grad_bytes"][:K - 1] == [4 * PSI] * (K - 1)
    assert s["fsdp2"]["grad_bytes"][0] == 258_800            # padded dim-0 shards
    assert (s["fsdp2"]["ring_bytes"]["reduce_scatter"]
            == K * s["fsdp2-no_sync"]["ring_bytes"]["reduce_scatter"])
    table = acc.accumulation_table(result)
    assert "✗" not in table
    assert table.count("✓") == (4 if wire.wire_available() else 3) * len(s) + 2    # + the legend


def test_bad_input_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="setups must be a non-empty selection"):
        acc.measure_accumulation(["zero4"])
    with pytest.raises(ValueError, match="divisible by 10"):
        acc.measure_accumulation(world_size=2, micro_batches=5)
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        acc.measure_accumulation(world_size=1)
    with pytest.raises(TypeError, match="micro_batches must be an int"):
        acc.predicted("zero2", micro_batches=2.0)
    with pytest.raises(TypeError, match="what measure_accumulation"):
        acc.accumulation_table({})
    with pytest.raises(ValueError, match="sync_off must be one of"):
        acc.accumulate(None, [(1, 2)], sync_off="no-sync")
    with pytest.raises(ValueError, match="micro_batches is empty"):
        acc.accumulate(None, [])
