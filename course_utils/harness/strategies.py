"""The strategies :func:`course_utils.harness.experiments.run` and ``wrap`` know: one table."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

from ..checks import check_choice, require_process_group
from ..impl import ddp, zero
from ..impl.common import DEFAULT_BUCKET_BYTES, broadcast_from_rank0, real_optimizer, trainable
from ..impl.fsdp import make_mesh, wrap_fsdp2
from ..impl.zero3 import Zero3
from ..runtime.ledger import CommLedger
from ..theory.sharding import DEFAULT_SHARDS
from .probes import PeakGradBytes

__all__ = ["Strategy", "STRATEGIES", "strategies", "get", "register_strategy", "wrap_single", "wrap_ddp",
           "wrap_torch_ddp", "wrap_zero1", "wrap_zero2", "wrap_torch_zero1", "wrap_zero3", "wrap_torch_fsdp",
           "wrap_torch_fsdp_zero2", "wrap_torch_hsdp", "zero_extras"]


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


# ------------------------------------------------------------------ the adapters: (model, make_optimizer, **options) -> (model, optimizer)

def wrap_single(model, make_optimizer):
    return model, make_optimizer(trainable(model))


def wrap_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True, group=None, impl=None):
    """``"ddp"``: ``(DataParallel(model), make_optimizer(its trainable parameters))``; ``impl``:
    another class of ``MyDDP``'s shape, ``impl(model, bucket_bytes)`` (the learner's), its object
    marked ``wraps_module`` so that :func:`~course_utils.impl.ddp.unwrap` finds the model inside."""
    if impl is None or impl is ddp.DataParallel:
        wrapped = ddp.DataParallel(model, bucket_bytes, overlap=overlap, group=group)
        return wrapped, make_optimizer(wrapped.params)
    wrapped = impl(model, bucket_bytes)
    wrapped.wraps_module = True
    return wrapped, make_optimizer(trainable(model))


def wrap_torch_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, group=None):
    """``"torch-ddp"``: torch's ``DistributedDataParallel`` (``bucket_bytes=0``: one bucket per
    parameter), its all-reduces issued from Python so that a CommLedger sees them."""
    from torch.nn.parallel import DistributedDataParallel

    require_process_group("torch-ddp")
    device = next(model.parameters()).device
    cap_mb = None if bucket_bytes is None else max(bucket_bytes, 1) / 2**20
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      process_group=group, bucket_cap_mb=cap_mb)
    return CommLedger.attach_ddp(wrapped), make_optimizer(trainable(model))


def zero_extras(model, optimizer) -> dict:
    """What a ZeRO-1/2 run also reports: the buckets' sizes Ψ_b."""
    return {"bucket_numels": [b.numel for b in optimizer.buckets]} if isinstance(optimizer, zero.Zero1) else {}


def _wrap_zero(model, make_optimizer, stage, group, bucket_bytes, impl=None, **options):
    frozen = [p for p in model.parameters() if not p.requires_grad]
    broadcast_from_rank0(frozen + list(model.buffers()), group)   # the trained ones: the optimizer
    groups, cls, defaults = real_optimizer(model, make_optimizer)
    if impl not in (None, zero.Zero1 if stage == 1 else zero.Zero2):   # the learner's class, as it is
        broadcast_from_rank0(model, group)
        return model, (impl(groups, cls, **defaults) if stage == 1 else impl(groups, cls, bucket_bytes, **defaults))
    opt = zero.zero_optimizer(groups, cls, stage=stage, bucket_bytes=bucket_bytes, group=group,
                              observers=(PeakGradBytes,), **options, **defaults)
    opt.reset_peak()
    return model, opt


def wrap_zero1(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, variant="reduce_scatter",
               mixed=False, overlap=True, group=None, impl=None):
    """``"zero1"``: the model and a Zero1 over ``make_optimizer``'s class, groups and hyperparameters
    (``impl``: a class of ``MyZero1``'s shape instead, ``impl(groups, optimizer_class, **defaults)``)."""
    return _wrap_zero(model, make_optimizer, 1, group, bucket_bytes, impl, variant=variant, mixed=mixed,
                      overlap=overlap)


def wrap_zero2(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, mixed=False, overlap=True,
               group=None, impl=None):
    """``"zero2"``: the model itself and a :class:`~course_utils.impl.zero.Zero2` (``impl``: a class of
    ``MyZero2``'s shape instead, ``impl(groups, optimizer_class, bucket_bytes, **defaults)``)."""
    return _wrap_zero(model, make_optimizer, 2, group, bucket_bytes, impl, mixed=mixed, overlap=overlap)


def wrap_torch_zero1(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True, group=None):
    """``"torch-zero1"``: ZeroRedundancyOptimizer over the gradients ``"ddp"`` averages."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = ddp.DataParallel(model, bucket_bytes, overlap=overlap, group=group)
    groups, cls, defaults = real_optimizer(model.module, make_optimizer)
    return model, ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=group, **defaults)


def wrap_zero3(model, make_optimizer, *, overlap: bool = True, group=None, unit_types=None,
               reshard_root: bool = False, param_dtype=None, reduce_dtype=None, ignored_params=(),
               async_reduce: bool = False, impl=None):
    """The ``"zero3"`` strategy: ``(Zero3(model), optimizer)``; ``overlap`` is the prefetch
    switch. ``make_optimizer`` runs on the full-shaped Parameters (so groups made from
    ``p.ndim`` are right), then the optimizer is rebuilt, same class, groups and
    hyperparameters, over the same Parameters, at rest their pieces of the shards.
    ``impl``: a unit class of ``MyFlatUnit``'s shape instead, the whole model made of its units
    (:class:`~course_utils.harness.units.UnitModel`; one flat shard per unit, so one set of
    hyperparameters), prefetching when the class has a ``prefetch()`` (exercise 06.2) and
    ``overlap``; ``impl=Zero3``: the course's own."""
    groups, cls, defaults = real_optimizer(model, make_optimizer)   # grouped while full-shaped
    if impl is not None and impl is not Zero3:
        from .units import UnitModel
        if any({k: v for k, v in g.items() if k != "params"} != {k: v for k, v in groups[0].items() if k != "params"}
               for g in groups):
            raise ValueError(f"impl={impl.__name__} keeps one flat shard per unit, so one set of optimizer "
                             "hyperparameters: make_optimizer must build a single parameter group")
        units = UnitModel(model, impl, prefetch=overlap and callable(getattr(impl, "prefetch", None)))
        return units, cls([{**groups[0], "params": units.shard_parameters()}], **defaults)
    z = Zero3(model, unit_types=unit_types, prefetch=overlap, reshard_root=reshard_root, param_dtype=param_dtype,
              reduce_dtype=reduce_dtype, ignored_params=ignored_params, group=group, async_reduce=async_reduce)
    return z, cls(groups, **defaults)


def wrap_torch_fsdp(model, make_optimizer, *, group=None, unit_types=None, reshard_root: bool = False,
                    mesh=None, fully_shard_kwargs: dict | None = None):
    """The ``"torch-fsdp"`` strategy: :func:`wrap_fsdp2` with ``reshard_after_forward=True``
    (ZeRO-3). ``unit_types``: shard those submodules instead of the first ``nn.ModuleList``'s
    children; ``mesh``: a 2-D one gives HSDP (notebook 08); ``fully_shard_kwargs``:
    ``mp_policy``, ``offload_policy``, ..."""
    return wrap_fsdp2(model, make_optimizer, reshard_after_forward=True, group=group, unit_types=unit_types,
                      reshard_root=reshard_root, mesh=mesh, fully_shard_kwargs=fully_shard_kwargs)


def wrap_torch_fsdp_zero2(model, make_optimizer, *, group=None, unit_types=None, mesh=None,
                          fully_shard_kwargs: dict | None = None):
    """The ``"torch-fsdp-zero2"`` strategy: parameters stay gathered from forward to backward."""
    return wrap_fsdp2(model, make_optimizer, reshard_after_forward=False, group=group, unit_types=unit_types,
                      mesh=mesh, fully_shard_kwargs=fully_shard_kwargs)


# Hybrid sharding (HSDP): FSDP inside a group of ranks, plain data parallelism across groups.
#
# Taught in ``notebooks/08_beyond_one_box.ipynb``; the strategy ``"torch-hsdp"``: ``"torch-fsdp"``
# (:mod:`course_utils.impl.fsdp`) on a **2-D device mesh** ``(replicas, shards)``, dims
# ``("replicate", "shard")``. Each parameter is sharded over the ``shards`` ranks of its mesh
# row (the *shard group*: one node's GPUs, fast links), which all-gather parameters and
# reduce-scatter gradients; each gradient shard is then all-reduced across the ``replicas``
# ranks holding the same shard (the *replicate group*, one rank per node: the only traffic on
# the slow inter-node links). ``run("torch-hsdp", 4)`` is 2 replicas x 2 shards
# (:data:`DEFAULT_SHARDS`: pretend nodes of 2 ranks); on 2 ranks ``shards=2`` is FSDP (FSDP2
# still all-reduces, over 1-rank groups: 0 bytes), ``shards=1`` DDP-like (one all-reduce per unit).
# Predictions: :mod:`course_utils.theory.sharding`; time across nodes:
# :mod:`course_utils.theory.multinode`; measurements: :mod:`course_utils.labs.hsdp_lab`.
def wrap_torch_hsdp(model, make_optimizer, *, shards: int = DEFAULT_SHARDS,
                    reshard_after_forward: bool = True, group=None, unit_types=None):
    """The ``"torch-hsdp"`` strategy: ``"torch-fsdp"`` on the 2-D mesh of :func:`make_mesh`
    (``world_size/shards`` replicas x ``shards`` shards) over all ranks, hence no ``group``."""
    if group is not None:
        raise ValueError("torch-hsdp builds its own 2-D mesh over all ranks; call it without group=")
    require_process_group("torch-hsdp")
    mesh = make_mesh(next(model.parameters()).device.type, shards=shards)
    return wrap_fsdp2(model, make_optimizer, reshard_after_forward=reshard_after_forward,
                      mesh=mesh, unit_types=unit_types)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("single", wrap_single, False, "one process, the whole global batch", "02_data_parallelism"),
    Strategy("ddp", wrap_ddp, True, "DataParallel: bucketed async all-reduce during backward",
             "02_data_parallelism"),
    Strategy("torch-ddp", wrap_torch_ddp, True, "torch's DistributedDataParallel", "02_data_parallelism"),
    Strategy("zero1", wrap_zero1, True, "ZeRO-1: optimizer states sharded", "04_zero1", zero_extras),
    Strategy("zero2", wrap_zero2, True, "ZeRO-2: also gradients, reduce-scattered in backward",
             "05_zero2", zero_extras),
    Strategy("torch-zero1", wrap_torch_zero1, True, "ZeroRedundancyOptimizer + gradient all-reduce",
             "04_zero1"),
    Strategy("zero3", wrap_zero3, True, "Zero3: parameters too, gathered per unit", "06_zero3"),
    Strategy("torch-fsdp", wrap_torch_fsdp, True, "FSDP2 fully_shard per block, then the root", "07_fsdp"),
    Strategy("torch-fsdp-zero2", wrap_torch_fsdp_zero2, True,
             "FSDP2, reshard_after_forward=False (ZeRO-2-like)", "07_fsdp"),
    Strategy("torch-hsdp", wrap_torch_hsdp, True,
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
