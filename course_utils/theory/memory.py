"""Where the memory goes: bytes of model states per GPU, for DDP and ZeRO stages 1-3.

Taught in ``notebooks/03_memory_anatomy.ipynb`` (first used for the course map in
``notebooks/00_orientation.ipynb``).

Model states per parameter, for the recipes the ZeRO paper and the course use:

==================  ======  =====  =================================================
recipe              params  grads  optimizer states (Adam)
==================  ======  =====  =================================================
``fp32``            4       4      8   (m and v, fp32)
``mixed``           2       2      12  (fp32 master copy + m + v: the paper's K = 12)
``mixed-fp32-grads``2       4      12  (fp32 gradient accumulation, e.g. Megatron: 18 B)
``torch-amp``       4       4      8   (torch autocast / FSDP2 ``MixedPrecisionPolicy``)
==================  ======  =====  =================================================

Two layouts hold mixed-precision training's 16 bytes per parameter. DeepSpeed and
Megatron-LM (``mixed``, the ZeRO paper's) keep bf16 parameters and gradients and a
separate fp32 master copy inside the optimizer, so ZeRO-1 shards 12 of the 16 bytes. In
torch (autocast, ``ZeroRedundancyOptimizer``, FSDP2 with ``MixedPrecisionPolicy``) the
fp32 parameter *is* the master: bf16 copies exist only inside an autocast op or while an
FSDP2 unit is gathered, and gradients are fp32. So ``torch-amp`` has fp32's bytes, and a
torch ZeRO-1 (DDP + ``ZeroRedundancyOptimizer``) shards only m and v: 4 + 4 + 8/N, not
2 + 2 + 12/N. Fully sharded (stage 3) the two layouts hold the same 16/N.

ZeRO shards, across ``world_size`` data-parallel ranks: stage 1 the optimizer states,
stage 2 also the gradients, stage 3 also the parameters. Sharded parts are the
analytic ``num_params * bytes / world_size`` (real implementations pad to a multiple
of the world size; notebooks 04-06 measure that padding).
"""
from __future__ import annotations

import dataclasses
import math
from numbers import Real

from .text import GB, UNITS, GiB, fmt_bytes, to_unit  # noqa: F401 (re-exported)

__all__ = ["RECIPES", "ModelStates", "model_states", "GB", "GiB", "fmt_bytes", "to_unit",
           "Placement", "placement", "Activations", "activation_bytes", "block_terms",
           "recompute_policy", "GpuMemory", "per_gpu",
           "STAGE_NAMES"]

#: bytes per parameter for (params, grads, optimizer states)
RECIPES: dict[str, tuple[int, int, int]] = {
    "fp32": (4, 4, 8),
    "mixed": (2, 2, 12),
    "mixed-fp32-grads": (2, 4, 12),
    "torch-amp": (4, 4, 8),
}

STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def _exact(x):
    """An int when the byte count is whole, else the float."""
    return int(x) if float(x).is_integer() else x


@dataclasses.dataclass(frozen=True)
class ModelStates:
    """Bytes of model states one rank holds. ``total = params + grads + optimizer``."""
    params: float
    grads: float
    optimizer: float
    num_params: float
    world_size: int
    stage: int
    recipe: str

    @property
    def total(self):
        return _exact(self.params + self.grads + self.optimizer)

    def as_dict(self, unit: str = "B") -> dict[str, float]:
        """``{"params", "grads", "optimizer", "total"}`` in ``unit`` (B, GB, GiB, MB, MiB)."""
        return {k: to_unit(getattr(self, k), unit) for k in ("params", "grads", "optimizer", "total")}

    def describe(self, unit: str = "GB", digits: int = 1) -> str:
        """One labelled line, e.g. ``ZeRO-1 x4, mixed: params 14.0 GB + ...``."""
        parts = " + ".join(f"{k} {fmt_bytes(getattr(self, k), unit, digits)}"
                           for k in ("params", "grads", "optimizer"))
        return (f"{STAGE_NAMES[self.stage]} x{self.world_size}, {self.recipe}: {parts}"
                f" = {fmt_bytes(self.total, unit, digits)} per GPU")


def model_states(num_params, *, world_size: int = 1, stage: int = 0,
                 recipe: str = "mixed") -> ModelStates:
    """Bytes of params, grads and optimizer states one rank holds.

    Args:
        num_params: parameter count Ψ of the model (e.g. ``7e9``), > 0.
        world_size: data-parallel ranks N the states are sharded over, >= 1.
        stage: 0 (plain DDP), 1, 2 or 3 (ZeRO stages).
        recipe: a key of :data:`RECIPES`.

    >>> model_states(7e9, world_size=4, stage=3).total / 1e9
    28.0
    """
    if isinstance(num_params, bool) or not isinstance(num_params, Real):
        raise TypeError(f"num_params must be a number such as 7e9, got {type(num_params).__name__}")
    if not math.isfinite(num_params) or num_params <= 0:
        raise ValueError(f"num_params must be > 0 (a parameter count such as 7e9), got {num_params!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (number of GPUs), got {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (number of data-parallel GPUs), got {world_size}")
    if stage not in STAGES or isinstance(stage, bool):
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3 (ZeRO stages), got {stage!r}")
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    bp, bg, bo = RECIPES[recipe]
    n = world_size
    params = num_params * bp / (n if stage >= 3 else 1)
    grads = num_params * bg / (n if stage >= 2 else 1)
    optimizer = num_params * bo / (n if stage >= 1 else 1)
    return ModelStates(_exact(params), _exact(grads), _exact(optimizer),
                       _exact(num_params), n, stage, recipe)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one rank's model states live: bytes on the accelerator and in host memory."""
    gpu: float
    cpu: float
    on_gpu: tuple[str, ...]
    on_cpu: tuple[str, ...]

    @property
    def total(self):
        return _exact(self.gpu + self.cpu)


def placement(states: ModelStates, *, offload_optimizer: bool = False,
              offload_params: bool = False) -> Placement:
    """Split ``states`` between GPU and host memory under CPU offload.

    * ``offload_optimizer`` (ZeRO-Offload, DeepSpeed ``offload_optimizer``): the optimizer
      states (fp32 master weights and Adam moments) live on the host, where the optimizer
      step runs; from ZeRO-2 on, the gradient shards are copied there too. Needs stage >= 1.
    * ``offload_params`` (ZeRO-Infinity / FSDP ``CPUOffloadPolicy``): the parameter shards
      and their gradients live on the host and are gathered to the GPU layer by layer.
      Needs stage 3 (parameters must be sharded) and implies ``offload_optimizer``.

    Transient GPU buffers (the layer being gathered, communication buckets) are not
    model states and are not counted here.
    """
    if not isinstance(states, ModelStates):
        raise TypeError("placement() takes the ModelStates returned by model_states(...)")
    if offload_params and states.stage != 3:
        raise ValueError("offload_params needs stage=3: only ZeRO-3 shards the parameters "
                         f"that would live on the host (got stage={states.stage})")
    if offload_optimizer and states.stage == 0:
        raise ValueError("offload_optimizer needs a ZeRO stage >= 1 (DeepSpeed offloads the "
                         "partitioned optimizer states); use stage=1, 2 or 3")
    if offload_params:
        offload_optimizer = True
    where = {"params": "gpu", "grads": "gpu", "optimizer": "gpu"}
    if offload_optimizer:
        where["optimizer"] = "cpu"
        if states.stage >= 2:
            where["grads"] = "cpu"
    if offload_params:
        where["params"] = "cpu"
    gpu = sum(getattr(states, k) for k, v in where.items() if v == "gpu")
    cpu = sum(getattr(states, k) for k, v in where.items() if v == "cpu")
    return Placement(_exact(gpu), _exact(cpu),
                     tuple(k for k, v in where.items() if v == "gpu"),
                     tuple(k for k, v in where.items() if v == "cpu"))


ATTENTION = ("standard", "flash")
RECOMPUTE = ("none", "selective", "full")
CROSS_ENTROPY = ("torch", "fused")
#: bool spellings of ``recompute`` kept working (the planner's ``Choice.recompute``)
_RECOMPUTE_ALIASES = {False: "none", True: "full"}
_S2_TERM = "attention scores"    # the s²-scaling term: what flash never stores, selective recomputes


def block_terms(model, *, micro_batch: int, seq: int | None = None,
                attention: str = "standard") -> dict[str, int]:
    """Bytes one transformer block saves for backward, term by term (no recomputation).

    With s = ``seq``, b = ``micro_batch``, h = hidden, a = heads, d = h/a, kv = a_kv·d
    (the key/value width: h unless grouped-query attention), f = FFN width, 16-bit (bf16)
    activations (2 bytes an element), and each tensor autograd saves counted once where
    two operations save the same one (a linear layer saves its input; an element-wise
    product saves both operands):

    ====================  ===========================  ===============================
    term                  GPT block (GELU, LayerNorm)  Llama block (SwiGLU, RMSNorm)
    ====================  ===========================  ===============================
    norm inputs           2 norms x 2·s·b·h            2 norms x 2·s·b·h
    norm statistics       (left out, as Korthikanti)   2 x 4·s·b (RMSNorm's fp32 1/rms)
    q/k/v input           2·s·b·h (norm output)        2·s·b·h
    q, k, v               2·s·b·(h + 2·kv)             2·s·b·(h + 2·kv)
    attention scores      5·a·s²·b                     2·a·s²·b
    softmax statistics    0                            4·a·s·b with flash (logsumexp)
    out-proj input        2·s·b·h                      2·s·b·h
    MLP input             2·s·b·h                      2·s·b·h
    MLP                   2·s·b·f + 2·s·b·f            4 x 2·s·b·f
    dropout masks         2 x s·b·h (1 byte each)      0 (Llama trains without dropout)
    ====================  ===========================  ===============================

    *GPT block* (Korthikanti et al. 2022, their count kept exactly): the attention scores
    are the softmax output (2·a·s²·b), its dropout mask (a·s²·b, one byte) and the
    dropped-out probabilities the product with V saves (2·a·s²·b); the MLP keeps the GELU's
    input and output, f = 4h wide; a one-byte dropout mask after attention and after the
    MLP. With f = 4h and kv = h the terms add up to 34·s·b·h + 5·a·s²·b: 4 (norms) + 2
    (q/k/v input) + 6 (q, k, v) + 2 (out-proj input) + 2 (MLP input) + 16 (MLP) + 2 (masks).
    Korthikanti et al. leave out the LayerNorms' per-token mean and 1/std and flash
    attention's logsumexp (< 0.1% of a block); so does this count for GPT configs.

    *Llama block* (``mlp="swiglu"``): no dropout, so the attention scores are the softmax
    output alone (2·a·s²·b, saved once: the softmax's backward and the product with V both
    use it); the SwiGLU MLP keeps the gate and up projections (f wide each), the SiLU
    output and their product (the down projection's input); RMSNorm keeps its input and
    one fp32 statistic per token; RoPE keeps only its cos/sin tables (s·d, not per
    sequence: left out). Grouped-query attention keeps K and V kv wide, as flash kernels
    take them (a kernel-less implementation that repeats them to h wide keeps more).

    ``attention="flash"``: a fused kernel never stores the s x s scores: the term is 0; it
    keeps q, k, v, its output (the out-proj input, the same tensor) and the logsumexp,
    one fp32 per head and token (counted for Llama blocks).

    Measured (``saved_tensors_hooks``, each storage once): one bf16 llama-2-7b block of
    the course model on an H200 (torch 2.11, cuDNN attention, s = 1024, b = 1) saves these
    terms plus RoPE's cos and sin tables (4·s·d·2 bytes) and 16 bytes of the attention's
    RNG seed and offset, to the byte; ``tests/test_activations.py`` checks a tiny Llama
    block on CPU the same way.
    """
    cfg = _config_of(model)
    s, b = _seq_batch(cfg, micro_batch, seq)
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    h, a, f = cfg.hidden, cfg.heads, cfg.ffn_
    kv = cfg.kv_heads_ * cfg.head_dim
    sb = s * b
    gpt = cfg.mlp == "gelu"
    flash = attention == "flash"
    scores = 0 if flash else (5 if gpt else 2) * a * s * s * b
    return {
        "norm inputs": 2 * 2 * sb * h,
        "norm statistics": 0 if cfg.norm == "layernorm" else 2 * 4 * sb,
        "q/k/v input": 2 * sb * h,
        "q, k, v": 2 * sb * (h + 2 * kv),
        _S2_TERM: scores,
        "softmax statistics": 4 * a * sb if (flash and not gpt) else 0,
        "out-proj input": 2 * sb * h,
        "MLP input": 2 * sb * h,
        "MLP": (2 if gpt else 4) * 2 * sb * f,
        "dropout masks": 2 * sb * h if gpt else 0,
    }


@dataclasses.dataclass(frozen=True)
class Activations:
    """Activation bytes on one rank at the peak of a training step (16-bit activations).

    ``layers + outside_layers`` is what autograd saves for backward (what
    ``torch.autograd.graph.saved_tensors_hooks`` sees); ``loss_grads`` and
    ``recompute_peak`` are transient buffers of backward, never alive at the same time
    (see :func:`activation_bytes`), so ``total`` adds the larger of the two.
    """
    per_layer: float        # kept by one block under the recompute policy
    layers: float           # per_layer x L
    outside_layers: float   # embedding dropout mask, final norm, output layer input, fp32 logits
    logits: float           # part of outside_layers: the fp32 log-probabilities the loss keeps
    micro_batch: int
    seq: int
    attention: str
    recompute: str
    loss_grads: float = 0           # fp32 gradients of the log-probabilities and the logits
    recompute_peak: float = 0       # one block's recomputed tensors during its backward
    terms: dict = dataclasses.field(default_factory=dict, compare=False)   # block_terms(...)

    @property
    def loss(self):
        """The output layer's share at the loss's backward: ``logits + loss_grads``."""
        return _exact(self.logits + self.loss_grads)

    @property
    def total(self):
        return _exact(self.layers + self.outside_layers + max(self.loss_grads, self.recompute_peak))


def _config_of(model):
    from .config import Preset, TransformerConfig

    if isinstance(model, Preset):
        if model.config is None:
            raise ValueError(f"preset {model.name!r} gives only a parameter count ({model.source}); "
                             "activations need an architecture: pass a TransformerConfig")
        return model.config
    if isinstance(model, str):
        from .config import preset

        return _config_of(preset(model))
    if isinstance(model, TransformerConfig):
        return model
    raise TypeError("pass a TransformerConfig, a Preset or a preset name such as 'gpt2-xl'")


def _seq_batch(cfg, micro_batch, seq) -> tuple[int, int]:
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be an int >= 1 (sequences per GPU per step), got {micro_batch!r}")
    seq = cfg.seq if seq is None else seq
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"seq must be an int >= 1 (tokens per sequence), got {seq!r}")
    return seq, micro_batch


def recompute_policy(recompute) -> str:
    """``"none"``, ``"selective"`` or ``"full"``; ``False``/``True`` are read as none/full."""
    if isinstance(recompute, bool):
        return _RECOMPUTE_ALIASES[recompute]
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} (or False/True for none/full), "
                         f"got {recompute!r}")
    return recompute


def activation_bytes(model, *, micro_batch: int, seq: int | None = None,
                     attention: str = "standard", recompute: str = "none",
                     cross_entropy: str = "torch") -> Activations:
    """Activation memory of a transformer at the peak of a step (no tensor parallelism).

    Per layer, :func:`block_terms` (GPT blocks: Korthikanti et al. 2022, 34·s·b·h +
    5·a·s²·b bytes; Llama blocks: their own count), under a recomputation policy:

    * ``"none"``: every block keeps all its terms.
    * ``"selective"`` (Korthikanti et al.; torch's op-level selective activation
      checkpointing set to recompute the attention core): the s²-scaling attention
      scores are not kept, every other term is; during a block's backward its scores are
      recomputed (``recompute_peak``: one block's scores; 0 with flash, which keeps none).
    * ``"full"`` (``torch.utils.checkpoint`` around every block): each block keeps only
      its 16-bit input, 2·s·b·h; during a block's backward its forward runs again and its
      saved tensors exist once more (``recompute_peak``: one block's terms minus the input,
      which is the same tensor as the one already kept).

    Outside the layers (saved, ``outside_layers``): the embedding dropout mask (s·b·h;
    GPT configs only), the final norm's and the output layer's inputs (2·s·b·h each), and
    the fp32 log-probabilities cross-entropy saves (``logits``, 4·s·b·V: the bf16 logits
    are upcast, and the upcast and the bf16 logits themselves are freed once
    log-softmax has run). At the loss's backward two more fp32 b·s·V buffers are alive
    together with the saved log-probabilities: their gradient (from the NLL) and the
    gradient of the logits that log-softmax's backward writes (``loss_grads``, 8·s·b·V,
    with ``cross_entropy="torch"``: ``F.cross_entropy``). ``cross_entropy="fused"``: a
    loss that writes its gradient over the fp32 softmax it saved (Megatron-LM's
    vocab-parallel cross-entropy, fused kernels): ``loss_grads`` is 0.
    The peak of a step is at that instant or, with recomputation, while a block is
    re-materialised; the loss's buffers are freed by then, so ``total`` adds
    ``max(loss_grads, recompute_peak)`` (it keeps counting the outside tensors at the
    second instant: an upper bound there by at most the logits' 4·s·b·V). A loop that
    keeps the bf16 logits alive through backward (a model output object holding them)
    adds 2·s·b·V; a chunked cross-entropy (never the whole b·s·V at once) removes most
    of the 12·s·b·V.

    Measured on an H200 (torch 2.11, bf16 logits of 4096 tokens x 32,000): the
    allocator holds 4·s·b·V bytes after the loss's forward and peaks at 12·s·b·V (each
    plus 1 KiB: the loss scalar) in its backward; ``tests/test_activations.py`` tracks
    the same on CPU.

    ``recompute`` also takes ``False``/``True`` (none/full).
    """
    cfg = _config_of(model)
    s, b = _seq_batch(cfg, micro_batch, seq)
    recompute = recompute_policy(recompute)
    if cross_entropy not in CROSS_ENTROPY:
        raise ValueError(f"cross_entropy must be one of {CROSS_ENTROPY} ('torch': F.cross_entropy; "
                         f"'fused': an in-place loss such as Megatron-LM's), got {cross_entropy!r}")
    terms = block_terms(cfg, micro_batch=b, seq=s, attention=attention)
    full_block = sum(terms.values())
    sbh = s * b * cfg.hidden
    if recompute == "full":
        per_layer, peak = 2 * sbh, full_block - 2 * sbh
    elif recompute == "selective":
        per_layer, peak = full_block - terms[_S2_TERM], terms[_S2_TERM]
    else:
        per_layer, peak = full_block, 0
    logits = 4 * s * b * cfg.vocab
    outside = (sbh if cfg.mlp == "gelu" else 0) + 2 * sbh + 2 * sbh + logits
    return Activations(per_layer, per_layer * cfg.layers, outside, logits, b, s, attention, recompute,
                       loss_grads=2 * logits if cross_entropy == "torch" else 0,
                       recompute_peak=peak, terms=terms)


@dataclasses.dataclass(frozen=True)
class GpuMemory:
    """Everything the calculator counts on one GPU, in bytes."""
    params: float
    grads: float
    optimizer: float
    activations: float
    cpu: float                 # model states moved to host memory by offload
    states: ModelStates
    activation_detail: Activations | None

    @property
    def total(self):
        return _exact(self.params + self.grads + self.optimizer + self.activations)

    def fits(self, gpu_bytes: float) -> bool:
        return self.total <= gpu_bytes


def per_gpu(model, *, world_size: int = 1, stage: int = 0, recipe: str = "mixed",
            offload_optimizer: bool = False, offload_params: bool = False,
            micro_batch: int | None = 1, seq: int | None = None,
            attention: str = "standard", recompute: str = "none",
            cross_entropy: str = "torch") -> GpuMemory:
    """Model states on this GPU (after offload) plus activations.

    ``model``: a parameter count, a TransformerConfig, a Preset or a preset name.
    ``micro_batch=None`` leaves activations out (e.g. for a preset with no architecture).
    Activations are :func:`activation_bytes`'s ``total`` (its peak, recompute peak and
    loss buffers included); ``recompute``: "none", "selective" or "full" (or False/True).
    """
    from .config import Preset, TransformerConfig, preset

    if isinstance(model, str):
        model = preset(model)
    if isinstance(model, Preset):
        num_params = model.num_params
    elif isinstance(model, TransformerConfig):
        num_params = model.num_params()
    else:
        num_params = model
    states = model_states(num_params, world_size=world_size, stage=stage, recipe=recipe)
    where = placement(states, offload_optimizer=offload_optimizer, offload_params=offload_params)
    acts = None
    if micro_batch is not None:
        if isinstance(model, Real) and not isinstance(model, bool):
            raise ValueError("activations need an architecture: pass a TransformerConfig or a "
                             "preset name, or micro_batch=None for model states only")
        acts = activation_bytes(model, micro_batch=micro_batch, seq=seq,
                                attention=attention, recompute=recompute,
                                cross_entropy=cross_entropy)
    part = {k: (getattr(states, k) if k in where.on_gpu else 0) for k in ("params", "grads", "optimizer")}
    return GpuMemory(part["params"], part["grads"], part["optimizer"],
                     acts.total if acts else 0, where.cpu, states, acts)
