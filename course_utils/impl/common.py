"""What every implementation in :mod:`course_utils.impl` shares: the same start on every
rank, the parameters a rank trains, flat padded buffers and their shards, and the bytes
a set of tensors really holds.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..theory.layout import padded_numel, shard_bounds

__all__ = ["DEFAULT_BUCKET_BYTES", "broadcast_from_rank0", "trainable", "padded_numel", "shard_bounds",
           "flatten_and_pad", "mark_grad_ready", "free_storage", "alloc_storage", "storage_bytes", "check_bucket_bytes",
           "WrapsOptimizer"]

#: Gradient bucket size of ``"ddp"``, ``"torch-ddp"`` and ZeRO-1/2: 25 MiB, torch DDP's default.
DEFAULT_BUCKET_BYTES = 25 * 2**20


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module, group=None) -> None:
    """Copy rank 0's parameters and buffers into every rank's ``module`` (in place), so all
    replicas start equal: the first thing DDP, ZeRO and FSDP do."""
    src = 0 if group is None else dist.get_global_rank(group, 0)
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=src, group=group)


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """Parameters with requires_grad, a shared (tied) Parameter once."""
    return [p for p in module.parameters() if p.requires_grad]


# ---------------------------------------------------------------- flat buffers and shards
# (how long a padded flat buffer is and which slice a rank owns: theory.layout)

def flatten_and_pad(tensors, world_size: int, *, dtype=None) -> torch.Tensor:
    """One 1-D tensor: the tensors flattened in order, then zeros up to :func:`padded_numel`."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("flatten_and_pad needs at least one tensor")
    numel = sum(t.numel() for t in tensors)
    dtype = dtype or tensors[0].dtype
    flat = torch.zeros(padded_numel(numel, world_size), dtype=dtype, device=tensors[0].device)
    offset = 0
    for t in tensors:
        flat[offset:offset + t.numel()].copy_(t.reshape(-1))
        offset += t.numel()
    return flat


def mark_grad_ready(bucket, p, second_backward: str) -> None:
    """Note in ``bucket.ready`` that ``p``'s gradient is in; a second one before the
    bucket was sent is an error (message ``second_backward``)."""
    if id(p) in bucket.ready:
        raise RuntimeError(second_backward)
    bucket.ready.add(id(p))


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
    if bucket_bytes is None:
        return
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
        raise ValueError(f"bucket_bytes must be an int >= 0 (0 or None: one bucket per parameter), "
                         f"got {bucket_bytes!r}")


class WrapsOptimizer:
    """Base of the course's optimizer wrappers (``DataParallelOptimizer``,
    ``ZeroOptimizer``, ``MasterWeightsAdamW``): the real optimizer is ``self.inner``, and
    ``param_groups`` (change ``lr`` there) and ``state`` are its."""

    inner: torch.optim.Optimizer

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state
