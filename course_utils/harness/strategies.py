"""The strategies :func:`course_utils.harness.experiments.run` and ``wrap`` know: one table."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

from ..checks import check_choice
from ..impl import fsdp, hsdp, zero3
from ..impl.common import trainable
from ..theory.sharding import DEFAULT_SHARDS
from . import probes

__all__ = ["Strategy", "STRATEGIES", "strategies", "get", "register_strategy"]


@dataclasses.dataclass(frozen=True)
class Strategy:
    """wrap: ``(model, make_optimizer, **options) -> (model, optimizer)``; extras:
    ``(model, optimizer) -> dict`` of what else a run reports."""
    name: str
    wrap: Callable
    distributed: bool = True
    description: str = ""
    notebook: str = ""
    extras: Callable | None = None

    @property
    def options(self) -> tuple[str, ...]:
        """The keyword options ``wrap`` accepts for this strategy."""
        return tuple(n for n, p in inspect.signature(self.wrap).parameters.items()
                     if p.kind is p.KEYWORD_ONLY)


def wrap_single(model, make_optimizer):
    return model, make_optimizer(trainable(model))


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("single", wrap_single, False, "one process, the whole global batch", "02_data_parallelism"),
    Strategy("ddp", probes.wrap_ddp, True, "DataParallel: bucketed async all-reduce during backward",
             "02_data_parallelism"),
    Strategy("torch-ddp", probes.wrap_torch_ddp, True, "torch's DistributedDataParallel", "02_data_parallelism"),
    Strategy("zero1", probes.wrap_zero1, True, "ZeRO-1: optimizer states sharded", "04_zero1", probes.zero_extras),
    Strategy("zero2", probes.wrap_zero2, True, "ZeRO-2: also gradients, reduce-scattered in backward",
             "05_zero2", probes.zero_extras),
    Strategy("torch-zero1", probes.wrap_torch_zero1, True, "ZeroRedundancyOptimizer + gradient all-reduce",
             "04_zero1"),
    Strategy("zero3", zero3.wrap_zero3, True, "Zero3: parameters too, gathered per unit", "06_zero3"),
    Strategy("torch-fsdp", fsdp.wrap_torch_fsdp, True, "FSDP2 fully_shard per block, then the root", "07_fsdp"),
    Strategy("torch-fsdp-zero2", fsdp.wrap_torch_fsdp_zero2, True,
             "FSDP2, reshard_after_forward=False (ZeRO-2-like)", "07_fsdp"),
    Strategy("torch-hsdp", hsdp.wrap_torch_hsdp, True,
             f"FSDP2 on a 2-D mesh (replicas x {DEFAULT_SHARDS} shards): HSDP", "08_beyond_one_box"),
)}


def strategies() -> list[str]:
    return list(STRATEGIES)


def get(name) -> Strategy:
    check_choice("strategy", name, STRATEGIES, kind="strategy", kinds="strategies")
    return STRATEGIES[name]


def register_strategy(name: str, wrap_fn: Callable, *, distributed: bool = True,
                      description: str = "", notebook: str = "") -> Strategy:
    """Add your own strategy to :data:`STRATEGIES` (each name once)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a strategy name must be a non-empty str, got {name!r}")
    if name in STRATEGIES:
        raise ValueError(f"strategy {name!r} is already registered")
    if not callable(wrap_fn):
        raise TypeError("wrap_fn must be callable: (model, make_optimizer, **options) -> (model, optimizer)")
    STRATEGIES[name] = Strategy(name, wrap_fn, distributed, description, notebook)
    return STRATEGIES[name]
