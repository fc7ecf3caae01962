"""ZeRO stages 1 and 2 written from scratch, next to PyTorch's ``ZeroRedundancyOptimizer``.

Taught in ``notebooks/04_zero1.ipynb`` (ZeRO-1: optimizer-state sharding) and
``notebooks/05_zero2.ipynb`` (ZeRO-2: gradient sharding during backward).

Three strategies of :mod:`course_utils.harness.strategies` use it:

``"zero1"``
    Every rank keeps the full parameters and the full gradients, but the optimizer
    (AdamW's m and v, and its step counter) only for its own 1/N shard.
``"zero2"``
    Like ``"zero1"``, but gradients are reduce-scattered *during* backward, bucket by
    bucket, and each full ``.grad`` is freed as soon as its bucket is sent: a rank only
    keeps the gradient of its own shard.
``"torch-zero1"``
    ``torch.distributed.optim.ZeroRedundancyOptimizer`` (AdamW inside) with the
    gradient all-reduce of ``"ddp"``.

The training loop is torch's own; a ``ZeroOptimizer`` is a ``torch.optim.Optimizer``
(built like ``ZeroRedundancyOptimizer``: parameters or groups, the optimizer class, its
hyperparameters), so LR schedulers, parameter groups and clipping work::

    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)
    loss = model(x, y); loss.backward()
    experiments.clip_grad_norm_(model, 1.0)      # global norm, over every rank's shard
    opt.step(); scheduler.step(); opt.zero_grad()

**Layout.** Trainable parameters (a tied Parameter once, frozen ones left out) are
grouped into buckets of about ``bucket_bytes`` in reverse registration order, as in
:class:`~course_utils.impl.ddp.DataParallel`. Each bucket of Ψ_b elements lives in
one flat buffer padded with zeros to P_b = ceil(Ψ_b/N)·N elements, and the model's
parameters become *views* of that buffer (so an all-gather into the buffer updates the
model, no copy). Rank r owns the contiguous slice ``[r·P_b/N, (r+1)·P_b/N)`` of every
bucket (:func:`shard_bounds`). A bucket never mixes two parameter groups. The real
optimizer (``optimizer_class``) is built over one *shard parameter* per bucket, a view of
the rank's slice, in the group of the bucket's parameters: its states are 1/N.

**One step of ZeRO-1** (:meth:`ZeroOptimizer.step`), per bucket:

1. the gradients, which backward accumulated into a flat gradient buffer (``.grad`` of
   every parameter is a view of it), are reduce-scattered (SUM): rank r receives the
   sum of slice r only, written in place into its own slice; then divided by N;
2. the inner optimizer steps the shard parameter (that slice only);
3. every rank all-gathers the updated slices into the flat parameter buffer.

``variant="allreduce"`` replaces step 1 by an all-reduce of the whole buffer and keeps
only the own slice: same result, twice the bytes for the gradient part.

**ZeRO-2** does step 1 during backward: when every gradient of the next bucket is
ready, the bucket is copied into a message, the full ``.grad`` tensors are freed
(set to None), and an asynchronous reduce-scatter starts; its result is *added* into a
shard-gradient buffer of P_b/N elements. The first hook of a backward queues a callback
that autograd runs when that backward ends (:meth:`ZeroOptimizer._end_backward`): it
sends the buckets still waiting (a parameter this rank did not use: zeros), waits for
every reduce-scatter and resets the per-backward bookkeeping, so when ``backward()``
returns a rank holds only its shard gradients. :attr:`ZeroOptimizer.peak_grad_bytes`
records the most gradient bytes this rank held at any moment (full ``.grad`` tensors
alive + messages in flight + shard gradients).

**Gradient accumulation** (k backwards, then one ``step()``). ZeRO-1 adds every
backward's gradients into its flat gradient buffers and reduces once, in ``step()``.
ZeRO-2 works as DeepSpeed's does: every micro-batch's backward reduce-scatters every bucket and adds the result
into the shard gradients (the sum over micro-batches and ranks); ``step()`` divides by N
once. So a rank never holds more than its shard between micro-batches, and pays k
reduce-scatters per bucket per step where DDP's ``no_sync`` pays one all-reduce but
keeps full gradients (:mod:`course_utils.labs.accumulation` measures both). With
``overlap=False`` the hooks send nothing: full gradients accumulate in ``.grad`` as in
DDP's ``no_sync`` and ``step()`` reduce-scatters them once.

**Bytes held** (fp32, B buckets, P = Σ P_b the padded numel; :func:`zero_state_bytes`):
params 4·P (the flat buffers: Ψ plus at most N-1 zeros per bucket); grads 4·P in
ZeRO-1 (the flat gradient buffers), 4·P/N in ZeRO-2 (the shard gradients only);
optimizer 8·P/N (m and v of the shard) + 4·B (AdamW keeps its step counter as a
4-byte float32 tensor per parameter it updates, and it updates one shard parameter per
bucket). That is ``model_states(P, world_size=N, stage=s, recipe="fp32")`` + 4·B
(:func:`expected_state_bytes`). With ``mixed=True`` the model is bf16 (2·P params and
grads in ZeRO-1, 2·P/N grads in ZeRO-2) and the optimizer holds an fp32 master copy
of the shard: 12·P/N + 4·B, the paper's K = 12.

**Bytes sent** per step, per rank: a reduce-scatter and an all-gather of every bucket,
(N-1)/N·4·P_b each, which is DDP's all-reduce 2·(N-1)/N·4·Ψ exactly when every Ψ_b
divides by N, and more by the padding otherwise (:func:`expected_comm_bytes`). ZeRO-2
with k micro-batches per step sends k reduce-scatters per bucket (``micro_batches=k``).

Clipping: ``experiments.clip_grad_norm_(model, max_norm)`` between ``backward()`` and
``step()`` reduces the gradients then (instead of in ``step()``) and clips the averaged
shards by their global norm (:meth:`ZeroOptimizer.clip_grad_norm_`). torch's own
``clip_grad_norm_(model.parameters(), ...)`` cannot: it would see un-averaged (ZeRO-1)
or no (ZeRO-2) gradients.

Clip after the *last* backward of a step: a backward after ``clip_grad_norm_`` and before
``step()`` is a ``RuntimeError`` (its gradients would miss the clipped, averaged shards).

Not covered (on purpose, to keep the code readable): consolidating the sharded optimizer
state into one checkpoint (``state_dict`` is this rank's shard).
"""
from __future__ import annotations

import dataclasses
import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_int, require_process_group
from ..runtime.compat import all_gather_into_tensor, queue_backward_callback, reduce_scatter_tensor
from ..theory.comm import collective_bytes
from .common import (DEFAULT_BUCKET_BYTES, broadcast_from_rank0, check_bucket_bytes, clip_sharded_,
                     flatten_and_pad, mark_grad_ready, padded_numel, real_optimizer, register_grad_owner,
                     shard_bounds, storage_bytes)
from .ddp import DataParallel, unwrap

__all__ = ["padded_numel", "shard_bounds", "flatten_and_pad", "ZeroBucket", "ZeroOptimizer",
           "zero_state_bytes", "zero_extras", "expected_state_bytes", "expected_comm_bytes",
           "wrap_zero1", "wrap_zero2", "wrap_torch_zero1", "real_optimizer", "torch_zero1_state_bytes", "VARIANTS",
           "STEP_COUNTER_BYTES"]

#: How ZeRO-1 reduces the gradients: a reduce-scatter, or an all-reduce then keep a slice.
VARIANTS = ("reduce_scatter", "allreduce")
#: Bytes of AdamW's ``state["step"]``: a 0-dim float32 tensor per parameter it updates.
STEP_COUNTER_BYTES = 4


# ====================================================================== the optimizer

@dataclasses.dataclass
class ZeroBucket:
    """One flat, padded group of parameters and this rank's shard of it.

    numel: Ψ_b, the parameters' elements; padded: P_b; lo, hi: this rank's slice.
    flat_params: P_b elements, the parameters are views of it. flat_grads: ZeRO-1 only,
    P_b elements, every ``.grad`` is a view of it. shard: the Parameter the inner
    optimizer updates (a view of ``flat_params[lo:hi]``, or an fp32 master copy when
    mixed). shard_grad: the averaged gradient of the shard (a view of ``flat_grads`` in
    ZeRO-1, its own P_b/N buffer in ZeRO-2).
    """

    params: list
    offsets: list
    numel: int
    padded: int
    lo: int
    hi: int
    flat_params: torch.Tensor
    flat_grads: torch.Tensor | None
    shard: nn.Parameter
    shard_grad: torch.Tensor
    ready: set = dataclasses.field(default_factory=set)   # ZeRO-2: grads in, this backward
    message: torch.Tensor | None = None      # ZeRO-2: the full gradients in flight
    work: object = None

    @property
    def shard_numel(self) -> int:
        return self.hi - self.lo


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO-1 (``stage=1``) or ZeRO-2 (``stage=2``): a ``torch.optim.Optimizer`` built like
    ``torch.distributed.optim.ZeroRedundancyOptimizer``::

        opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.01)
        opt = ZeroOptimizer([{"params": matrices, "weight_decay": 0.1},
                             {"params": vectors, "weight_decay": 0.0}], torch.optim.AdamW, lr=1e-3)

    Args:
        params: parameters or parameter groups (dicts), as for any torch optimizer; every
            rank passes the same ones in the same order. They are broadcast from rank 0,
            then become views of flat buffers. A bucket never mixes two groups.
        optimizer_class: the real optimizer (e.g. ``torch.optim.AdamW``), built once over
            this rank's shard parameters (one per bucket) with each group's hyperparameters.
        stage: 1 or 2.
        bucket_bytes: bucket size (None: 25 MiB as torch DDP; 0: one bucket per parameter).
        variant: ZeRO-1's gradient reduction, ``"reduce_scatter"`` or ``"allreduce"``.
        mixed: bf16 parameters and gradients in the model, fp32 master shard in the optimizer.
        overlap: ZeRO-2 only; False sends nothing during backward: full gradients stay
            (and accumulate) in ``.grad`` until ``step()`` reduce-scatters them.
        group: the process group (default: all ranks).
        **defaults: the real optimizer's hyperparameters (``lr=...``, ``weight_decay=...``).

    ``param_groups`` are your groups (with your parameters): an LR scheduler or your code
    changes ``lr`` there, and ``step()`` copies every group's hyperparameters into the
    real optimizer (``.inner``), whose ``state`` holds the shards' states.
    ``clip_grad_norm_`` of :mod:`course_utils.harness.experiments` asks
    :meth:`clip_grad_norm_` to clip by the global norm of the averaged shards.
    """

    def __init__(self, params, optimizer_class, *, stage: int = 1,
                 bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, variant: str = "reduce_scatter",
                 mixed: bool = False, overlap: bool = True, group=None, **defaults):
        require_process_group("ZeroOptimizer")
        if isinstance(params, nn.Module):
            raise TypeError("ZeroOptimizer takes parameters, like torch's optimizers: pass "
                            "model.parameters() (or parameter groups), not the model")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError("optimizer_class must be a torch.optim.Optimizer class such as "
                            f"torch.optim.AdamW (the class itself), got {optimizer_class!r}")
        if stage not in (1, 2) or isinstance(stage, bool):
            raise ValueError(f"stage must be 1 or 2 (ZeRO-3 is course_utils.impl.zero3), got {stage!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if variant == "allreduce" and stage != 1:
            raise ValueError("variant='allreduce' is ZeRO-1's comparison; ZeRO-2 reduce-scatters")
        check_bucket_bytes(bucket_bytes)
        self._laying_out = True                  # the base class adds the groups once, here
        super().__init__(params, defaults)
        self._laying_out = False
        self.stage, self.variant = stage, variant
        self.mixed, self.overlap, self.group = bool(mixed), bool(overlap), group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        every = [p for g in self.param_groups for p in g["params"]]
        broadcast_from_rank0(every, self.group)
        self.params = [p for p in every if p.requires_grad]
        if not self.params:
            raise ValueError("no trainable parameters (every one has requires_grad=False)")
        self.buckets, inner_groups, self._pairs = [], [], []
        for index, g in enumerate(self.param_groups):
            trained = [p for p in g["params"] if p.requires_grad]
            if not trained:
                continue
            made = [self._make_bucket(b.params) for b in DataParallel._make_buckets(trained, bucket_bytes)]
            self.buckets += made
            inner_groups.append({**self._hyper(g), "params": [b.shard for b in made]})
            self._pairs.append(index)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        self.inner = optimizer_class(inner_groups, **defaults)
        # ZeRO-2 bookkeeping: the next bucket to send (per backward), and gradient bytes held
        self._next = 0
        self._callback_queued = False
        self._reduced = False                    # reduce_gradients ran since the last step
        self._live: dict[int, int] = {}          # id(param) -> bytes of its full .grad, still held
        self.peak_grad_bytes = self.grad_bytes_now()
        self._hooks = []
        if stage == 2:
            self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                           for p in self.params]
        register_grad_owner(self.params, self)

    @staticmethod
    def _hyper(group: dict) -> dict:
        return {k: v for k, v in group.items() if k != "params"}

    def add_param_group(self, param_group: dict) -> None:
        if not getattr(self, "_laying_out", False):
            raise NotImplementedError("ZeroOptimizer lays out its flat buffers once: pass every "
                                      "parameter group to the constructor")
        super().add_param_group(param_group)

    def _sync_hyperparameters(self) -> None:
        """Copy ``lr``, ``weight_decay``... of each of your groups into the real optimizer's."""
        for inner, index in zip(self.inner.param_groups, self._pairs):
            inner.update(self._hyper(self.param_groups[index]))

    # -- flat buffers, views, shard
    @torch.no_grad()
    def _make_bucket(self, params) -> ZeroBucket:
        n = self.world_size
        offsets, numel = [], 0
        for p in params:
            offsets.append(numel)
            numel += p.numel()
        flat32 = flatten_and_pad([p.detach() for p in params], n, dtype=torch.float32)
        lo, hi = shard_bounds(numel, n, self.rank)
        dtype = torch.bfloat16 if self.mixed else params[0].dtype
        flat_params = flat32.to(dtype) if dtype != flat32.dtype else flat32
        for p, off in zip(params, offsets):          # the model now reads the flat buffer
            p.data = flat_params[off:off + p.numel()].view_as(p)
        flat_grads = None
        if self.stage == 1:
            flat_grads = torch.zeros_like(flat_params)
            for p, off in zip(params, offsets):
                p.grad = flat_grads[off:off + p.numel()].view_as(p)
            shard_grad = flat_grads[lo:hi]
        else:
            shard_grad = torch.zeros(hi - lo, dtype=dtype, device=flat_params.device)
        if self.mixed:      # fp32 master copy of the shard, taken before rounding to bf16
            shard = nn.Parameter(flat32[lo:hi].clone())
        else:               # a view: the optimizer updates the flat buffer in place
            shard = nn.Parameter(flat_params[lo:hi])
            shard.grad = shard_grad
        return ZeroBucket(list(params), offsets, numel, flat_params.numel(), lo, hi,
                          flat_params, flat_grads, shard, shard_grad)

    # -- ZeRO-2: during backward
    def _grad_ready(self, p: nn.Parameter) -> None:
        if self._reduced:
            raise RuntimeError("ZeRO-2: a backward after the gradients were reduced "
                               "(clip_grad_norm_) and before optimizer.step(); clip after the "
                               "last backward of the step")
        self._live[id(p)] = p.grad.numel() * p.grad.element_size()
        self._note_peak()
        if not self.overlap:                     # full gradients accumulate; step() sends them
            return
        if not self._callback_queued:            # finish this backward's buckets when it ends
            queue_backward_callback(self._end_backward)
            self._callback_queued = True
        mark_grad_ready(self.buckets[self._bucket_of[id(p)]], p,
                        "ZeRO-2: a gradient arrived twice in one backward (a parameter used by "
                        "two autograd graphs?); ZeroOptimizer reduce-scatters each once per backward")
        while self._next < len(self.buckets) and \
                len(self.buckets[self._next].ready) == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next])
            self._next += 1

    @torch.no_grad()
    def _end_backward(self) -> None:
        """Autograd runs this when a backward ends: send the buckets not sent yet, wait for
        every reduce-scatter (each added into its shard gradient), reset for the next
        backward. Gradient accumulation: the next micro-batch adds to the same shards."""
        self._callback_queued = False
        self._flush()

    def _flush(self) -> None:
        for b in self.buckets[self._next:]:     # a gradient this rank did not produce: zeros
            self._launch(b)
        for b in self.buckets:
            if b.work is not None:
                self._finish(b)
            b.ready.clear()
        self._next = 0

    @torch.no_grad()
    def _launch(self, bucket: ZeroBucket) -> None:
        """Copy the bucket's gradients into one message, free them, start the reduce-scatter."""
        for earlier in self.buckets:                 # at most one message in flight
            if earlier.work is not None:
                self._finish(earlier)
        message = torch.zeros(bucket.padded, dtype=bucket.flat_params.dtype,
                              device=bucket.flat_params.device)
        for p, off in zip(bucket.params, bucket.offsets):
            if p.grad is not None:               # unused on this rank: zeros
                message[off:off + p.numel()].copy_(p.grad.reshape(-1))
            p.grad = None                        # the full gradient is gone
            self._live.pop(id(p), None)
        bucket.message = message
        self._note_peak()
        # in place: rank r's slice of the message receives the sum of everyone's slice r
        bucket.work = reduce_scatter_tensor(message[bucket.lo:bucket.hi], message,
                                            op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _finish(self, bucket: ZeroBucket) -> None:
        bucket.work.wait()
        bucket.shard_grad.add_(bucket.message[bucket.lo:bucket.hi])
        bucket.message, bucket.work = None, None
        self._note_peak()

    # -- gradient memory
    def grad_bytes_now(self) -> int:
        """Gradient bytes this rank holds now: ZeRO-1 the flat gradient buffers; ZeRO-2 the
        full ``.grad`` tensors not sent yet + messages in flight + the shard gradients."""
        if self.stage == 1:
            return sum(b.flat_grads.numel() * b.flat_grads.element_size() for b in self.buckets)
        held = sum(self._live.values())
        for b in self.buckets:
            held += b.shard_grad.numel() * b.shard_grad.element_size()
            if b.message is not None:
                held += b.message.numel() * b.message.element_size()
        return held

    def _note_peak(self) -> None:
        self.peak_grad_bytes = max(self.peak_grad_bytes, self.grad_bytes_now())

    def reset_peak(self) -> None:
        """Start measuring :attr:`peak_grad_bytes` afresh."""
        self.peak_grad_bytes = self.grad_bytes_now()

    # -- ZeRO-1: gradients into the flat buffer (robust to model.zero_grad() etc.)
    @torch.no_grad()
    def _gather_local_grads(self, bucket: ZeroBucket) -> None:
        for p, off in zip(bucket.params, bucket.offsets):
            view = bucket.flat_grads[off:off + p.numel()].view_as(p)
            if p.grad is None:
                view.zero_()                     # unused, or grads set to None: zeros
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view

    # -- the step
    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Leave the averaged gradient of this rank's shard in every ``bucket.shard_grad``.
        Runs once per step (``step()`` or :meth:`clip_grad_norm_`, whichever comes first);
        afterwards only this rank's shard of the ZeRO-1 gradient buffer is meaningful."""
        if self._reduced:
            return
        self._reduced = True
        n = self.world_size
        if self.stage == 1:
            works = []
            for b in self.buckets:
                self._gather_local_grads(b)
                if self.variant == "allreduce":    # everyone gets everything, keeps a slice
                    works.append(dist.all_reduce(b.flat_grads, op=dist.ReduceOp.SUM,
                                                 group=self.group, async_op=True))
                else:                              # everyone gets only its slice
                    works.append(reduce_scatter_tensor(b.flat_grads[b.lo:b.hi], b.flat_grads,
                                                       op=dist.ReduceOp.SUM, group=self.group,
                                                       async_op=True))
            for w in works:
                w.wait()
        else:
            if not self.overlap:                   # the hooks sent nothing: send it all now
                self._flush()
            for p in self.params:                  # no full gradient survives a ZeRO-2 step
                p.grad = None
            self._live.clear()
        for b in self.buckets:
            b.shard_grad.div_(n)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Reduce the gradients (if ``step()`` has not yet), then clip the averaged shards
        to a global norm of ``max_norm`` as ``torch.nn.utils.clip_grad_norm_`` clips one
        process's gradients. Returns the global norm before clipping (a collective)."""
        self.reduce_gradients()
        return clip_sharded_([b.shard_grad for b in self.buckets], max_norm, norm_type, self.group)

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce the gradients, step the real optimizer on the shard, all-gather the shards."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._sync_hyperparameters()
        if self.mixed:
            for b in self.buckets:                 # fp32 gradient of the master, for the step only
                b.shard.grad = b.shard_grad.float()
        self.inner.step()
        works = []
        for b in self.buckets:
            if self.mixed:
                b.shard.grad = None
                b.flat_params[b.lo:b.hi].copy_(b.shard)   # round the master to bf16
            # in place: rank r's slice is the input, the whole buffer the output
            works.append(all_gather_into_tensor(b.flat_params, b.flat_params[b.lo:b.hi],
                                                group=self.group, async_op=True))
        for w in works:
            w.wait()
        self._reduced = False
        return loss

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradient buffers. ZeRO-1 keeps ``.grad`` as (zeroed) views of its flat
        buffers whatever ``set_to_none`` says, as torch DDP's ``gradient_as_bucket_view``;
        ZeRO-2's full gradients are None after every step already. Frozen parameters in
        the groups follow ``set_to_none`` as in any torch optimizer."""
        self._reduced = False
        for b in self.buckets:
            if self.stage == 1:
                b.flat_grads.zero_()
                for p, off in zip(b.params, b.offsets):
                    p.grad = b.flat_grads[off:off + p.numel()].view_as(p)
            else:
                b.shard_grad.zero_()
        if self.stage == 2:
            for p in self.params:
                p.grad = None
            self._live.clear()
        for g in self.param_groups:
            for p in g["params"]:
                if not p.requires_grad and p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    # -- checkpoints: this rank's shard
    def _layout(self) -> list:
        return [(b.numel, b.padded) for b in self.buckets]

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state: the real optimizer's state dict over
        the shards, your groups' hyperparameters, and the layout it fits (world size,
        rank, buckets). Load it on the same rank of the same layout."""
        self._sync_hyperparameters()
        return {"inner": self.inner.state_dict(), "world_size": self.world_size, "rank": self.rank,
                "buckets": self._layout(), "param_groups": [self._hyper(g) for g in self.param_groups]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what :meth:`state_dict` of the same rank returned (a ``ValueError`` for
        another world size, rank or bucket layout)."""
        if not isinstance(state_dict, dict) or "inner" not in state_dict:
            raise TypeError("load_state_dict takes what ZeroOptimizer.state_dict() returned")
        mine = {"world_size": self.world_size, "rank": self.rank, "buckets": self._layout()}
        theirs = {k: state_dict.get(k) for k in mine}
        theirs["buckets"] = [tuple(b) for b in theirs["buckets"] or []]
        if theirs != mine:
            raise ValueError(f"this state dict is the shard of another layout ({theirs}); this "
                             f"optimizer is {mine}: load each rank's own shard, same world size and buckets")
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        self.inner.load_state_dict(state_dict["inner"])
        self._sync_hyperparameters()

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __repr__(self) -> str:
        sizes = [(b.numel, b.padded) for b in self.buckets]
        return (f"ZeroOptimizer(stage={self.stage}, world_size={self.world_size}, "
                f"groups={len(self.param_groups)}, "
                f"variant={self.variant!r}, mixed={self.mixed}, buckets (numel, padded)={sizes}, "
                f"inner={type(self.inner).__name__})")


# ======================================================================== measuring

def zero_state_bytes(model: nn.Module, optimizer: ZeroOptimizer) -> dict:
    """Bytes this rank holds, each storage once: params (the flat buffers and any frozen
    parameters), grads (ZeRO-1: the flat gradient buffers; ZeRO-2: the shard gradients,
    the full ones were freed), optimizer (the inner optimizer's states of the shard, its
    step counters, and the fp32 master shard when mixed)."""
    seen: set = set()
    params = list(unwrap(model).parameters())
    out = {"params": storage_bytes(params, seen)}
    grads = [p.grad for p in params]
    if optimizer.stage == 2:
        grads += [b.shard_grad for b in optimizer.buckets]
    out["grads"] = storage_bytes(grads, seen)
    state = [v for s in optimizer.inner.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    if optimizer.mixed:
        state += [b.shard for b in optimizer.buckets]
    out["optimizer"] = storage_bytes(state, seen)
    return out


def expected_state_bytes(bucket_numels, world_size: int, stage: int, *, mixed: bool = False,
                         frozen_bytes: int = 0) -> dict:
    """The bytes :func:`zero_state_bytes` must find, from the buckets' sizes Ψ_b.

    ``model_states(P, world_size=N, stage=stage, recipe)`` with P = Σ padded_numel(Ψ_b, N),
    plus one 4-byte AdamW step counter per bucket, plus frozen parameters' bytes.
    """
    from ..theory.memory import model_states

    padded = sum(padded_numel(k, world_size) for k in bucket_numels)
    ms = model_states(padded, world_size=world_size, stage=stage,
                      recipe="mixed" if mixed else "fp32")
    return {"params": int(ms.params) + frozen_bytes, "grads": int(ms.grads),
            "optimizer": int(ms.optimizer) + STEP_COUNTER_BYTES * len(bucket_numels)}


def expected_comm_bytes(bucket_numels, world_size: int, steps: int = 1, *,
                        variant: str = "reduce_scatter", bytes_per_elem: int = 4,
                        micro_batches: int = 1) -> dict:
    """Bytes one rank sends over ``steps`` steps: per bucket one reduce-scatter (or, for
    ``variant="allreduce"``, an all-reduce) and one all-gather of P_b elements. ZeRO-2
    with gradient accumulation reduce-scatters every bucket once per micro-batch:
    ``micro_batches`` reduce-scatters per bucket per step, still one all-gather."""
    check_int("micro_batches", micro_batches, 1)
    if variant == "allreduce" and micro_batches != 1:
        raise ValueError("variant='allreduce' is ZeRO-1's, which reduces once per step whatever "
                         "the micro-batches: leave micro_batches=1")
    out = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    grad_op = "all_reduce" if variant == "allreduce" else "reduce_scatter"
    for k in bucket_numels:
        m = padded_numel(k, world_size) * bytes_per_elem
        out[grad_op] += steps * micro_batches * collective_bytes(grad_op, m, world_size)
        out["all_gather"] += steps * collective_bytes("all_gather", m, world_size)
    return {k: int(v) if float(v).is_integer() else v for k, v in out.items()}


# ====================================================================== strategies

def _wrap_zero(model, make_optimizer, stage, group, **options):
    frozen = [p for p in model.parameters() if not p.requires_grad]
    broadcast_from_rank0(frozen + list(model.buffers()), group)   # the trained ones: ZeroOptimizer
    groups, cls, defaults = real_optimizer(model, make_optimizer)
    return model, ZeroOptimizer(groups, cls, stage=stage, group=group, **options, **defaults)


def wrap_zero1(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, variant="reduce_scatter",
               mixed=False, overlap=True, group=None):
    """The ``"zero1"`` strategy: the model itself and a :class:`ZeroOptimizer` of stage 1
    with the class, parameter groups and hyperparameters of ``make_optimizer``'s optimizer."""
    return _wrap_zero(model, make_optimizer, 1, group, bucket_bytes=bucket_bytes, variant=variant,
                      mixed=mixed, overlap=overlap)


def wrap_zero2(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, mixed=False, overlap=True,
               group=None):
    """The ``"zero2"`` strategy: the model itself and a :class:`ZeroOptimizer` of stage 2."""
    return _wrap_zero(model, make_optimizer, 2, group, bucket_bytes=bucket_bytes, mixed=mixed,
                      overlap=overlap)


def zero_extras(model, optimizer) -> dict:
    """What a run reports besides the common fields: the buckets' sizes Ψ_b."""
    return {"bucket_numels": [b.numel for b in optimizer.buckets]}


def wrap_torch_zero1(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True,
                     group=None):
    """torch's ZeroRedundancyOptimizer (whole parameters assigned to ranks, each rank
    steps its own and broadcasts them) over the gradients ``"ddp"`` averages in backward."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = DataParallel(model, bucket_bytes=bucket_bytes, overlap=overlap, group=group)
    groups, cls, defaults = real_optimizer(model, make_optimizer)
    return ddp, ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=group, **defaults)


def torch_zero1_state_bytes(model, optimizer) -> dict:
    """Bytes this rank holds under ``"torch-zero1"``: full parameters and gradients, and
    the states of the optimizer over the parameters this rank owns."""
    seen: set = set()
    params = list(unwrap(model).parameters())
    out = {"params": storage_bytes(params, seen), "grads": storage_bytes([p.grad for p in params], seen)}
    local = optimizer.optim                # the optimizer over this rank's parameters
    out["optimizer"] = storage_bytes([v for s in local.state.values() for v in s.values()
                                      if isinstance(v, torch.Tensor)], seen)
    return out
