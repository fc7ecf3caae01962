"""Exercises of ``notebooks/05_zero2.ipynb``: a reduce-scatter bucket, then ZeRO-2 (nb04's rank side)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ...harness.grading import Verdict, compare, grade_build, judge_on_ranks, refuse_non_function
from ...impl.common import DEFAULT_BUCKET_BYTES
from ...theory.layout import padded_numel, shard_bounds
from .nb04 import params_right, zero_on_rank

__all__ = ["check_zero2", "check_reduce_scatter_bucket", "ZERO2_BUCKETS"]


_BUCKETS = ((3, 4), (5,))


def _bucket_grad(rank: int, sizes: tuple):
    return torch.cat([torch.arange(k, dtype=torch.float32) + 10.0 * (rank + 1) + i for i, k in enumerate(sizes)])


def _bucket_rank(fn):
    out = []
    for sizes in _BUCKETS:
        params = [torch.nn.Parameter(torch.zeros(k)) for k in sizes]
        for p, g in zip(params, _bucket_grad(dist.get_rank(), sizes).split(sizes)):
            p.grad = g.clone()
        out.append((fn(params), [p.grad is None for p in params]))
    return out


def _judge_bucket(per, rank, n):
    for (shard, freed), sizes in zip(per, _BUCKETS):
        numel = sum(sizes)
        flat = torch.zeros(padded_numel(numel, n))
        flat[:numel] = sum(_bucket_grad(r, sizes) for r in range(n)) / n
        lo, hi = shard_bounds(numel, n, rank)
        if why := compare(shard, flat[lo:hi]) or (
                "" if all(freed) else "the full gradients were not freed (set p.grad = None)"):
            return f"bucket {list(sizes)}: {why}", ""
    return "", "buckets [3, 4] and [5] sharded, averaged, freed"


def check_reduce_scatter_bucket(fn: Callable) -> Verdict:
    """Exercise 05.1: ``fn(params)`` -> this rank's shard of the averaged bucket; frees ``p.grad``."""
    name = "reduce_scatter_bucket"
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    return judge_on_ranks(_bucket_rank, _judge_bucket, world_sizes=(2, 3, 4), name=name, args=(fn,), timeout_s=20)


# ------------------------------------------------------------ exercise 05.2: build ZeRO-2
#: The bucket sizes the ZeRO-2 grader tries: one bucket per parameter, and 25 MiB.
ZERO2_BUCKETS = (0, DEFAULT_BUCKET_BYTES)


def _zero2_right(values) -> str:
    per = values[0]
    calls = [seen["rs_in_backward"] for _, seen in per]
    last = per[-1][1]                     # 25 MiB: one bucket per group
    return (f"reduce-scatters during backward {calls} (per parameter, 25 MiB), full gradients freed, "
            f"shard gradients 4·P/N = {last['grad_bytes']:,} B (ZeRO-1 keeps 4·P = "
            f"{4 * last['padded']:,} B), {params_right(values)}")


def check_zero2(cls) -> Verdict:
    """Exercise 05.2: ``cls(params, optimizer_class, bucket_bytes=..., **defaults)`` is ZeRO-2,
    checked as ``check_zero1`` plus: one reduce-scatter per bucket in backward, no full
    ``.grad`` left, shard gradients of 4·P/N bytes."""
    return grade_build("zero2", "MyZero2", cls, zero_on_rank, ZERO2_BUCKETS, 2, right=_zero2_right)
