"""course_utils.theory.memory contract: RECIPES and model_states."""
import pytest

from course_utils.theory.memory import GB, GiB, RECIPES, fmt_bytes, model_states, to_unit


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


from hypothesis import given, settings
from hypothesis import strategies as st

from course_utils.theory.config import PRESETS
from course_utils.theory.memory import activation_bytes, per_gpu, placement

psi = st.integers(min_value=1, max_value=10**12)
ranks = st.integers(min_value=1, max_value=4096)
recipes = st.sampled_from(sorted(RECIPES))


def test_zero_paper_figure_1():
    """Ψ = 7.5B, N_d = 64, K = 12: 120, 31.4, 16.6 and 1.9 GB per GPU."""
    totals = [model_states(7.5e9, world_size=64, stage=s).total / GB for s in range(4)]
    assert totals == [120, 31.40625, 16.640625, 1.875]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]


def test_gpt2_xl_at_18_bytes():
    assert model_states(PRESETS["gpt2-xl"].num_params, recipe="mixed-fp32-grads").total == 1_557_611_200 * 18
    assert round(model_states(1.56e9, recipe="mixed-fp32-grads").total / GB, 2) == 28.08


def test_seed_000_shards_too_little_in_zero1():
    """Seed 000's ZeRO-1 keeps the 4 B fp32 master unsharded: 13B on 8 GPUs."""
    seed = (13e9 * 16 - 13e9 * 8 * (1 - 1 / 8))          # their formula, in bytes
    ours = model_states(13e9, world_size=8, stage=1).total
    assert ours < seed and seed - ours == 13e9 * 4 * (1 - 1 / 8)


def test_seed_004_percentages():
    """004's ~75/50/33 %: with K = 12 on 3 GPUs it is 50 / 41.7 / 33.3 % of DDP."""
    ddp = model_states(1e9, world_size=3, stage=0).total
    pct = [round(100 * model_states(1e9, world_size=3, stage=s).total / ddp, 1) for s in (1, 2, 3)]
    assert pct == [50.0, 41.7, 33.3]


@settings(max_examples=200, deadline=None)
@given(psi, ranks, recipes)
def test_more_sharding_never_uses_more_memory(n, world, recipe):
    totals = [model_states(n, world_size=world, stage=s, recipe=recipe).total for s in range(4)]
    assert all(a >= b for a, b in zip(totals, totals[1:]))


@settings(max_examples=200, deadline=None)
@given(psi, ranks, recipes)
def test_stage3_times_n_is_the_ddp_total(n, world, recipe):
    s3 = model_states(n, world_size=world, stage=3, recipe=recipe).total
    s0 = model_states(n, world_size=1, stage=0, recipe=recipe).total
    assert abs(s3 * world - s0) <= 1e-6 * s0


@settings(max_examples=200, deadline=None)
@given(psi, recipes, st.sampled_from([0, 1, 2, 3]))
def test_one_rank_is_ddp_for_every_stage(n, recipe, stage):
    assert model_states(n, world_size=1, stage=stage, recipe=recipe).total == \
        model_states(n, world_size=1, stage=0, recipe=recipe).total


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([p for p in PRESETS if PRESETS[p].config]), st.integers(1, 64),
       st.sampled_from(["standard", "flash"]), st.sampled_from(["none", "selective", "full"]))
def test_activations_grow_linearly_in_batch(name, b, attention, recompute):
    one = activation_bytes(name, micro_batch=1, attention=attention, recompute=recompute).total
    assert activation_bytes(name, micro_batch=b, attention=attention, recompute=recompute).total == b * one


def test_korthikanti_formula():
    cfg = PRESETS["gpt2-xl"].config
    s, b, h, a = 1024, 2, cfg.hidden, cfg.heads
    full = activation_bytes(cfg, micro_batch=b, seq=s)
    assert full.per_layer == s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes(cfg, micro_batch=b, seq=s, attention="flash").per_layer == 34 * s * b * h
    assert activation_bytes(cfg, micro_batch=b, seq=s, recompute="selective").per_layer == 34 * s * b * h
    assert activation_bytes(cfg, micro_batch=b, seq=s, recompute="full").per_layer == 2 * s * b * h
    assert full.logits == 4 * s * b * cfg.vocab
    assert full.total == cfg.layers * full.per_layer + 5 * s * b * h + 4 * s * b * cfg.vocab \
        + 8 * s * b * cfg.vocab                    # F.cross_entropy's two fp32 gradients
    fused = activation_bytes(cfg, micro_batch=b, seq=s, cross_entropy="fused")
    assert fused.total == cfg.layers * full.per_layer + 5 * s * b * h + 4 * s * b * cfg.vocab


def test_offload_placement():
    ms = model_states(1e9, world_size=8, stage=2)
    p = placement(ms, offload_optimizer=True)
    assert p.gpu == 2e9 and p.on_cpu == ("grads", "optimizer") and p.total == ms.total
    assert placement(model_states(1e9, world_size=8, stage=1), offload_optimizer=True).on_gpu == ("params", "grads")
    p3 = placement(model_states(1e9, world_size=8, stage=3), offload_params=True)
    assert p3.gpu == 0 and p3.cpu == model_states(1e9, world_size=8, stage=3).total
    with pytest.raises(ValueError, match="offload_params needs stage=3"):
        placement(ms, offload_params=True)
    with pytest.raises(ValueError, match="offload_optimizer needs a ZeRO stage"):
        placement(model_states(1e9), offload_optimizer=True)
    with pytest.raises(TypeError):
        placement(1e9)


def test_per_gpu_adds_activations_and_respects_offload():
    m = per_gpu("llama-2-7b", world_size=4, stage=3, micro_batch=2, seq=1024, attention="flash")
    acts = activation_bytes("llama-2-7b", micro_batch=2, seq=1024, attention="flash")
    assert m.total == model_states(PRESETS["llama-2-7b"].num_params, world_size=4, stage=3).total + acts.total
    off = per_gpu("llama-2-7b", world_size=4, stage=3, micro_batch=None, offload_params=True)
    assert off.total == 0 and off.cpu > 0
    with pytest.raises(ValueError, match="activations need an architecture"):
        per_gpu(7e9, micro_batch=1)
    with pytest.raises(ValueError, match="gives only a parameter count"):
        per_gpu("zero-paper-7.5b", micro_batch=1)
    assert per_gpu("zero-paper-7.5b", world_size=64, stage=3, micro_batch=None).total == 1.875e9


@pytest.mark.parametrize("kwargs, words", [
    (dict(micro_batch=0), r"micro_batch must be >= 1 \(sequences per GPU"),
    (dict(micro_batch=1, seq=0), r"seq must be >= 1 \(tokens per sequence"),
    (dict(micro_batch=1, attention="sparse"), "attention must be one of"),
    (dict(micro_batch=1, recompute="some"), "recompute must be one of"),
])
def test_activation_input_errors(kwargs, words):
    with pytest.raises(ValueError, match=words):
        activation_bytes("gpt2-xl", **kwargs)
    with pytest.raises(TypeError, match="TransformerConfig"):
        activation_bytes(3.0, micro_batch=1)


def test_llama_3_1_presets_have_the_published_counts_and_work_everywhere():
    """8,030,261,248 / 70,553,706,496 / 405,853,388,800: the sums of the HF checkpoints'
    tensors (configs meta-llama/Llama-3.1-*): GQA with 8 KV heads, 128,256 tokens, untied."""
    from course_utils.course.calculator import PlannerSetting, Setting
    from course_utils.theory import planner

    published = {"llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496,
                 "llama-3.1-405b": 405_853_388_800}
    for name, count in published.items():
        assert PRESETS[name].num_params == PRESETS[name].config.num_params() == count
        assert per_gpu(name, world_size=8, stage=3, micro_batch=1, seq=4096, attention="flash").total > 0
        Setting(model=name)                                   # the calculator accepts it
        PlannerSetting(model=name, gpus_per_node=8, nodes=2, global_batch=64)
    assert planner.plan("llama-3.1-8b", gpu_mem_gb=80, gpus_per_node=8, nodes=1, intra_bw_gbps=450,
                        inter_bw_gbps=50, seq_len=8192, global_batch=64)


def test_torch_amp_layout_shards_less_in_zero1_than_deepspeeds():
    """The same 16 bytes per parameter, held differently: torch's fp32 parameter is the
    master, so its ZeRO-1 (ZeroRedundancyOptimizer) shards 8 of them, DeepSpeed's 12."""
    psi = PRESETS["llama-2-7b"].num_params
    torch_z1 = model_states(psi, world_size=8, stage=1, recipe="torch-amp")
    ds_z1 = model_states(psi, world_size=8, stage=1, recipe="mixed")
    assert torch_z1.total == psi * (4 + 4 + 1) and ds_z1.total == psi * (2 + 2 + 1.5)
    assert round(torch_z1.total / 1e9, 1) == 60.6 and round(ds_z1.total / 1e9, 1) == 37.1
    for stage in (0, 3):
        assert model_states(psi, world_size=8, stage=stage, recipe="torch-amp").total == \
            model_states(psi, world_size=8, stage=stage, recipe="mixed").total
