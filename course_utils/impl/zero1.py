"""ZeRO-1 from scratch: :class:`Zero1`, ``MyZero1``'s algorithm (``notebooks/04_zero1.ipynb``) per
bucket, with what a user's loop needs (``zero_grad``, clipping, checkpoints); ``torch.optim.Optimizer``
built like torch's ``ZeroRedundancyOptimizer`` (parameters or groups, the optimizer class, its
hyperparameters). Its hook points, which ZeRO-2 (:mod:`course_utils.impl.zero2`, notebook 05's build)
overrides: ``_grad_buffers``, ``_sum_gradients``, ``_zero_grads``.

Each group's trainable parameters are cut into DDP's buckets; a bucket of Ψ_b elements
lives in one flat buffer padded to P_b = ceil(Ψ_b/N)·N, which its parameters become views
of. Rank r owns ``[r·P_b/N, (r+1)·P_b/N)``, and the real optimizer steps only that slice.
Options are mixins; predicted bytes: :mod:`course_utils.theory.zero`, measured:
:mod:`course_utils.harness.probes`. ``state_dict`` is this rank's shard.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..runtime.compat import all_gather_into_tensor, reduce_scatter_tensor
from .common import (DEFAULT_BUCKET_BYTES, broadcast_from_rank0, clip_sharded_, flatten_and_pad,
                     make_buckets, register_grad_owner)
from ..theory.layout import shard_bounds

__all__ = ["Zero1", "ZeroBucket", "AllReduceGradients", "BF16Master", "MixedZero1"]


@dataclasses.dataclass
class ZeroBucket:
    """A flat padded buffer (``flat``, P_b elements) and this rank's slice ``[lo, hi)``:
    ``shard`` (stepped by the inner optimizer) and ``shard_grad``. ZeRO-1: ``flat_grads``;
    ZeRO-2: ``message``, the gradients in flight."""

    params: list
    numel: int                      # Ψ_b
    flat: torch.Tensor
    lo: int
    hi: int
    shard: nn.Parameter
    shard_grad: torch.Tensor | None = None
    flat_grads: torch.Tensor | None = None
    message: torch.Tensor | None = None
    work: object = None

    def views(self, flat: torch.Tensor):
        """(parameter, its view of ``flat``) for each parameter of the bucket."""
        pieces = flat[:self.numel].split([p.numel() for p in self.params])
        return [(p, piece.view_as(p)) for p, piece in zip(self.params, pieces)]


class Zero1(torch.optim.Optimizer):
    """ZeRO-1: optimizer states sharded. ``params`` (or groups), the same on every rank;
    ``optimizer_class`` (e.g. ``torch.optim.AdamW``) is built once (``.inner``) over this
    rank's shards with each group's hyperparameters, which ``step()`` copies in first."""

    def __init__(self, params, optimizer_class, bucket_bytes=DEFAULT_BUCKET_BYTES, *, group=None, **defaults):
        _check_arguments(type(self).__name__, params, optimizer_class)
        super().__init__(params, defaults)            # self.param_groups: your groups, as given
        self.group, self.n, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        broadcast_from_rank0([p for g in self.param_groups for p in g["params"]], group)
        self.params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("no trainable parameters (every one has requires_grad=False)")
        self.buckets, inner_groups = [], []
        for g in self.param_groups:                   # a bucket never mixes two groups
            trained = [p for p in g["params"] if p.requires_grad]
            made = [self._make_bucket(b) for b in make_buckets(trained, bucket_bytes)]
            self.buckets += made
            inner_groups.append({**self._hyper(g), "params": [b.shard for b in made]})
        self.inner = optimizer_class(inner_groups, **defaults)
        self._reduced = False                         # reduce_gradients ran since the last step
        register_grad_owner(self.params, self)

    @torch.no_grad()
    def _make_bucket(self, params) -> ZeroBucket:
        """The parameters become views of one flat padded buffer; the shard is this
        rank's slice of it (a view: the inner optimizer updates the buffer in place)."""
        flat = flatten_and_pad([p.detach() for p in params], self.n)
        numel = sum(p.numel() for p in params)
        lo, hi = shard_bounds(numel, self.n, self.rank)
        bucket = ZeroBucket(list(params), numel, flat, lo, hi, nn.Parameter(flat[lo:hi]))
        for p, view in bucket.views(flat):
            p.data = view
        self._grad_buffers(bucket)
        return bucket

    def _grad_buffers(self, bucket: ZeroBucket) -> None:
        """ZeRO-1: a flat gradient buffer, every ``.grad`` a view of it; the shard's slice of
        it is the shard's gradient (reduce-scattered into in place)."""
        bucket.flat_grads = torch.zeros_like(bucket.flat)
        bucket.shard_grad = bucket.shard.grad = bucket.flat_grads[bucket.lo:bucket.hi]
        for p, view in bucket.views(bucket.flat_grads):
            p.grad = view

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Leave the average of this rank's slice in every ``shard_grad``: once per step, in
        ``step()`` or earlier in :meth:`clip_grad_norm_`."""
        if self._reduced:
            return
        self._sum_gradients()
        for b in self.buckets:
            b.shard_grad.div_(self.n)
        self._reduced = True

    def _sum_gradients(self) -> None:
        """ZeRO-1: each bucket's flat gradient reduce-scattered (SUM) into its shard's, now."""
        works = []
        for b in self.buckets:
            self._collect(b)
            works.append(self._reduce(b))
        for w in works:
            w.wait()

    def _reduce(self, b: ZeroBucket):
        # in place: rank r's slice of the buffer receives the sum of everyone's slice r
        return reduce_scatter_tensor(b.flat_grads[b.lo:b.hi], b.flat_grads, op=dist.ReduceOp.SUM,
                                     group=self.group, async_op=True)

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce the gradients, step the real optimizer on the shards, all-gather them."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._copy_hyperparameters()                  # lr etc., as an LR scheduler left them
        self.inner.step()                             # the shards only
        works = [all_gather_into_tensor(b.flat, b.flat[b.lo:b.hi], group=self.group, async_op=True)
                 for b in self.buckets]               # in place: every rank's slice, everywhere
        for w in works:
            w.wait()
        self._reduced = False
        return loss

    # -- the rest of a torch optimizer: zero_grad, clipping, checkpoints
    @staticmethod
    def _hyper(group: dict) -> dict:
        return {k: v for k, v in group.items() if k != "params"}

    def _copy_hyperparameters(self) -> None:
        for inner, group in zip(self.inner.param_groups, self.param_groups):
            inner.update(self._hyper(group))

    @torch.no_grad()
    def _collect(self, b: ZeroBucket) -> None:
        """Every ``.grad`` a view of the flat gradient buffer again, if something replaced
        it (``model.zero_grad()``: zeros)."""
        for p, view in b.views(b.flat_grads):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """ZeRO-1 keeps ``.grad`` as zeroed views (as DDP's ``gradient_as_bucket_view``)."""
        self._reduced = False
        for b in self.buckets:
            self._zero_grads(b)
        for g in self.param_groups:
            for p in g["params"]:
                if not p.requires_grad and p.grad is not None:
                    p.grad = None if set_to_none else p.grad.zero_()

    def _zero_grads(self, b: ZeroBucket) -> None:
        for p in b.params:
            p.grad = None
        self._collect(b)                              # zeroed views again

    def add_param_group(self, param_group: dict) -> None:
        if hasattr(self, "inner"):
            raise NotImplementedError(f"{type(self).__name__} lays out its flat buffers once: pass "
                                      "every parameter group to the constructor")
        super().add_param_group(param_group)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Reduce now, clip the averaged shards to a global norm (a collective); returns it."""
        self.reduce_gradients()
        return clip_sharded_([b.shard_grad for b in self.buckets], max_norm, norm_type, self.group)

    def _layout(self) -> dict:
        return {"world_size": self.n, "rank": self.rank, "buckets": [(b.numel, b.flat.numel()) for b in self.buckets]}

    def state_dict(self) -> dict:
        """This rank's shard, with the layout it fits (same rank, world size and buckets)."""
        self._copy_hyperparameters()
        return {"inner": self.inner.state_dict(), **self._layout(),
                "param_groups": [self._hyper(g) for g in self.param_groups]}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict, dict) or "inner" not in state_dict:
            raise TypeError(f"load_state_dict takes what {type(self).__name__}.state_dict() returned")
        mine = self._layout()
        theirs = {k: state_dict.get(k) for k in mine}
        theirs["buckets"] = [tuple(b) for b in theirs["buckets"] or []]
        if theirs != mine:
            raise ValueError(f"this state dict is the shard of another layout ({theirs}); this "
                             f"optimizer is {mine}: load each rank's own shard, same world size and buckets")
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        self.inner.load_state_dict(state_dict["inner"])
        self._copy_hyperparameters()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(world_size={self.n}, groups={len(self.param_groups)}, "
                f"buckets (numel, padded)={self._layout()['buckets']}, inner={type(self.inner).__name__})")


# ---------------------------------------------------------------- options, as mixins
class AllReduceGradients:
    """ZeRO-1 with ``variant="allreduce"``: all-reduce the whole flat gradient, keep the own
    slice. Same numbers, twice the gradient bytes of a reduce-scatter."""

    def _reduce(self, b: ZeroBucket):
        return dist.all_reduce(b.flat_grads, op=dist.ReduceOp.SUM, group=self.group, async_op=True)


class BF16Master:
    """``mixed=True``: bf16 parameters and gradients in the model, an fp32 master copy of
    the shard in the optimizer (the paper's K = 12 bytes per parameter)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.inner.register_step_pre_hook(self._master_grads)
        self.inner.register_step_post_hook(self._round_master)

    @torch.no_grad()
    def _make_bucket(self, params) -> ZeroBucket:
        master = flatten_and_pad([p.detach() for p in params], self.n, dtype=torch.float32)
        for p in params:
            p.data = p.data.to(torch.bfloat16)
        bucket = super()._make_bucket(params)
        bucket.shard = nn.Parameter(master[bucket.lo:bucket.hi].clone())
        return bucket

    def _master_grads(self, *_) -> None:
        for b in self.buckets:                        # fp32 gradient of the master, for the step only
            b.shard.grad = b.shard_grad.float()

    @torch.no_grad()
    def _round_master(self, *_) -> None:
        for b in self.buckets:
            b.shard.grad = None
            b.flat[b.lo:b.hi].copy_(b.shard)          # the master, rounded to bf16, then all-gathered


class MixedZero1(BF16Master, Zero1):
    """ZeRO-1 with bf16 parameters and an fp32 master shard (``zero_optimizer(..., mixed=True)``): the
    course's answer to notebook 04's optional mixed-precision build."""


def _check_arguments(name: str, params, optimizer_class) -> None:
    require_process_group(name)
    if isinstance(params, nn.Module):
        raise TypeError(f"{name} takes parameters, like torch's optimizers: pass model.parameters() "
                        "(or parameter groups), not the model")
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError("optimizer_class must be a torch.optim.Optimizer class such as "
                        f"torch.optim.AdamW (the class itself), got {optimizer_class!r}")
