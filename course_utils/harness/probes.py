"""Measuring the course's DDP and ZeRO-1/2 from outside: the classes of
:mod:`course_utils.impl` hold no bookkeeping, so what a run reports about them beyond the
common fields is taken here. Used by the ``"ddp"``/``"zero1"``/``"zero2"``/``"torch-*"``
rows of :mod:`course_utils.harness.strategies`.

- :func:`grad_bytes`: the gradient bytes a :class:`~course_utils.impl.zero.Zero1` or
  ``Zero2`` holds now; :func:`measure_peak` extends one so that it records the most it
  held at any moment (``peak_grad_bytes``; ``harness.experiments`` calls ``reset_peak()``
  before each step and reads it after);
- :func:`zero_state_bytes`, :func:`torch_zero1_state_bytes`: the bytes of model states
  a rank holds under ZeRO-1/2 and torch's ZeroRedundancyOptimizer.
"""
from __future__ import annotations

import functools

import torch

from ..impl import ddp, zero
from ..impl.common import storage_bytes
from ..runtime.ledger import CommLedger

__all__ = ["grad_bytes", "PeakGradBytes", "measure_peak", "zero_state_bytes", "zero_extras",
           "torch_zero1_state_bytes", "wrap_zero1", "wrap_zero2", "wrap_torch_ddp"]


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def grad_bytes(opt) -> int:
    """Gradient bytes ``opt`` holds now: ZeRO-1 its flat gradient buffers; ZeRO-2 the full
    ``.grad`` not sent yet + the message in flight + the shard gradients."""
    if not isinstance(opt, zero.Zero2):
        return sum(_nbytes(b.flat_grads) for b in opt.buckets)
    return (sum(_nbytes(p.grad) for p in opt.params)
            + sum(_nbytes(b.shard_grad) + _nbytes(b.message) for b in opt.buckets))


class PeakGradBytes:
    """Mixed into a Zero1/Zero2 by :func:`measure_peak`: after each gradient hook, launch
    and completed message, ``peak_grad_bytes`` is raised to :func:`grad_bytes` if above."""

    peak_grad_bytes = 0

    def reset_peak(self) -> None:
        """Start measuring :attr:`peak_grad_bytes` afresh."""
        self.peak_grad_bytes = grad_bytes(self)

    def _note(self) -> None:
        self.peak_grad_bytes = max(self.peak_grad_bytes, grad_bytes(self))

    def _on_grad(self, p) -> None:
        self._note()
        super()._on_grad(p)

    def _launch(self) -> None:
        super()._launch()
        self._note()

    def _wait(self) -> None:
        super()._wait()
        self._note()


@functools.cache
def _measured(cls: type) -> type:
    return type(f"Measured{cls.__name__}", (PeakGradBytes, cls), {})


def measure_peak(opt):
    """``opt`` (a Zero1/Zero2), from now on recording ``peak_grad_bytes``; returned."""
    opt.__class__ = _measured(type(opt))
    if isinstance(opt, zero.Zero2):            # the hooks are bound methods: bind them again
        opt.remove_hooks()
        opt._hook(opt.waiting)
    opt.reset_peak()
    return opt


def zero_state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds under ZeRO-1/2, each storage once: params (the flat buffers and
    any frozen parameters), grads (ZeRO-1: the flat gradient buffers; ZeRO-2: the shard
    gradients), optimizer (the inner optimizer's states, and the fp32 master shard when mixed)."""
    seen: set = set()
    params = list(ddp.unwrap(model).parameters())
    out = {"params": storage_bytes(params, seen)}
    out["grads"] = storage_bytes([p.grad for p in params] + [b.shard_grad for b in optimizer.buckets], seen)
    state = [v for s in optimizer.inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    if isinstance(optimizer, zero.BF16Master):
        state += [b.shard for b in optimizer.buckets]
    out["optimizer"] = storage_bytes(state, seen)
    return out


def zero_extras(model, optimizer) -> dict:
    """What a ZeRO-1/2 run reports besides the common fields: the buckets' sizes Ψ_b."""
    return {"bucket_numels": [b.numel for b in optimizer.buckets]}


def torch_zero1_state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds under ``"torch-zero1"``: full parameters and gradients, and
    the states of the optimizer over the parameters this rank owns."""
    seen: set = set()
    params = list(ddp.unwrap(model).parameters())
    out = {"params": storage_bytes(params, seen), "grads": storage_bytes([p.grad for p in params], seen)}
    local = optimizer.optim                # the optimizer over this rank's parameters
    out["optimizer"] = storage_bytes([v for s in local.state.values() for v in s.values()
                                      if isinstance(v, torch.Tensor)], seen)
    return out


def _then(wrap, after):
    """``wrap`` (its signature, so its options), with ``after(model, optimizer)`` applied."""
    @functools.wraps(wrap)
    def wrapped(model, make_optimizer, **options):
        model, optimizer = wrap(model, make_optimizer, **options)
        return after(model, optimizer)
    return wrapped


wrap_zero1 = _then(zero.wrap_zero1, lambda m, o: (m, measure_peak(o)))
wrap_zero2 = _then(zero.wrap_zero2, lambda m, o: (m, measure_peak(o)))
# torch DDP's default averaging, issued from Python so that a CommLedger sees each bucket
wrap_torch_ddp = _then(ddp.wrap_torch_ddp, lambda m, o: (CommLedger.attach_ddp(m), o))
