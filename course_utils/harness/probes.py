"""The adapters of the strategy table (:mod:`.strategies`), ``(model, make_optimizer, **options)
-> (model, optimizer)``: ``"ddp"``, ``"torch-ddp"``, ``"zero1"``, ``"zero2"`` and ``"torch-zero1"``,
measured from outside (:mod:`course_utils.impl` holds no bookkeeping): :class:`PeakGradBytes` for
Zero1/Zero2, torch DDP's all-reduces seen by a CommLedger."""
from __future__ import annotations

from ..checks import require_process_group
from ..impl import ddp, zero
from ..impl.common import DEFAULT_BUCKET_BYTES, broadcast_from_rank0, real_optimizer, trainable
from ..runtime.ledger import CommLedger

__all__ = ["grad_bytes", "PeakGradBytes", "zero_extras", "wrap_ddp", "wrap_torch_ddp",
           "wrap_zero1", "wrap_zero2", "wrap_torch_zero1"]


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
    :func:`grad_bytes` noted after each hook, launch and wait."""
    peak_grad_bytes = 0

    def reset_peak(self) -> None:
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


def wrap_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True, group=None, impl=None):
    """``"ddp"``: ``(DataParallel(model), make_optimizer(its trainable parameters))``; ``impl``:
    another class of ``MyDDP``'s shape, ``impl(model, bucket_bytes)`` (the learner's), its object
    marked ``wraps_module`` so that :func:`~course_utils.impl.ddp.unwrap` finds the model inside."""
    if impl is None or impl is ddp.DataParallel:
        wrapped = ddp.DataParallel(model, bucket_bytes, overlap=overlap, group=group)
        return wrapped, make_optimizer(wrapped.params)
    wrapped = impl(model, bucket_bytes)
    wrapped.wraps_module = True
    return wrapped, make_optimizer(trainable(model))


def wrap_torch_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, group=None):
    """``"torch-ddp"``: torch's ``DistributedDataParallel`` (``bucket_bytes=0``: one bucket per
    parameter), its all-reduces issued from Python so that a CommLedger sees them."""
    from torch.nn.parallel import DistributedDataParallel

    require_process_group("torch-ddp")
    device = next(model.parameters()).device
    cap_mb = None if bucket_bytes is None else max(bucket_bytes, 1) / 2**20
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      process_group=group, bucket_cap_mb=cap_mb)
    return CommLedger.attach_ddp(wrapped), make_optimizer(trainable(model))


def zero_extras(model, optimizer) -> dict:
    """What a ZeRO-1/2 run also reports: the buckets' sizes Ψ_b."""
    return {"bucket_numels": [b.numel for b in optimizer.buckets]} if isinstance(optimizer, zero.Zero1) else {}


def _wrap_zero(model, make_optimizer, stage, group, bucket_bytes, impl=None, **options):
    frozen = [p for p in model.parameters() if not p.requires_grad]
    broadcast_from_rank0(frozen + list(model.buffers()), group)   # the trained ones: the optimizer
    groups, cls, defaults = real_optimizer(model, make_optimizer)
    if impl not in (None, zero.Zero1 if stage == 1 else zero.Zero2):   # the learner's class, as it is
        broadcast_from_rank0(model, group)
        return model, (impl(groups, cls, **defaults) if stage == 1 else impl(groups, cls, bucket_bytes, **defaults))
    opt = zero.zero_optimizer(groups, cls, stage=stage, bucket_bytes=bucket_bytes, group=group,
                              observers=(PeakGradBytes,), **options, **defaults)
    opt.reset_peak()
    return model, opt


def wrap_zero1(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, variant="reduce_scatter",
               mixed=False, overlap=True, group=None, impl=None):
    """``"zero1"``: the model and a Zero1 over ``make_optimizer``'s class, groups and hyperparameters
    (``impl``: a class of ``MyZero1``'s shape instead, ``impl(groups, optimizer_class, **defaults)``)."""
    return _wrap_zero(model, make_optimizer, 1, group, bucket_bytes, impl, variant=variant, mixed=mixed,
                      overlap=overlap)


def wrap_zero2(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, mixed=False, overlap=True,
               group=None, impl=None):
    """``"zero2"``: the model itself and a :class:`~course_utils.impl.zero.Zero2` (``impl``: a class of
    ``MyZero2``'s shape instead, ``impl(groups, optimizer_class, bucket_bytes, **defaults)``)."""
    return _wrap_zero(model, make_optimizer, 2, group, bucket_bytes, impl, mixed=mixed, overlap=overlap)


def wrap_torch_zero1(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True, group=None):
    """``"torch-zero1"``: ZeroRedundancyOptimizer over the gradients ``"ddp"`` averages."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = ddp.DataParallel(model, bucket_bytes, overlap=overlap, group=group)
    groups, cls, defaults = real_optimizer(model.module, make_optimizer)
    return model, ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=group, **defaults)
