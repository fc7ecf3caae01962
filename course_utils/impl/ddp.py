"""Data parallelism from scratch: :class:`DataParallel` does what torch's
``DistributedDataParallel`` does, with the methods of ``notebooks/02_data_parallelism.ipynb``'s
exercise ``MyDDP``. As with torch DDP the gradients are averaged by the end of
``backward()``, so clipping, LR schedulers and any optimizer work unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..runtime.compat import queue_backward_callback
from .common import DEFAULT_BUCKET_BYTES, broadcast_from_rank0, make_buckets, trainable
from .hooks import BucketHooks

__all__ = ["DataParallel", "unwrap"]


class DataParallel(BucketHooks, nn.Module):
    """1. every parameter and buffer is broadcast from rank 0; 2. trainable parameters are
    cut into buckets (:func:`~course_utils.impl.common.make_buckets`); 3. during backward
    a hook marks each gradient ready and, once the next bucket is complete, :meth:`_launch`
    starts its asynchronous all-reduce (overlapping the rest of backward); 4. the first
    hook queues :meth:`_finish`, which autograd runs when backward ends: it launches the
    rest, waits, divides by N and writes the averages into ``.grad``.

    ``overlap=False`` sends everything from :meth:`_finish`; inside :meth:`no_sync` nothing
    is sent. Frozen parameters are never sent, a tied one once; a parameter without a
    gradient on some rank contributes zeros (every rank sends every bucket) and gets a
    ``.grad`` (zeros if no rank used it, where torch DDP leaves None).
    """

    #: a wrapper whose ``.module`` is the user's model (what :func:`unwrap` looks for)
    wraps_module = True

    def __init__(self, module: nn.Module, bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, *,
                 overlap: bool = True, group=None):
        super().__init__()
        require_process_group("DataParallel")
        self.module, self.group, self.overlap = module, group, bool(overlap)
        self.world_size = dist.get_world_size(group)
        self._broadcast_from_rank0()
        self.params = trainable(module)
        self.buckets = make_buckets(self.params, bucket_bytes)
        self.pending = []                   # (bucket, flat, work) in flight
        self.register_bucket_hooks(self.buckets)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _broadcast_from_rank0(self) -> None:
        broadcast_from_rank0(self.module, self.group)

    def _launch(self) -> None:
        """Start the all-reduce of bucket ``self.next`` (a missing gradient: zeros)."""
        bucket = self.buckets[self.next]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in bucket])
        self.pending.append((bucket, flat, dist.all_reduce(flat, group=self.group, async_op=True)))
        self.next += 1

    @torch.no_grad()
    def _finish(self) -> None:
        """When backward ends: launch the rest, wait, write the averages into ``.grad``."""
        self.queued = False
        while self.next < len(self.buckets):
            self._launch()
        for bucket, flat, work in self.pending:
            work.wait()
            flat.div_(self.world_size)
            for p, average in zip(bucket, flat.split([p.numel() for p in bucket])):
                if p.grad is None:
                    p.grad = average.view_as(p).clone()
                else:
                    p.grad.copy_(average.view_as(p))
        self.next, self.ready, self.pending = 0, set(), []

    # -- modes (not the algorithm): send after backward, gradient accumulation
    _hooks_off = False

    def _on_grad(self, p) -> None:
        if self._hooks_off:
            return
        if self.overlap:
            return super()._on_grad(p)
        if not self.queued:                 # overlap=False: everything from _finish
            queue_backward_callback(self._finish)
            self.queued = True

    @contextmanager
    def no_sync(self):
        """Gradient accumulation: backwards inside this block send nothing; the next
        backward outside it all-reduces the accumulated gradients."""
        previous, self._hooks_off = self._hooks_off, True
        try:
            yield
        finally:
            self._hooks_off = previous

    def extra_repr(self) -> str:
        sizes = [sum(p.numel() for p in b) for b in self.buckets]
        return f"world_size={self.world_size}, buckets={len(sizes)} (elements {sizes}), overlap={self.overlap}"


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a wrapper: torch DDP's ``.module``, or that of any object marked
    ``wraps_module = True`` (:class:`DataParallel`, a learner's class run by ``wrap("ddp", impl=...)``)."""
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, DistributedDataParallel) or getattr(model, "wraps_module", False) is True:
        model = model.module
    return model
