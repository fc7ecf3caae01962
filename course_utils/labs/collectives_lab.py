"""The collectives of ``notebooks/01_collectives.ipynb`` on live ranks: one demo each (every
rank prints ``before: ... after: ...``), :func:`expected` results, and :func:`time_collective`.
Rank ``r`` holds ``10*r + i`` at position ``i``, float32: sums this small are exact in any
order, so results compare with ``==``.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch
import torch.distributed as dist

from ..checks import check_int
from ..impl.collectives import all_reduce_via_rs_ag
from ..runtime.compat import all_gather_into_tensor, reduce_scatter_tensor
from ..runtime.launch import launch, rank_device
from ..theory.layout import padded_numel

__all__ = ["ROOT", "DEMOS", "demo_broadcast", "demo_all_reduce", "demo_reduce", "demo_scatter",
           "demo_gather", "demo_all_gather", "demo_reduce_scatter", "demo_allreduce_as_rs_ag",
           "expected", "TIMED_OPS", "DEFAULT_SIZES", "time_collective"]

ROOT = 0  # the source of broadcast/scatter and the destination of reduce/gather
_RS_AG_NUMEL = 10  # not a multiple of 3 or 4: the padding matters


def _values(rank: int, positions) -> torch.Tensor:
    return torch.tensor([10.0 * rank + i for i in positions], dtype=torch.float32, device=rank_device())


def _sum_values(world_size: int, positions) -> torch.Tensor:  # sum over ranks of _values
    base = 5.0 * world_size * (world_size - 1)
    return torch.tensor([base + world_size * i for i in positions], dtype=torch.float32)


def _concat_ranks(world_size: int, per_rank: int) -> torch.Tensor:
    return torch.cat([_values(r, range(per_rank)) for r in range(world_size)])


def _expected_demo(name: str, rank: int, n: int) -> dict:
    v, total, every = _values, _sum_values, _concat_ranks
    root = rank == ROOT
    if name == "allreduce_as_rs_ag":
        chunk = padded_numel(_RS_AG_NUMEL, n) // n
        mine = total(n, range(rank * chunk, (rank + 1) * chunk))
        mine[max(0, _RS_AG_NUMEL - rank * chunk):] = 0.0  # padding beyond numel sums zeros
        whole = total(n, range(_RS_AG_NUMEL))
        return {"before": v(rank, range(_RS_AG_NUMEL)), "chunk": mine, "all_reduce": whole, "rs_ag": whole,
                "equal": True}
    before_after = {
        "broadcast": (v(rank, range(4)), v(ROOT, range(4))),                  # ROOT's tensor everywhere
        "all_reduce": (v(rank, range(4)), total(n, range(4))),                # the sum everywhere
        "reduce": (v(rank, range(4)), total(n, range(4)) if root else None),  # the sum on ROOT only
        "scatter": (every(n, 2) if root else None, v(rank, range(2))),        # rank r gets ROOT's slice r
        "gather": (v(rank, range(2)), every(n, 2) if root else None),         # every slice on ROOT, in order
        "all_gather": (v(rank, range(2)), every(n, 2)),                       # every slice everywhere
        "reduce_scatter": (v(rank, range(2 * n)), total(n, range(2 * rank, 2 * rank + 2))),  # slice r of the sum
    }
    if name not in before_after:
        raise ValueError(f"unknown demo {name!r}; known demos: {sorted(DEMOS)}")
    return dict(zip(("before", "after"), before_after[name]))


def expected(name: str, rank: int, world_size: int) -> dict:
    """What demo ``name`` returns on ``rank`` (``None`` where a rank holds nothing)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a demo name (str), got {type(name).__name__}")
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0, world_size - 1)
    return _expected_demo(name, rank, world_size)


def _fmt(t) -> str:
    return "-" if t is None else "[" + ", ".join(f"{x:g}" for x in t.tolist()) + "]"


def _report(name: str, before, after) -> dict:
    n = dist.get_world_size()
    width = max(len(_fmt(_expected_demo(name, r, n)["before"])) for r in range(n))
    print(f"before: {_fmt(before):<{width}}  after: {_fmt(after)}")
    return {"before": before, "after": after}


def demo_broadcast() -> dict:
    """broadcast: rank 0's tensor is copied to every rank (in place)."""
    before = _values(dist.get_rank(), range(4))
    after = before.clone()
    dist.broadcast(after, src=ROOT)
    return _report("broadcast", before, after)


def demo_all_reduce() -> dict:
    """all-reduce: every rank ends with the element-wise sum over ranks (in place)."""
    before = _values(dist.get_rank(), range(4))
    after = before.clone()
    dist.all_reduce(after, op=dist.ReduceOp.SUM)
    return _report("all_reduce", before, after)


def demo_reduce() -> dict:
    """reduce: the sum arrives on rank 0 only (the others' buffers are scratch: ``None``)."""
    rank = dist.get_rank()
    before = _values(rank, range(4))
    buffer = before.clone()
    dist.reduce(buffer, dst=ROOT, op=dist.ReduceOp.SUM)
    return _report("reduce", before, buffer if rank == ROOT else None)


def demo_scatter() -> dict:
    """scatter: rank 0 holds one slice per rank; rank r receives slice r."""
    rank, n = dist.get_rank(), dist.get_world_size()
    before = _concat_ranks(n, 2) if rank == ROOT else None
    after = torch.zeros(2, device=rank_device())
    dist.scatter(after, scatter_list=list(before.chunk(n)) if rank == ROOT else None, src=ROOT)
    return _report("scatter", before, after)


def demo_gather() -> dict:
    """gather: every rank's slice arrives on rank 0, in rank order."""
    rank, n = dist.get_rank(), dist.get_world_size()
    before = _values(rank, range(2))
    slots = [torch.zeros_like(before) for _ in range(n)] if rank == ROOT else None
    dist.gather(before, gather_list=slots, dst=ROOT)
    return _report("gather", before, torch.cat(slots) if rank == ROOT else None)


def demo_all_gather() -> dict:
    """all-gather: every rank receives every rank's slice, concatenated in rank order."""
    before = _values(dist.get_rank(), range(2))
    after = torch.zeros(2 * dist.get_world_size(), device=before.device)
    all_gather_into_tensor(after, before)  # dist.all_gather_single on torch >= 2.13
    return _report("all_gather", before, after)


def demo_reduce_scatter() -> dict:
    """reduce-scatter: the sum over ranks, cut into N slices; rank r keeps slice r."""
    before = _values(dist.get_rank(), range(2 * dist.get_world_size()))
    after = torch.zeros(2, device=before.device)
    reduce_scatter_tensor(after, before)  # dist.reduce_scatter_single on torch >= 2.13
    return _report("reduce_scatter", before, after)


def demo_allreduce_as_rs_ag() -> dict:
    """all-reduce == reduce-scatter + all-gather on 10 elements (padded): bitwise for small integers."""
    rank, n = dist.get_rank(), dist.get_world_size()
    before = _values(rank, range(_RS_AG_NUMEL))
    direct = before.clone()
    dist.all_reduce(direct)
    chunk = padded_numel(_RS_AG_NUMEL, n) // n
    padded = torch.zeros(chunk * n, device=before.device)
    padded[:_RS_AG_NUMEL] = before
    mine = torch.empty(chunk, device=before.device)
    reduce_scatter_tensor(mine, padded)
    two_step = all_reduce_via_rs_ag(before)
    equal = torch.equal(direct, two_step)
    width = max(len(_fmt(_expected_demo("allreduce_as_rs_ag", r, n)["chunk"])) for r in range(n))
    print(f"my chunk of the padded sum: {_fmt(mine):<{width}}  rs+ag == all_reduce: {equal}")
    return {"before": before, "chunk": mine, "all_reduce": direct, "rs_ag": two_step, "equal": equal}


DEMOS = {n: globals()[f"demo_{n}"] for n in ("broadcast", "all_reduce", "reduce", "scatter", "gather",
                                              "all_gather", "reduce_scatter", "allreduce_as_rs_ag")}

TIMED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_SIZES = tuple(1024 * 4 ** k for k in range(8))  # 1 KiB, 4 KiB, ..., 16 MiB


def _call(op: str, inp, out) -> None:
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "broadcast":
        dist.broadcast(inp, src=ROOT)
    elif op == "all_gather":
        all_gather_into_tensor(out, inp)
    else:
        reduce_scatter_tensor(out, inp)
    if inp.is_cuda:  # GPU collectives return before they finish: wait for them
        torch.cuda.synchronize()


def _time_on_rank(op: str, sizes: list, repeats: int, warmup: int) -> list:
    """The fastest call per size on this rank; returns the max over ranks, per size."""
    n = dist.get_world_size()
    fastest = []
    for size in sizes:
        per_rank = max(1, size // 4 // n)  # M rounded down to whole elements per rank
        full = torch.zeros(per_rank * n, device=rank_device())  # zeros: repeated sums never overflow
        part = torch.zeros(per_rank, device=full.device)
        inp, out = {"all_gather": (part, full), "reduce_scatter": (full, part)}.get(op, (full, full))
        for _ in range(warmup):
            _call(op, inp, out)
        samples = []
        for _ in range(repeats):
            dist.barrier()  # start together, so we time the collective, not the waiting
            t0 = time.perf_counter()
            _call(op, inp, out)
            samples.append(time.perf_counter() - t0)
        fastest.append(min(samples))  # noise (the scheduler, other programs) only adds time
    slowest = torch.tensor(fastest, dtype=torch.float64, device=rank_device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the collective ends with its slowest rank
    return slowest.tolist()


def time_collective(op: str, sizes_bytes: Sequence[int] = DEFAULT_SIZES, world_size: int = 4, *,
                    repeats: int = 9, warmup: int = 2, timeout_s: float = 120) -> dict:
    """``{M: seconds}`` of ``op`` on ``world_size`` ranks per message size M (bytes of the full
    float32 tensor): the slowest rank's fastest of ``repeats`` calls, each after a barrier."""
    if op not in TIMED_OPS:
        raise ValueError(f"op must be one of {TIMED_OPS}, got {op!r}")
    if isinstance(sizes_bytes, (str, bytes)) or not isinstance(sizes_bytes, Sequence) or not sizes_bytes:
        raise TypeError("sizes_bytes must be a non-empty list of message sizes in bytes")
    for size in sizes_bytes:
        check_int("each message size", size, 4)
    check_int("world_size", world_size, 2)
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    results = launch(_time_on_rank, world_size, op, list(sizes_bytes), repeats, warmup,
                     quiet=True, timeout_s=timeout_s)
    return dict(zip(sizes_bytes, results[0]))
