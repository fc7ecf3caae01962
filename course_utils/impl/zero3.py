"""ZeRO-3 from scratch: parameters, gradients and optimizer states all sharded.

Taught in ``notebooks/06_zero3.ipynb``; the strategy ``"zero3"`` of
:mod:`course_utils.harness.strategies`.

* **Units** (:func:`~course_utils.theory.sharding.find_units`, shared with the FSDP2 wrapping of :mod:`.fsdp`): every
  child of the first ``nn.ModuleList`` (the course GPT's blocks), or every submodule of
  ``unit_types``, plus the *root*, which owns the rest (embeddings, final norm). A
  Parameter shared by two units belongs to their innermost common ancestor (e.g. the root);
  frozen Parameters and ``ignored_params`` stay whole on every rank, never communicated.
* **A unit** (:class:`FlatUnit`): its trainable Parameters flattened into one buffer,
  zero-padded to a multiple of N; rank r keeps chunk r, the *shard*. At rest each
  Parameter *is* its piece of the shard (a 1-D view, empty when none of its elements is
  on this rank), so an optimizer over ``model.parameters()`` updates the shard.
* **Forward**: all-gather a unit before its forward, free it after; the root stays gathered
  until the end of backward (the course GPT uses its embedding at both ends), so a step
  makes 2L + 1 all-gathers for L blocks (``reshard_root=True``: 2L + 2).
* **Backward**: a hook on a unit's output gathers it again before its backward; a hook on
  each Parameter counts the gradients in, and once all of a unit's are, its flat gradient
  is reduce-scattered (SUM, / N) into ``shard.grad`` and the full gradients and
  parameters are freed. Units are reduce-scattered strictly in backward order, and the
  first hook queues a callback that finishes the rest when backward ends, as the course's
  DDP does with its buckets, so every rank issues the same collectives in the same order.
* **Optimizer**: any torch optimizer over ``model.parameters()``; ``step()`` sends nothing.
* **Mixed precision**: ``param_dtype`` gathers copies of the fp32 shards in that dtype;
  gradients are reduce-scattered in ``reduce_dtype`` (FSDP2's ``MixedPrecisionPolicy``).
* **Prefetch**: the next unit's all-gather (the previous one's, in backward) starts
  asynchronously while the current unit computes.

Frees are real: ``full`` keeps one tensor whose storage is resized to 0 bytes and back,
so even tensors autograd saved from the parameters see the regathered values. Limits:
every rank must run the same units, in module order.
"""
from __future__ import annotations


import torch
import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..runtime.compat import all_gather_into_tensor, queue_backward_callback, reduce_scatter_tensor, tree_flatten
from ..theory.layout import padded_numel
from ..theory.sharding import find_units
from .common import (alloc_storage, broadcast_from_rank0, clip_sharded_, flatten_and_pad, free_storage,
                     register_grad_owner)

__all__ = ["Zero3", "FlatUnit"]


def _before_backward(output, fn) -> bool:
    """Call ``fn()`` when backward reaches ``output`` (the first gradient of one of its
    tensors arrives): just before the backward of what computed it. False when no tensor
    of ``output`` needs a gradient (no backward will come)."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if tensors:
        torch.autograd.graph.register_multi_grad_hook(tensors, lambda grad: fn(), mode="any")
    return bool(tensors)


class FlatUnit(nn.Module):
    """One ZeRO-3 unit: ``module``'s trainable Parameters (or ``params``) as one flat
    buffer of ``padded`` elements, of which this rank keeps chunk ``rank``, ``shard`` (its
    averaged gradient in ``shard.grad``); ``full`` is the gather buffer (0 bytes while
    freed). Call it like ``module``, or let :class:`Zero3` drive it from hooks. Alone, every
    Parameter must get a gradient in every backward (the counter of :meth:`_grad_ready`).
    """

    def __init__(self, module: nn.Module, params=None, *, group=None, param_dtype=None, reduce_dtype=None,
                 grads_in=None):
        super().__init__()
        self.module, self.group = module, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.params = [p for p in module.parameters() if p.requires_grad] if params is None else list(params)
        if len({p.dtype for p in self.params}) > 1:
            raise ValueError(f"a unit mixes dtypes {sorted({str(p.dtype) for p in self.params})}: "
                             "one dtype per flat buffer")
        self.shapes = [p.shape for p in self.params]
        self.offsets = [0]
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.numel = self.offsets.pop()
        self.padded = padded_numel(self.numel, self.world)
        size, lo = self.padded // self.world, self.rank * self.padded // self.world
        self.pieces = [(min(max(off - lo, 0), size), min(max(off + p.numel() - lo, 0), size))
                       for p, off in zip(self.params, self.offsets)]        # p's elements in shard
        flat = flatten_and_pad([p.detach() for p in self.params], self.world)
        self.shard = flat[lo:lo + size].clone()           # the master copy the optimizer updates
        compute = param_dtype or flat.dtype
        self.full = flat if compute == flat.dtype else torch.empty(self.padded, dtype=compute, device=flat.device)
        self.reduce_dtype = reduce_dtype or compute
        self.work = None                                   # an all-gather in flight
        self.reducing = None                               # (chunk, flat, work): a reduce-scatter in flight
        self.ready = 0                                     # gradients in, this backward
        self.grads_in = grads_in or self.reduce_scatter    # called once all of them are
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self.params]
        self.free()

    def gather(self, async_op: bool = False) -> None:
        """All-gather every rank's shard into ``full`` and make each Parameter its view of it;
        with ``async_op`` only start it (:meth:`wait` finishes). Nothing if already gathered."""
        if self.full.untyped_storage().nbytes() == 0:
            alloc_storage(self.full)
            self.work = all_gather_into_tensor(self.full, self.shard.to(self.full.dtype), group=self.group,
                                               async_op=True)
        if not async_op:
            self.wait()

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None
            if all(p.grad is None for p in self.params):
                self.shard.grad = None     # optimizer.zero_grad() since the last backward
            for p, off, shape in zip(self.params, self.offsets, self.shapes):
                p.grad = None              # the pieces' gradients wait in shard.grad
                p.data = self.full[off:off + shape.numel()].view(shape)

    def free(self) -> None:
        """Give ``full``'s memory back; each Parameter is its piece of the shard again."""
        self.wait()
        for p, (a, b) in zip(self.params, self.pieces):
            p.data = self.shard[a:b]
            p.grad = None if self.shard.grad is None else self.shard.grad[a:b]
        free_storage(self.full)

    def forward(self, *args, **kwargs):
        self.gather()
        out = self.module(*args, **kwargs)
        self.free()
        _before_backward(out, self.gather)   # backward needs the parameters again
        return out

    @torch.no_grad()
    def _grad_ready(self, p) -> None:
        """Autograd calls this once ``p.grad`` is accumulated (a tied weight's once)."""
        self.ready += 1
        if self.ready == len(self.params):
            self.grads_in()

    @torch.no_grad()
    def reduce_scatter(self, async_op: bool = False) -> None:
        """Flat gradient (zeros where a Parameter has none), SUM over ranks, keep this rank's
        chunk, / N, into ``shard.grad`` (added to what accumulated there); the full gradients
        and parameters are dropped. With ``async_op`` only start it (:meth:`finish_reduce`
        adds it in), so it travels while backward computes the units before this one."""
        self.wait()
        gathered = self.full.untyped_storage().nbytes() > 0    # else the .grads are the pieces'
        flat = torch.zeros(self.padded, dtype=self.reduce_dtype, device=self.shard.device)
        for p, off in zip(self.params, self.offsets):
            if gathered and p.grad is not None:
                flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None
        mine = torch.empty(self.padded // self.world, dtype=self.reduce_dtype, device=self.shard.device)
        self.reducing = (mine, flat, reduce_scatter_tensor(mine, flat, group=self.group, async_op=True))
        self.ready = 0
        if not async_op:
            self.finish_reduce()
        self.free()

    @torch.no_grad()
    def finish_reduce(self) -> None:
        """Wait for the reduce-scatter in flight, if any, and add its chunk / N into ``shard.grad``."""
        if self.reducing is None:
            return
        mine, _flat, work = self.reducing
        self.reducing = None
        work.wait()
        mine = mine.div_(self.world).to(self.shard.dtype)
        self.shard.grad = mine if self.shard.grad is None else self.shard.grad.add_(mine)
        if self.full.untyped_storage().nbytes() == 0:            # at rest: the pieces' .grad views
            for p, (a, b) in zip(self.params, self.pieces):
                p.grad = self.shard.grad[a:b]

    def extra_repr(self) -> str:
        return f"{len(self.params)} params, numel={self.numel}, padded={self.padded}, shard={self.shard.numel()}"


class Zero3(nn.Module):
    """A model wrapped for ZeRO-3 (see the module docstring); call it like the model.

    Args:
        module: any ``nn.Module`` (its parameters and buffers are broadcast from rank 0).
        unit_types: module types to shard as units (default: the children of the first
            ``nn.ModuleList``); the root unit owns the rest.
        prefetch: start the next unit's all-gather while the current unit computes.
        async_reduce: let each unit's reduce-scatter travel while backward computes the units
            before it, one in flight at a time (its flat gradient kept until it is waited for),
            as FSDP2 runs its reduce-scatters on a stream of their own; waited for by the end
            of backward.
        reshard_root: free the root after forward too (2L + 2 all-gathers, not 2L + 1).
        param_dtype: the dtype forward and backward compute in (``torch.bfloat16``, ...);
            the shards stay fp32 masters. Frozen Parameters are cast to it once.
        reduce_dtype: the dtype gradients are reduce-scattered in (None: ``param_dtype``).
        ignored_params: Parameters left to the caller, as ``fully_shard``'s: not sharded,
            not flattened, not reduce-scattered; they stay whole on every rank and their
            gradient is this rank's own (average it yourself, e.g. with an all-reduce).
        group: the process group (default: all ranks).

    The optimizer: any torch optimizer over ``model.parameters()``. A piece is flat, so
    make parameter groups before wrapping (``wrap("zero3", ...)`` does). Attributes:
    ``units`` (:class:`FlatUnit`, root first, then in module order).
    """

    def __init__(self, module: nn.Module, *, unit_types=None, prefetch: bool = False, reshard_root: bool = False,
                 param_dtype=None, reduce_dtype=None, ignored_params=(), group=None, async_reduce: bool = False):
        super().__init__()
        require_process_group("Zero3")
        for name, dtype in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype not in (None, torch.bfloat16, torch.float16, torch.float32):
                raise ValueError(f"{name} must be torch.bfloat16, torch.float16, torch.float32 or None, "
                                 f"got {dtype!r}")
        ignored_params = list(ignored_params)
        own = {id(p) for p in module.parameters()}
        if not all(isinstance(p, nn.Parameter) and id(p) in own for p in ignored_params):
            raise ValueError("ignored_params must be Parameters of the module")
        self.module, self.group = module, group
        self.prefetch, self.reshard_root, self.async_reduce = bool(prefetch), bool(reshard_root), bool(async_reduce)
        broadcast_from_rank0(module, group)
        self.units = [FlatUnit(m, ps, group=group, param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                               grads_in=self._reduce_in_order)
                      for m, ps in find_units(module, unit_types, ignored_params) if ps]
        if param_dtype is not None:               # frozen weights: one compute copy, once
            with torch.no_grad():
                for p in module.parameters():
                    if not p.requires_grad and p.is_floating_point():
                        p.data = p.data.to(param_dtype)
        register_grad_owner(self.shard_parameters(), self)
        self.root = next((u for u in self.units if u.module is module), None)
        self.order = [u for u in self.units if u is not self.root]    # forward order
        self._next = len(self.units) - 1          # the next unit to reduce-scatter
        self._callback_queued = False
        self._hooks = [h for u in self.order for h in (
            u.module.register_forward_pre_hook(lambda m, args, u=u: self._pre_forward(u)),
            u.module.register_forward_hook(lambda m, args, out, u=u: self._post_forward(u, out)))]

    def _neighbour(self, unit, step: int):
        i = self.order.index(unit) + step if unit in self.order else (0 if step > 0 else len(self.order) - 1)
        return self.order[i] if 0 <= i < len(self.order) else None

    def forward(self, *args, **kwargs):
        if self.root is not None:
            self.root.gather()
        if self.prefetch and self._neighbour(self.root, +1):
            self._neighbour(self.root, +1).gather(async_op=True)
        out = self.module(*args, **kwargs)
        if not _before_backward(out, lambda: self._pre_backward(self.root)):
            for unit in self.units:
                unit.free()                       # no backward will come
        elif self.reshard_root and self.root is not None:
            self.root.free()
        return out

    def _pre_forward(self, unit: FlatUnit) -> None:
        unit.gather()
        if self.prefetch and self._neighbour(unit, +1):
            self._neighbour(unit, +1).gather(async_op=True)

    def _post_forward(self, unit: FlatUnit, out) -> None:
        unit.free()
        _before_backward(out, lambda: self._pre_backward(unit))

    def _pre_backward(self, unit) -> None:
        if not self._callback_queued:             # the first hook of this backward
            queue_backward_callback(self._end_of_backward)
            self._callback_queued = True
        if unit is not None and unit is not self.root:
            self._reduce_in_order(done_after=self.units.index(unit))
        if unit is not None:
            unit.gather()
        if self.prefetch and self._neighbour(unit, -1):
            self._neighbour(unit, -1).gather(async_op=True)

    def _reduce_in_order(self, done_after: int | None = None) -> None:
        """Reduce-scatter, strictly last unit first, the units whose gradients are all in, and
        those after unit ``done_after``, whose backward is over once backward reaches it (a
        Parameter that got no gradient on this rank sends zeros): so every rank issues the
        same collectives in the same order. A unit still waiting holds back the rest."""
        while self._next >= 0:
            unit = self.units[self._next]
            if (done_after is None or self._next <= done_after) and unit.ready < len(unit.params):
                return
            if self.async_reduce:                  # one in flight at a time, as FSDP2 keeps one
                for other in self.units:
                    other.finish_reduce()
            unit.reduce_scatter(async_op=self.async_reduce)
            self._next -= 1

    def _end_of_backward(self) -> None:
        """Reduce-scatter the units not done yet, in the same order; wait for every one in
        flight; free what is left."""
        for unit in reversed(self.units[:self._next + 1]):
            unit.reduce_scatter()
        for unit in self.units:
            unit.finish_reduce()
            unit.free()                            # e.g. a prefetch nobody used
        self._next, self._callback_queued = len(self.units) - 1, False

    def shard_parameters(self) -> list[nn.Parameter]:
        """The sharded Parameters, unit by unit; at rest each is its piece of this rank's shard."""
        return [p for u in self.units for p in u.params]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the shard gradients to a global norm of ``max_norm`` (over every rank's shard:
        a collective); returns the norm before clipping. Call it after backward."""
        if any(u.full.untyped_storage().nbytes() for u in self.units):
            raise RuntimeError("clip_grad_norm_ between backward() and optimizer.step(): a unit "
                               "is still gathered (inside forward or backward)")
        return clip_sharded_([u.shard.grad for u in self.units], max_norm, norm_type, self.group)

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` as ``module.named_parameters()`` names them: CPU clones,
        gathered from the shards. A collective: call it on every rank."""
        values: dict[int, torch.Tensor] = {}
        for u in self.units:
            flat = torch.empty(u.padded, dtype=u.shard.dtype, device=u.shard.device)
            all_gather_into_tensor(flat, u.shard, group=self.group)
            for p, off, shape in zip(u.params, u.offsets, u.shapes):
                values[id(p)] = flat[off:off + shape.numel()].view(shape)
        return {name: values.get(id(p), p).detach().cpu().clone() for name, p in self.module.named_parameters()}

    def remove_hooks(self) -> None:
        for h in self._hooks + [h for u in self.units for h in u._hooks]:
            h.remove()
        self._hooks = []

    def extra_repr(self) -> str:
        return (f"units={len(self.units)} (padded numels {[u.padded for u in self.units]}), "
                f"prefetch={self.prefetch}, reshard_root={self.reshard_root}, async_reduce={self.async_reduce}")
