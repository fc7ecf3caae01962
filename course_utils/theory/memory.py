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

__all__ = ["RECIPES", "ModelStates", "model_states", "GB", "GiB", "fmt_bytes", "to_unit",
           "Placement", "placement", "Activations", "activation_bytes", "GpuMemory", "per_gpu",
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

GB = 10**9      #: the ZeRO paper's "GB" (decimal)
GiB = 2**30     #: what nvidia-smi and DeepSpeed's estimators print (they label it "GB")
UNITS = {"B": 1, "GB": GB, "GiB": GiB, "MB": 10**6, "MiB": 2**20}


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


def _check_unit(unit: str) -> None:
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {sorted(UNITS)}, got {unit!r}")


def to_unit(num_bytes, unit: str = "GB") -> float:
    """Bytes expressed in ``unit`` ("GB" = 1e9 bytes, "GiB" = 2**30 bytes, ...)."""
    _check_unit(unit)
    return num_bytes / UNITS[unit]


def fmt_bytes(num_bytes, unit: str = "GB", digits: int = 1) -> str:
    """``28000000000`` -> ``"28.0 GB"``; always labelled with its unit."""
    return f"{to_unit(num_bytes, unit):.{digits}f} {unit}"


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


# ---------------------------------------------------------------------- offload

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


# ------------------------------------------------------------------ activations

ATTENTION = ("standard", "flash")
RECOMPUTE = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class Activations:
    """Activation bytes kept for backward on one rank (16-bit activations)."""

    per_layer: float
    layers: float           # per_layer x L
    outside_layers: float   # embedding dropout mask, final norm, output layer input, fp32 logits
    logits: float           # part of outside_layers: the fp32 logits the loss keeps
    micro_batch: int
    seq: int
    attention: str
    recompute: str

    @property
    def total(self):
        return _exact(self.layers + self.outside_layers)


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


def activation_bytes(model, *, micro_batch: int, seq: int | None = None,
                     attention: str = "standard", recompute: str = "none") -> Activations:
    """Activation memory of a transformer (Korthikanti et al. 2022, no tensor parallelism).

    Per layer, 16-bit activations with 1-byte dropout masks keep
    ``s·b·h·(34 + 5·a·s/h)`` bytes: 34·s·b·h for the linear layers, norms, GELU and
    dropouts, and 5·a·s²·b for the attention scores, softmax and its dropout mask.

    * ``attention="flash"``: a fused attention kernel never stores the s x s scores:
      the 5·a·s²·b term disappears (its few softmax statistics are ignored).
    * ``recompute="selective"``: recompute only the attention core in backward; same
      effect on memory as flash (34·s·b·h per layer).
    * ``recompute="full"``: keep only each layer's 16-bit input (2·s·b·h) and recompute
      the rest during backward.

    Outside the layers: the embedding dropout mask (s·b·h), the final norm's and the
    output layer's inputs (2·s·b·h each) and the fp32 logits the loss keeps (4·s·b·V).
    The formula was derived for GPT-style blocks (4h GELU MLP); for SwiGLU models it is
    an approximation.
    """
    cfg = _config_of(model)
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be an int >= 1 (sequences per GPU per step), got {micro_batch!r}")
    seq = cfg.seq if seq is None else seq
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"seq must be an int >= 1 (tokens per sequence), got {seq!r}")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    s, b, h, a, v = seq, micro_batch, cfg.hidden, cfg.heads, cfg.vocab
    sbh = s * b * h
    if recompute == "full":
        per_layer = 2 * sbh
    elif recompute == "selective" or attention == "flash":
        per_layer = 34 * sbh
    else:
        per_layer = 34 * sbh + 5 * a * s * s * b
    logits = 4 * s * b * v
    outside = sbh + 2 * sbh + 2 * sbh + logits
    return Activations(per_layer, per_layer * cfg.layers, outside, logits, b, s, attention, recompute)


# ------------------------------------------------------------------- per GPU

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
            attention: str = "standard", recompute: str = "none") -> GpuMemory:
    """Model states on this GPU (after offload) plus activations.

    ``model``: a parameter count, a TransformerConfig, a Preset or a preset name.
    ``micro_batch=None`` leaves activations out (e.g. for a preset with no architecture).
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
                                attention=attention, recompute=recompute)
    part = {k: (getattr(states, k) if k in where.on_gpu else 0) for k in ("params", "grads", "optimizer")}
    return GpuMemory(part["params"], part["grads"], part["optimizer"],
                     acts.total if acts else 0, where.cpu, states, acts)
