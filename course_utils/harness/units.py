"""A whole model sharded with a unit class of ``MyFlatUnit``'s shape (exercise 06.1).

``UnitModel(model, Unit)`` makes each child of the model's first ``nn.ModuleList`` (the course
GPT's blocks) ``Unit(block)``, and the parameters no block owns (embeddings, final norm) one more
``Unit``, the *root*, over a module that holds just them. The root is gathered at the start of
each forward and stays gathered: its parameters are used at both ends of the model (the tied
embedding), and the unit frees it itself once its gradients are in, at the end of backward.
So a step makes 2L + 1 all-gathers and L + 1 reduce-scatters, as the course's
:class:`~course_utils.impl.zero3.Zero3` without prefetch. What a unit does (gather, free,
reduce-scatter) is the unit's own: nothing here sends a byte but ``broadcast_from_rank0``.

``prefetch=True`` (exercise 06.2: a unit class with ``prefetch()``, which starts the unit's
all-gather and returns at once) schedules the prefetches as the course's ``Zero3`` does, the unit
doing the rest: before block i computes, block i + 1's all-gather starts; when backward reaches
the model's output, the last block's; when it reaches block i's output (after block i's own
re-gather), block i - 1's. The same collectives, earlier.

What a unit must have: ``Unit(module)``, ``.params`` (its trainable Parameters), ``.shard``
(the Parameter the optimizer updates, its averaged gradient in ``.shard.grad``), ``gather()``
and ``free()``. The strategy ``"zero3"`` runs it with ``impl=Unit``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..checks import require_process_group
from ..impl.common import broadcast_from_rank0, clip_sharded_, register_grad_owner
from ..theory.sharding import find_units

__all__ = ["UnitModel"]


class UnitModel(nn.Module):
    """``module`` with each block a ``unit_cls(block)`` and its other trainable parameters a
    root ``unit_cls``; call it like ``module``. ``units``: the root first, then the blocks."""

    def __init__(self, module: nn.Module, unit_cls: type, *, prefetch: bool = False):
        super().__init__()
        require_process_group("UnitModel")
        blocks = next((m for m in module.modules() if isinstance(m, nn.ModuleList)), None)
        if blocks is None:
            raise ValueError("UnitModel makes the children of the model's first nn.ModuleList units; "
                             f"{type(module).__name__} has no nn.ModuleList")
        (_, root_params), *owned = find_units(module)
        for i, (block, params) in enumerate(owned):
            mine = [p for p in block.parameters() if p.requires_grad]
            if {id(p) for p in mine} != {id(p) for p in params}:
                raise ValueError(f"block {i} shares a trainable parameter with another unit (tied weights): "
                                 "a unit flattens all its module's parameters, so each must be its own")
        broadcast_from_rank0(module)             # every rank starts from rank 0's state
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.module = module
        for i, block in enumerate(list(blocks)):
            blocks[i] = unit_cls(block)
        holder = nn.Module()                     # the root's parameters, still the model's own
        holder.params = nn.ParameterList(root_params)
        self.root = unit_cls(holder) if root_params else None
        self.units = ([self.root] if self.root is not None else []) + list(blocks)
        self.blocks, self.prefetch = list(blocks), bool(prefetch)
        if self.prefetch and not callable(getattr(unit_cls, "prefetch", None)):
            raise ValueError(f"prefetch=True needs a unit class with a prefetch() method; "
                             f"{unit_cls.__name__} has none (exercise 06.2 adds it)")
        if self.prefetch:
            for i, block in enumerate(self.blocks):
                block.register_forward_pre_hook(lambda m, args, i=i: self._before_block(i))
                block.register_forward_hook(lambda m, args, out, i=i: self._after_block(i, out))
        register_grad_owner(self.shard_parameters(), self)

    def forward(self, *args, **kwargs):
        if self.root is not None:
            self.root.gather()                   # freed by the unit, once its gradients are in
        out = self.module(*args, **kwargs)
        if self.prefetch and self.blocks and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(_then(self.blocks[-1].prefetch))   # backward starts at the last block
        return out

    def _before_block(self, i: int) -> None:
        """Block i is about to gather and compute: its own all-gather first (if not on its way),
        then block i + 1's, which travels while block i computes."""
        for unit in self.blocks[i:i + 2]:
            unit.prefetch()

    def _after_block(self, i: int, out) -> None:
        """Block i computed its output: when backward reaches it, after block i's own re-gather
        (the unit's hook, registered first), block i - 1's all-gather starts."""
        if i > 0 and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(_then(self.blocks[i - 1].prefetch))

    def shard_parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates: each unit's shard (the course's ``FlatUnit`` keeps its shard
        as its Parameters' pieces: those)."""
        return [p for u in self.units
                for p in ([u.shard] if isinstance(u.shard, nn.Parameter) else u.params)]

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` named as the unwrapped module's (CPU clones): each unit
        gathered, read and freed in turn. A collective: call it on every rank."""
        values = {}
        for u in self.units:
            u.gather()
            values.update({id(p): p.detach().cpu().clone() for p in u.params})
            u.free()
        for p in self.module.parameters():      # frozen: whole on every rank
            if id(p) in self._names and id(p) not in values:
                values[id(p)] = p.detach().cpu().clone()
        return {name: values[pid] for pid, name in self._names.items()}

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the shards' gradients to a global norm of ``max_norm``; the norm before clipping."""
        return clip_sharded_([u.shard.grad for u in self.units], max_norm, norm_type)


def _then(fn):
    """A tensor hook that calls ``fn()`` and leaves the gradient as it is."""
    def hook(grad):
        fn()
        return grad
    return hook
