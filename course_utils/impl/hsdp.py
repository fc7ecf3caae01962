"""Hybrid sharding (HSDP): FSDP inside a group of ranks, plain data parallelism across groups.

Taught in ``notebooks/08_beyond_one_box.ipynb``; the strategy ``"torch-hsdp"`` of
:mod:`course_utils.harness.strategies`:
``fully_shard(mesh=...)`` per block and then on the root, as ``"torch-fsdp"``
(:mod:`course_utils.impl.fsdp`), but on a **2-D device mesh** of shape ``(replicas, shards)``
with dimension names ``("replicate", "shard")``:

* every parameter is sharded over the ``shards`` ranks of its row of the mesh (the
  *shard group*, meant to be the GPUs of one node, joined by fast links); the rows
  are ``replicas`` identical copies of the sharded model (one per node);
* forward and backward all-gather each unit's parameters inside the shard group and
  reduce-scatter its gradients there (FSDP2's messages: every parameter's dim 0
  padded to a multiple of ``shards``, :func:`course_utils.theory.layout.dim0_padded_numel`);
* each reduce-scattered gradient shard (``1/shards`` of the unit) is then all-reduced
  across the ``replicas`` ranks that hold the same shard (the *replicate group*, one
  rank per node: the only traffic that crosses the slow inter-node links).

Ranks are laid out row-major, as ``init_device_mesh`` does: with 4 ranks and 2 shards the
shard groups are {0, 1} and {2, 3}, the replicate groups {0, 2} and {1, 3}.
:data:`DEFAULT_SHARDS` = 2 pretends each "node" has 2 ranks: ``run("torch-hsdp", 4)`` is
2 replicas x 2 shards. Other shapes through :func:`wrap_torch_hsdp` (``shards=``); on
2 ranks, ``shards=2`` is one replica of 2 shards (FSDP; FSDP2 still issues its
replicate all-reduces, on a 1-rank group: 0 bytes) and ``shards=1`` is 2 replicas of an
unsharded model (DDP-like: one all-reduce per unit, no all-gather, no reduce-scatter).

What HSDP sends per step and holds is predicted from the model alone
(:func:`hsdp_comm_bytes_per_step`, :func:`hsdp_expected_state_bytes`) and checked against
a real run in ``tests/test_hsdp.py``; the time model of full sharding vs HSDP across
nodes is :mod:`course_utils.theory.multinode`, the measurements are
:mod:`course_utils.labs.hsdp_lab`.
"""
from __future__ import annotations

from fractions import Fraction

from ..checks import check_int, require_process_group
from ..runtime.fmt import plural
from . import fsdp

__all__ = ["DEFAULT_SHARDS", "MESH_DIM_NAMES", "mesh_shape", "mesh_groups", "make_mesh",
           "wrap_torch_hsdp", "hsdp_calls_per_step", "hsdp_comm_bytes_per_step",
           "hsdp_expected_state_bytes"]

#: Ranks per shard group of ``run("torch-hsdp", N)``: the course's pretend "GPUs per node".
DEFAULT_SHARDS = 2
#: The names of the two mesh dimensions, outer (across nodes) first.
MESH_DIM_NAMES = ("replicate", "shard")


# ------------------------------------------------------------------ the mesh

def mesh_shape(world_size: int, shards: int = DEFAULT_SHARDS) -> tuple[int, int]:
    """``(replicas, shards)`` of the HSDP mesh for ``world_size`` ranks."""
    check_int("world_size", world_size, 1)
    check_int("shards", shards, 1)
    if world_size % shards:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(f"HSDP needs world_size divisible by shards: {plural(world_size, 'rank')} cannot form "
                         f"groups of {shards}; use shards in {fits} (or a world size that "
                         f"{shards} divides)")
    return world_size // shards, shards


def mesh_groups(world_size: int, shards: int = DEFAULT_SHARDS) -> dict:
    """The ranks of every shard group (mesh rows) and replicate group (mesh columns),
    row-major as ``init_device_mesh`` lays them out."""
    replicas, shards = mesh_shape(world_size, shards)
    rows = [list(range(i * shards, (i + 1) * shards)) for i in range(replicas)]
    return {"shard": rows, "replicate": [[row[j] for row in rows] for j in range(shards)]}


def make_mesh(shards: int = DEFAULT_SHARDS, device_type: str | None = None):
    """The 2-D ``DeviceMesh`` (replicas, shards) over all ranks, dims ``("replicate", "shard")``.

    A collective call (it creates the process groups): call it on every rank, inside
    :func:`course_utils.launch.launch`. ``device_type`` defaults to this rank's device
    (``"cuda"`` under NCCL, else ``"cpu"``).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ..runtime.launch import rank_device

    require_process_group("make_mesh")
    shape = mesh_shape(dist.get_world_size(), shards)
    return init_device_mesh(device_type or rank_device().type, shape, mesh_dim_names=MESH_DIM_NAMES)


# ------------------------------------------------------------------ the strategy

def wrap_torch_hsdp(model, make_optimizer, *, shards: int = DEFAULT_SHARDS,
                    reshard_after_forward: bool = True, group=None, unit_types=None):
    """The ``"torch-hsdp"`` strategy: ``fully_shard`` per block and on the root over the 2-D
    mesh of :func:`make_mesh` (``world_size/shards`` replicas x ``shards`` shards).

    Every rank starts from rank 0's parameters; the root stays gathered between forward
    and backward, as in ``"torch-fsdp"``. ``group`` must be None (the mesh spans all
    ranks).
    """
    if group is not None:
        raise ValueError("torch-hsdp builds its own 2-D mesh over all ranks; call it without group=")
    require_process_group("torch-hsdp")
    device_type = next(model.parameters()).device.type
    mesh = make_mesh(shards, device_type)
    return fsdp.wrap_fsdp2(model, make_optimizer, reshard_after_forward=reshard_after_forward,
                      mesh=mesh, unit_types=unit_types)


# ------------------------------------------------------------------ predicted traffic and state

def hsdp_calls_per_step(num_units: int, *, shards: int, reshard_after_forward: bool = True) -> dict:
    """Collective calls per step for ``num_units`` units plus the root (torch 2.13, measured).

    The all-gathers and reduce-scatters of :func:`course_utils.impl.fsdp.calls_per_step`, none
    when ``shards == 1``; one all-reduce per unit always, even with one replica (FSDP2
    then all-reduces over a 1-rank group: a call that sends nothing).
    """
    check_int("num_units", num_units, 0)
    check_int("shards", shards, 1)
    out = fsdp.calls_per_step(num_units, reshard_after_forward=reshard_after_forward)
    if shards == 1:
        out["reduce_scatter"] = out["all_gather"] = 0
    out["all_reduce"] = num_units + 1
    return out


def hsdp_comm_bytes_per_step(model, world_size: int, shards: int = DEFAULT_SHARDS, *,
                             reshard_after_forward: bool = True, bytes_per_elem: int = 4,
                             unit_types=None) -> dict:
    """Bytes one rank sends per step (exact :class:`fractions.Fraction` values), for an
    unwrapped ``model``: FSDP2's all-gathers and reduce-scatters inside the shard group
    (:func:`course_utils.impl.fsdp.comm_bytes_per_step` with ``world_size=shards``) and the
    all-reduce of each unit's ``1/shards`` gradient shard across the replicate group."""
    replicas, shards = mesh_shape(world_size, shards)
    out = fsdp.comm_bytes_per_step(model, shards, reshard_after_forward=reshard_after_forward,
                                   bytes_per_elem=bytes_per_elem, unit_types=unit_types)
    shard_numel = Fraction(sum(fsdp.message_numels(model, shards, unit_types)), shards)
    out["all_reduce"] = Fraction(2 * (replicas - 1), replicas) * bytes_per_elem * shard_numel
    return out


def hsdp_expected_state_bytes(model, world_size: int, rank: int, shards: int = DEFAULT_SHARDS) -> dict:
    """What :func:`course_utils.impl.fsdp.fsdp_state_bytes` reports on ``rank`` after an AdamW
    step: FSDP's local shards for ``shards`` ranks, at this rank's place in its shard group."""
    mesh_shape(world_size, shards)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    return fsdp.expected_state_bytes(model, shards, rank % shards)
