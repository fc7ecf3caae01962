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
  *shard*. At rest each of the module's Parameters *is* its piece of the shard (a 1-D
  view, empty when none of its elements is on this rank), as FSDP2's Parameters are
  their local shards, so an optimizer over ``model.parameters()`` updates the shard.
* **Forward.** A forward pre-hook all-gathers the unit's full flat buffer and points
  the module's Parameters at views of it; a forward hook frees it again. The root is
  gathered first and stays gathered until the end of backward: the course GPT uses its
  embedding at both ends (tied output layer), so freeing it after forward would only
  gather it again at once. Hence the all-gathers per step: each of the L blocks twice
  (forward, backward), the root once: **2L + 1** for L blocks (L + 1 units),
  ``collective_calls(3, num_blocks=L)`` of :mod:`course_utils.theory.comm`.
  ``reshard_root=True`` frees the root after forward as well: 2L + 2 all-gathers.
* **Backward.** A tiny autograd Function marks the unit boundaries in the graph. The
  unit's *output* passes through a :class:`_BackwardHook` calling ``_pre_backward``:
  autograd calls its backward when the gradient of the output arrives, i.e. just before
  the unit's own backward, and it gathers the parameters again. The unit's *inputs*
  pass through one calling ``_post_backward``: its backward runs once the gradient of the
  inputs is complete, i.e. after every operation of the unit (and the gradient
  accumulation of its Parameters: autograd runs those first) has run. It flattens the
  Parameters' ``.grad`` (zeros for a Parameter without one), reduce-scatters it (SUM,
  then divided by N) into the shard gradient (each Parameter's ``.grad`` is then its
  piece of it) and frees the full gradients and parameters. Units whose inputs need no gradient (the root) are finished by a callback
  at the end of backward, in a fixed order, so every rank issues the same collectives
  in the same order. One reduce-scatter per unit per step: L.
* **Optimizer.** Any torch optimizer over ``model.parameters()``, parameter groups
  included; ``step()`` updates the pieces of the shards in place and sends nothing: the
  next forward gathers. ``experiments.clip_grad_norm_`` clips by the global norm.
* **Mixed precision.** ``param_dtype=torch.bfloat16`` gathers bf16 copies of the fp32
  shards and computes in bf16; gradients are reduce-scattered in ``reduce_dtype`` and
  kept as fp32 shard gradients (FSDP2's ``MixedPrecisionPolicy``).
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
from .common import (alloc_storage, broadcast_from_rank0, clip_sharded_, free_storage, padded_numel,
                     real_optimizer, register_grad_owner, storage_bytes)

__all__ = ["Zero3", "FlatUnit", "wrap_zero3", "zero3_state_bytes"]


class FlatUnit:
    """One sharded unit: its Parameters, their place in the flat buffer, this rank's shard.

    ``params``: ``(module, attribute name, Parameter, shape, offset)`` for each trainable
    Parameter it owns. ``numel``: their total; ``padded``: rounded up to a multiple of N;
    ``shard``: this rank's ``padded // N`` elements (the master copy, in the parameters'
    dtype); ``pieces``: for each Parameter, the ``(start, stop)`` of its elements inside
    ``shard`` (empty when none of them is on this rank); ``full``: the gathered buffer, in
    ``compute_dtype`` (its storage 0 bytes while freed); ``shard_grad``: the averaged
    gradient of the shard after backward (None before).

    At rest every Parameter *is* its piece of the shard (``p.data`` a 1-D view of
    ``shard``, ``p.grad`` of ``shard_grad``), as FSDP2's Parameters are their local
    shards: an optimizer over ``model.parameters()`` updates the shard in place. While the
    unit is gathered, ``p.data`` is a view of ``full`` with ``p``'s own shape.
    """

    def __init__(self, name: str, module: nn.Module, params: list, world_size: int, rank: int,
                 group=None, *, param_dtype=None, reduce_dtype=None):
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
        self.compute_dtype = param_dtype or self.dtype
        self.reduce_dtype = reduce_dtype or self.compute_dtype
        lo = rank * self.shard_numel
        self.pieces = []
        for _, _, p, _, off in self.params:
            a, b = max(off, lo) - lo, min(off + p.numel(), lo + self.shard_numel) - lo
            self.pieces.append((a, b) if b > a else (0, 0))
        with torch.no_grad():
            flat = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
            for _, _, p, _, off in self.params:
                flat[off:off + p.numel()].copy_(p.detach().reshape(-1))
            self.shard = flat[lo:lo + self.shard_numel].clone()
        # the gather buffer: the flat copy itself when compute and master dtypes agree
        self.full = flat if self.compute_dtype == self.dtype else \
            torch.empty(self.padded, dtype=self.compute_dtype, device=self.device)
        self.shard_grad = None
        self._held = [None] * len(self.params)   # the pieces' .grad, set aside while gathered
        self.gathered = False       # full params usable
        self.work = None            # in-flight async all-gather
        self.grads_reduced = True   # post-backward done for the current backward
        self.free()

    # -- parameters point at the full buffer, or at their piece of the shard
    def _use_views(self) -> None:
        for i, (_, _, p, shape, off) in enumerate(self.params):
            if self._held[i] is None:
                self._held[i] = p.grad          # the piece's gradient waits beside
            p.grad = None
            p.data = self.full[off:off + math.prod(shape)].view(shape)

    def _use_pieces(self) -> None:
        for i, (_, _, p, _, _) in enumerate(self.params):
            a, b = self.pieces[i]
            p.data = self.shard[a:b]
            p.grad, self._held[i] = self._held[i], None

    def start_gather(self, async_op: bool) -> None:
        """Allocate the full buffer and all-gather every rank's shard into it (cast to
        ``compute_dtype`` first, when it differs)."""
        alloc_storage(self.full)
        send = self.shard if self.compute_dtype == self.dtype else self.shard.to(self.compute_dtype)
        self.work = all_gather_into_tensor(self.full, send, group=self.group, async_op=async_op)
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
        self._use_pieces()
        free_storage(self.full)
        self.gathered = False

    @torch.no_grad()
    def reduce_scatter_grads(self) -> None:
        """Flat full gradient (zeros where a Parameter got none), in ``reduce_dtype`` ->
        SUM over ranks -> /N -> this rank's chunk, in the master dtype, added to the
        pieces' gradients if they have some (accumulation) -> ``shard_grad``; the full
        gradients are dropped."""
        flat = torch.zeros(self.padded, dtype=self.reduce_dtype, device=self.device)
        for _, _, p, shape, off in self.params:
            if p.grad is not None:
                flat[off:off + math.prod(shape)].copy_(p.grad.reshape(-1))
                p.grad = None
        out = torch.empty(self.shard_numel, dtype=self.reduce_dtype, device=self.device)
        reduce_scatter_tensor(out, flat, group=self.group)
        out = out.div_(self.world_size).to(self.dtype)
        for i, (a, b) in enumerate(self.pieces):
            if self._held[i] is not None:       # gradient accumulation: pieces accumulate
                out[a:b].add_(self._held[i])
            self._held[i] = out[a:b]
        self.shard_grad = out
        self.grads_reduced = True

    @torch.no_grad()
    def full_flat(self) -> torch.Tensor:
        """A new tensor with the unit's full, unpadded flat parameters (a collective)."""
        out = torch.empty(self.padded, dtype=self.dtype, device=self.device)
        all_gather_into_tensor(out, self.shard, group=self.group)
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
        reshard_root: free the root after forward too (2L + 2 all-gathers per step for L blocks, not 2L + 1).
        param_dtype: mixed precision, as FSDP2's ``MixedPrecisionPolicy``: the dtype of the
            gathered copies forward and backward compute with (``torch.bfloat16`` or
            ``torch.float16``); the shards stay fp32 masters, which the optimizer updates.
            Frozen Parameters are cast to it once. None: compute in the parameters' dtype.
        reduce_dtype: the dtype gradients are reduce-scattered in (None: ``param_dtype``);
            the averaged shard gradient is then kept in the master dtype.
        group: the process group (default: all ranks).

    The optimizer: any torch optimizer over ``model.parameters()`` (parameter groups
    welcome): at rest each Parameter is its 1-D piece of this rank's shard, so the
    optimizer updates the shards in place and sends nothing; the next forward gathers.
    A piece is flat, so make the groups before wrapping (or by name), not from
    ``p.ndim`` afterwards; ``wrap("zero3", ...)`` calls ``make_optimizer`` first. Clip with
    ``experiments.clip_grad_norm_(model, max_norm)`` (:meth:`clip_grad_norm_`).

    Attributes: ``units`` (:class:`FlatUnit`, root first, then in module order),
    ``frozen`` (names of the whole, unsharded frozen Parameters), ``timeline`` (the
    events of the current/last step: dicts with ``step``, ``phase`` ("forward",
    "backward"), ``unit``, ``event`` ("gather", "free"), ``alive_units`` and
    ``alive_bytes``: units and bytes of full parameters gathered or in flight after the
    event).
    """

    def __init__(self, module: nn.Module, *, unit_types=None, prefetch: bool = False,
                 reshard_root: bool = False, param_dtype=None, reduce_dtype=None, group=None):
        super().__init__()
        require_process_group("Zero3")
        for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype is not None and dtype not in (torch.bfloat16, torch.float16, torch.float32):
                raise ValueError(f"{name} must be torch.bfloat16, torch.float16, torch.float32 or "
                                 f"None, got {dtype!r}")
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.module = module
        self.group = group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.prefetch, self.reshard_root = bool(prefetch), bool(reshard_root)
        self._broadcast_from_rank0()
        self.units, self.frozen = self._make_units(module, unit_types)
        if param_dtype is not None:               # frozen weights: one compute copy, once
            with torch.no_grad():
                for p in module.parameters():
                    if not p.requires_grad and p.is_floating_point():
                        p.data = p.data.to(param_dtype)
        register_grad_owner(self.shard_parameters(), self)
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
        units = [FlatUnit(n, unit_modules[n], per_unit[n], self.world_size, self.rank, self.group,
                          param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)
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
        late = [u.name for u in self.units for _, _, p, _, _ in u.params
                if p.grad is not None and p.grad.shape != p.shape]
        if late:
            raise RuntimeError(f"gradients arrived after their unit was reduce-scattered: {late}")

    def _finish_all(self) -> None:
        for unit in self.units:
            self._free(unit)
            unit.grads_reduced = True

    # ------------------------------------------------------------------ results
    def shard_parameters(self) -> list[nn.Parameter]:
        """The trainable Parameters, unit by unit; at rest each is its piece of this rank's
        shard (what the optimizer updates)."""
        return [p for u in self.units for _, _, p, _, _ in u.params]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged shard gradients to a global norm of ``max_norm`` (taken over
        every rank's shard: a collective); returns the norm before clipping. Call it after
        backward, before ``optimizer.step()``."""
        if any(u.gathered or u.in_flight for u in self.units):
            raise RuntimeError("clip_grad_norm_ between backward() and optimizer.step(): a unit "
                               "is still gathered (inside forward or backward)")
        return clip_sharded_([u.shard_grad for u in self.units], max_norm, norm_type, self.group)

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
               reshard_root: bool = False, param_dtype=None, reduce_dtype=None):
    """The ``"zero3"`` strategy: ``(Zero3(model), make_optimizer(its trainable parameters))``.

    ``overlap`` is the prefetch switch: True overlaps the next unit's all-gather with the
    current unit's compute. ``make_optimizer`` runs on the full-shaped Parameters before
    they are sharded (so groups made from ``p.ndim`` are right); the optimizer is then
    rebuilt, same class, groups and hyperparameters, over the same Parameters, which at
    rest are their pieces of the shards; its ``step()`` needs no communication.
    """
    groups, cls, defaults = real_optimizer(model, make_optimizer)   # grouped while full-shaped
    z = Zero3(model, unit_types=unit_types, prefetch=overlap, reshard_root=reshard_root,
              param_dtype=param_dtype, reduce_dtype=reduce_dtype, group=group)
    return z, cls(groups, **defaults)


def zero3_state_bytes(model: Zero3, optimizer) -> dict:
    """Bytes this rank holds: parameters (the shards, frozen Parameters, any full buffer
    still gathered), gradients (shard grads and any full ``.grad`` left) and optimizer
    state tensors, each storage once."""
    inner = getattr(optimizer, "inner", optimizer)
    seen: set = set()
    module_params = list(model.module.parameters())
    out = {"params": storage_bytes([u.shard for u in model.units] + module_params +
                                   [u.full for u in model.units], seen),
           "grads": storage_bytes([u.shard_grad for u in model.units] +
                                  [p.grad for p in module_params], seen)}
    state = [v for per in inner.state.values() for v in per.values() if isinstance(v, torch.Tensor)]
    out["optimizer"] = storage_bytes(state, seen)
    return out
