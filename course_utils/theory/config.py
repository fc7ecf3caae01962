"""Transformer configurations: exact parameter counts, and the presets the course uses.

Taught in ``notebooks/03_memory_anatomy.ipynb``. One :class:`TransformerConfig`
describes both GPT-2-style models (learned positions, LayerNorm with biases, GELU MLP,
tied embeddings) and Llama-style ones (RoPE, RMSNorm, SwiGLU MLP, no biases, untied
output, grouped-query attention). :meth:`TransformerConfig.num_params` is exact: it
equals ``sum(p.numel())`` of ``course_utils.harness.model.GPT`` built from the same config
(``tests/test_model.py``) and the published counts of the presets.
"""
from __future__ import annotations

import dataclasses

from ..checks import check_int

__all__ = ["TransformerConfig", "Preset", "PRESETS", "COURSE_CONFIG", "preset"]

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rope")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer.

    hidden: model width h; layers: blocks L; heads: attention heads a; vocab: V;
    seq: maximum sequence length (the learned position table has ``seq`` rows);
    ffn: MLP inner width (default 4h); kv_heads: key/value heads (default a; fewer
    means grouped-query attention); tied_embeddings: the output layer reuses the
    token embedding; bias: linear layers (and LayerNorm) have biases.
    """

    hidden: int
    layers: int
    heads: int
    vocab: int
    seq: int
    ffn: int | None = None
    kv_heads: int | None = None
    tied_embeddings: bool = True
    bias: bool = True
    norm: str = "layernorm"
    mlp: str = "gelu"
    position: str = "learned"

    def __post_init__(self):
        for name in ("hidden", "layers", "heads", "vocab", "seq"):
            check_int(name, getattr(self, name), 1)
        if self.ffn is not None:
            check_int("ffn", self.ffn, 1)
        if self.kv_heads is not None:
            check_int("kv_heads", self.kv_heads, 1)
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads_:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads_})")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    # -- derived sizes
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_(self) -> int:
        """MLP inner width (``ffn``, or 4 x hidden when not given)."""
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def kv_heads_(self) -> int:
        """Key/value heads (``kv_heads``, or ``heads`` when not given)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    # -- parameter counts
    def _norm_params(self) -> int:
        return 2 * self.hidden if (self.norm == "layernorm" and self.bias) else self.hidden

    def attention_params(self) -> int:
        h, kv = self.hidden, self.kv_heads_ * self.head_dim
        weights = h * h + 2 * h * kv + h * h          # q, k, v, output projections
        return weights + ((h + 2 * kv + h) if self.bias else 0)

    def mlp_params(self) -> int:
        h, f = self.hidden, self.ffn_
        if self.mlp == "swiglu":                       # gate, up, down
            return 3 * h * f + ((2 * f + h) if self.bias else 0)
        return 2 * h * f + ((f + h) if self.bias else 0)

    def block_params(self) -> int:
        """One transformer block: attention + MLP + its two norms."""
        return self.attention_params() + self.mlp_params() + 2 * self._norm_params()

    def embedding_params(self) -> int:
        """Token embedding (+ learned positions, + an untied output layer)."""
        n = self.vocab * self.hidden
        if self.position == "learned":
            n += self.seq * self.hidden
        if not self.tied_embeddings:
            n += self.vocab * self.hidden
        return n

    def num_params(self) -> int:
        """Exact parameter count Ψ (tied weights counted once)."""
        return self.embedding_params() + self.layers * self.block_params() + self._norm_params()

    def largest_layer_params(self) -> int:
        """Parameters of the largest single module (what DeepSpeed's ZeRO-3 estimator
        gathers at once): the token embedding (or output layer) or a block's biggest linear."""
        linears = [self.hidden * self.hidden, self.hidden * self.ffn_,
                   self.hidden * self.kv_heads_ * self.head_dim]
        return max(self.vocab * self.hidden, *linears)

    def describe(self) -> str:
        return (f"h={self.hidden}, L={self.layers}, heads={self.heads}"
                + (f" (kv {self.kv_heads_})" if self.kv_heads_ != self.heads else "")
                + f", V={self.vocab}, seq={self.seq}, ffn={self.ffn_}, {self.norm}, {self.mlp}, "
                f"{self.position} positions, {'tied' if self.tied_embeddings else 'untied'}"
                f"{', biases' if self.bias else ''}")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named model: its config (None when the source gives only a size), Ψ, and where
    the numbers come from."""

    name: str
    num_params: int
    source: str
    config: TransformerConfig | None = None


def _preset(name: str, source: str, config: TransformerConfig | None = None,
            num_params: int | None = None) -> Preset:
    if config is not None:
        num_params = config.num_params()
    return Preset(name, int(num_params), source, config)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    _preset("gpt2-xl", "Radford et al. 2019, HF config gpt2-xl; the Megatron-LM benchmark of notebook 08 (1.56B)",
            TransformerConfig(hidden=1600, layers=48, heads=25, vocab=50257, seq=1024)),
    _preset("llama-2-7b", "Touvron et al. 2023 (Llama 2), Table 1 and HF config",
            TransformerConfig(hidden=4096, layers=32, heads=32, vocab=32000, seq=4096, ffn=11008,
                              tied_embeddings=False, bias=False, norm="rmsnorm", mlp="swiglu",
                              position="rope")),
    _preset("zero-paper-7.5b", "Rajbhandari et al. 2020 (ZeRO), Figure 1: Psi = 7.5B, N_d = 64; "
            "the paper gives the size only", num_params=7_500_000_000),
    _preset("llama-2-13b", "Touvron et al. 2023 (Llama 2); the 13B exercise of notebooks 03-05",
            TransformerConfig(hidden=5120, layers=40, heads=40, vocab=32000, seq=4096, ffn=13824,
                              tied_embeddings=False, bias=False, norm="rmsnorm", mlp="swiglu",
                              position="rope")),
    _preset("llama-2-70b", "Touvron et al. 2023 (Llama 2), grouped-query attention with 8 KV heads",
            TransformerConfig(hidden=8192, layers=80, heads=64, kv_heads=8, vocab=32000, seq=4096,
                              ffn=28672, tied_embeddings=False, bias=False, norm="rmsnorm",
                              mlp="swiglu", position="rope")),
    # Llama 3.1 (Meta, 2024; HF configs meta-llama/Llama-3.1-{8B,70B,405B}): 128,256-token
    # vocabulary, 8 KV heads, untied output. seq is the 8,192-token pretraining context
    # (max_position_embeddings is 131,072): what activations are computed for by default.
    *[_preset(f"llama-3.1-{size}", f"Llama 3.1 (Meta 2024), HF config meta-llama/Llama-3.1-{size.upper()}",
              TransformerConfig(hidden=h, layers=L, heads=a, kv_heads=8, vocab=128256, seq=8192, ffn=f,
                                tied_embeddings=False, bias=False, norm="rmsnorm", mlp="swiglu",
                                position="rope"))
      for size, h, L, a, f in (("8b", 4096, 32, 32, 14336), ("70b", 8192, 80, 64, 28672),
                               ("405b", 16384, 126, 128, 53248))],
]}

#: The course's own small GPT: every CPU demo trains it in seconds. Its parameter
#: count (129,350) is deliberately not a multiple of 3 or 4, so sharding code
#: must pad.
COURSE_CONFIG = TransformerConfig(hidden=50, layers=4, heads=5, vocab=101, seq=32)


def preset(name: str) -> Preset:
    """A preset by name (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
