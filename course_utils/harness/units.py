"""A whole model sharded with a unit class of ``MyFlatUnit``'s shape (exercise 06.1).

``UnitModel(model, Unit)`` makes each child of the model's first ``nn.ModuleList`` (the course
GPT's blocks) ``Unit(block)``, and the parameters no block owns (embeddings, final norm) one more
``Unit``, the *root*, over a module that holds just them. The root is gathered at the start of
each forward and stays gathered: its parameters are used at both ends of the model (the tied
embedding), and the unit frees it itself once its gradients are in, at the end of backward.
So a step makes 2L + 1 all-gathers and L + 1 reduce-scatters, as the course's
:class:`~course_utils.impl.zero3.Zero3` without prefetch. What a unit does (gather, free,
reduce-scatter) is the unit's own: nothing here sends a byte but ``broadcast_from_rank0``.

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

    def __init__(self, module: nn.Module, unit_cls: type):
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
        register_grad_owner(self.shard_parameters(), self)

    def forward(self, *args, **kwargs):
        if self.root is not None:
            self.root.gather()                   # freed by the unit, once its gradients are in
        return self.module(*args, **kwargs)

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
