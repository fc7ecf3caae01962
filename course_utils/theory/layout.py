"""How a sharded model is laid out: flat padded buffers (the course's ZeRO) and per-parameter
dim-0 shards (PyTorch FSDP2), as arithmetic.

Taught in ``notebooks/04_zero1.ipynb`` (flat buffers) and ``notebooks/07_fsdp.ipynb``
(FSDP2's layout).
"""
from __future__ import annotations

import math

from ..checks import check_int

__all__ = ["padded_numel", "shard_bounds", "dim0_padded_numel", "local_rows"]


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size``: ceil(numel/N)·N, the length of
    a flat buffer that splits into N equal shards.

    >>> padded_numel(10, 4), padded_numel(12, 4)
    (12, 12)
    """
    check_int("numel", numel, 0)
    check_int("world_size", world_size, 1)
    return math.ceil(numel / world_size) * world_size


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank's shard in a flat buffer of ``numel`` elements padded to
    :func:`padded_numel`: every shard has the same size P/N, the last one ends in padding.

    >>> [shard_bounds(10, 4, r) for r in range(4)]
    [(0, 3), (3, 6), (6, 9), (9, 12)]
    """
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    size = padded_numel(numel, world_size) // world_size
    return rank * size, (rank + 1) * size


def dim0_padded_numel(shape, world_size: int) -> int:
    """Elements FSDP2 communicates for one parameter of ``shape``: dim 0 padded to a
    multiple of ``world_size`` (a 0-d parameter counts as one row)."""
    shape = tuple(shape) or (1,)
    return math.ceil(shape[0] / world_size) * world_size * math.prod(shape[1:])


def local_rows(d0: int, world_size: int, rank: int) -> int:
    """Rows of a ``d0``-row parameter that rank ``rank`` really owns (``torch.chunk`` split)."""
    c = math.ceil(d0 / world_size)
    return max(0, min(c, d0 - rank * c))
