"""course_utils.memory contract: RECIPES and model_states."""
import pytest

from course_utils.memory import GB, GiB, RECIPES, fmt_bytes, model_states, to_unit


def test_recipes_contract():
    assert RECIPES["fp32"] == (4, 4, 8)
    assert RECIPES["mixed"] == (2, 2, 12)
    assert RECIPES["mixed-fp32-grads"] == (2, 4, 12)


@pytest.mark.parametrize("stage, params, grads, opt, total", [
    (0, 14, 14, 84, 112), (1, 14, 14, 21, 49), (2, 14, 3.5, 21, 38.5), (3, 3.5, 3.5, 21, 28)])
def test_seed_7b_on_4_gpus(stage, params, grads, opt, total):
    ms = model_states(7e9, world_size=4, stage=stage, recipe="mixed")
    assert (ms.params / GB, ms.grads / GB, ms.optimizer / GB, ms.total / GB) == (params, grads, opt, total)


def test_paper_and_megatron_recipes():
    assert model_states(7.5e9, world_size=64, stage=0).total == 120e9          # ZeRO paper Fig. 1
    assert model_states(7.5e9, world_size=64, stage=3).total == 1.875e9
    assert model_states(1.56e9, recipe="mixed-fp32-grads").total == pytest.approx(28.08e9)  # 18 B/param
    assert model_states(10, world_size=3, stage=3, recipe="fp32").params == pytest.approx(40 / 3)


def test_units_are_labelled():
    assert fmt_bytes(28e9) == "28.0 GB"
    assert fmt_bytes(2**30, "GiB", 2) == "1.00 GiB"
    assert to_unit(GiB, "GB") == pytest.approx(1.073741824)
    with pytest.raises(ValueError, match="unit must be one of"):
        to_unit(1, "gb")


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(num_params=0), ValueError, "num_params must be > 0"),
    (dict(num_params=-5), ValueError, "num_params must be > 0"),
    (dict(num_params="7B"), TypeError, "num_params must be a number"),
    (dict(num_params=7e9, world_size=0), ValueError, "world_size must be >= 1"),
    (dict(num_params=7e9, world_size=2.0), TypeError, "world_size must be an int"),
    (dict(num_params=7e9, stage=4), ValueError, "stage must be 0"),
    (dict(num_params=7e9, recipe="bf16"), ValueError, "unknown recipe"),
])
def test_bad_input_gets_clear_errors(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        model_states(**kwargs)
