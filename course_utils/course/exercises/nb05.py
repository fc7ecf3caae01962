"""Exercises of ``notebooks/05_zero2.ipynb``: a reduce-scatter bucket."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, compare, launch_or_report, refuse_non_function, report_ranks

__all__ = ["check_reduce_scatter_bucket"]


def _bucket_rank(fn, sizes):
    """Rank side of :func:`check_reduce_scatter_bucket`."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    params = []
    for i, k in enumerate(sizes):
        p = torch.nn.Parameter(torch.zeros(k))
        p.grad = torch.arange(k, dtype=torch.float32) + 10.0 * (rank + 1) + i
        params.append(p)
    shard = fn(params)
    return shard, [p.grad is None for p in params]


def check_reduce_scatter_bucket(fn: Callable) -> Verdict:
    """Exercise 05.1: ``fn(params)`` -> this rank's shard of the *averaged* gradient of
    the bucket (the ``.grad`` of ``params`` flattened in order, padded with zeros to a
    multiple of the world size), using a reduce-scatter; it must also free every full
    gradient (``p.grad = None``), as ZeRO-2 does. Checked on 2, 3 and 4 ranks with
    buckets of 3 + 4 elements (7: odd) and 5 elements."""
    import torch

    from ...impl.zero import padded_numel, shard_bounds

    name = "reduce_scatter_bucket"
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    all_right = True
    for sizes in ((3, 4), (5,)):
        numel = sum(sizes)
        for n in (2, 3, 4):
            flat = torch.zeros(padded_numel(numel, n))
            for r in range(n):
                flat[:numel] += torch.cat([torch.arange(k, dtype=torch.float32) + 10.0 * (r + 1) + i
                                           for i, k in enumerate(sizes)])
            flat /= n
            values = launch_or_report(_bucket_rank, n, fn, sizes, timeout_s=20)
            if values is None:
                all_right = False
                continue
            findings = []
            for rank, (shard, freed) in enumerate(values):
                lo, hi = shard_bounds(numel, n, rank)
                why = compare(shard, flat[lo:hi])
                if not why and not all(freed):
                    why = "the full gradients were not freed (set p.grad = None)"
                findings.append((why, ""))
            all_right &= report_ranks(f"bucket {list(sizes)} on {n} ranks", findings)
    return Verdict(name, all_right)
