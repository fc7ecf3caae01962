"""The strategies :func:`course_utils.harness.experiments.run` and ``wrap`` know: one table."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

from ..checks import check_choice
from ..impl import ddp, fsdp, hsdp, zero3
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
    Strategy("single", wrap_single, distributed=False, notebook="02_data_parallelism",
             description="one process, the whole global batch; no communication"),
    Strategy("ddp", ddp.wrap_ddp, notebook="02_data_parallelism",
             description="data parallelism from scratch: bucketed async all-reduce of the "
                         "gradients during backward (DataParallel)"),
    Strategy("torch-ddp", probes.wrap_torch_ddp, notebook="02_data_parallelism",
             description="torch.nn.parallel.DistributedDataParallel"),
    Strategy("zero1", probes.wrap_zero1, notebook="04_zero1", extras=probes.zero_extras,
             description="ZeRO-1 from scratch: optimizer states sharded (flat padded buffers, "
                         "reduce-scatter, step on the shard, all-gather)"),
    Strategy("zero2", probes.wrap_zero2, notebook="05_zero2", extras=probes.zero_extras,
             description="ZeRO-2 from scratch: also gradients sharded, reduce-scattered "
                         "bucket by bucket during backward, full grads freed"),
    Strategy("torch-zero1", probes.wrap_torch_zero1, notebook="04_zero1",
             description="torch.distributed.optim.ZeroRedundancyOptimizer + gradient all-reduce"),
    Strategy("zero3", zero3.wrap_zero3, notebook="06_zero3",
             description="ZeRO-3 from scratch: parameters, gradients and optimizer states sharded; "
                         "each unit all-gathered for forward and again for backward, gradients "
                         "reduce-scattered (Zero3)"),
    Strategy("torch-fsdp", fsdp.wrap_torch_fsdp, notebook="07_fsdp",
             description="torch FSDP2: fully_shard per block then the root, "
                         "reshard_after_forward=True (ZeRO-3)"),
    Strategy("torch-fsdp-zero2", fsdp.wrap_torch_fsdp_zero2, notebook="07_fsdp",
             description="torch FSDP2 with reshard_after_forward=False: parameters stay gathered "
                         "between forward and backward (ZeRO-2-like)"),
    Strategy("torch-hsdp", hsdp.wrap_torch_hsdp, notebook="08_beyond_one_box",
             description=f"torch FSDP2 on a 2-D mesh (replicas x {DEFAULT_SHARDS} shards): "
                         "fully_shard inside each shard group, all-reduce across replicas (HSDP)"),
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
