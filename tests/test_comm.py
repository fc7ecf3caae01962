"""course_utils.theory.comm: ring volumes per rank, the paper's convention, call counts."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.theory.comm import collective_bytes, collective_calls, comm_volume, paper_volume, ring_factor


def test_seven_b_on_four_ranks():
    m = 7e9 * 2
    assert comm_volume(7e9, world_size=4, stage=0) == {
        "all_reduce": 2 * 0.75 * m, "reduce_scatter": 0, "all_gather": 0, "total": 1.5 * m}
    for stage in (1, 2):
        v = comm_volume(7e9, world_size=4, stage=stage)
        assert v["reduce_scatter"] == v["all_gather"] == 0.75 * m and v["total"] == 1.5 * m
    v3 = comm_volume(7e9, world_size=4, stage=3)
    assert v3["all_gather"] == 1.5 * m and v3["reduce_scatter"] == 0.75 * m
    assert v3["total"] == 1.5 * comm_volume(7e9, world_size=4, stage=0)["total"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**11), st.integers(1, 1024), st.sampled_from([1, 2, 4]))
def test_zero12_equal_ddp_and_zero3_is_one_and_a_half(n, world, b):
    ddp = comm_volume(n, world_size=world, stage=0, bytes_per_elem=b)["total"]
    assert comm_volume(n, world_size=world, stage=1, bytes_per_elem=b)["total"] == pytest.approx(ddp)
    assert comm_volume(n, world_size=world, stage=2, bytes_per_elem=b)["total"] == pytest.approx(ddp)
    assert comm_volume(n, world_size=world, stage=3, bytes_per_elem=b)["total"] == pytest.approx(1.5 * ddp)


def test_ring_factor_and_single_rank():
    assert ring_factor(1) == 0 and ring_factor(4) == 0.75
    assert comm_volume(1e9, world_size=1, stage=3)["total"] == 0
    assert collective_bytes("all_reduce", 100, 4) == 150
    assert collective_bytes("all_gather", 100, 4) == collective_bytes("reduce_scatter", 100, 4) == 75


def test_paper_convention():
    assert paper_volume(7e9, stage=0) == paper_volume(7e9, stage=2) == 14e9
    assert paper_volume(7e9, stage=3) == 21e9
    # the ring volume tends to the paper's figure (in elements) as N grows
    assert comm_volume(7e9, world_size=10**6, stage=3, bytes_per_elem=1)["total"] == pytest.approx(21e9, rel=1e-5)


def test_zero3_last_layer_not_regathered():
    full = comm_volume(1e9, world_size=8, stage=3, num_layers=24)["all_gather"]
    skip = comm_volume(1e9, world_size=8, stage=3, num_layers=24, skip_last_regather=True)["all_gather"]
    assert skip == pytest.approx(full * 47 / 48)
    assert collective_calls(3, num_layers=24) == {"all_reduce": 0, "reduce_scatter": 24, "all_gather": 48}
    assert collective_calls(3, num_layers=24, skip_last_regather=True)["all_gather"] == 47
    assert collective_calls(0, buckets=3) == {"all_reduce": 3, "reduce_scatter": 0, "all_gather": 0}
    assert collective_calls(2, buckets=2) == {"all_reduce": 0, "reduce_scatter": 2, "all_gather": 2}


def test_seed_000_zero3_exercise_counts_every_layer():
    """24 layers of 1B params in bf16 on N ranks: every layer's grads are reduce-scattered."""
    calls = collective_calls(3, num_layers=24, skip_last_regather=True)
    per_layer = 1e9 * 2
    seed_total = (47 + 1) * per_layer            # 000: 47 all-gathers + ONE reduce-scatter
    right_total = (calls["all_gather"] + calls["reduce_scatter"]) * per_layer
    assert right_total - seed_total == 23 * per_layer


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(num_params=0, world_size=2, stage=0), ValueError, "num_params must be"),
    (dict(num_params=1e9, world_size=0, stage=0), ValueError, "world_size must be >= 1"),
    (dict(num_params=1e9, world_size=2.5, stage=0), TypeError, "world_size must be an int"),
    (dict(num_params=1e9, world_size=2, stage=5), ValueError, "stage must be"),
    (dict(num_params=1e9, world_size=2, stage=0, bytes_per_elem=0), ValueError, "bytes_per_elem"),
    (dict(num_params=1e9, world_size=2, stage=2, skip_last_regather=True), ValueError, "only applies to ZeRO-3"),
    (dict(num_params=1e9, world_size=2, stage=3, skip_last_regather=True), ValueError, "needs num_layers"),
])
def test_bad_input(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        comm_volume(**kwargs)
    with pytest.raises(ValueError):
        collective_bytes("broadcast", 1, 2)


def test_zero3_calls_counted_in_blocks():
    """The course's convention: L blocks + a root unit; the root kept gathered by default."""
    assert collective_calls(3, num_blocks=4) == {"all_reduce": 0, "reduce_scatter": 5, "all_gather": 9}
    assert collective_calls(3, num_blocks=4, reshard_root=True)["all_gather"] == 10
    for L in (1, 4, 32):
        assert collective_calls(3, num_blocks=L) == collective_calls(3, num_layers=L + 1, skip_last_regather=True)
        assert collective_calls(3, num_blocks=L, reshard_root=True) == collective_calls(3, num_layers=L + 1)
    with pytest.raises(ValueError, match="either num_blocks"):
        collective_calls(3, num_blocks=4, num_layers=5)
    with pytest.raises(ValueError, match="reshard_root needs num_blocks"):
        collective_calls(3, num_layers=5, reshard_root=True)
    with pytest.raises(ValueError, match="stage=3"):
        collective_calls(2, num_blocks=4)
    with pytest.raises(ValueError, match="num_blocks"):
        collective_calls(3, num_blocks=0)
