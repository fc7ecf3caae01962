"""How a sharded model is laid out, as arithmetic: flat padded buffers (the course's ZeRO,
``notebooks/04_zero1.ipynb``) and per-parameter dim-0 shards (FSDP2, ``notebooks/07_fsdp.ipynb``).
"""
from __future__ import annotations

import math

from ..checks import check_int

__all__ = ["padded_numel", "shard_bounds", "dim0_padded_numel", "local_rows"]


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size``: a flat buffer of N equal shards."""
    check_int("numel", numel, 0)
    check_int("world_size", world_size, 1)
    return -(-numel // world_size) * world_size      # integer ceil: exact for any size


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank's shard of the padded flat buffer (the last ends in padding)."""
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    size = padded_numel(numel, world_size) // world_size
    return rank * size, (rank + 1) * size


def dim0_padded_numel(shape, world_size: int) -> int:
    """Elements FSDP2 communicates for one parameter: dim 0 padded to a multiple of ``world_size``."""
    shape = tuple(shape) or (1,)
    return padded_numel(shape[0], world_size) * math.prod(shape[1:])


def local_rows(d0: int, world_size: int, rank: int) -> int:
    """Rows of a ``d0``-row parameter that rank ``rank`` really owns (``torch.chunk`` split)."""
    c = padded_numel(d0, world_size) // world_size
    return max(0, min(c, d0 - rank * c))
