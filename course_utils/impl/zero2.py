"""ZeRO-2 = ZeRO-1 + DDP's hooks: :class:`Zero2` is :class:`~course_utils.impl.zero1.Zero1` whose
gradients are reduce-scattered during backward, bucket by bucket, by
:class:`~course_utils.impl.hooks.BucketHooks` (``notebooks/02``'s ``_on_grad``). Its methods are the
answer to notebook 05's build (``course/solutions/zero2.py``, tested equal), kept apart from ``Zero1``
(:mod:`~course_utils.impl.zero1`) so that reading ZeRO-1's hook points does not show the answer. ``overlap=False``:
:class:`SendAfterBackward`.
"""
from __future__ import annotations

import torch

from ..runtime.compat import reduce_scatter_tensor
from .common import DEFAULT_BUCKET_BYTES, flatten_and_pad
from .hooks import BucketHooks
from .zero1 import Zero1

__all__ = ["Zero2", "SendAfterBackward"]


class Zero2(Zero1, BucketHooks):
    """ZeRO-2: ZeRO-1 whose gradients are reduce-scattered during backward, bucket by
    bucket, by DDP's hooks (``_on_grad`` of :class:`BucketHooks`, notebook 02), each full
    ``.grad`` freed once sent: a rank keeps only its shard's gradient (P_b/N per bucket).
    The methods are the answer to notebook 05's build (``solutions/zero2.py``, tested equal),
    plus the error of a backward after clipping."""

    def __init__(self, params, optimizer_class, bucket_bytes=DEFAULT_BUCKET_BYTES, **defaults):
        super().__init__(params, optimizer_class, bucket_bytes, **defaults)
        self.in_flight = None                         # the bucket whose message is being sent
        self.register_bucket_hooks([b.params for b in self.buckets])

    def _grad_buffers(self, bucket):
        """ZeRO-2 keeps only the shard's gradient: P_b/N elements."""
        bucket.shard_grad = bucket.shard.grad = torch.zeros_like(bucket.shard)

    def _launch(self):
        """Bucket ``self.next``: its gradients into one padded message, freed, the message
        reduce-scattered asynchronously (the message before it finished first: at most
        one in flight, to bound the memory)."""
        self._wait()
        b = self.buckets[self.next]
        b.message = flatten_and_pad([p.grad if p.grad is not None else torch.zeros_like(p)
                                     for p in b.params], self.n)      # unused on this rank: zeros
        for p in b.params:
            p.grad = None                             # the full gradient is gone
        # in place: rank r's slice of the message receives the sum of everyone's slice r
        b.work = reduce_scatter_tensor(b.message[b.lo:b.hi], b.message, group=self.group, async_op=True)
        self.in_flight = b
        self.next += 1

    def _wait(self):
        """Wait for the message in flight; add this rank's slice into its shard gradient."""
        if self.in_flight is not None:
            b, self.in_flight = self.in_flight, None
            b.work.wait()
            b.shard_grad.add_(b.message[b.lo:b.hi])
            b.message = b.work = None

    def _finish(self):
        """When backward ends: send what is left, wait. The next backward (gradient
        accumulation) adds into the same shard gradients."""
        self.queued = False
        while self.next < len(self.buckets):
            self._launch()
        self._wait()
        self.next, self.ready = 0, set()

    def _sum_gradients(self):
        """Nothing: the hooks already summed every backward's gradients into the shards."""

    def _zero_grads(self, bucket):
        bucket.shard_grad.zero_()
        for p in bucket.params:
            p.grad = None

    def _on_grad(self, p) -> None:
        if self._reduced:
            raise RuntimeError("ZeRO-2: a backward after the gradients were reduced (clip_grad_norm_) "
                               "and before optimizer.step(); clip after the last backward of the step")
        super()._on_grad(p)


class SendAfterBackward:
    """ZeRO-2 with ``overlap=False``: the hooks send nothing, full gradients accumulate in
    ``.grad`` (as under DDP's ``no_sync``) and ``step()`` reduce-scatters them once."""

    def _on_grad(self, p) -> None:
        if self._reduced:
            super()._on_grad(p)                       # the error of a backward after clipping

    def reduce_gradients(self) -> None:
        if not self._reduced:
            self._finish()
        super().reduce_gradients()
