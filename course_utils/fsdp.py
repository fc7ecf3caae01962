"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) as course strategies.

Taught in ``notebooks/07_fsdp.ipynb``. Importing this module registers two strategies in
:data:`course_utils.experiments.STRATEGIES`:

* ``"torch-fsdp"``: ``fully_shard`` on every *unit* (every child of the model's first
  ``nn.ModuleList``, the course GPT's ``blocks``; or every submodule of ``unit_types``),
  then on the root, with ``reshard_after_forward=True``: ZeRO-3, the same design as the
  course's ``"zero3"`` (:mod:`course_utils.zero3`).
* ``"torch-fsdp-zero2"``: the same with ``reshard_after_forward=False``: a unit's
  parameters stay gathered from its forward until its backward (no second all-gather),
  ZeRO-2-like memory for parameters (gradients and optimizer states stay sharded).

fp32 throughout (no ``MixedPrecisionPolicy``); rank 0's parameters are broadcast before
sharding; the optimizer is ``make_optimizer(model.parameters())`` over the sharded
parameters (DTensors; AdamW's states are DTensors too); the training loop is the usual
``loss.backward(); optimizer.step(); optimizer.zero_grad()``.

**What FSDP2 sends per step** (measured by :class:`~course_utils.comm.CommLedger`, checked
exactly in ``tests/test_fsdp.py``). FSDP2 shards every parameter on dim 0: a
parameter of shape ``(d0, *rest)`` is padded to ``ceil(d0/N)·N`` rows, and rank r keeps
rows ``[r·c, (r+1)·c)`` with ``c = ceil(d0/N)`` (:func:`padded_numel`). One unit's
all-gather (``dist.all_gather_single``) and reduce-scatter (``dist.reduce_scatter_single``)
move one message of

    M_unit = 4 bytes · Σ_p ceil(d0_p/N)·N·prod(rest_p)

(:func:`unit_message_numel`), where the course's ``"zero3"`` pads the *flat* unit only
once: ``ceil(Σ_p numel_p / N)·N``. So FSDP2's messages are a little larger whenever some
``d0`` is not a multiple of N: for the course GPT the embedding's 101 rows are padded for
every N > 1, and the blocks' 50- and 200-row parameters for N = 3 and 4
(:func:`message_numels`: root 6800 / 6852 / 6904 and block 30650 / 31110 / 31468 elements
for N = 2 / 3 / 4, against ``"zero3"``'s 6750 / 6750 / 6752 and 30650 / 30651 / 30652).
Calls per step for L units plus the root: the root is gathered once and each of the L blocks twice
with ``reshard_after_forward=True`` (forward, then again for backward): **2L+1** all-gathers,
exactly the course's ``"zero3"`` (2·(L+1)-1); once with ``False``: **L+1**. One
reduce-scatter per unit: **L+1**. Bytes one rank sends per step, ring convention:

    all_gather     = (N-1)/N · (M_root + g·Σ_blocks M_block),  g = 2 (zero3) or 1 (zero2)
    reduce_scatter = (N-1)/N · (M_root + Σ_blocks M_block)

(:func:`comm_bytes_per_step`). For the course GPT (4 blocks): 9 all-gathers and 5
reduce-scatters per step ("torch-fsdp"), 5 and 5 ("torch-fsdp-zero2").

**The root.** ``fully_shard(root, reshard_after_forward=None)`` (FSDP2's default) keeps the
root gathered after forward, since backward needs it at once (the course GPT's tied
embedding is also the output layer); an explicit ``True`` on the root frees it and
gathers it again in backward: one all-gather more per step (measured, torch 2.13). These
strategies keep the root gathered, like FSDP2's default and the course's ``"zero3"``;
``wrap_torch_fsdp(model, make_optimizer, reshard_root=True)`` (called directly) applies ``reshard_after_forward`` to the root as well: 2L+2.

**State bytes** (:func:`fsdp_state_bytes`, right after ``optimizer.step()``): each
parameter's local shard storage holds ``ceil(d0/N)·prod(rest)`` elements (FSDP2 keeps a
padded shard per parameter, so every rank holds the same amount); the gradients are
the reduce-scatter's output, the same padded shards; AdamW's ``exp_avg`` and
``exp_avg_sq`` are ``zeros_like`` the DTensor parameter, so their local tensors hold only
this rank's *real* rows, ``rows_r·prod(rest)`` with ``rows_r = clamp(d0 - r·c, 0, c)``
(ranks differ when N does not divide d0); plus one 4-byte ``step`` tensor per parameter.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from . import experiments

__all__ = ["shard_per_unit", "wrap_torch_fsdp", "wrap_torch_fsdp_zero2", "fsdp_units", "fsdp_state_bytes",
           "padded_numel", "local_rows", "unit_message_numel", "message_numels",
           "comm_bytes_per_step", "calls_per_step", "expected_state_bytes", "param_group",
           "param_groups"]


# ------------------------------------------------------------------ the layout, analytically

def padded_numel(shape, world_size: int) -> int:
    """Elements FSDP2 communicates for one parameter of ``shape``: dim 0 padded to a
    multiple of ``world_size`` (a 0-d parameter counts as one row)."""
    shape = tuple(shape) or (1,)
    return math.ceil(shape[0] / world_size) * world_size * math.prod(shape[1:])


def local_rows(d0: int, world_size: int, rank: int) -> int:
    """Rows of a ``d0``-row parameter that rank ``rank`` really owns (``torch.chunk`` split)."""
    c = math.ceil(d0 / world_size)
    return max(0, min(c, d0 - rank * c))


def fsdp_units(model: nn.Module, unit_types=None) -> list[nn.Module]:
    """The submodules ``fully_shard`` is applied to before the root: every child of the first
    ``nn.ModuleList`` (the course GPT's blocks), or every submodule (not the root) that is an
    instance of ``unit_types``, innermost first."""
    if unit_types is not None:
        types = tuple(unit_types) if isinstance(unit_types, (list, tuple, set)) else (unit_types,)
        return [m for m in reversed(list(model.modules())) if m is not model and isinstance(m, types)]
    for m in model.modules():
        if isinstance(m, nn.ModuleList):
            return list(m)
    return []


def _unit_params(model: nn.Module, unit_types=None) -> list[list[nn.Parameter]]:
    """Trainable parameters per FSDP unit: ``[root, unit_1, ..., unit_L]`` (each Parameter once,
    owned by the innermost unit containing it, as ``fully_shard`` assigns them)."""
    units = fsdp_units(model, unit_types)
    owner: dict[int, int] = {}
    for i, u in enumerate(units, start=1):       # innermost first: the first claim wins
        for p in u.parameters():
            if p.requires_grad and id(p) not in owner:
                owner[id(p)] = i
    out: list[list[nn.Parameter]] = [[] for _ in range(len(units) + 1)]
    for p in model.parameters():
        if p.requires_grad:
            out[owner.get(id(p), 0)].append(p)
    return out


def unit_message_numel(params, world_size: int) -> int:
    """Elements of one unit's all-gather output / reduce-scatter input: Σ padded_numel."""
    return sum(padded_numel(p.shape, world_size) for p in params)


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

def _wrap(model, make_optimizer, *, reshard_after_forward: bool | int, group=None, unit_types=None,
          reshard_root: bool = False, mesh=None, fully_shard_kwargs: dict | None = None,
          **_options):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch-fsdp needs torch.distributed initialised: run it inside "
                           "course_utils.launch.launch(...) or %%ranks")
    if mesh is not None and group is not None:
        raise ValueError("pass group= (a 1-D mesh is made from it) or mesh=, not both")
    experiments.broadcast_from_rank0(model, group)        # every rank starts from rank 0's model
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


def wrap_torch_fsdp(model, make_optimizer, **options):
    """The ``"torch-fsdp"`` strategy: ``fully_shard`` per block, then the root;
    ``reshard_after_forward=True`` (ZeRO-3); the root stays gathered unless
    ``reshard_root=True``. ``unit_types``: shard those submodules instead of the first
    ``nn.ModuleList``'s children. ``group``: a process group (a 1-D mesh is made from it);
    ``mesh``: a DeviceMesh to shard over instead (a 2-D one gives HSDP, notebook 08).
    ``overlap``/``bucket_bytes`` are ignored (FSDP2 prefetches one unit ahead by default)."""
    return _wrap(model, make_optimizer, reshard_after_forward=True, **options)


def wrap_torch_fsdp_zero2(model, make_optimizer, **options):
    """The ``"torch-fsdp-zero2"`` strategy: as ``"torch-fsdp"`` with
    ``reshard_after_forward=False`` (parameters stay gathered between forward and backward)."""
    return _wrap(model, make_optimizer, reshard_after_forward=False, **options)


def _local(t):
    if t is None:
        return None
    return t.to_local() if hasattr(t, "to_local") else t


_storage_bytes = experiments._storage_bytes  # one definition, shared by every strategy


def fsdp_state_bytes(model: nn.Module, optimizer) -> dict:
    """Bytes this rank holds: the local shards (``DTensor.to_local()`` storages) of the
    parameters, their gradients and the optimizer states, each storage once."""
    inner = getattr(optimizer, "inner", optimizer)
    params = list(model.parameters())
    seen: set = set()
    out = {"params": _storage_bytes([_local(p) for p in params], seen),
           "grads": _storage_bytes([_local(p.grad) for p in params], seen)}
    state = [_local(v) for per in inner.state.values() for v in per.values()
             if isinstance(v, torch.Tensor)]
    out["optimizer"] = _storage_bytes(state, seen)
    return out


# ------------------------------------------------------------------ FSDP2's private state

def param_group(module: nn.Module):
    """The ``FSDPParamGroup`` of one module ``fully_shard`` was applied to: the flat
    group of its own parameters that FSDP2 all-gathers and reduce-scatters as one unit
    (``unshard``, ``reshard``, ``fsdp_params``, ``is_unsharded``...). None when the
    module is not sharded or has no parameters of its own.

    Reads FSDP2's *private* state, as of torch 2.13:
    ``fully_shard.state(module)._fsdp_param_groups[0]`` (the course makes one group per
    unit; before torch 2.10, ``._fsdp_param_group``). Not an API: it may move in any
    release; the course only uses it to observe what FSDP2 holds, never to change it.
    """
    from torch.distributed.fsdp import fully_shard

    state = fully_shard.state(module)
    if state is None:
        return None
    groups = getattr(state, "_fsdp_param_groups", None)           # torch >= 2.10: a list
    if groups is None:
        return state._fsdp_param_group
    return groups[0] if groups else None


def param_groups(model: nn.Module) -> dict[str, object]:
    """``{unit name: FSDPParamGroup}`` (:func:`param_group`) of every ``fully_shard``
    unit of ``model`` that has parameters, in module order: the root is ``"root"``, the
    others their qualified names (``"blocks.0"``, ...). Reads FSDP2's private state
    (torch 2.13), see :func:`param_group`."""
    from torch.distributed.fsdp import FSDPModule

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule) and (group := param_group(m)) is not None:
            out[name or "root"] = group
    return out


for _name, _fn, _desc in (
        ("torch-fsdp", wrap_torch_fsdp,
         "torch FSDP2: fully_shard per block then the root, reshard_after_forward=True (ZeRO-3)"),
        ("torch-fsdp-zero2", wrap_torch_fsdp_zero2,
         "torch FSDP2 with reshard_after_forward=False: parameters stay gathered between "
         "forward and backward (ZeRO-2-like)")):
    if _name not in experiments.STRATEGIES:
        experiments.register_strategy(_name, _fn, notebook="07_fsdp", state_bytes=fsdp_state_bytes,
                                      description=_desc)
