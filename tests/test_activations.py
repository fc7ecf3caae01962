"""course_utils.theory.memory's activation model: block terms (GPT and Llama), the loss's
buffers, the three recomputation policies, and one real block's saved tensors.

Hand counts below are written out independently of the module: per layer, 16-bit
activations (2 bytes), s tokens, b sequences, h hidden, a heads, kv = kv_heads x head_dim,
f the FFN width, V the vocabulary.
"""
import weakref
from functools import partial

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

from course_utils.harness.model import build_model
from course_utils.harness.recompute import sac_context
from course_utils.theory.config import PRESETS, TransformerConfig
from course_utils.theory.memory import GB, OP_SELECTIVE, activation_bytes, block_terms, op_selective_terms, per_gpu

TINY_LLAMA = TransformerConfig(hidden=64, layers=2, heads=4, kv_heads=2, vocab=1000, seq=16, ffn=96,
                               tied_embeddings=False, bias=False, norm="rmsnorm", mlp="swiglu",
                               position="rope")


@pytest.mark.parametrize("name", ["gpt2-xl"])
@pytest.mark.parametrize("s, b", [(1024, 1), (512, 3)])
def test_gpt_blocks_keep_korthikanti_exactly(name, s, b):
    cfg = PRESETS[name].config
    h, a = cfg.hidden, cfg.heads
    std = block_terms(cfg, micro_batch=b, seq=s)
    assert sum(std.values()) == 34 * s * b * h + 5 * a * s * s * b
    assert sum(block_terms(cfg, micro_batch=b, seq=s, attention="flash").values()) == 34 * s * b * h
    # the 34, term by term: norms 4, q/k/v input 2, q k v 6, out-proj 2, MLP input 2, MLP 16, masks 2
    sbh = s * b * h
    assert [std[k] // sbh for k in ("norm inputs", "q/k/v input", "q, k, v", "out-proj input",
                                    "MLP input", "MLP", "dropout masks")] == [4, 2, 6, 2, 2, 16, 2]


def test_llama_block_against_a_hand_count():
    s, b, h, a, kv, f = 16, 3, 64, 4, 32, 96          # TINY_LLAMA: 2 kv heads of 16
    t = 16 * 3
    flash = {"norm inputs": 2 * 2 * t * h, "norm statistics": 2 * 4 * t, "q/k/v input": 2 * t * h,
             "q, k, v": 2 * t * (h + 2 * kv), "attention scores": 0, "softmax statistics": 4 * a * t,
             "out-proj input": 2 * t * h, "MLP input": 2 * t * h, "MLP": 4 * 2 * t * f,
             "dropout masks": 0}
    assert block_terms(TINY_LLAMA, micro_batch=b, seq=s, attention="flash") == flash
    std = block_terms(TINY_LLAMA, micro_batch=b, seq=s)
    assert std["attention scores"] == 2 * a * s * s * b and std["softmax statistics"] == 0
    assert sum(flash.values()) == t * (12 * h + 4 * kv + 8 * f + 8 + 4 * a)


def test_logits_and_loss_buffers_are_counted_once():
    s, b, V = 16, 3, 1000
    sbh = s * b * 64
    for rc in ("none", "selective"):
        act = activation_bytes(TINY_LLAMA, micro_batch=b, seq=s, attention="flash", recompute=rc)
        assert act.logits == 4 * s * b * V and act.loss_grads == 8 * s * b * V
        assert act.loss == 12 * s * b * V
        assert act.outside_layers == 2 * sbh + 2 * sbh + act.logits       # no dropout mask (Llama)
        assert act.total == TINY_LLAMA.layers * act.per_layer + act.outside_layers + act.loss_grads
    fused = activation_bytes(TINY_LLAMA, micro_batch=b, seq=s, cross_entropy="fused")
    assert fused.loss_grads == 0 and fused.logits == 4 * s * b * V
    with pytest.raises(ValueError, match="cross_entropy must be one of"):
        activation_bytes(TINY_LLAMA, micro_batch=b, cross_entropy="liger")


@pytest.mark.parametrize("name", ["gpt2-xl", "llama-2-7b", "llama-3.1-8b"])
@pytest.mark.parametrize("attention", ["standard", "flash"])
def test_three_policies(name, attention):
    cfg = PRESETS[name].config
    s, b = 2048, 2
    block = sum(block_terms(cfg, micro_batch=b, seq=s, attention=attention).values())
    scores = block_terms(cfg, micro_batch=b, seq=s, attention=attention)["attention scores"]
    none, sel, full = (activation_bytes(cfg, micro_batch=b, seq=s, attention=attention, recompute=rc)
                       for rc in ("none", "selective", "full"))
    assert none.per_layer == block and none.recompute_peak == 0
    assert sel.per_layer == block - scores and sel.recompute_peak == scores
    assert full.per_layer == 2 * s * b * cfg.hidden                       # the block input only
    assert full.recompute_peak == block - 2 * s * b * cfg.hidden          # exactly one block, input shared
    assert none.per_layer > full.per_layer and none.per_layer >= sel.per_layer > full.per_layer
    assert (none.per_layer > sel.per_layer) == (attention == "standard")
    for act in (none, sel, full):                                          # the peak: the larger instant
        kept = act.layers + act.outside_layers
        assert act.total == kept + max(act.loss_grads, act.recompute_peak)
    assert none.total >= sel.total > full.total
    # the old bool spelling still works
    assert activation_bytes(cfg, micro_batch=b, seq=s, recompute=True) == \
        activation_bytes(cfg, micro_batch=b, seq=s, recompute="full")
    assert activation_bytes(cfg, micro_batch=b, seq=s, recompute=False).total == \
        activation_bytes(cfg, micro_batch=b, seq=s).total


def test_the_issues_recompute_peak_for_llama_2_7b():
    """The issue's +0.57 GB is GPT's 34·s·b·h put on a Llama block; the Llama count is
    0.630 GB, less the input the checkpoint already keeps: 0.596 GB. At micro-batch 1 and
    seq 4096 the loss's two fp32 gradients (1.05 GB) are larger and are freed before the
    first block is recomputed, so the peak is at the loss."""
    s, h = 4096, 4096
    full = activation_bytes("llama-2-7b", micro_batch=1, seq=s, attention="flash", recompute="full")
    assert 34 * s * h == 570_425_344                                      # the issue's 0.57 GB
    per_token = 12 * h + 4 * h + 8 * 11008 + 8 + 4 * 32                    # no GQA: kv = h
    assert sum(full.terms.values()) == s * per_token == 629_702_656
    assert full.recompute_peak == s * per_token - 2 * s * h == 596_148_224
    assert full.loss_grads == 8 * s * 32000 == 1_048_576_000 > full.recompute_peak
    assert full.total == full.layers + full.outside_layers + full.loss_grads
    assert round(full.recompute_peak / GB, 3) == 0.596


@pytest.mark.parametrize("bad", ["some", "partial", None, 1])
def test_bad_recompute_values_raise(bad):
    with pytest.raises(ValueError, match="recompute must be one of"):
        activation_bytes("llama-2-7b", micro_batch=1, recompute=bad)
    with pytest.raises(ValueError, match="recompute must be one of"):
        per_gpu("llama-2-7b", micro_batch=1, recompute=bad)


# ------------------------------------------------------------------ measured

def _saved_bytes(module, x):
    """Bytes of the storages autograd saves in ``module(x)``, each once, weights left out."""
    weights = {p.untyped_storage()._cdata for p in module.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage()._cdata not in weights:
            saved[t.untyped_storage()._cdata] = t          # kept alive: no storage id reused
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(t.untyped_storage().nbytes() for t in saved.values())


def test_one_real_block_saves_what_block_terms_counts():
    """One bf16 block of the course model (CPU: SDPA runs a fused, flash-style kernel).
    Every term matches to the byte except three choices of the course's implementation,
    each counted here: torch's RMSNorm (measured alone: on CPU it runs as separate ops
    and keeps fp32 copies instead of the 16-bit input), RoPE's cos and sin tables (two
    s x d tensors per rotation, two rotations), and k, v repeated to all heads before
    attention (repeat_interleave; flash kernels take them a_kv·d wide)."""
    b, s, h, d, kv = 3, 16, 64, 16, 32
    block = build_model(TINY_LLAMA, dtype=torch.bfloat16).blocks[0]
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    terms = block_terms(TINY_LLAMA, micro_batch=b, seq=s, attention="flash")
    norm = _saved_bytes(block.norm1, x)
    rope = 2 * 2 * s * d * 2
    gqa = 2 * 2 * b * s * (h - kv)
    expected = sum(terms.values()) - terms["norm inputs"] - terms["norm statistics"] + 2 * norm + rope + gqa
    assert _saved_bytes(block, x) == expected == 126_080
    assert sum(terms.values()) == 81_024


class Live(TorchDispatchMode):
    """Bytes of the storages ops create that are still alive (``now``) and their peak."""
    def __init__(self):
        super().__init__()
        self.live, self.now, self.peak = {}, 0, 0

    def _free(self, key):
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            st = t.untyped_storage() if isinstance(t, torch.Tensor) else None
            if st is not None and st._cdata not in before and st._cdata not in self.live:
                self.live[st._cdata] = st.nbytes()
                self.now += st.nbytes()
                weakref.finalize(st, self._free, st._cdata)
        self.peak = max(self.peak, self.now)
        return out


def test_the_loss_peaks_at_12_bytes_per_logit():
    """Live bytes during F.cross_entropy's forward and backward on bf16 logits, tracked
    op by op: after forward the fp32 log-probabilities (4·b·s·V) remain; the peak, in
    log-softmax's backward, is those plus two more fp32 buffers (12·b·s·V): Activations'
    logits + loss_grads."""
    import torch.nn.functional as F

    n, h, V = 48, 64, 1000                                 # b·s = 48 tokens
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=gen).bfloat16().requires_grad_()
    w = torch.randn(V, h, generator=gen).bfloat16().requires_grad_()
    y = torch.randint(V, (n,), generator=gen)
    with Live() as live:
        loss = F.cross_entropy(F.linear(x, w).float(), y)
        after_forward = live.now
        loss.backward()
    act = activation_bytes(TINY_LLAMA, micro_batch=3, seq=16)          # 48 tokens, V = 1000
    assert after_forward - 8 == act.logits == 4 * n * V                   # + the loss, its total weight
    assert live.peak - 8 == act.logits + act.loss_grads == 12 * n * V


def test_planner_uses_the_same_activation_model():
    from course_utils.theory import planner

    kw = dict(gpu_mem_gb=80, gpus_per_node=8, nodes=1, intra_bw_gbps=450, inter_bw_gbps=50,
              seq_len=4096, micro_batch=1, choices=[("ZeRO-3", "none", False), ("ZeRO-3", "none", True)])
    plain, rc = planner.plan("llama-2-7b", **kw)
    for row, policy in ((plain, "none"), (rc, "full")):
        assert row.activations == activation_bytes("llama-2-7b", micro_batch=1, seq=4096,
                                                   attention="flash", recompute=policy).total
    fused = planner.plan("llama-2-7b", cross_entropy="fused", **kw)[0]
    assert plain.activations - fused.activations == 8 * 4096 * 32000
    with pytest.raises(ValueError, match="cross_entropy must be"):
        planner.plan("llama-2-7b", cross_entropy="chunked", **kw)


# ------------------------------------------------------------------ op-level selective checkpointing

def kept_by_checkpoint(block, x0, context_fn):
    """Bytes alive after ``checkpoint(block)``'s forward besides its output (the input included:
    made here, only the checkpoint holds it), then backward runs the recompute for real."""
    with Live() as live:
        x = x0 * 1
        y = checkpoint(block, x, use_reentrant=False, context_fn=context_fn, preserve_rng_state=False)
        del x
        kept = live.now - y.untyped_storage().nbytes()
        y.float().sum().backward()
    return kept


TINY_GPT = TransformerConfig(hidden=64, layers=2, heads=4, vocab=1000, seq=16, ffn=256, bias=True)


@pytest.mark.parametrize("cfg, expected", [(TINY_LLAMA, {"op-selective": 56_064, "torchtitan": 37_632}),
                                           (TINY_GPT, {"op-selective": 13_056, "torchtitan": 13_056})])
def test_op_selective_checkpointing_keeps_what_the_model_counts(cfg, expected):
    """A bf16 block of the course model under torch's SAC with torchtitan's save list: what stays
    alive is the model's count to the byte (Llama: q, v, gate, down saved under torchtitan; GPT:
    its biased projections run as addmm, which the list does not name: none saved)."""
    b, s = 3, 16
    block = build_model(cfg, dtype=torch.bfloat16).blocks[0]
    x0 = torch.randn(b, s, cfg.hidden, dtype=torch.bfloat16, requires_grad=True)
    for policy, every in OP_SELECTIVE.items():
        terms = op_selective_terms(cfg, micro_batch=b, seq=s, policy=policy)
        assert kept_by_checkpoint(block, x0, partial(sac_context, every)) == sum(terms.values()) == expected[policy]
        act = activation_bytes(cfg, micro_batch=b, seq=s, attention="flash", recompute=policy)
        assert act.per_layer == expected[policy] and act.recompute == policy
    full = activation_bytes(cfg, micro_batch=b, seq=s, attention="flash", recompute="full")
    assert kept_by_checkpoint(block, x0, lambda: sac_context(1)) > full.per_layer == 2 * b * s * cfg.hidden


def test_torchtitans_table_1_run_predicted():
    """Llama 3.1 8B, 8 GPUs, FSDP (fp32 states sharded: 16 B/param / 8), local batch 2, seq 8192,
    torchtitan's selective AC: 63,616 bytes per token and block (of 168,072 without AC)."""
    kw = dict(world_size=8, stage=3, recipe="torch-amp", micro_batch=2, seq=8192, attention="flash")
    tt = per_gpu("llama-3.1-8b", recompute="torchtitan", **kw)
    t, h, kv, f = 2 * 8192, 4096, 1024, 14336
    assert tt.activation_detail.per_layer == t * (2 * (h + h + kv + f + h + h) + 4 * 32) == t * 63_616
    assert sum(block_terms("llama-3.1-8b", micro_batch=2, seq=8192, attention="flash").values()) == t * 168_072
    assert round(tt.total / 2 ** 30, 1) == 69.8
    assert per_gpu("llama-3.1-8b", recompute="selective", **kw).total > 120 * 2 ** 30 > tt.total
    with pytest.raises(ValueError, match="policy must be one of"):
        op_selective_terms("llama-3.1-8b", micro_batch=1, policy="megatron")


def test_the_34h_per_token_is_block_terms_term_by_term():
    """03 §4's 34h bytes per token, its terms in one line, and appendix 09 §7's '4 + 2 + 6 + 2 + 2 + 16 + 2 = 34', term by term:
    block_terms of a GPT block for one token (flash: no s x s scores), in units of h bytes."""
    from course_utils.theory.memory import block_terms
    from notebook_text import cell_source
    h = PRESETS["gpt2-xl"].config.hidden
    t = {k: v / h for k, v in block_terms("gpt2-xl", micro_batch=1, seq=1, attention="flash").items()}
    text03 = cell_source("03_memory_anatomy.ipynb", "## 4. Activations")
    assert f"**{sum(t.values()):g}h bytes per token**" in text03 and "[Appendix 09 §7]" in text03
    line = (f"  {t['norm inputs']:g}h (the two norms' inputs) + {t['q/k/v input']:g}h + {t['q, k, v']:g}h (the input q, k and v "
            f"share; q, k, v) + {t['out-proj input']:g}h + {t['MLP input']:g}h (the inputs of the output projection and of the "
            f"MLP) + {t['MLP']:g}h (the MLP's activation function, GELU: its input and output, 4h values each) + "
            f"{t['dropout masks']:g}h (two 1-byte dropout masks) = {sum(t.values()):g}h.")
    assert line in text03, line
    listed = ("norm inputs", "q/k/v input", "q, k, v", "out-proj input", "MLP input", "MLP", "dropout masks")
    assert sum(t[k] for k in listed) == sum(t.values()) == 34      # the table's rows are every nonzero term
    text = cell_source("09_appendix_forensics.ipynb", "= 34: a GPT block keeps")
    assert f"{' + '.join(f'{v:g}' for v in t.values() if v)} = {sum(t.values()):g}" in text and sum(t.values()) == 34
