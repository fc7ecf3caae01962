"""course_utils.harness.model: exact parameter counts, deterministic init, forward, data."""
import dataclasses
import math

import pytest
import torch

from course_utils.theory.config import COURSE_CONFIG, PRESETS, TransformerConfig
from course_utils.harness.model import GPT, Block, SyntheticData, build_model, num_params

TINY = dict(hidden=48, layers=2, heads=6, vocab=97, seq=16)
EXTRA_CONFIGS = {
    "gqa-llama-style": TransformerConfig(**TINY, kv_heads=2, ffn=64, tied_embeddings=False, bias=False,
                                         norm="rmsnorm", mlp="swiglu", position="rope"),
    "untied+bias": TransformerConfig(**TINY, tied_embeddings=False),
    "rmsnorm+gelu": TransformerConfig(**TINY, norm="rmsnorm"),
    "layernorm-no-bias": TransformerConfig(**TINY, bias=False),
    "swiglu+bias+learned": TransformerConfig(**TINY, mlp="swiglu", kv_heads=3),
    "rope+tied+bias": TransformerConfig(**TINY, position="rope"),
    "multi-query": TransformerConfig(**TINY, kv_heads=1, position="rope", bias=False),
}
PRESET_CONFIGS = {name: p.config for name, p in PRESETS.items() if p.config is not None}
ALL_CONFIGS = {"course": COURSE_CONFIG, **PRESET_CONFIGS, **EXTRA_CONFIGS}


@pytest.mark.parametrize("name", list(ALL_CONFIGS))
def test_meta_model_has_exactly_config_num_params(name):
    cfg = ALL_CONFIGS[name]
    model = build_model(cfg, device="meta")
    assert num_params(model) == cfg.num_params()
    assert all(p.is_meta for p in model.parameters())


def test_course_model_is_129350_params_with_tied_embedding_counted_once():
    model = build_model()
    assert num_params(model) == COURSE_CONFIG.num_params() == 129_350
    assert not hasattr(model, "lm_head")
    assert len(list(model.parameters())) == 68
    untied = build_model(dataclasses.replace(COURSE_CONFIG, tied_embeddings=False))
    assert num_params(untied) == 129_350 + 101 * 50
    assert untied.lm_head.bias is None


def test_module_names_and_blocks():
    model = build_model(EXTRA_CONFIGS["gqa-llama-style"], device="meta")
    assert isinstance(model.blocks, torch.nn.ModuleList) and all(isinstance(b, Block) for b in model.blocks)
    names = {n for n, _ in model.named_parameters()}
    assert {"tok_emb.weight", "norm_f.weight", "lm_head.weight", "blocks.0.norm1.weight",
            "blocks.0.attn.q_proj.weight", "blocks.0.attn.k_proj.weight", "blocks.0.attn.v_proj.weight",
            "blocks.0.attn.o_proj.weight", "blocks.0.mlp.gate.weight", "blocks.0.mlp.up.weight",
            "blocks.0.mlp.down.weight", "blocks.1.norm2.weight"} <= names
    assert not any("pos_emb" in n or n.endswith("bias") for n in names)
    assert model.blocks[0].attn.k_proj.weight.shape == (2 * 8, 48)     # kv_heads * head_dim
    assert isinstance(model.norm_f, torch.nn.RMSNorm)


@pytest.mark.parametrize("name", list(EXTRA_CONFIGS))
def test_real_build_counts_and_forward_shapes(name):
    cfg = EXTRA_CONFIGS[name]
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    idx = torch.randint(cfg.vocab, (3, cfg.seq))
    assert model(idx).shape == (3, cfg.seq, cfg.vocab)
    assert model(idx[:, :5]).shape == (3, 5, cfg.vocab)
    loss = model(idx, torch.randint(cfg.vocab, (3, cfg.seq)))
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert loss.item() == pytest.approx(math.log(cfg.vocab), abs=0.15)     # small init: near uniform


@pytest.mark.parametrize("name", ["course", "gqa-llama-style"])
def test_attention_is_causal(name):
    cfg = ALL_CONFIGS[name]
    model = build_model(cfg)
    idx = torch.randint(cfg.vocab, (2, cfg.seq))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab
    a, b = model(idx), model(changed)
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1])


def test_init_is_deterministic_and_leaves_global_rng_alone():
    rng = torch.random.get_rng_state()
    a, b, c = build_model(seed=0), build_model(seed=0), build_model(seed=1)
    assert torch.equal(rng, torch.random.get_rng_state())
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if name.endswith("attn.q_proj.weight"):
            assert not torch.equal(pa, pc)
    block = a.blocks[0]
    assert torch.all(block.norm1.weight == 1) and torch.all(block.norm1.bias == 0)
    assert torch.all(block.attn.q_proj.bias == 0)
    assert block.mlp.up.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_bf16_build_is_the_fp32_build_rounded():
    full, half = build_model(), build_model(dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    assert all(torch.equal(p.to(torch.bfloat16), q) for p, q in zip(full.parameters(), half.parameters()))
    x, y = SyntheticData().batch(0)
    loss = half(x, y)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(full(x, y).item(), abs=0.05)


def test_loss_decreases_with_fp32_adamw():
    model, data = build_model(), SyntheticData(global_batch=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(20):
        loss = model(*data.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(101), abs=0.1)
    assert losses[-1] < losses[0] - 0.8


def test_synthetic_data_is_deterministic_shifted_and_in_range():
    data = SyntheticData(global_batch=4, seed=3)
    x, y = data.batch(7)
    assert x.shape == y.shape == (4, COURSE_CONFIG.seq) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert 0 <= int(x.min()) and int(x.max()) < COURSE_CONFIG.vocab
    again = SyntheticData(global_batch=4, seed=3).batch(7)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, data.batch(8)[0])
    assert not torch.equal(x, SyntheticData(global_batch=4, seed=4).batch(7)[0])
    follows_rule = (data.rule[x] == y).float().mean().item()
    assert 0.8 < follows_rule < 0.97          # 10% noise: learnable, not trivial


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shards_of_any_world_size_make_the_global_batch(world_size):
    data = SyntheticData(global_batch=8)
    shards = [data.shard(5, rank, world_size) for rank in range(world_size)]
    x, y = data.batch(5)
    assert torch.equal(torch.cat([s[0] for s in shards]), x)
    assert torch.equal(torch.cat([s[1] for s in shards]), y)
    assert shards[0][0].shape == (8 // world_size, COURSE_CONFIG.seq)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: SyntheticData(global_batch=6).shard(0, 0, 4), ValueError, "cannot be split evenly over 4 ranks"),
    (lambda: SyntheticData().shard(0, 2, 2), ValueError, "rank must be < world_size"),
    (lambda: SyntheticData().shard(0, 0, 0), ValueError, "world_size must be >= 1"),
    (lambda: SyntheticData().batch(-1), ValueError, "step must be >= 0"),
    (lambda: SyntheticData().batch(1.0), TypeError, "step must be an int"),
    (lambda: SyntheticData(global_batch=0), ValueError, "global_batch must be >= 1"),
    (lambda: SyntheticData(noise=2), ValueError, "noise must be"),
    (lambda: SyntheticData({"hidden": 50}), TypeError, "TransformerConfig"),
    (lambda: build_model("gpt2"), TypeError, "TransformerConfig"),
    (lambda: build_model(seed=-1), ValueError, "seed must be >= 0"),
    (lambda: build_model(seed=1.5), TypeError, "seed must be an int"),
    (lambda: build_model(dtype=torch.int64), TypeError, "floating torch.dtype"),
    (lambda: build_model(dtype="bf16"), TypeError, "floating torch.dtype"),
    (lambda: build_model(device=0), TypeError, "device must be"),
    (lambda: GPT(TransformerConfig(hidden=9, layers=1, heads=3, vocab=11, seq=4, position="rope")),
     ValueError, "even head_dim"),
    (lambda: num_params("model"), TypeError, "nn.Module"),
])
def test_bad_arguments_get_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_bad_forward_inputs():
    model = build_model()
    idx = torch.zeros(2, COURSE_CONFIG.seq + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="longer than config.seq=32"):
        model(idx)
    with pytest.raises(TypeError, match="LongTensor of shape"):
        model(torch.zeros(2, 4))
    with pytest.raises(TypeError, match="LongTensor of shape"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must have the shape"):
        model(idx[:, :4], idx[:, :3])
