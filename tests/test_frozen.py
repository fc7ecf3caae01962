"""Fine-tuning with frozen weights (notebook 12 §6): the course GPT with LoRA-style adapters on
a frozen base, on 2 and 3 gloo ranks under DDP, ZeRO-1/2, Zero3 and FSDP2 (its frozen base
sharded, or left whole with ``ignored_params``). Each rank holds exactly the bytes predicted
from the trainable and frozen parameters' sizes (``experiments.state_bytes``), and one
micro-batch's all-gathers are exactly the predicted calls and ring-model bytes.

On 3 ranks nothing divides: an adapter's A has 4 rows, the token embedding 101, and with
the final norm's weight trained too the flat buffers hold 14,450 elements (ZeRO's padding,
a Zero3 root unit of 50).
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils.harness import experiments
from course_utils.harness.model import SyntheticData, build_model
from course_utils.runtime.launch import launch
from course_utils.runtime.ledger import CommLedger
from course_utils.theory import sharding, zero
from course_utils.theory.comm import collective_bytes
from course_utils.theory.layout import dim0_padded_numel, padded_numel, shard_bounds

pytestmark = pytest.mark.usefixtures("no_leftover_children")

SETUPS = {"ddp": ("ddp", False), "zero1": ("zero1", False), "zero2": ("zero2", False),
          "zero3": ("zero3", False), "fsdp2": ("torch-fsdp", False), "fsdp2 ignored": ("torch-fsdp", True)}


class LoRA(nn.Module):
    """``base(x) + x Aᵀ Bᵀ``: a frozen Linear plus a trainable rank-``r`` update (B starts at 0)."""

    def __init__(self, base: nn.Linear, r: int = 4):
        super().__init__()
        self.base = base
        self.A = nn.Parameter(torch.randn(r, base.in_features) / base.in_features)
        self.B = nn.Parameter(torch.zeros(base.out_features, r))

    def forward(self, x):
        return self.base(x) + x @ self.A.t() @ self.B.t()


def lora_gpt(r: int = 4, train_norm: bool = False) -> nn.Module:
    model = build_model(seed=0).requires_grad_(False)
    for block in model.blocks:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LoRA(child, r))
    model.norm_f.weight.requires_grad_(train_norm)
    return model


def _fine_tune(strategy, ignore_frozen, train_norm, micro_batches=2):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = lora_gpt(train_norm=train_norm)
    options = {}
    if ignore_frozen:
        options["fully_shard_kwargs"] = {"ignored_params": {p for p in model.parameters() if not p.requires_grad}}
    model, opt = experiments.wrap(strategy, model, experiments.make_adamw, **options)
    data = SyntheticData(global_batch=12, seed=0)
    for step in range(micro_batches):
        with CommLedger() as ledger:                  # the last micro-batch's collectives
            model(*data.shard(step, rank, world)).backward()
    opt.step()
    return experiments.state_bytes(model, opt), ledger.counts(), ledger.totals()


def predicted_state_bytes(model, setup: str, n: int, rank: int) -> dict:
    """fp32 + AdamW: frozen parameters cost 4 B each (whole, or their dim-0 shard under FSDP2);
    trainable ones params + grads + m + v, sharded as the strategy shards them, and a 4-byte
    step counter per tensor the optimizer updates."""
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    T, F, k = sum(p.numel() for p in trained), sum(p.numel() for p in frozen), len(trained)
    if setup == "ddp":
        return {"params": 4 * (F + T), "grads": 4 * T, "optimizer": 8 * T + 4 * k}
    if setup in ("zero1", "zero2"):                   # one bucket of T elements
        return zero.expected_state_bytes([T], n, int(setup[-1]), frozen_bytes=4 * F)
    if setup == "zero3":                              # a flat unit per block (and root), frozen whole
        units = [sum(p.numel() for p in ps) for _, ps in sharding.find_units(model) if ps]
        shard = sum(padded_numel(u, n) for u in units) // n
        mine = sum(max(0, min(hi, u) - lo) for u in units for lo, hi in [shard_bounds(u, n, rank)])
        return {"params": 4 * F + 4 * shard, "grads": 4 * shard, "optimizer": 8 * mine + 4 * k}
    out = sharding.fsdp_state_bytes(model, n, rank)   # the trainable dim-0 shards
    out["params"] += 4 * F if setup == "fsdp2 ignored" else 4 * sum(dim0_padded_numel(p.shape, n) for p in frozen) // n
    return out


def predicted_gathers(model, n: int, *, frozen_sharded: bool, flat: bool = False) -> tuple[int, float]:
    """One micro-batch's all-gathers: the root's parameters (embeddings, final norm) gathered once,
    each block's twice (forward, backward); a unit is padded dim 0 by dim 0 (FSDP2) or as one
    ``flat`` buffer (Zero3); only units with parameters to gather issue a call."""
    def padded(params):
        ps = [p for p in params if frozen_sharded or p.requires_grad]
        if flat:
            return padded_numel(sum(p.numel() for p in ps), n)
        return sum(dim0_padded_numel(p.shape, n) for p in ps)
    in_blocks = {id(p) for p in model.blocks.parameters()}
    blocks = [padded(b.parameters()) for b in model.blocks]
    root = padded(p for p in model.parameters() if id(p) not in in_blocks)
    calls = 2 * sum(b > 0 for b in blocks) + (root > 0)
    return calls, collective_bytes("all_gather", 4 * (root + 2 * sum(blocks)), n)


@pytest.mark.parametrize("world_size, train_norm", [(2, False), (3, True)])
def test_state_bytes_and_gathers_equal_the_prediction(world_size, train_norm):
    model = lora_gpt(train_norm=train_norm)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == 14_400 + 50 * train_norm and (trained % world_size != 0) == train_norm
    for setup, (strategy, ignore) in SETUPS.items():
        results = launch(_fine_tune, world_size, strategy, ignore, train_norm, quiet=True)
        for rank, (held, counts, totals) in enumerate(results):
            assert held == predicted_state_bytes(model, setup, world_size, rank), (setup, rank)
            if setup.startswith("fsdp2"):
                calls, sent = predicted_gathers(model, world_size, frozen_sharded=setup == "fsdp2")
                assert (counts["all_gather"], totals["all_gather"]) == (calls, sent), (setup, rank)
                assert counts["reduce_scatter"] == 4 + train_norm    # only units with trainable tensors
            if setup == "zero3":                       # frozen weights are never sent
                calls, sent = predicted_gathers(model, world_size, frozen_sharded=False, flat=True)
                assert (counts["all_gather"], totals["all_gather"]) == (calls, sent), rank


def test_lora_gpt_starts_as_the_base_model():
    x, y = SyntheticData(global_batch=2, seed=0).shard(0, 0, 1)
    assert torch.equal(lora_gpt()(x, y), build_model(seed=0)(x, y))


def test_model_states_trainable_fraction():
    from course_utils.theory.memory import model_states
    full = model_states(1000, world_size=4, stage=3, recipe="mixed")
    lora = model_states(1000, world_size=4, stage=3, recipe="mixed", trainable=0.25)
    assert (lora.params, lora.grads, lora.optimizer) == (full.params, full.grads / 4, full.optimizer / 4)
    assert model_states(1000, recipe="fp32", trainable=1).total == 16_000
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="trainable"):
            model_states(1000, trainable=bad)
    # the course GPT with rank-4 adapters, fp32 + AdamW on 2 ranks: the strategies that lay
    # nothing out per tensor hold model_states plus AdamW's step counters (48 tensors, 1 bucket)
    model = lora_gpt()
    T = sum(p.numel() for p in model.parameters() if p.requires_grad)
    F = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    for setup, stage, counters in (("ddp", 0, 48), ("zero1", 1, 1), ("zero2", 2, 1)):
        predicted = sum(predicted_state_bytes(model, setup, 2, 0).values())
        ms = model_states(F + T, world_size=2, stage=stage, recipe="fp32", trainable=T / (F + T))
        assert predicted == ms.total + 4 * counters, setup
