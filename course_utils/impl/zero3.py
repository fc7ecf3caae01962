"""ZeRO-3 from scratch: parameters, gradients and optimizer states all sharded.

Taught in ``notebooks/06_zero3.ipynb``; the strategy ``"zero3"`` of
:mod:`course_utils.harness.strategies`, so ``experiments.run("zero3", N)`` trains the
course GPT with it.

What :class:`Zero3` does (the same design as PyTorch FSDP, written out in Python):

* **Units.** The model is cut into *units*: every child of the first ``nn.ModuleList``
  (the course GPT's ``blocks``), or every submodule of ``unit_types``, plus the *root*
  unit, which owns everything else (embeddings, final norm). A Parameter shared by two
  units (tied weights) belongs to their innermost common ancestor unit (e.g. the root);
  a frozen Parameter (``requires_grad=False``) is kept whole on every rank, is never
  communicated and never updated.
* **Storage.** A unit's trainable parameters are flattened into one fp32 buffer, padded
  with zeros to a multiple of the world size N. Rank r keeps only chunk r of it: the
  *shard*, one ``nn.Parameter`` per unit, which is what the optimizer updates. At rest
  the module's own Parameters are empty tensors (``p.shape == (0,)``).
* **Forward.** A forward pre-hook all-gathers the unit's full flat buffer and points
  the module's Parameters at views of it; a forward hook frees it again. The root is
  gathered first and stays gathered until the end of backward: the course GPT uses its
  embedding at both ends (tied output layer), so freeing it after forward would only
  gather it again at once. Hence the all-gathers per step: each of the L-1 non-root
  units twice (forward, backward), the root once: **2L-1** for L units (root included),
  :func:`course_utils.theory.comm.collective_calls` with ``skip_last_regather=True``.
  ``reshard_root=True`` frees the root after forward as well: 2L all-gathers.
* **Backward.** A tiny autograd Function marks the unit boundaries in the graph. The
  unit's *output* passes through a :class:`_BackwardHook` calling ``_pre_backward``:
  autograd calls its backward when the gradient of the output arrives, i.e. just before
  the unit's own backward, and it gathers the parameters again. The unit's *inputs*
  pass through one calling ``_post_backward``: its backward runs once the gradient of the
  inputs is complete, i.e. after every operation of the unit (and the gradient
  accumulation of its Parameters: autograd runs those first) has run. It flattens the
  Parameters' ``.grad`` (zeros for a Parameter without one), reduce-scatters it (SUM,
  then divided by N) into the shard's ``.grad`` and frees the full gradients and
  parameters. Units whose inputs need no gradient (the root) are finished by a callback
  at the end of backward, in a fixed order, so every rank issues the same collectives
  in the same order. One reduce-scatter per unit per step: L.
* **Optimizer.** The real optimizer over the shards (``make_optimizer(shards)``);
  ``step()`` updates shards only and sends nothing: the next forward gathers.
* **Prefetch.** ``prefetch=True`` starts the next unit's all-gather asynchronously
  (``async_op=True``) while the current one computes (forward: the next unit; backward:
  the previous one) and waits for it just before use. Units gathered (or in flight) at
  once: root + 1 without prefetch, root + 2 with it (:attr:`Zero3.timeline`).

Frees are real: a unit's full buffer keeps one tensor whose storage is resized to 0
bytes when freed and back when gathered (as FSDP does), so even tensors autograd saved
from the parameters see the regathered values. Limits, as in the course's "ddp": a
Parameter no rank used gets a zero gradient (AdamW then still decays it), and every
rank must run the same units in the same order.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..runtime.compat import (all_gather_into_tensor, queue_backward_callback, reduce_scatter_tensor,
                              tree_flatten, tree_unflatten)
from .common import alloc_storage, broadcast_from_rank0, free_storage, padded_numel, storage_bytes

__all__ = ["Zero3", "FlatUnit", "wrap_zero3", "zero3_state_bytes"]


class FlatUnit:
    """One sharded unit: its Parameters, their place in the flat buffer, this rank's shard.

    ``params``: ``(module, attribute name, Parameter, shape, offset)`` for each trainable
    Parameter it owns. ``numel``: their total; ``padded``: rounded up to a multiple of N;
    ``shard``: this rank's ``padded // N`` elements, an ``nn.Parameter`` (the optimizer's);
    ``full``: the gathered buffer (its storage 0 bytes while freed).
    """

    def __init__(self, name: str, module: nn.Module, params: list, world_size: int, rank: int,
                 group=None):
        self.name, self.module, self.group = name, module, group
        self.world_size, self.rank = world_size, rank
        self.params = []
        offset = 0
        for owner, attr, p in params:
            self.params.append((owner, attr, p, p.shape, offset))
            offset += p.numel()
        self.numel = offset
        self.padded = padded_numel(offset, world_size)
        self.shard_numel = self.padded // world_size
        dtypes = {p.dtype for _, _, p in params}
        if len(dtypes) > 1:
            raise ValueError(f"unit {name!r} mixes dtypes {dtypes}: one dtype per flat buffer")
        p0 = params[0][2]
        self.dtype, self.device = p0.dtype, p0.device
        with torch.no_grad():
            flat = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
            for _, _, p, _, off in self.params:
                flat[off:off + p.numel()].copy_(p.detach().reshape(-1))
            self.shard = nn.Parameter(flat[rank * self.shard_numel:(rank + 1) * self.shard_numel].clone())
        self.full = flat            # kept as the gather buffer; freed just below
        self.gathered = False       # full params usable
        self.work = None            # in-flight async all-gather
        self.grads_reduced = True   # post-backward done for the current backward
        self._use_views()
        self.free()

    # -- parameters point at the full buffer, or at nothing
    def _use_views(self) -> None:
        for _, _, p, shape, off in self.params:
            p.data = self.full[off:off + math.prod(shape)].view(shape)

    def _use_empty(self) -> None:
        for _, _, p, _, _ in self.params:
            p.data = torch.empty(0, dtype=self.dtype, device=self.device)

    def start_gather(self, async_op: bool) -> None:
        """Allocate the full buffer and all-gather every rank's shard into it."""
        alloc_storage(self.full)
        self.work = all_gather_into_tensor(self.full, self.shard.detach(), group=self.group,
                                           async_op=async_op)
        if not async_op:
            self.work = None
            self._use_views()
            self.gathered = True

    def wait(self) -> None:
        """Finish an in-flight all-gather; the parameters are usable afterwards."""
        if self.work is not None:
            self.work.wait()
            self.work = None
            self._use_views()
            self.gathered = True

    @property
    def in_flight(self) -> bool:
        return self.work is not None

    def free(self) -> None:
        """Drop the full parameters (the shard stays)."""
        self._use_empty()
        free_storage(self.full)
        self.gathered = False

    @torch.no_grad()
    def reduce_scatter_grads(self) -> None:
        """Flat full gradient (zeros where a Parameter got none) -> SUM over ranks -> /N
        -> this rank's chunk, added to ``shard.grad``; the full gradients are dropped."""
        flat = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
        for _, _, p, shape, off in self.params:
            if p.grad is not None:
                flat[off:off + math.prod(shape)].copy_(p.grad.reshape(-1))
                p.grad = None
        out = torch.empty(self.shard_numel, dtype=self.dtype, device=self.device)
        reduce_scatter_tensor(out, flat, group=self.group)
        out.div_(self.world_size)
        if self.shard.grad is None:
            self.shard.grad = out
        else:                               # gradient accumulation: shards accumulate
            self.shard.grad.add_(out)
        self.grads_reduced = True

    @torch.no_grad()
    def full_flat(self) -> torch.Tensor:
        """A new tensor with the unit's full, unpadded flat parameters (a collective)."""
        out = torch.empty(self.padded, dtype=self.dtype, device=self.device)
        all_gather_into_tensor(out, self.shard.detach(), group=self.group)
        return out[:self.numel]

    def __repr__(self) -> str:
        return (f"FlatUnit({self.name or '<root>'!r}, {len(self.params)} params, numel={self.numel}, "
                f"padded={self.padded}, shard={self.shard_numel})")


class _BackwardHook(torch.autograd.Function):
    """Identity in forward. Its backward runs once the gradients of the tensors that
    passed through it are complete, and calls ``hook(unit)`` first: on a unit's
    *outputs* that is just before the unit's own backward (gather it again), on its
    *inputs* just after it (reduce-scatter its gradients)."""

    @staticmethod
    def forward(ctx, hook, unit, *tensors):
        ctx.hook, ctx.unit = hook, unit
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.hook(ctx.unit)
        return (None, None) + grads


def _through(hook, unit, tree):
    """Pass the tensors of ``tree`` that require grad through a :class:`_BackwardHook`
    calling ``hook(unit)``; returns ``(tree, whether any tensor went through)``."""
    leaves, spec = tree_flatten(tree)
    idx = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not idx or not torch.is_grad_enabled():
        return tree, False
    out = _BackwardHook.apply(hook, unit, *[leaves[i] for i in idx])
    out = out if isinstance(out, tuple) else (out,)
    for i, t in zip(idx, out):
        leaves[i] = t
    return tree_unflatten(leaves, spec), True


def _find_units(module: nn.Module, unit_types) -> list[tuple[str, nn.Module]]:
    if unit_types is None:
        first = next((m for m in module.modules() if isinstance(m, nn.ModuleList)), None)
        if first is None:
            return []
        names = {id(m): n for n, m in module.named_modules()}
        return [(names[id(c)], c) for c in first.children()]
    unit_types = tuple(unit_types) if isinstance(unit_types, (list, tuple)) else (unit_types,)
    return [(n, m) for n, m in module.named_modules() if n and isinstance(m, unit_types)]


class Zero3(nn.Module):
    """A model wrapped for ZeRO-3 (see the module docstring); call it like the model.

    Args:
        module: any ``nn.Module`` (its parameters and buffers are broadcast from rank 0).
        unit_types: module types to shard as units (default: the children of the first
            ``nn.ModuleList``, the course GPT's blocks); the root unit owns the rest.
        prefetch: start the next unit's all-gather while the current unit computes.
        reshard_root: free the root after forward too (2L all-gathers per step, not 2L-1).
        group: the process group (default: all ranks).

    Attributes: ``units`` (:class:`FlatUnit`, root first, then in module order),
    ``frozen`` (names of the whole, unsharded frozen Parameters), ``timeline`` (the
    events of the current/last step: dicts with ``step``, ``phase`` ("forward",
    "backward"), ``unit``, ``event`` ("gather", "free"), ``alive_units`` and
    ``alive_bytes``: units and bytes of full parameters gathered or in flight after the
    event).
    """

    def __init__(self, module: nn.Module, *, unit_types=None, prefetch: bool = False,
                 reshard_root: bool = False, group=None):
        super().__init__()
        require_process_group("Zero3")
        self.module = module
        self.group = group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.prefetch, self.reshard_root = bool(prefetch), bool(reshard_root)
        self._broadcast_from_rank0()
        self.units, self.frozen = self._make_units(module, unit_types)
        self.root = next((u for u in self.units if u.module is module), None)
        self.order = [u for u in self.units if u is not self.root]   # prefetch order
        self.timeline: list[dict] = []
        self.step_count = -1
        self._phase = "forward"
        self._callback_queued = False
        self._hooks = []
        for u in self.units:
            self._hooks.append(u.module.register_forward_pre_hook(
                self._make_pre_forward(u), with_kwargs=True))
            self._hooks.append(u.module.register_forward_hook(self._make_post_forward(u)))
        if self.root is None:                     # no trainable root params: still hook the root
            self._hooks.append(module.register_forward_pre_hook(self._root_pre_forward_only))
            self._hooks.append(module.register_forward_hook(self._root_post_forward_only))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------------ construction
    def _broadcast_from_rank0(self) -> None:
        broadcast_from_rank0(self.module, self.group)

    def _make_units(self, module, unit_types):
        found = _find_units(module, unit_types)
        unit_names = [""] + [n for n, _ in found]
        unit_modules = {"": module, **dict(found)}

        def innermost(path: str) -> str:              # the deepest unit containing this path
            best = ""
            for n in unit_names:
                if n and (path == n or path.startswith(n + ".")) and len(n) > len(best):
                    best = n
            return best

        owners: dict[int, list] = {}                  # id(p) -> [(module, attr, full name)]
        first: dict[int, nn.Parameter] = {}
        for mname, m in module.named_modules(remove_duplicate=False):
            for attr, p in m.named_parameters(recurse=False):
                full = f"{mname}.{attr}" if mname else attr
                owners.setdefault(id(p), []).append((m, attr, full))
                first.setdefault(id(p), p)
        per_unit: dict[str, list] = {n: [] for n in unit_names}
        frozen = []
        for pid, places in owners.items():
            p = first[pid]
            if not p.requires_grad:
                frozen.append(places[0][2])
                continue
            paths = [innermost(full.rsplit(".", 1)[0] if "." in full else "") for _, _, full in places]
            unit = paths[0]
            while not all(q == unit or q.startswith(unit + ".") for q in paths):  # common ancestor
                unit = innermost(unit.rsplit(".", 1)[0]) if "." in unit else ""
                if unit == "":
                    break
            per_unit[unit].append((places[0][0], places[0][1], p))
        units = [FlatUnit(n, unit_modules[n], per_unit[n], self.world_size, self.rank, self.group)
                 for n in unit_names if per_unit[n]]
        return units, frozen

    # ------------------------------------------------------------------ the timeline
    def _alive(self) -> list[FlatUnit]:
        return [u for u in self.units if u.gathered or u.in_flight]

    def _log(self, unit: FlatUnit, event: str) -> None:
        alive = self._alive()
        self.timeline.append({"step": self.step_count, "phase": self._phase,
                              "unit": unit.name or "root", "event": event,
                              "alive_units": len(alive),
                              "alive_bytes": sum(u.padded * u.full.element_size() for u in alive)})

    def _gather(self, unit: FlatUnit, *, async_op: bool = False) -> None:
        if unit.gathered or unit.in_flight:
            if not async_op:
                unit.wait()
            return
        unit.start_gather(async_op)
        self._log(unit, "gather")

    def _free(self, unit: FlatUnit) -> None:
        if not (unit.gathered or unit.in_flight):
            return
        unit.wait()
        unit.free()
        self._log(unit, "free")

    def _neighbour(self, unit: FlatUnit, step: int):
        if unit is self.root:
            i = -1 if step > 0 else len(self.order)
        else:
            i = self.order.index(unit)
        j = i + step
        return self.order[j] if 0 <= j < len(self.order) else None

    # ------------------------------------------------------------------ forward
    def _start_step(self) -> None:
        self.step_count += 1
        self.timeline = []
        self._phase = "forward"
        for u in self.units:
            u.grads_reduced = False

    def _make_pre_forward(self, unit: FlatUnit):
        def hook(module, args, kwargs):
            if unit is self.root:
                self._start_step()
            self._gather(unit)
            if self.prefetch:
                nxt = self._neighbour(unit, +1)
                if nxt is not None:
                    self._gather(nxt, async_op=True)
            if unit is self.root:
                return None
            # mark "this unit's backward is done" on its inputs
            (args, kwargs), _ = _through(self._post_backward, unit, (args, kwargs))
            return args, kwargs
        return hook

    def _make_post_forward(self, unit: FlatUnit):
        def hook(module, args, output):
            output, wrapped = _through(self._pre_backward, unit, output)
            if unit is self.root:
                if not wrapped or self.reshard_root:    # no backward coming: free everything
                    self._free(unit)
                if not wrapped:
                    self._finish_all()
            else:
                self._free(unit)
            return output
        return hook

    def _root_pre_forward_only(self, module, args):
        self._start_step()
        if self.prefetch and self.order:
            self._gather(self.order[0], async_op=True)

    def _root_post_forward_only(self, module, args, output):
        if self.root is None:
            output, wrapped = _through(self._pre_backward, None, output)
            if not wrapped:
                self._finish_all()
        return output

    # ------------------------------------------------------------------ backward
    def _pre_backward(self, unit) -> None:
        if unit is self.root or unit is None:   # the first thing backward runs
            self._phase = "backward"
            if not self._callback_queued:
                queue_backward_callback(self._finish_backward)
                self._callback_queued = True
            if unit is None:
                if self.prefetch and self.order:
                    self._gather(self.order[-1], async_op=True)
                return
        self._gather(unit)
        if self.prefetch:
            prev = self._neighbour(unit, -1)
            if prev is not None:
                self._gather(prev, async_op=True)

    def _post_backward(self, unit: FlatUnit) -> None:
        unit.wait()
        unit.reduce_scatter_grads()
        self._free(unit)

    def _finish_backward(self) -> None:
        """End of backward: finish the units not finished yet (the root), in a fixed order."""
        self._callback_queued = False
        for unit in reversed(self.units):         # blocks last to first, then the root
            if not unit.grads_reduced:
                self._post_backward(unit)
            else:
                self._free(unit)                  # e.g. a prefetch nobody used
        late = [u.name for u in self.units for _, _, p, _, _ in u.params if p.grad is not None]
        if late:
            raise RuntimeError(f"gradients arrived after their unit was reduce-scattered: {late}")

    def _finish_all(self) -> None:
        for unit in self.units:
            self._free(unit)
            unit.grads_reduced = True

    # ------------------------------------------------------------------ results
    def shard_parameters(self) -> list[nn.Parameter]:
        """This rank's shards, one per unit: what the optimizer updates."""
        return [u.shard for u in self.units]

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` as ``module.named_parameters()`` names them (a tied
        Parameter under its first name): CPU clones, gathered from the shards. A
        collective: call it on every rank."""
        values: dict[int, torch.Tensor] = {}
        for u in self.units:
            flat = u.full_flat()
            for _, _, p, shape, off in u.params:
                values[id(p)] = flat[off:off + math.prod(shape)].view(shape)
        out = {}
        for name, p in self.module.named_parameters():
            t = values.get(id(p), p)
            out[name] = t.detach().cpu().clone()
        return out

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def extra_repr(self) -> str:
        return (f"world_size={self.world_size}, units={len(self.units)} "
                f"(padded numels {[u.padded for u in self.units]}), prefetch={self.prefetch}, "
                f"reshard_root={self.reshard_root}, frozen={self.frozen}")


def wrap_zero3(model, make_optimizer, *, overlap: bool = True, group=None, unit_types=None,
               reshard_root: bool = False):
    """The ``"zero3"`` strategy: ``(Zero3(model), make_optimizer(shards))``.

    ``overlap`` is the prefetch
    switch: True overlaps the next unit's all-gather with the current unit's compute.
    The optimizer is the real one; its ``step()`` needs no communication.
    """
    z = Zero3(model, unit_types=unit_types, prefetch=overlap, reshard_root=reshard_root, group=group)
    return z, make_optimizer(z.shard_parameters())


def zero3_state_bytes(model: Zero3, optimizer) -> dict:
    """Bytes this rank holds: parameters (the shards, frozen Parameters, any full buffer
    still gathered), gradients (shard grads and any full ``.grad`` left) and optimizer
    state tensors, each storage once."""
    inner = getattr(optimizer, "inner", optimizer)
    seen: set = set()
    module_params = list(model.module.parameters())
    shards = model.shard_parameters()
    out = {"params": storage_bytes(shards + module_params + [u.full for u in model.units], seen),
           "grads": storage_bytes([p.grad for p in shards + module_params], seen)}
    state = [v for per in inner.state.values() for v in per.values() if isinstance(v, torch.Tensor)]
    out["optimizer"] = storage_bytes(state, seen)
    return out
