"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) as course strategies, and its
layout and traffic predicted from the model alone.

Taught in ``notebooks/07_fsdp.ipynb``. Two strategies of
:mod:`course_utils.harness.strategies`:

* ``"torch-fsdp"``: ``fully_shard`` on every *unit* (every child of the model's first
  ``nn.ModuleList``, the course GPT's ``blocks``; or every submodule of ``unit_types``),
  then on the root, with ``reshard_after_forward=True``: ZeRO-3, the same design as the
  course's ``"zero3"`` (:mod:`course_utils.impl.zero3`).
* ``"torch-fsdp-zero2"``: the same with ``reshard_after_forward=False``: a unit's
  parameters stay gathered from its forward until its backward (no second all-gather).

fp32 throughout; rank 0's parameters are broadcast before sharding; the optimizer is
``make_optimizer`` over the sharded parameters (DTensors). The root stays gathered
between forward and backward (FSDP2's default for the root; the course GPT's tied
embedding is needed again at once), unless ``reshard_root=True``.

FSDP2 shards every parameter on dim 0, padding each to a multiple of N rows
(:func:`course_utils.theory.layout.dim0_padded_numel`), where the course's ``"zero3"``
pads a whole flat unit once; :func:`message_numels`, :func:`calls_per_step`,
:func:`comm_bytes_per_step` and :func:`expected_state_bytes` predict from that what a
run sends and holds, and ``tests/test_fsdp.py`` checks them against a real run.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..theory.layout import dim0_padded_numel, local_rows
from .common import broadcast_from_rank0, storage_bytes
from .zero3 import find_units

__all__ = ["shard_per_unit", "wrap_fsdp2", "wrap_torch_fsdp", "wrap_torch_fsdp_zero2", "fsdp_units", "fsdp_state_bytes",
           "local_tensor", "unit_message_numel", "message_numels",
           "comm_bytes_per_step", "calls_per_step", "expected_state_bytes"]


# ------------------------------------------------------------------ the layout, analytically

def fsdp_units(model: nn.Module, unit_types=None) -> list[nn.Module]:
    """The submodules ``fully_shard`` is applied to before the root: the units of
    :func:`~course_utils.impl.zero3.find_units` (the course's ``Zero3`` cuts the same way),
    innermost first when ``unit_types`` may nest."""
    units = [m for m, _ in find_units(model, unit_types)[1:]]
    return units if unit_types is None else units[::-1]


def _unit_params(model: nn.Module, unit_types=None) -> list[list[nn.Parameter]]:
    """Trainable parameters per FSDP unit: ``[root, *in fsdp_units order]``, each Parameter
    once, owned as :func:`~course_utils.impl.zero3.find_units` says."""
    root, *units = [ps for _, ps in find_units(model, unit_types)]
    return [root] + (units if unit_types is None else units[::-1])


def unit_message_numel(params, world_size: int) -> int:
    """Elements of one unit's all-gather output / reduce-scatter input: Σ padded_numel."""
    return sum(dim0_padded_numel(p.shape, world_size) for p in params)


def message_numels(model: nn.Module, world_size: int, unit_types=None) -> list[int]:
    """``[M_root, M_unit_1, ...]`` in elements, for an unwrapped ``model``."""
    return [unit_message_numel(ps, world_size) for ps in _unit_params(model, unit_types)]


def calls_per_step(num_units: int, *, reshard_after_forward: bool = True,
                   reshard_root: bool = False) -> dict:
    """Collective calls per step for ``num_units`` units plus the root."""
    g = 2 if reshard_after_forward else 1
    gathers = g * num_units + (g if reshard_root else 1)
    return {"all_reduce": 0, "reduce_scatter": num_units + 1, "all_gather": gathers}


def comm_bytes_per_step(model: nn.Module, world_size: int, *, reshard_after_forward: bool = True,
                        reshard_root: bool = False, bytes_per_elem: int = 4,
                        unit_types=None) -> dict:
    """Bytes one rank sends per step (ring convention of :class:`~course_utils.comm.CommLedger`),
    as exact :class:`fractions.Fraction` values, for an unwrapped ``model``."""
    from fractions import Fraction

    root, *units = message_numels(model, world_size, unit_types)
    f = Fraction(world_size - 1, world_size) * bytes_per_elem
    g = 2 if reshard_after_forward else 1
    return {"all_reduce": Fraction(0), "reduce_scatter": f * (root + sum(units)),
            "all_gather": f * ((g if reshard_root else 1) * root + g * sum(units))}


def expected_state_bytes(model: nn.Module, world_size: int, rank: int) -> dict:
    """What :func:`fsdp_state_bytes` reports on ``rank`` after an AdamW step, fp32, for an
    unwrapped ``model`` (every trainable parameter got a gradient)."""
    params = [p for ps in _unit_params(model) for p in ps]
    shard = 0
    real = 0
    for p in params:
        shape = tuple(p.shape) or (1,)
        rest = math.prod(shape[1:])
        shard += math.ceil(shape[0] / world_size) * rest
        real += local_rows(shape[0], world_size, rank) * rest
    return {"params": 4 * shard, "grads": 4 * shard, "optimizer": 4 * (2 * real + len(params))}


# ------------------------------------------------------------------ wrapping

def wrap_fsdp2(model, make_optimizer, *, reshard_after_forward: bool | int, group=None, unit_types=None,
               reshard_root: bool = False, mesh=None, fully_shard_kwargs: dict | None = None):
    """Broadcast rank 0's parameters, ``fully_shard`` every unit and the root
    (:func:`shard_per_unit`) on ``mesh`` (default: a 1-D mesh of ``group`` on the
    parameters' device), and build ``make_optimizer`` over the sharded parameters."""
    require_process_group("torch-fsdp")
    if mesh is not None and group is not None:
        raise ValueError("pass group= (a 1-D mesh is made from it) or mesh=, not both")
    broadcast_from_rank0(model, group)        # every rank starts from rank 0's model
    kwargs = dict(fully_shard_kwargs or {})               # mp_policy=, offload_policy=, ...
    if mesh is not None:                                   # e.g. a 2-D (replicate, shard) mesh: HSDP
        kwargs["mesh"] = mesh
    else:
        # A mesh on the parameters' device, always: fully_shard's default mesh is a CUDA one
        # whenever a GPU is visible, which breaks gloo CPU ranks on a one-GPU machine (Colab).
        from torch.distributed.device_mesh import DeviceMesh

        device_type = next(model.parameters()).device.type
        kwargs["mesh"] = DeviceMesh.from_group(group or dist.group.WORLD, device_type)
    shard_per_unit(model, reshard_after_forward=reshard_after_forward, unit_types=unit_types,
                   reshard_root=reshard_root, **kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, make_optimizer(params)


def shard_per_unit(model: nn.Module, *, mesh=None, reshard_after_forward: bool | int = True,
                   unit_types=None, reshard_root: bool = False, **fully_shard_kwargs) -> nn.Module:
    """``fully_shard`` each unit (:func:`fsdp_units`), then the root, and nothing else: no
    broadcast (each rank shards what it holds: build the model identically on every rank,
    or use :func:`wrap_torch_fsdp`, which broadcasts rank 0's weights first). The mesh
    defaults to all ranks on the parameters' device: ``fully_shard``'s own default is a
    CUDA mesh whenever a GPU is visible, wrong for gloo CPU ranks on a one-GPU machine.
    The root stays gathered between forward and backward unless ``reshard_root``."""
    from torch.distributed.fsdp import fully_shard

    if mesh is None:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(dist.group.WORLD, next(model.parameters()).device.type)
    for unit in fsdp_units(model, unit_types):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, **fully_shard_kwargs)
    return fully_shard(model, mesh=mesh, reshard_after_forward=bool(reshard_after_forward and reshard_root),
                       **fully_shard_kwargs)


def wrap_torch_fsdp(model, make_optimizer, *, group=None, unit_types=None, reshard_root: bool = False,
                    mesh=None, fully_shard_kwargs: dict | None = None):
    """The ``"torch-fsdp"`` strategy: ``fully_shard`` per block, then the root;
    ``reshard_after_forward=True`` (ZeRO-3); the root stays gathered unless
    ``reshard_root=True``. ``unit_types``: shard those submodules instead of the first
    ``nn.ModuleList``'s children. ``group``: a process group (a 1-D mesh is made from it);
    ``mesh``: a DeviceMesh to shard over instead (a 2-D one gives HSDP, notebook 08).
    ``fully_shard_kwargs``: more arguments of ``fully_shard`` (``mp_policy``, ...)."""
    return wrap_fsdp2(model, make_optimizer, reshard_after_forward=True, group=group, unit_types=unit_types,
                 reshard_root=reshard_root, mesh=mesh, fully_shard_kwargs=fully_shard_kwargs)


def wrap_torch_fsdp_zero2(model, make_optimizer, *, group=None, unit_types=None, mesh=None,
                          fully_shard_kwargs: dict | None = None):
    """The ``"torch-fsdp-zero2"`` strategy: as ``"torch-fsdp"`` with
    ``reshard_after_forward=False`` (parameters stay gathered between forward and backward)."""
    return wrap_fsdp2(model, make_optimizer, reshard_after_forward=False, group=group, unit_types=unit_types,
                 mesh=mesh, fully_shard_kwargs=fully_shard_kwargs)


def local_tensor(t):
    """This rank's local part of ``t`` (``DTensor.to_local()``), ``t`` itself otherwise."""
    if t is None:
        return None
    return t.to_local() if hasattr(t, "to_local") else t


def fsdp_state_bytes(model: nn.Module, optimizer) -> dict:
    """Bytes this rank holds: the local shards (``DTensor.to_local()`` storages) of the
    parameters, their gradients and the optimizer states, each storage once."""
    inner = getattr(optimizer, "inner", optimizer)
    params = list(model.parameters())
    seen: set = set()
    out = {"params": storage_bytes([local_tensor(p) for p in params], seen),
           "grads": storage_bytes([local_tensor(p.grad) for p in params], seen)}
    state = [local_tensor(v) for per in inner.state.values() for v in per.values()
             if isinstance(v, torch.Tensor)]
    out["optimizer"] = storage_bytes(state, seen)
    return out
