"""What the implementations of :mod:`course_utils.impl` share: the same start on every
rank, buckets (the hooks that send them during backward: :mod:`.hooks`), flat padded
buffers and their shards, who holds the gradients (for clipping).
"""
from __future__ import annotations

import inspect
import weakref

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_int
from ..theory.layout import padded_numel

__all__ = ["DEFAULT_BUCKET_BYTES", "broadcast_from_rank0", "trainable", 
           "make_buckets", "flatten_and_pad", "free_storage", "alloc_storage", "storage_bytes", "check_bucket_bytes",
           "WrapsOptimizer", "register_grad_owner", "grad_owners", "clip_sharded_", "real_optimizer"]

#: Gradient bucket size of ``"ddp"``, ``"torch-ddp"`` and ZeRO-1/2: 25 MiB, torch DDP's default.
DEFAULT_BUCKET_BYTES = 25 * 2**20


@torch.no_grad()
def broadcast_from_rank0(module, group=None) -> None:
    """Copy rank 0's parameters and buffers into every rank's ``module`` (in place), so all
    replicas start equal: the first thing DDP, ZeRO and FSDP do. ``module`` may also be
    a list of tensors (e.g. an optimizer's parameters)."""
    src = 0 if group is None else dist.get_global_rank(group, 0)
    tensors = list(module.parameters()) + list(module.buffers()) if isinstance(module, nn.Module) else module
    for t in tensors:
        dist.broadcast(t.data, src=src, group=group)


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """Parameters with requires_grad, a shared (tied) Parameter once."""
    return [p for p in module.parameters() if p.requires_grad]


# ---------------------------------------------------------------- buckets, sent during backward

def make_buckets(params, bucket_bytes=DEFAULT_BUCKET_BYTES) -> list[list[nn.Parameter]]:
    """``params`` in reverse order (roughly the order backward produces their gradients),
    cut into lists: one is closed as soon as it holds ``bucket_bytes`` (None: 25 MiB, torch
    DDP's default; 0: one parameter each) or the next parameter has another dtype."""
    check_bucket_bytes(bucket_bytes)
    limit = DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    buckets, size = [[]], 0
    for p in reversed(list(params)):
        if buckets[-1] and (size >= limit or buckets[-1][0].dtype != p.dtype):
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
    return [b for b in buckets if b]


# ------------------------------------------- flat buffers and shards (their sizes: theory.layout)

def flatten_and_pad(tensors, world_size: int, *, dtype=None) -> torch.Tensor:
    """One 1-D tensor: the tensors flattened in order, then zeros up to :func:`padded_numel`
    (allocated once, at its padded size)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("flatten_and_pad needs at least one tensor")
    numel = sum(t.numel() for t in tensors)
    flat = tensors[0].new_zeros(padded_numel(numel, world_size), dtype=dtype or tensors[0].dtype)
    offset = 0
    for t in tensors:                     # copied into the one buffer: no second, unpadded copy
        flat[offset:offset + t.numel()].copy_(t.reshape(-1))
        offset += t.numel()
    return flat


def free_storage(t: torch.Tensor) -> None:
    """Give ``t``'s memory back; the tensor keeps its shape (and can be refilled)."""
    t.untyped_storage().resize_(0)


def alloc_storage(t: torch.Tensor) -> None:
    """Memory again for a tensor emptied by :func:`free_storage`."""
    t.untyped_storage().resize_(t.numel() * t.element_size())


def storage_bytes(tensors, seen: set) -> int:
    """Bytes of the storages behind ``tensors``, each storage once (``seen`` carries the
    ones already counted across calls); freed (0-byte) storages count nothing."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr(), st.nbytes())
        if st.nbytes() and key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total


def check_bucket_bytes(bucket_bytes) -> None:
    """None (25 MiB) or an int >= 0, as :func:`make_buckets` reads it."""
    if bucket_bytes is not None:
        check_int("bucket_bytes", bucket_bytes, 0, what=f"0: one bucket per parameter; None: torch's "
                                                         f"default, {DEFAULT_BUCKET_BYTES // 2**20} MiB")


class WrapsOptimizer:
    """Base of an optimizer wrapper whose real optimizer is ``self.inner``
    (``harness.precision.MasterWeightsAdamW``): ``param_groups`` (change ``lr`` there) and
    ``state`` are its."""

    inner: torch.optim.Optimizer

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state


def real_optimizer(model: nn.Module, make_optimizer) -> tuple[list, type, dict]:
    """What ``make_optimizer`` asks for, to rebuild it sharded: ``(param_groups, class,
    defaults)`` of ``make_optimizer(trainable parameters)`` (built once and dropped; torch's
    optimizers allocate their states at the first step, so that costs no memory)."""
    real = make_optimizer(trainable(model))
    if not isinstance(real, torch.optim.Optimizer):
        raise TypeError(f"make_optimizer must return a torch.optim.Optimizer for a sharded "
                        f"strategy, got {type(real).__name__}")
    accepted = inspect.signature(type(real).__init__).parameters
    defaults = {k: v for k, v in real.defaults.items() if k in accepted}
    return [dict(g) for g in real.param_groups], type(real), defaults


# ------------------------------------------------------------- who holds the gradients
# A sharded implementation keeps the averaged gradients where torch's clip_grad_norm_
# cannot see them (ZeRO-1/2: shard buffers of the optimizer; ZeRO-3: the unit's shard).
# It registers itself here for its parameters, and harness.experiments.clip_grad_norm_
# asks it to clip: ``owner.clip_grad_norm_(max_norm, norm_type)``.
_OWNER_ATTR = "_course_grad_owner"      # on the Parameter: a weak reference to its owner


def register_grad_owner(params, owner) -> None:
    """Say that ``owner`` (it has ``clip_grad_norm_(max_norm, norm_type)``) holds the
    gradients of ``params``."""
    for p in params:
        setattr(p, _OWNER_ATTR, weakref.ref(owner))


def grad_owners(params) -> list:
    """The distinct live owners registered for any of ``params``, in order of first appearance."""
    out = []
    for p in params:
        ref = getattr(p, _OWNER_ATTR, None)
        owner = ref() if ref is not None else None
        if owner is not None and not any(owner is o for o in out):
            out.append(owner)
    return out


@torch.no_grad()
def clip_sharded_(shards, max_norm: float, norm_type: float = 2.0, group=None) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for gradients sharded over ranks: ``shards`` are
    this rank's pieces (disjoint across ranks, padding zeros allowed); the norm is taken over
    every rank's pieces (a collective), each piece is scaled by ``max_norm / (norm + 1e-6)``
    if that is below 1. Returns the global norm (float32) before clipping."""
    norm_type = float(norm_type)
    shards = [g for g in shards if g is not None]
    device = shards[0].device if shards else torch.device("cpu")
    norms = [torch.linalg.vector_norm(g.float(), norm_type) for g in shards]
    local = torch.linalg.vector_norm(torch.stack(norms), norm_type) if norms else torch.zeros((), device=device)
    if norm_type == float("inf"):
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
        total = local
    else:
        powered = local.double() ** norm_type
        dist.all_reduce(powered, group=group)
        total = (powered ** (1.0 / norm_type)).float()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in shards:
        g.mul_(coef.to(g.dtype))
    return total
