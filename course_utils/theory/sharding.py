"""What PyTorch FSDP2 and HSDP send and hold per step, predicted from the unwrapped model alone
(``notebooks/07_fsdp.ipynb``, ``08_beyond_one_box.ipynb``; checked against real runs by
``tests/test_fsdp.py`` and ``tests/test_hsdp.py``). FSDP2 pads every parameter's dim 0 to a
multiple of N rows, where ``Zero3`` pads a whole flat unit once. Bytes: the ring convention
of ``CommLedger``, as exact Fractions. HSDP lays ranks out row-major, as ``init_device_mesh``.
"""
from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

from torch import nn

from ..checks import check_int
from .layout import dim0_padded_numel, local_rows

__all__ = ["DEFAULT_SHARDS", "MESH_DIM_NAMES", "mesh_shape", "mesh_groups", "fsdp_units", "unit_params",
           "message_numels", "calls_per_step", "comm_bytes_per_step",
           "fsdp_state_bytes", "hsdp_calls_per_step", "hsdp_comm_bytes_per_step",
           "hsdp_state_bytes"]

#: Ranks per shard group of ``run("torch-hsdp", N)``: the course's pretend "GPUs per node".
DEFAULT_SHARDS = 2
#: The names of the two HSDP mesh dimensions, outer (across nodes) first.
MESH_DIM_NAMES = ("replicate", "shard")


def find_units(model: nn.Module, unit_types=None, ignored_params=()) -> list[tuple[nn.Module, list]]:
    """``[(module, its trainable Parameters)]``, the root first, then the units (children of the
    first ``nn.ModuleList``, or submodules of ``unit_types``); a Parameter belongs to the
    innermost unit holding every use of it (tied across units: their ancestor, else the root)."""
    if unit_types is None:
        first = next((m for m in model.modules() if isinstance(m, nn.ModuleList)), None)
        units = list(first.children()) if first is not None else []
    else:
        types = tuple(unit_types) if isinstance(unit_types, (list, tuple, set)) else (unit_types,)
        units = [m for m in model.modules() if m is not model and isinstance(m, types)]
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    depth = {id(m): n.count(".") + 1 for n, m in model.named_modules() if n}
    owner: dict[int, int] = {}
    for i in sorted(range(len(units)), key=lambda i: depth[id(units[i])]):   # outer first: inner wins
        inside = Counter(id(p) for _, p in units[i].named_parameters(remove_duplicate=False))
        owner.update({pid: i + 1 for pid, k in inside.items() if k == uses[pid]})
    ignored = {id(p) for p in ignored_params}
    out = [(m, []) for m in [model] + units]
    for p in model.parameters():
        if p.requires_grad and id(p) not in ignored:
            out[owner.get(id(p), 0)][1].append(p)
    return out


def fsdp_units(model: nn.Module, unit_types=None) -> list[nn.Module]:
    """The submodules ``fully_shard`` is applied to before the root, innermost first."""
    units = [m for m, _ in find_units(model, unit_types)[1:]]
    return units if unit_types is None else units[::-1]


def unit_params(model: nn.Module, unit_types=None) -> list[list[nn.Parameter]]:
    """Trainable parameters per FSDP unit: ``[root, *in fsdp_units order]``."""
    root, *units = [ps for _, ps in find_units(model, unit_types)]
    return [root] + (units if unit_types is None else units[::-1])


def message_numels(model: nn.Module, world_size: int, unit_types=None) -> list[int]:
    """``[M_root, M_unit_1, ...]``: elements of each unit's all-gather output / reduce-scatter input."""
    return [sum(dim0_padded_numel(p.shape, world_size) for p in ps) for ps in unit_params(model, unit_types)]


def calls_per_step(num_units: int, *, reshard_after_forward: bool = True,
                   reshard_root: bool = False) -> dict:
    g = 2 if reshard_after_forward else 1
    gathers = g * num_units + (g if reshard_root else 1)
    return {"all_reduce": 0, "reduce_scatter": num_units + 1, "all_gather": gathers}


def comm_bytes_per_step(model: nn.Module, world_size: int, *, reshard_after_forward: bool = True,
                        reshard_root: bool = False, bytes_per_elem: int = 4, unit_types=None) -> dict:
    root, *units = message_numels(model, world_size, unit_types)
    f = Fraction(world_size - 1, world_size) * bytes_per_elem
    g = 2 if reshard_after_forward else 1
    return {"all_reduce": Fraction(0), "reduce_scatter": f * (root + sum(units)),
            "all_gather": f * ((g if reshard_root else 1) * root + g * sum(units))}


def fsdp_state_bytes(model: nn.Module, world_size: int, rank: int) -> dict:
    """Bytes of params, grads and optimizer states FSDP2 holds on ``rank`` after an AdamW step,
    fp32: the padded dim-0 shards; AdamW's states cover the rows the rank really owns."""
    params = [p for ps in unit_params(model) for p in ps]
    shard = sum(dim0_padded_numel(p.shape, world_size) for p in params) // world_size
    real = sum(local_rows((tuple(p.shape) or (1,))[0], world_size, rank) * math.prod(p.shape[1:]) for p in params)
    return {"params": 4 * shard, "grads": 4 * shard, "optimizer": 4 * (2 * real + len(params))}


def mesh_shape(world_size: int, shards: int = DEFAULT_SHARDS) -> tuple[int, int]:
    check_int("world_size", world_size, 1)
    check_int("shards", shards, 1)
    if world_size % shards:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(f"HSDP needs world_size divisible by shards: {world_size} ranks cannot form "
                         f"groups of {shards}; use shards in {fits} (or a world size that {shards} divides)")
    return world_size // shards, shards


def mesh_groups(world_size: int, shards: int = DEFAULT_SHARDS) -> dict:
    """The ranks of every shard group (mesh rows) and replicate group (mesh columns)."""
    replicas, shards = mesh_shape(world_size, shards)
    rows = [list(range(i * shards, (i + 1) * shards)) for i in range(replicas)]
    return {"shard": rows, "replicate": [[row[j] for row in rows] for j in range(shards)]}


def hsdp_calls_per_step(num_units: int, *, shards: int, reshard_after_forward: bool = True) -> dict:
    """FSDP2's calls (none when ``shards == 1``) plus one all-reduce per unit, even with one
    replica (a 1-rank group: sends nothing; torch 2.13, measured)."""
    check_int("num_units", num_units, 0)
    check_int("shards", shards, 1)
    out = calls_per_step(num_units, reshard_after_forward=reshard_after_forward)
    if shards == 1:
        out["reduce_scatter"] = out["all_gather"] = 0
    out["all_reduce"] = num_units + 1
    return out


def hsdp_comm_bytes_per_step(model, world_size: int, shards: int = DEFAULT_SHARDS, *,
                             reshard_after_forward: bool = True, bytes_per_elem: int = 4,
                             unit_types=None) -> dict:
    """FSDP2's bytes in the shard group plus the all-reduce of the gradient shards across replicas."""
    replicas, shards = mesh_shape(world_size, shards)
    out = comm_bytes_per_step(model, shards, reshard_after_forward=reshard_after_forward,
                              bytes_per_elem=bytes_per_elem, unit_types=unit_types)
    shard_numel = Fraction(sum(message_numels(model, shards, unit_types)), shards)
    out["all_reduce"] = Fraction(2 * (replicas - 1), replicas) * bytes_per_elem * shard_numel
    return out


def hsdp_state_bytes(model, world_size: int, rank: int, shards: int = DEFAULT_SHARDS) -> dict:
    """FSDP's local shards for ``shards`` ranks, at ``rank``'s place in its shard group."""
    mesh_shape(world_size, shards)
    check_int("rank", rank, 0, world_size - 1)
    return fsdp_state_bytes(model, shards, rank % shards)
