"""The course model (from ``notebooks/03_memory_anatomy.ipynb`` on): a GPT-2-style or
Llama-style GPT for any :class:`~course_utils.theory.config.TransformerConfig`, with exactly
``config.num_params()`` parameters and the same weights, bit for bit, in every process.

Module names (what FSDP wrapping and the memory tables refer to)::

    GPT
      tok_emb            token embedding (also the output layer when tied)
      pos_emb            learned positions (only with position="learned")
      blocks[i]: Block   norm1, attn (q_proj, k_proj, v_proj, o_proj), norm2,
                         mlp (up, down; swiglu adds gate)
      norm_f             final norm
      lm_head            output layer (only when untied)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import check_int, check_module, check_number
from ..theory.config import COURSE_CONFIG, TransformerConfig

__all__ = ["GPT", "Block", "Attention", "MLP", "build_model", "init_weights", "num_params", "warm_up",
           "SyntheticData", "rows_per_rank"]

INIT_STD = 0.02  #: standard deviation of every linear / embedding weight (GPT-2's choice)


def _check_config(config) -> None:
    if not isinstance(config, TransformerConfig):
        raise TypeError("config must be a course_utils.theory.config.TransformerConfig "
                        f"(e.g. COURSE_CONFIG), got {type(config).__name__}")


def _norm(config: TransformerConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden, eps=1e-5)                  # weight only
    return nn.LayerNorm(config.hidden, bias=config.bias)           # weight (+ bias)


def apply_rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` [B, heads, T, head_dim]; no parameters."""
    T, head_dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=x.device).float() / head_dim))
    angles = torch.outer(torch.arange(T, device=x.device).float(), inv_freq)  # [T, head_dim/2]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention, separate q, k, v, o projections; ``kv_heads`` < ``heads``: GQA."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        h, kv = config.hidden, config.kv_heads_ * config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads_, config.head_dim
        self.rope = config.position == "rope"
        self.q_proj = nn.Linear(h, h, bias=config.bias)
        self.k_proj = nn.Linear(h, kv, bias=config.bias)
        self.v_proj = nn.Linear(h, kv, bias=config.bias)
        self.o_proj = nn.Linear(h, h, bias=config.bias)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, heads, self.head_dim).transpose(1, 2)  # [B, heads, T, head_dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, h = x.shape
        q = self._split(self.q_proj(x), self.heads)
        k = self._split(self.k_proj(x), self.kv_heads)
        v = self._split(self.v_proj(x), self.kv_heads)
        if self.rope:
            q, k = apply_rope(q), apply_rope(k)
        if self.kv_heads != self.heads:                     # grouped-query attention
            repeat = self.heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, h))


class MLP(nn.Module):
    """``down(GELU(up(x)))``, or SwiGLU ``down(SiLU(gate(x)) * up(x))``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        h, f = config.hidden, config.ffn_
        self.swiglu = config.mlp == "swiglu"
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=config.bias)
        self.up = nn.Linear(h, f, bias=config.bias)
        self.down = nn.Linear(f, h, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    """A pre-norm block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; FSDP's unit."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm1 = _norm(config)
        self.attn = Attention(config)
        self.norm2 = _norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A decoder-only transformer; PyTorch's default init (use :func:`build_model`)."""

    def __init__(self, config: TransformerConfig = COURSE_CONFIG):
        super().__init__()
        _check_config(config)
        if config.position == "rope" and config.head_dim % 2:
            raise ValueError(f"rope positions need an even head_dim; hidden/heads = "
                             f"{config.hidden}/{config.heads} = {config.head_dim}: change heads or hidden")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab, config.hidden)
        if config.position == "learned":
            self.pos_emb = nn.Embedding(config.seq, config.hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm_f = _norm(config)
        if not config.tied_embeddings:
            self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)

    @staticmethod
    def _check_tokens(name: str, t) -> None:
        if isinstance(t, torch.Tensor) and t.dtype == torch.long and t.dim() == 2:
            return
        got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a LongTensor of shape [batch, seq], got {got}")

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab]; given ``targets`` [B, T], the mean cross-entropy (fp32)."""
        self._check_tokens("idx", idx)
        B, T = idx.shape
        if T > self.config.seq:
            raise ValueError(f"sequence length {T} is longer than config.seq={self.config.seq}; "
                             f"pass at most {self.config.seq} tokens per row or use a config with a larger seq")
        x = self.tok_emb(idx)
        if self.config.position == "learned":
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.norm_f(x)
        # tied: the same Parameter, used twice
        logits = F.linear(x, self.tok_emb.weight) if self.config.tied_embeddings else self.lm_head(x)
        if targets is None:
            return logits
        self._check_tokens("targets", targets)
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, "
                             f"got {tuple(targets.shape)}")
        return F.cross_entropy(logits.float().reshape(B * T, -1), targets.reshape(B * T))


@torch.no_grad()
def init_weights(model: nn.Module, *, seed: int = 0) -> nn.Module:
    """In place: weights ~ N(0, 0.02), biases 0, norm weights 1, drawn on the CPU from a
    local generator in module order: bit-identical in every process, on any device."""
    check_module("model", model)
    check_int("seed", seed, minimum=0)
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.copy_(torch.empty(module.weight.shape).normal_(0.0, INIT_STD, generator=gen))
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
            module.weight.fill_(1.0)
        if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
            module.bias.zero_()
    return model


def build_model(config: TransformerConfig = COURSE_CONFIG, *, seed: int = 0,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> GPT:
    """The course's GPT with deterministic weights; ``device="meta"``: shapes only."""
    _check_config(config)
    check_int("seed", seed, minimum=0)
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device such as 'cpu', got {type(device).__name__}")
    device = torch.device(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.float32 or "
                        f"torch.bfloat16, got {dtype!r}")
    with torch.device("meta"):          # no allocation, no default init, no global RNG
        model = GPT(config).to(dtype=dtype)
    return model if device.type == "meta" else init_weights(model.to_empty(device=device), seed=seed)


def num_params(model: nn.Module) -> int:
    """Parameter count with shared (tied) Parameters counted once."""
    check_module("model", model)
    unique = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(p.numel() for p in unique.values())


class SyntheticData:
    """Tokens that follow ``rule[token]`` (a fixed permutation) except a fraction ``noise``:
    the loss falls from ln(vocab) within a few dozen steps; the same batches in every process."""

    def __init__(self, config: TransformerConfig = COURSE_CONFIG, *, global_batch: int = 8,
                 seed: int = 0, noise: float = 0.1):
        _check_config(config)
        check_int("global_batch", global_batch, minimum=1)
        check_int("seed", seed, minimum=0)
        check_number("noise", noise, minimum=0, maximum=1)
        self.config, self.global_batch, self.seed, self.noise = config, global_batch, seed, float(noise)
        self.rule = torch.randperm(config.vocab, generator=torch.Generator().manual_seed(seed))

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) [global_batch, seq]; targets are inputs shifted by one."""
        check_int("step", step, minimum=0)
        gen = torch.Generator().manual_seed((self.seed * 2**32 + step) % 2**64)  # one stream per (seed, step)
        B, V = self.global_batch, self.config.vocab
        tokens = torch.empty(B, self.config.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(V, (B,), generator=gen)
        for t in range(1, self.config.seq + 1):
            random = torch.randint(V, (B,), generator=gen)
            is_noise = torch.rand(B, generator=gen) < self.noise
            tokens[:, t] = torch.where(is_noise, random, self.rule[tokens[:, t - 1]])
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def shard(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_int("world_size", world_size, minimum=1)
        check_int("rank", rank, minimum=0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
        b = rows_per_rank(self.global_batch, world_size)
        inputs, targets = self.batch(step)
        return inputs[rank * b:(rank + 1) * b].clone(), targets[rank * b:(rank + 1) * b].clone()

    def __repr__(self) -> str:
        return (f"SyntheticData(global_batch={self.global_batch}, seq={self.config.seq}, "
                f"vocab={self.config.vocab}, seed={self.seed}, noise={self.noise})")


def rows_per_rank(global_batch: int, world_size: int) -> int:
    """``global_batch // world_size``; a ValueError naming the world sizes that fit."""
    check_int("world_size", world_size, minimum=1)
    if global_batch % world_size:
        fits = [n for n in range(1, global_batch + 1) if global_batch % n == 0]
        raise ValueError(f"the global batch of {global_batch} rows cannot be split evenly over "
                         f"{world_size} ranks; use a world size in {fits} (or another global batch)")
    return global_batch // world_size


def warm_up(config: TransformerConfig = COURSE_CONFIG, *, imports=()) -> None:
    """Import ``imports`` and build a meta model (1-2 s of torch imports) once, in the
    launching process, so forked ranks inherit it instead of each doing it."""
    import importlib
    for name in imports:
        importlib.import_module(name)
    build_model(config, device="meta")
