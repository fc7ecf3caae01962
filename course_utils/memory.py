"""Where the memory goes: bytes of model states per GPU, for DDP and ZeRO stages 1-3.

Taught in ``notebooks/03_memory.ipynb`` (first used for the course map in
``notebooks/00_orientation.ipynb``).

Model states per parameter, for the recipes the ZeRO paper and the seeds use:

==================  ======  =====  =================================================
recipe              params  grads  optimizer states (Adam)
==================  ======  =====  =================================================
``fp32``            4       4      8   (m and v, fp32)
``mixed``           2       2      12  (fp32 master copy + m + v: the paper's K = 12)
``mixed-fp32-grads``2       4      12  (fp32 gradient accumulation, e.g. Megatron: 18 B)
==================  ======  =====  =================================================

ZeRO shards, across ``world_size`` data-parallel ranks: stage 1 the optimizer states,
stage 2 also the gradients, stage 3 also the parameters. Sharded parts are the
analytic ``num_params * bytes / world_size`` (real implementations pad to a multiple
of the world size; notebooks 04-06 measure that padding).
"""
from __future__ import annotations

import dataclasses
import math
from numbers import Real

__all__ = ["RECIPES", "ModelStates", "model_states", "GB", "GiB", "fmt_bytes", "to_unit"]

#: bytes per parameter for (params, grads, optimizer states)
RECIPES: dict[str, tuple[int, int, int]] = {
    "fp32": (4, 4, 8),
    "mixed": (2, 2, 12),
    "mixed-fp32-grads": (2, 4, 12),
}

STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}

GB = 10**9      #: the ZeRO paper's and the seeds' "GB"
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


def _check_count(name: str, value, *, minimum) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


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
