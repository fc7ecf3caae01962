"""Exercises of ``notebooks/04_zero1.ipynb``: shard bounds and a ZeRO-1 step."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, grade_cases, launch_or_report, refuse_non_function, report_ranks
from ...runtime.fmt import show as _show

__all__ = ["check_shard_bounds", "check_zero1_step"]


_SHARD_CASES = [dict(numel=12, world_size=4, rank=0), dict(numel=10, world_size=4, rank=3),
                dict(numel=10, world_size=4, rank=1), dict(numel=7, world_size=3, rank=2),
                dict(numel=129350, world_size=3, rank=1), dict(numel=5, world_size=8, rank=7),
                dict(numel=1, world_size=1, rank=0)]


def check_shard_bounds(fn: Callable) -> Verdict:
    """Exercise 04.1: ``fn(numel, world_size, rank)`` -> ``(start, stop)`` of rank's shard
    of a flat buffer of ``numel`` elements padded to a multiple of ``world_size``
    (all shards equal, :func:`course_utils.impl.zero.shard_bounds`)."""
    from ...impl.zero import shard_bounds

    def as_tuple(numel, world_size, rank):
        return tuple(fn(numel=numel, world_size=world_size, rank=rank))

    return grade_cases(as_tuple, _SHARD_CASES, shard_bounds, name="shard_bounds")


def _exercise_flat(rank: int, numel: int, salt: float):
    """Rank r's flat gradient: small integers + salt, exact in float32 sums."""
    import torch

    return (torch.arange(numel, dtype=torch.float32) % 7 + (rank + 1) * salt)


def _first_difference(got, want, shard: int) -> str:
    """Where two flat tensors first differ, and whose shard that position is in."""
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"expected a tensor of shape {tuple(want.shape)}, got {_show(got)[:80]}"
    bad = (got - want).abs() > 1e-6
    if not bool(bad.any()):
        return ""
    i = int(bad.nonzero()[0])
    return (f"first difference at element {i} (in rank {i // shard}'s shard): got "
            f"{got[i].item():g}, expected {want[i].item():g}; {int(bad.sum())} elements differ")


def _zero1_sgd_rank(fn, numel: int, lr: float):
    """Rank side of :func:`check_zero1_step`."""
    import torch.distributed as dist

    from ...impl.zero import padded_numel

    rank, n = dist.get_rank(), dist.get_world_size()
    padded = padded_numel(numel, n)
    flat_param = _exercise_flat(0, padded, 0.5)
    flat_param[numel:] = 0
    flat_grad = _exercise_flat(rank, padded, 1.0)
    flat_grad[numel:] = 0
    out = fn(flat_param, flat_grad, lr)
    return flat_param if out is None else out


def check_zero1_step(fn: Callable) -> Verdict:
    """Exercise 04.2: ``fn(flat_param, flat_grad, lr)``: one ZeRO-1 step with plain SGD.
    Both tensors are padded to a multiple of the world size; reduce-scatter the gradient,
    average it, update only this rank's shard (``p -= lr * g``), all-gather the shards
    into ``flat_param`` (return it, or update it in place). Checked on 2, 3 and 4 ranks
    against ``p - lr * mean over ranks of g``; the first differing element is named."""
    from ...impl.zero import padded_numel

    name = "zero1_step"
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    numel, lr = 10, 0.25
    all_right = True
    for n in (2, 3, 4):
        padded = padded_numel(numel, n)
        want = _exercise_flat(0, padded, 0.5)
        want[numel:] = 0
        mean = sum(_exercise_flat(r, padded, 1.0) for r in range(n)) / n
        mean[numel:] = 0
        want = want - lr * mean
        values = launch_or_report(_zero1_sgd_rank, n, fn, numel, lr, timeout_s=20)
        if values is None:
            all_right = False
            continue
        all_right &= report_ranks(f"{n} ranks ({numel} elements padded to {padded})",
                                  [(_first_difference(got, want, padded // n), "") for got in values])
    return Verdict(name, all_right)
