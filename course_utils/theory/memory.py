"""Where the memory goes (notebook 03): model states per GPU for DDP and ZeRO-1/2/3, and activations.

Bytes per parameter (params, grads, optimizer) are :data:`RECIPES`. DeepSpeed's ``mixed``
keeps an fp32 master in the optimizer (ZeRO-1 shards 12 of 16 B); in torch (``torch-amp``)
the fp32 parameter is the master, so its ZeRO-1 shards only m and v (4 + 4 + 8/N). Sharded
parts are the analytic ``num_params * bytes / world_size`` (notebooks 04-06 measure the padding).
"""
from __future__ import annotations

import dataclasses

from ..checks import check_int, check_number, is_int, is_number
from .text import GB, UNITS, GiB, fmt_bytes, to_unit  # noqa: F401 (re-exported)

__all__ = ["RECIPES", "ModelStates", "model_states", "GB", "GiB", "fmt_bytes", "to_unit",
           "Placement", "placement", "Activations", "activation_bytes", "block_terms",
           "recompute_policy", "GpuMemory", "per_gpu", "STAGE_NAMES", "OP_SELECTIVE", "op_selective_terms"]

#: bytes per parameter for (params, grads, optimizer states)
RECIPES: dict[str, tuple[int, int, int]] = {"fp32": (4, 4, 8), "mixed": (2, 2, 12),
                                             "mixed-fp32-grads": (2, 4, 12), "torch-amp": (4, 4, 8)}

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

    def describe(self, unit: str = "GB", digits: int = 1) -> str:
        """One labelled line, e.g. ``ZeRO-1 x4, mixed: params 14.0 GB + ...``."""
        parts = " + ".join(f"{k} {fmt_bytes(getattr(self, k), unit, digits)}"
                           for k in ("params", "grads", "optimizer"))
        return (f"{STAGE_NAMES[self.stage]} x{self.world_size}, {self.recipe}: {parts}"
                f" = {fmt_bytes(self.total, unit, digits)} per GPU")


def model_states(num_params, *, world_size: int = 1, stage: int = 0,
                 recipe: str = "mixed", trainable: float = 1) -> ModelStates:
    """Bytes of params, grads and optimizer states one rank holds (stage 0: DDP). ``trainable``:
    the fraction that trains (LoRA: ~0.01); the frozen rest holds params only, sharded by stage 3
    as FSDP2 does (the course's ``Zero3`` keeps them whole: notebook 12 §6).

    >>> model_states(7e9, world_size=4, stage=3).total / 1e9
    28.0
    """
    check_number("num_params", num_params, above=0, example="7e9")
    check_int("world_size", world_size, 1, what="number of data-parallel GPUs")
    if not is_int(stage) or stage not in STAGE_NAMES:
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3 (ZeRO stages), got {stage!r}")
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    check_number("trainable", trainable, above=0, maximum=1, example="0.01")
    bp, bg, bo = RECIPES[recipe]
    n, trained = world_size, num_params * trainable
    params = num_params * bp / (n if stage >= 3 else 1)
    grads = trained * bg / (n if stage >= 2 else 1)
    optimizer = trained * bo / (n if stage >= 1 else 1)
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
    """Split ``states`` between GPU and host under CPU offload: ``offload_optimizer`` (stage >= 1;
    from stage 2 the gradient shards too), ``offload_params`` (stage 3; implies the optimizer)."""
    if not isinstance(states, ModelStates):
        raise TypeError("placement() takes the ModelStates returned by model_states(...)")
    if offload_params and states.stage != 3:
        raise ValueError("offload_params needs stage=3: only ZeRO-3 shards the parameters "
                         f"that would live on the host (got stage={states.stage})")
    if offload_optimizer and states.stage == 0:
        raise ValueError("offload_optimizer needs a ZeRO stage >= 1 (DeepSpeed offloads the "
                         "partitioned optimizer states); use stage=1, 2 or 3")
    off_opt = offload_optimizer or offload_params
    on_cpu = {"params": offload_params, "grads": off_opt and states.stage >= 2, "optimizer": off_opt}
    gpu = tuple(k for k, c in on_cpu.items() if not c)
    cpu = tuple(k for k, c in on_cpu.items() if c)
    return Placement(_exact(sum(getattr(states, k) for k in gpu)),
                     _exact(sum(getattr(states, k) for k in cpu)), gpu, cpu)


ATTENTION = ("standard", "flash")
#: recomputation policies: none, selective (Korthikanti et al.: the attention core), full (every block)
RECOMPUTE = ("none", "selective", "full")
#: torch's op-level selective checkpointing (``create_selective_checkpoint_contexts``, a policy saying
#: which ops' outputs are saved; the rest is recomputed in backward): every k-th matmul saved.
#: "op-selective": every ``aten.mm`` (torch's docstring example) and the fused attention kernels;
#: "torchtitan": its ``_save_list`` (torchtitan 9dec370, torchtitan/parallelisms/parallelize_llama.py
#: l. 214-276, the Table 1 run's commit): the same with every second ``aten.mm`` recomputed (its
#: reduce_scatter, abs and max run in no bf16 1-D FSDP block). activation_bytes(recompute=...) only.
OP_SELECTIVE = {"op-selective": 1, "torchtitan": 2}
CROSS_ENTROPY = ("torch", "fused")
_S2_TERM = "attention scores"    # the s²-scaling term: what flash never stores, selective recomputes


def block_terms(model, *, micro_batch: int, seq: int | None = None,
                attention: str = "standard") -> dict[str, int]:
    """Bytes one block saves for backward, term by term (16-bit): Korthikanti et al. 2022 for GPT
    (34·s·b·h + 5·a·s²·b), Llama's own count; flash keeps no s x s scores. Measured to the byte
    on an H200 llama-2-7b block; tests/test_activations.py checks a tiny one on CPU."""
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
    """Activation bytes on one rank at the peak of a step: what autograd saves plus the larger
    of two transients never alive together (``loss_grads``, ``recompute_peak``)."""
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
        return _exact(self.logits + self.loss_grads)

    @property
    def total(self):
        return _exact(self.layers + self.outside_layers + max(self.loss_grads, self.recompute_peak))


def _config_of(model):
    from .config import Preset, TransformerConfig, preset

    if isinstance(model, str):
        model = preset(model)
    if isinstance(model, Preset):
        if model.config is None:
            raise ValueError(f"preset {model.name!r} gives only a parameter count ({model.source}); "
                             "activations need an architecture: pass a TransformerConfig")
        return model.config
    if isinstance(model, TransformerConfig):
        return model
    raise TypeError("pass a TransformerConfig, a Preset or a preset name such as 'gpt2-xl'")


def _seq_batch(cfg, micro_batch, seq) -> tuple[int, int]:
    check_int("micro_batch", micro_batch, 1, what="sequences per GPU per step")
    seq = cfg.seq if seq is None else seq
    check_int("seq", seq, 1, what="tokens per sequence")
    return seq, micro_batch


def op_selective_terms(model, *, micro_batch: int, seq: int | None = None, attention: str = "flash",
                       policy: str = "torchtitan") -> dict[str, int]:
    """Bytes one block keeps under an :data:`OP_SELECTIVE` policy: its input (the checkpoint holds it),
    the saved matmul outputs (bias-free projections run as ``aten.mm``; a bias makes them
    ``aten.addmm``, which neither list names) and a fused attention kernel's output and fp32
    logsumexp (standard attention runs as bmm and softmax: recomputed). tests/test_activations.py
    checks it to the byte on CPU blocks under torch's SAC."""
    cfg = _config_of(model)
    s, b = _seq_batch(cfg, micro_batch, seq)
    if policy not in OP_SELECTIVE:
        raise ValueError(f"policy must be one of {tuple(OP_SELECTIVE)}, got {policy!r}")
    h, f, kv = cfg.hidden, cfg.ffn_, cfg.kv_heads_ * cfg.head_dim
    mlp = [("gate", f), ("up", f)] if cfg.mlp == "swiglu" else [("up", f)]
    mms = [("q", h), ("k", kv), ("v", kv), ("out-proj", h), *mlp, ("down", h)]
    terms = {"block input": 2 * s * b * h}
    terms.update({f"{n} output": 2 * s * b * w for i, (n, w) in enumerate(mms)
                  if not cfg.bias and i % OP_SELECTIVE[policy] == 0})
    if attention == "flash":
        terms.update({"attention output": 2 * s * b * h, "logsumexp": 4 * cfg.heads * s * b})
    return terms


def recompute_policy(recompute) -> str:
    """``"none"``, ``"selective"``, ``"full"`` or an :data:`OP_SELECTIVE` policy; ``False``/``True``
    are read as none/full."""
    if isinstance(recompute, bool):
        return "full" if recompute else "none"
    if recompute not in (*RECOMPUTE, *OP_SELECTIVE):
        raise ValueError(f"recompute must be one of {RECOMPUTE + tuple(OP_SELECTIVE)} (or False/True "
                         f"for none/full), got {recompute!r}")
    return recompute


def activation_bytes(model, *, micro_batch: int, seq: int | None = None,
                     attention: str = "standard", recompute: str = "none",
                     cross_entropy: str = "torch") -> Activations:
    """Activations at the peak of a step: :func:`block_terms` per layer under ``recompute`` (or
    :func:`op_selective_terms` under an :data:`OP_SELECTIVE` policy), the
    output layer's inputs and fp32 log-probs, plus the larger of the loss's fp32 gradients
    (8·s·b·V, "fused": 0) and one block's recompute (H200: the loss peaks at 12·s·b·V)."""
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
    elif recompute in OP_SELECTIVE:     # peak: at most the block again (cached outputs are not redone)
        per_layer = sum(op_selective_terms(cfg, micro_batch=b, seq=s, attention=attention,
                                           policy=recompute).values())
        peak = full_block - 2 * sbh
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
            cross_entropy: str = "torch", trainable: float = 1) -> GpuMemory:
    """Model states on this GPU after offload plus activations (``micro_batch=None``: none);
    ``trainable``: as in :func:`model_states`."""
    from .config import Preset, TransformerConfig, preset

    if isinstance(model, str):
        model = preset(model)
    num_params = (model.num_params if isinstance(model, Preset) else
                  model.num_params() if isinstance(model, TransformerConfig) else model)
    states = model_states(num_params, world_size=world_size, stage=stage, recipe=recipe, trainable=trainable)
    where = placement(states, offload_optimizer=offload_optimizer, offload_params=offload_params)
    acts = None
    if micro_batch is not None:
        if is_number(model):
            raise ValueError("activations need an architecture: pass a TransformerConfig or a "
                             "preset name, or micro_batch=None for model states only")
        acts = activation_bytes(model, micro_batch=micro_batch, seq=seq, attention=attention,
                                recompute=recompute, cross_entropy=cross_entropy)
    on_gpu = (getattr(states, k) if k in where.on_gpu else 0 for k in ("params", "grads", "optimizer"))
    return GpuMemory(*on_gpu, acts.total if acts else 0, where.cpu, states, acts)
