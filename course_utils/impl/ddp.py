"""Data parallelism from scratch: :class:`DataParallel` does what
``torch.nn.parallel.DistributedDataParallel`` does, in Python a learner can read.

Taught in ``notebooks/02_data_parallelism.ipynb``. ``wrap("ddp", model, make_optimizer)``
(:mod:`course_utils.harness.experiments`) returns a :class:`DataParallel` model and the
real optimizer ``make_optimizer`` built: as with torch DDP, the gradients are averaged by
the end of ``backward()``, so clipping, LR schedulers and any optimizer work unchanged.
``wrap("torch-ddp", ...)`` the real DDP, for comparison.
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ..checks import require_process_group
from ..runtime.compat import queue_backward_callback
from ..runtime.ledger import CommLedger
from .common import DEFAULT_BUCKET_BYTES, broadcast_from_rank0, check_bucket_bytes, mark_grad_ready, trainable

__all__ = ["DataParallel", "wrap_ddp", "wrap_torch_ddp", "unwrap"]


@dataclasses.dataclass
class _Bucket:
    """Gradients all-reduced together as one flat message."""

    params: list[nn.Parameter]
    numel: int
    ready: set = dataclasses.field(default_factory=set)   # ids of params whose grad is in
    flat: torch.Tensor | None = None                      # the message, reused every step
    work: object = None                                   # its async work handle, in flight


class DataParallel(nn.Module):
    """Data parallelism from scratch: what ``torch.nn.parallel.DistributedDataParallel`` does.

    1. At construction every parameter and buffer is broadcast from rank 0, so all
       ranks start from the same model.
    2. Trainable parameters are grouped into *buckets* of about ``bucket_bytes``, in
       reverse registration order (roughly the order backward produces gradients).
       ``bucket_bytes=None`` means torch DDP's default, 25 MiB; ``bucket_bytes=0`` one
       bucket per parameter (a bucket is closed as soon as it holds ``bucket_bytes``).
    3. During backward a hook on each parameter marks its gradient ready. When every
       gradient of the next bucket is ready, the bucket is flattened into one tensor and
       an asynchronous all-reduce (SUM) is started: communication *overlaps* with the
       rest of backward. Buckets are launched strictly in order, so every rank issues
       the same collectives in the same order.
    4. The first hook also queues a callback that autograd runs when backward ends:
       :meth:`finish_gradient_sync` launches whatever is left, waits for every
       all-reduce, divides by the world size and copies the averages back into
       ``.grad``. So when ``loss.backward()`` returns, every ``.grad`` is the average
       over ranks, as with torch DDP: ``clip_grad_norm_``, an LR scheduler and any
       optimizer built over ``model.parameters()`` work unchanged.

    Like torch DDP's, the flat bucket buffers are allocated once and kept: one more
    gradient-sized buffer per rank, outside what ``state_bytes`` counts.

    ``overlap=False`` starts no all-reduce during backward: everything is sent in the
    end-of-backward callback (to measure what overlapping buys). Inside :meth:`no_sync`
    (gradient accumulation) the hooks do nothing and the next backward outside it
    all-reduces the accumulated gradients. Two backwards without ``no_sync`` also work
    (as in torch DDP): the second adds the average of its gradients to the first's.

    Frozen parameters (``requires_grad=False``) are broadcast once and never
    communicated again; a tied Parameter (one object used twice) is one entry, so it is
    communicated once. A parameter that got no gradient this step on some rank
    contributes zeros there (every rank still sends every bucket, so the collectives stay
    matched); after the average every rank has a ``.grad`` for it (zeros if no rank used
    it, where torch DDP would leave ``None``).

    Inside :meth:`record_events` the model also writes down, in this process, *when*
    each of those things happens (a gradient hook fires, a bucket is launched, its
    all-reduce completes, backward ends): what notebook 02 draws as a timeline. Off by
    default; recording changes nothing that is computed or sent.
    """

    def __init__(self, module: nn.Module, *, bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
                 overlap: bool = True, group=None):
        super().__init__()
        require_process_group("DataParallel")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.overlap = bool(overlap)
        self._sync_enabled = True
        self._callback_queued = False
        check_bucket_bytes(bucket_bytes)
        self._broadcast_from_rank0()
        self.params = trainable(module)
        self.buckets = self._make_buckets(self.params, bucket_bytes)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        self._next = 0                      # the next bucket to launch
        self.event_log: list | None = None  # a list while record_events() is on
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self.params]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- 1. same start everywhere
    def _broadcast_from_rank0(self) -> None:
        broadcast_from_rank0(self.module, self.group)

    # -- 2. buckets
    @staticmethod
    def _make_buckets(params, bucket_bytes) -> list[_Bucket]:
        if bucket_bytes is None:
            bucket_bytes = DEFAULT_BUCKET_BYTES
        buckets: list[_Bucket] = []
        current: list[nn.Parameter] = []
        size = 0
        for p in reversed(params):
            if current and current[0].dtype != p.dtype:       # one dtype per flat message
                buckets.append(_Bucket(current, sum(q.numel() for q in current)))
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                buckets.append(_Bucket(current, sum(q.numel() for q in current)))
                current, size = [], 0
        if current:
            buckets.append(_Bucket(current, sum(q.numel() for q in current)))
        return buckets

    # -- 3. during backward
    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self._sync_enabled:
            return
        self._log("grad_ready", bucket=self._bucket_of[id(p)])
        if not self._callback_queued:       # average everything when backward ends
            queue_backward_callback(self.finish_gradient_sync)
            self._callback_queued = True
        if not self.overlap:
            return
        mark_grad_ready(self.buckets[self._bucket_of[id(p)]], p,
                        "a gradient arrived twice in one backward (a parameter used by two "
                        "autograd graphs?); DataParallel all-reduces each once per backward")
        while self._next < len(self.buckets) and \
                len(self.buckets[self._next].ready) == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next], during_backward=True)
            self._next += 1

    def _launch(self, bucket: _Bucket, during_backward: bool = False) -> None:
        if bucket.flat is None:         # allocated once, like torch DDP's bucket buffers
            p0 = bucket.params[0]
            bucket.flat = torch.empty(bucket.numel, dtype=p0.dtype, device=p0.device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        torch.cat([g.reshape(-1) for g in grads], out=bucket.flat)
        bucket.work = dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self.group,
                                      async_op=True)
        if self.event_log is not None:
            self._log_launch(bucket, during_backward)

    # -- 4. when backward ends
    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """Launch the buckets not launched yet, wait for all, write averaged grads to
        ``.grad``. Autograd runs it at the end of every backward (outside ``no_sync``)."""
        self._callback_queued = False
        self._log("backward_end")
        for bucket in self.buckets[self._next:]:
            self._launch(bucket)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.flat.div_(self.world_size)
            offset = 0
            for p in bucket.params:
                average = bucket.flat[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = average.clone()
                else:
                    p.grad.copy_(average)
                offset += p.numel()
            bucket.work = None
            bucket.ready.clear()
        self._next = 0
        self._log("synced")

    # -- the event log (notebook 02's timeline); off unless record_events() is on
    @contextmanager
    def record_events(self):
        """Within this block, record when things happen during each backward, in this process.

        Yields the list the events are appended to, in order, each a dict with ``"event"``
        and ``"t"`` (``time.perf_counter()`` seconds):

        - ``"grad_ready"`` (with ``"bucket"``): a parameter's gradient hook fired;
        - ``"launch"`` (``"bucket"``, ``"during_backward"``): a bucket's all-reduce was
          started, from a hook (True) or from the end-of-backward callback (False);
        - ``"done"`` (``"bucket"``): that all-reduce completed (a callback on its future,
          run by the backend's thread; appended when it fires, so possibly out of order);
        - ``"backward_end"``: autograd ran :meth:`finish_gradient_sync`;
        - ``"synced"``: every ``.grad`` holds the average.

        Recording computes and sends exactly what the model does without it.
        """
        log: list = []
        previous, self.event_log = self.event_log, log
        try:
            yield log
        finally:
            self.event_log = previous

    def _log(self, event: str, **fields) -> None:
        if self.event_log is not None:
            self.event_log.append({"event": event, "t": time.perf_counter(), **fields})

    def _log_launch(self, bucket: _Bucket, during_backward: bool) -> None:
        index = next(i for i, b in enumerate(self.buckets) if b is bucket)
        self._log("launch", bucket=index, during_backward=during_backward)
        log = self.event_log
        try:
            future = bucket.work.get_future()
        except (AttributeError, RuntimeError, NotImplementedError):
            return                          # a backend without futures: no completion time

        def done(_fut, log=log, index=index):
            log.append({"event": "done", "t": time.perf_counter(), "bucket": index})
        future.then(done)

    @contextmanager
    def no_sync(self):
        """Gradient accumulation: backwards inside this block start no communication;
        the accumulated gradients are all-reduced by the next ``optimizer.step()``."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the module's parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def extra_repr(self) -> str:
        sizes = [b.numel for b in self.buckets]
        return (f"world_size={self.world_size}, buckets={len(sizes)} (elements {sizes}), "
                f"overlap={self.overlap}")


def wrap_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True,
             group=None):
    """The ``"ddp"`` strategy: ``(DataParallel(model), make_optimizer(its trainable parameters))``;
    the optimizer is the real one (the gradients are averaged when backward ends)."""
    ddp = DataParallel(model, bucket_bytes=bucket_bytes, overlap=overlap, group=group)
    return ddp, make_optimizer(ddp.params)


def wrap_torch_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, group=None):
    from torch.nn.parallel import DistributedDataParallel

    require_process_group("torch-ddp")
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    # None: torch's default (25 MiB); 0: a cap of one byte, one bucket per parameter, as in "ddp"
    cap_mb = None if bucket_bytes is None else max(bucket_bytes, 1) / 2**20
    ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=group,
                                  bucket_cap_mb=cap_mb)
    # DDP's default averaging, but issued from Python, so a CommLedger sees each bucket.
    CommLedger.attach_ddp(ddp)
    return ddp, make_optimizer(trainable(model))


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a wrapper (torch DDP's or :class:`DataParallel`'s ``.module``)."""
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, (DataParallel, DistributedDataParallel)):
        model = model.module
    return model
