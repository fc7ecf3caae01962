"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) as course strategies.

Taught in ``notebooks/07_fsdp.ipynb``. Two strategies of
:mod:`course_utils.harness.strategies`:

* ``"torch-fsdp"``: ``fully_shard`` on every *unit* (every child of the model's first
  ``nn.ModuleList``, the course GPT's ``blocks``; or every submodule of ``unit_types``),
  then on the root, with ``reshard_after_forward=True``: ZeRO-3, the same design as the
  course's ``"zero3"`` (:mod:`course_utils.impl.zero3`).
* ``"torch-fsdp-zero2"``: the same with ``reshard_after_forward=False``: a unit's
  parameters stay gathered from its forward until its backward (no second all-gather).

fp32 throughout; rank 0's parameters are broadcast before sharding. The root stays gathered
between forward and backward (FSDP2's default for the root; the course GPT's tied
embedding is needed again at once), unless ``reshard_root=True``. What a run sends and
holds is predicted in :mod:`course_utils.theory.sharding`.
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..theory.sharding import MESH_DIM_NAMES, fsdp_units, mesh_shape
from .common import broadcast_from_rank0

__all__ = ["shard_per_unit", "wrap_fsdp2", "make_mesh"]


# ------------------------------------------------------------------ wrapping

def make_mesh(device_type: str | None = None, *, group=None, shards: int | None = None):
    """The ``DeviceMesh`` to shard over on ``device_type`` (default: this rank's device), made on
    every rank: 1-D over ``group`` (default all ranks), or 2-D ``(replicas, shards)``, row-major
    (HSDP). Always pass one: ``fully_shard``'s default is a CUDA mesh whenever a GPU is visible,
    which breaks gloo CPU ranks on a one-GPU machine (Colab)."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from ..runtime.launch import rank_device

    require_process_group("make_mesh")
    device_type = device_type or rank_device().type
    if shards is None:
        return DeviceMesh.from_group(group or dist.group.WORLD, device_type)
    if group is not None:
        raise ValueError("a 2-D mesh spans all ranks: pass group= or shards=, not both")
    return init_device_mesh(device_type, mesh_shape(dist.get_world_size(), shards), mesh_dim_names=MESH_DIM_NAMES)


def wrap_fsdp2(model, make_optimizer, *, reshard_after_forward: bool | int, group=None, unit_types=None,
               reshard_root: bool = False, mesh=None, fully_shard_kwargs: dict | None = None):
    """Broadcast rank 0's parameters, ``fully_shard`` every unit and the root
    (:func:`shard_per_unit`) on ``mesh`` (default: :func:`make_mesh` of ``group``), and build
    ``make_optimizer`` over the sharded parameters (DTensors)."""
    require_process_group("torch-fsdp")
    if mesh is not None and group is not None:
        raise ValueError("pass group= (a 1-D mesh is made from it) or mesh=, not both")
    broadcast_from_rank0(model, group)        # every rank starts from rank 0's model
    if mesh is None:
        mesh = make_mesh(next(model.parameters()).device.type, group=group)
    shard_per_unit(model, mesh=mesh, reshard_after_forward=reshard_after_forward, unit_types=unit_types,
                   reshard_root=reshard_root, **(fully_shard_kwargs or {}))   # mp_policy=, offload_policy=, ...
    return model, make_optimizer([p for p in model.parameters() if p.requires_grad])


def shard_per_unit(model: nn.Module, *, mesh=None, reshard_after_forward: bool | int = True,
                   unit_types=None, reshard_root: bool = False, **fully_shard_kwargs) -> nn.Module:
    """``fully_shard`` each unit (:func:`fsdp_units`), then the root (kept gathered from forward
    to backward unless ``reshard_root``), and nothing else: no broadcast (each rank shards what
    it holds; :func:`wrap_fsdp2` broadcasts rank 0's weights first)."""
    from torch.distributed.fsdp import fully_shard

    if mesh is None:
        mesh = make_mesh(next(model.parameters()).device.type)
    for unit in fsdp_units(model, unit_types):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, **fully_shard_kwargs)
    return fully_shard(model, mesh=mesh, reshard_after_forward=bool(reshard_after_forward and reshard_root),
                       **fully_shard_kwargs)
