"""Transformer configurations (GPT-2 and Llama styles) with exact parameter counts, and the
course's presets (``notebooks/03_memory_anatomy.ipynb``): ``num_params`` equals the built
``GPT``'s ``sum(p.numel())`` (``tests/test_model.py``) and the published counts.
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
    """A decoder-only transformer: ffn defaults to 4h, kv_heads to heads (fewer: grouped-query)."""
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
        for name in ("hidden", "layers", "heads", "vocab", "seq", "ffn", "kv_heads"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads_:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads_})")
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def ffn_(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

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

    def param_numels(self) -> list[int]:
        """Each parameter tensor's numel in forward order: the course GPT's ``parameters()``."""
        h, kv, f, b = self.hidden, self.kv_heads_ * self.head_dim, self.ffn_, self.bias
        norm = [h, h] if (self.norm == "layernorm" and b) else [h]
        lin = lambda i, o: [i * o] + [o] * b                                       # noqa: E731
        mlp = (lin(h, f) * 2 if self.mlp == "swiglu" else lin(h, f)) + lin(f, h)
        block = norm + lin(h, h) + lin(h, kv) * 2 + lin(h, h) + norm + mlp
        return ([self.vocab * h] + [self.seq * h] * (self.position == "learned") + block * self.layers
                + norm + [self.vocab * h] * (not self.tied_embeddings))

    def largest_layer_params(self) -> int:
        """Parameters of the largest single module (what DeepSpeed's ZeRO-3 estimator gathers at once)."""
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
    """A named model: its config (None when the source gives only a size), Ψ, and its source."""
    name: str
    num_params: int
    source: str
    config: TransformerConfig | None = None


def _preset(name: str, source: str, config: TransformerConfig | None = None,
            num_params: int | None = None) -> Preset:
    return Preset(name, int(config.num_params() if config else num_params), source, config)


def _llama(h, L, a, f, **kw) -> TransformerConfig:
    return TransformerConfig(hidden=h, layers=L, heads=a, ffn=f, tied_embeddings=False, bias=False,
                             norm="rmsnorm", mlp="swiglu", position="rope", **kw)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    _preset("gpt2-xl", "Radford et al. 2019, HF config gpt2-xl; the Megatron-LM benchmark of notebook 08 (1.56B)",
            TransformerConfig(hidden=1600, layers=48, heads=25, vocab=50257, seq=1024)),
    _preset("llama-2-7b", "Touvron et al. 2023 (Llama 2), Table 1 and HF config",
            _llama(4096, 32, 32, 11008, vocab=32000, seq=4096)),
    _preset("zero-paper-7.5b", "Rajbhandari et al. 2020 (ZeRO), Figure 1: Psi = 7.5B, N_d = 64; "
            "the paper gives the size only", num_params=7_500_000_000),
    _preset("llama-2-13b", "Touvron et al. 2023 (Llama 2); the 13B exercise of notebooks 03-05",
            _llama(5120, 40, 40, 13824, vocab=32000, seq=4096)),
    _preset("llama-2-70b", "Touvron et al. 2023 (Llama 2), grouped-query attention with 8 KV heads",
            _llama(8192, 80, 64, 28672, kv_heads=8, vocab=32000, seq=4096)),
    # Llama 3.1 (HF configs meta-llama/Llama-3.1-*): seq is the 8,192-token pretraining context
    # (max_position_embeddings is 131,072): what activations are computed for by default.
    *[_preset(f"llama-3.1-{size}", f"Llama 3.1 (Meta 2024), HF config meta-llama/Llama-3.1-{size.upper()}",
              _llama(h, L, a, f, kv_heads=8, vocab=128256, seq=8192))
      for size, h, L, a, f in (("8b", 4096, 32, 32, 14336), ("70b", 8192, 80, 64, 28672),
                               ("405b", 16384, 126, 128, 53248))],
]}

#: The course's own small GPT: every CPU demo trains it in seconds. Its parameter
#: count (129,350) is deliberately not a multiple of 3 or 4, so sharding code
#: must pad.
COURSE_CONFIG = TransformerConfig(hidden=50, layers=4, heads=5, vocab=101, seq=32)


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
