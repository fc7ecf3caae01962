"""What the strategy adapters (:mod:`.strategies`) measure from outside the algorithms
(:mod:`course_utils.impl` holds no bookkeeping): :func:`grad_bytes` and :class:`PeakGradBytes`,
the gradient bytes a Zero1/Zero2 optimizer holds, now and at its peak."""
from __future__ import annotations

from ..impl import zero

__all__ = ["grad_bytes", "PeakGradBytes"]


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def grad_bytes(opt) -> int:
    """ZeRO-1: its flat gradient buffers; ZeRO-2: unsent ``.grad`` + message in flight + shards."""
    if not isinstance(opt, zero.Zero2):
        return sum(_nbytes(b.flat_grads) for b in opt.buckets)
    return (sum(_nbytes(p.grad) for p in opt.params)
            + sum(_nbytes(b.shard_grad) + _nbytes(b.message) for b in opt.buckets))


class PeakGradBytes:
    """An observer mixed into Zero1/Zero2 (``zero_optimizer(..., observers=(PeakGradBytes,))``):
    :func:`grad_bytes` noted after each hook, launch and wait, and inside each launch, where a
    bucket's gradients and its new message are both alive."""
    peak_grad_bytes = 0

    def reset_peak(self) -> None:
        self.peak_grad_bytes = grad_bytes(self)

    def _note(self) -> None:
        self.peak_grad_bytes = max(self.peak_grad_bytes, grad_bytes(self))

    def _on_grad(self, p) -> None:
        self._note()
        super()._on_grad(p)

    def _launch(self) -> None:
        # Inside a launch, the bucket's gradients and its new padded message coexist for a moment
        # (after the message in flight, if any, was waited for and freed): count that moment too.
        flight = getattr(self, "in_flight", None)
        waited = grad_bytes(self) - (_nbytes(flight.message) if flight is not None else 0)
        bucket = self.buckets[self.next]
        self.peak_grad_bytes = max(self.peak_grad_bytes, waited + bucket.flat.numel() * bucket.flat.element_size())
        super()._launch()
        self._note()

    def _wait(self) -> None:
        super()._wait()
        self._note()
