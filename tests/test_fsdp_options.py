"""tests/fsdp_checks.py: FSDP2's options run on gloo ranks, measured against predictions.

Each option is run for real (2-4 gloo ranks) and checked against numbers derived by hand
below, independently of the module's own prediction code:

* message sizes of FSDP2 (elements; each parameter's dim 0 padded to a multiple of N, see
  tests/test_fsdp.py): root 6852 / 6904, block 31110 / 31468 for N = 3 / 4; 129,350
  parameters; 4 blocks; 68 parameter tensors.
* bytes one rank sends per step (ring): all-gather (N-1)/N · b · (M_root + g·4·M_block) with
  b = 4 (fp32) or 2 (bf16 params), g = 2 (True) or 1 (False); reduce-scatter in fp32.
* activations the course GPT saves for backward, fp32, b sequences of s = 32 tokens,
  h = 50, a = 5 heads, V = 101: per block 4·(16·s·b·h + 4·b·s + a·b·s) bytes (8 tensors of
  s·b·h, 2 of 4·s·b·h, two LayerNorms' mean and 1/std, the attention's logsumexp); with
  checkpointing only the block input, 4·s·b·h; outside the blocks 4·(2·s·b·h + s·b·V +
  2·b·s) + 8·(2·b·s + s) + 4.

Numel not divisible by N: N = 3 and 4 (the 101-row embedding, 50- and 200-row weights).
"""
import math
from fractions import Fraction

import pytest
import torch

import fsdp_checks as fo
from fsdp_checks import Check, OptionResult

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PSI, LAYERS, TENSORS = 129_350, 4, 68
M_ROOT = {3: 6_852, 4: 6_904}
M_BLOCK = {3: 31_110, 4: 31_468}
S, H, A, V = 32, 50, 5, 101


def ring(n, message):
    return Fraction(n - 1, n) * message


# ------------------------------------------------------------------ no processes

def test_check_ops_and_table():
    assert Check("a", 3, 3).ok and not Check("a", 3, 4).ok
    assert Check("b", 1.0, 2.0, op="<=").ok and not Check("b", 3.0, 2.0, op="<=").ok
    assert Check("c", 1.05, 1.0, op="~", rel_tol=0.1).ok
    assert not Check("c", 1.2, 1.0, op="~", rel_tol=0.1).ok
    assert Check("d", 1, 0, op=">").ok and Check("e", 2, 2, op=">=").ok
    assert Check("f", None, None).ok is None
    r = OptionResult("opt", "2 ranks, gloo on CPU", [Check("x", 1, 1), Check("y", 1, 2)], {})
    assert not r.ok and "DIFFERS" in repr(r) and "2 ranks, gloo on CPU" in r.table()
    assert r.check("x").ok
    with pytest.raises(KeyError):
        r.check("z")


@pytest.mark.parametrize("call, error", [
    (lambda: fo.measure_mixed_precision(1), ValueError),
    (lambda: fo.measure_mixed_precision(5), ValueError),
    (lambda: fo.measure_mixed_precision(2.0), TypeError),
    (lambda: fo.measure_cpu_offload(2, steps=0), ValueError),
    (lambda: fo.measure_reshard_after_forward(4, settings=(3,)), ValueError),
    (lambda: fo.measure_reshard_after_forward(4, settings=(1,)), ValueError),
    (lambda: fo.measure_reshard_after_forward(4, settings=("yes",)), TypeError),
    (lambda: fo.measure_prefetch(2, depth=0), ValueError),
    (lambda: fo.measure_prefetch(2, depth=4), ValueError),
    (lambda: fo.measure_gradient_clipping(2, max_norm=0), ValueError),
    (lambda: fo.measure_gradient_accumulation(2, micro_batches=4), ValueError),
    (lambda: fo.measure_gradient_accumulation(2, micro_batches=1), ValueError),
    (lambda: fo.shard_model("model"), TypeError),
    (lambda: fo.predicted_saved_activation_bytes(0, checkpointed=False), ValueError),
])
def test_arguments_are_checked(call, error):
    with pytest.raises(error):
        call()


def test_shard_model_needs_torch_distributed():
    from course_utils.harness.model import build_model

    with pytest.raises(RuntimeError, match="launch"):
        fo.shard_model(build_model())


def test_predictions_match_hand_derivations():
    b = 6
    sbh = S * b * H
    per_block = 4 * (16 * sbh + 4 * b * S + A * b * S)
    outside = 4 * (2 * sbh + S * b * V + 2 * b * S) + 8 * (2 * b * S + S) + 4
    assert fo.predicted_saved_activation_bytes(b, checkpointed=False) == {
        "per_block": per_block, "outside": outside, "total": LAYERS * per_block + outside}
    assert fo.predicted_saved_activation_bytes(b, checkpointed=True)["per_block"] == 4 * sbh
    block = 4 * H * H + 2 * H * 4 * H
    forward = 2 * b * S * (LAYERS * block + V * H)
    assert fo.matmul_flops_per_step(b, checkpointed=False) == 3 * forward
    recompute = 2 * b * S * LAYERS * (block - 4 * H * H)          # all but the down projection
    assert fo.matmul_flops_per_step(b, checkpointed=True) == 3 * forward + recompute
    order = fo.predicted_prefetch_order(4, 0, 1)
    assert order[:3] == ["AG root", "fwd block0", "AG block0"] and order[-1] == "RS root"
    assert order.count("AG block2") == 2 and order.count("RS block1") == 1


# ------------------------------------------------------------------ 1. mixed precision

def test_mixed_precision_halves_all_gathers_keeps_fp32_state():
    n = 3                                                  # 101-row embedding: padded
    r = fo.measure_mixed_precision(n, steps=2)
    assert r.ok, r.table()
    assert r.where == "3 ranks, gloo on CPU"
    fp, bf = r.details["fp32"], r.details["bf16"]
    fp32 = ring(n, 4 * (M_ROOT[n] + 2 * LAYERS * M_BLOCK[n]))
    assert fp["comm"]["all_gather"] == fp32 == 681_952
    assert bf["comm"]["all_gather"] == fp32 / 2
    assert bf["comm"]["reduce_scatter"] == fp["comm"]["reduce_scatter"] \
        == ring(n, 4 * (M_ROOT[n] + LAYERS * M_BLOCK[n]))
    assert fp["same_every_step"] and bf["same_every_step"]
    assert bf["stored"] == {"param": ["float32"], "grad": ["float32"], "optimizer": ["float32"]}
    assert bf["inside_forward"] == {"weight": "bfloat16", "input": "bfloat16"}
    assert fp["inside_forward"] == {"weight": "float32", "input": "float32"}
    diffs = r.details["loss_differences"]
    assert 0 < max(diffs) and max(a / b for a, b in zip(diffs, fp["losses"])) < 2 ** -8


# ------------------------------------------------------------------ 2. CPU offload

def test_cpu_offload_same_losses_states_on_cpu():
    r = fo.measure_cpu_offload(2, steps=2)
    assert r.ok, r.table()
    d = r.details
    off, base = d["CPUOffloadPolicy"], d["no offload"]
    assert off["losses"] == base["losses"]                     # bit for bit
    for key in ("param", "grad", "optimizer"):
        assert off["stored"][key] == ["cpu"]
    assert off["stored"]["bytes"] == base["stored"]["bytes"]
    assert d["device"] == "cpu" and r.check("device B saved (measured on GPUs only)").measured is None
    if not torch.cuda.is_available():
        assert d["pin_memory=True"].startswith("RuntimeError")


# ------------------------------------------------------------------ 3. reshard_after_forward

def test_reshard_after_forward_true_false_int():
    n = 4
    r = fo.measure_reshard_after_forward(n, settings=(True, False, 2), steps=1)
    assert r.ok, r.table()
    root, blocks = 4 * M_ROOT[n], 4 * LAYERS * M_BLOCK[n]        # bytes of the messages
    want = {  # setting: (all-gathers, bytes sent, groups of the backward all-gathers, held)
        "True": (9, ring(4, root + 2 * blocks), [[0, 1, 2, 3]] * 4, root),
        "False": (5, ring(4, root + blocks), [None] * 4, root + blocks),
        "2": (9, ring(4, root + blocks) + ring(2, blocks), [[0, 1], [0, 1], [2, 3], [2, 3]],
              root + blocks // 2),
    }
    assert want["2"][1] == 650_072 and want["True"][1] == 775_944 and want["False"][1] == 398_328
    for key, (calls, sent, groups, held) in want.items():
        d = r.details[key]
        assert d["counts"]["all_gather"] == calls
        assert d["totals"]["all_gather"] == sent
        assert d["held"] == [held]
        assert d["losses"] == r.details["True"]["losses"]
        assert d["backward_group"] == groups[0]
    two = r.details["2"]["gathers"]                  # (message bytes, group size) in order
    assert two == [(root, 4)] + [(blocks // 4, 4)] * 4 + [(blocks // 4, 2)] * 4


# ------------------------------------------------------------------ 4. explicit prefetching

def test_explicit_prefetch_issues_earlier_and_holds_more():
    r = fo.measure_prefetch(2, depth=2, steps=1)
    assert r.ok, r.table()
    default, explicit = r.details["default"], r.details["explicit"]
    ev = explicit["events"]
    assert ev.index("AG block2") < ev.index("fwd block1")        # two blocks ahead
    assert default["events"].index("AG block2") > default["events"].index("fwd block2")
    assert default["peaks"] == {"forward": 2, "backward": 3}
    assert explicit["peaks"] == {"forward": 4, "backward": 4}
    assert explicit["losses"] == default["losses"]
    assert explicit["counts"] == default["counts"] == {"all_reduce": 0, "reduce_scatter": 5,
                                                       "all_gather": 9}


# ------------------------------------------------------------------ 5. activation checkpointing

def test_activation_checkpointing_keeps_block_inputs_only():
    r = fo.measure_activation_checkpointing(2, steps=1)
    assert r.ok, r.table()
    b = 6
    sbh = S * b * H
    outside = 4 * (2 * sbh + S * b * V + 2 * b * S) + 8 * (2 * b * S + S) + 4
    none = r.details["none"]
    assert none["saved"]["activations"] == LAYERS * 4 * (16 * sbh + 4 * b * S + A * b * S) + outside \
        == 2_644_484
    for method in ("composable", "wrapper"):
        m = r.details[method]
        assert m["saved"]["activations"] == LAYERS * 4 * sbh + outside == 312_836
        assert m["block_forwards"] == {"forward": LAYERS, "step": 2 * LAYERS}
        assert m["counts"] == none["counts"]                   # no extra all-gathers
        assert m["matmul_flops"] > none["matmul_flops"]
        assert m["losses"] == none["losses"]


# ------------------------------------------------------------------ 6. gradient clipping

@pytest.mark.parametrize("n", [2, 3])
def test_clip_grad_norm_on_sharded_grads_equals_one_process(n):
    r = fo.measure_gradient_clipping(n, max_norm=0.5)
    assert r.ok, r.table()
    d = r.details
    assert abs(d["total_norm"] - d["reference_norm"]) <= 1e-6 * d["reference_norm"]
    assert d["grad_max_rel_diff"] <= 1e-6
    local = d["local_shard_norms"]                           # the wrong way
    assert len(local) == n and len(set(local)) == n and max(local) < d["reference_norm"]
    assert math.isclose(math.sqrt(sum(x * x for x in local)), d["reference_norm"], rel_tol=1e-6)
    assert d["totals"]["all_reduce"] == pytest.approx(float(2 * ring(n, 4 * TENSORS)))  # 68 floats
    assert d["reference_norm"] > 0.5                        # clipping really scaled


# ------------------------------------------------------------------ 7. accumulation without sync

def test_gradient_accumulation_without_sync():
    n, k = 3, 2
    r = fo.measure_gradient_accumulation(n, micro_batches=k)
    assert r.ok, r.table()
    no_sync, sync = r.details["no_sync"], r.details["sync"]
    assert [m["counts"]["reduce_scatter"] for m in no_sync] == [0, 1 + LAYERS]
    assert [m["counts"]["reduce_scatter"] for m in sync] == [1 + LAYERS] * k
    assert no_sync[0]["unsharded_grad_bytes"] == 4 * PSI and no_sync[0]["sharded_grad_bytes"] == 0
    shard = 4 * 43_764                  # Σ ceil(d0/3)·rest, tests/test_fsdp.py
    assert sync[0]["sharded_grad_bytes"] == no_sync[-1]["sharded_grad_bytes"] == shard
    assert r.details["grad_max_rel_diff_no_sync"] <= 1e-6
