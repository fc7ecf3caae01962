"""The collectives, one small demo each, and the alpha-beta model of their cost.

Taught in ``notebooks/01_collectives.ipynb``. Run a demo on ranks with
``launch(demo_all_reduce, 4)``: every rank prints one line, ``before: ... after: ...``,
and returns ``{"before": tensor, "after": tensor}``. :func:`expected` gives the
documented result of every demo on every rank, so the notebook (and the tests) can
check each rank.

The data are chosen to be read at a glance: rank ``r`` holds ``10*r + i`` at position
``i`` (the tens digit is the rank, the units digit the position), as float32. Sums of
integers this small are exact in float32 whatever the order of the additions, so
results compare with ``==``, not "close enough".

The second half is the alpha-beta (latency-bandwidth) model: a ring collective takes
``steps`` rounds, each costing a latency ``alpha``, and each rank sends
``comm.collective_bytes(op, M, N)`` bytes at ``bandwidth`` bytes/s:

    t(M) = alpha * steps + bytes_sent(M) / bandwidth

with ``steps = 2(N-1)`` for all-reduce and ``N-1`` for reduce-scatter and all-gather.
:func:`time_collective` measures ``t(M)`` on real ranks, :func:`fit_alpha_beta` fits
alpha and bandwidth, :func:`plot_alpha_beta` draws both.
"""
from __future__ import annotations

import dataclasses
import math
import time
from numbers import Real
from typing import Sequence

from .comm import OPS, collective_bytes
from .launch import rank_device

__all__ = [
    "ROOT", "DEMOS", "demo_broadcast", "demo_all_reduce", "demo_reduce", "demo_scatter",
    "demo_gather", "demo_all_gather", "demo_reduce_scatter", "demo_allreduce_as_rs_ag",
    "all_reduce_via_rs_ag", "expected",
    "TIMED_OPS", "DEFAULT_SIZES", "time_collective", "ring_steps", "predict_time",
    "crossover_bytes", "AlphaBetaFit", "fit_alpha_beta", "plot_alpha_beta",
]

ROOT = 0  # the source of broadcast/scatter and the destination of reduce/gather


# ------------------------------------------------------------------------- the demos

def _values(rank: int, positions) -> "torch.Tensor":
    """Rank ``rank``'s easy-to-read data: ``10*rank + i`` for each position i (float32).

    On the rank's device: its GPU when the ranks run NCCL, else the CPU.
    """
    import torch

    return torch.tensor([10.0 * rank + i for i in positions], dtype=torch.float32, device=rank_device())


def _sum_values(world_size: int, positions) -> "torch.Tensor":
    """The sum over all ranks of :func:`_values`: ``10*N(N-1)/2 + N*i``."""
    import torch

    base = 10.0 * world_size * (world_size - 1) / 2
    return torch.tensor([base + world_size * i for i in positions], dtype=torch.float32)


def _concat_ranks(world_size: int, per_rank: int) -> "torch.Tensor":
    """Every rank's ``_values(r, range(per_rank))`` one after the other."""
    import torch

    return torch.cat([_values(r, range(per_rank)) for r in range(world_size)])


def _expected_demo(name: str, rank: int, n: int) -> dict:
    """The documented before/after of demo ``name`` on ``rank`` of ``n`` ranks."""
    if name == "broadcast":  # rank ROOT's tensor lands on every rank
        return {"before": _values(rank, range(4)), "after": _values(ROOT, range(4))}
    if name == "all_reduce":  # every rank gets the sum
        return {"before": _values(rank, range(4)), "after": _sum_values(n, range(4))}
    if name == "reduce":  # only ROOT is guaranteed the sum
        return {"before": _values(rank, range(4)),
                "after": _sum_values(n, range(4)) if rank == ROOT else None}
    if name == "scatter":  # ROOT holds one 2-element slice per rank; rank r gets slice r
        return {"before": _concat_ranks(n, 2) if rank == ROOT else None,
                "after": _values(rank, range(2))}
    if name == "gather":  # ROOT receives every rank's slice, in rank order
        return {"before": _values(rank, range(2)),
                "after": _concat_ranks(n, 2) if rank == ROOT else None}
    if name == "all_gather":  # every rank receives every rank's slice
        return {"before": _values(rank, range(2)), "after": _concat_ranks(n, 2)}
    if name == "reduce_scatter":  # rank r gets slice r (2 elements) of the sum
        return {"before": _values(rank, range(2 * n)),
                "after": _sum_values(n, range(2 * rank, 2 * rank + 2))}
    if name == "allreduce_as_rs_ag":
        numel = _RS_AG_NUMEL
        chunk = -(-numel // n)
        total = _sum_values(n, range(numel))
        mine = _sum_values(n, range(rank * chunk, (rank + 1) * chunk))
        mine[max(0, numel - rank * chunk):] = 0.0  # padding beyond numel sums zeros
        return {"before": _values(rank, range(numel)), "chunk": mine,
                "all_reduce": total, "rs_ag": total, "equal": True}
    raise ValueError(f"unknown demo {name!r}; known demos: {sorted(DEMOS)}")


def expected(name: str, rank: int, world_size: int) -> dict:
    """What demo ``name`` returns on ``rank`` of ``world_size`` ranks.

    A dict of the same keys as the demo's (``"before"`` and ``"after"``; ``None`` where a
    rank holds nothing, e.g. ``"after"`` of reduce and gather on ranks other than
    :data:`ROOT`).

    >>> expected("all_reduce", 1, 4)["after"]
    tensor([60., 64., 68., 72.])
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a demo name (str), got {type(name).__name__}")
    for label, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an int, got {type(value).__name__}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return _expected_demo(name, rank, world_size)


def _fmt(t) -> str:
    """``[0, 1, 2, 3]`` for a tensor of whole numbers; ``-`` for None."""
    if t is None:
        return "-"
    return "[" + ", ".join(f"{x:g}" for x in t.tolist()) + "]"


def _report(name: str, before, after) -> dict:
    """Print this rank's one line (``before`` padded so the ranks' lines align); return it."""
    import torch.distributed as dist

    n = dist.get_world_size()
    width = max(len(_fmt(_expected_demo(name, r, n)["before"])) for r in range(n))
    print(f"before: {_fmt(before):<{width}}  after: {_fmt(after)}")
    return {"before": before, "after": after}


def demo_broadcast() -> dict:
    """broadcast: rank 0's tensor is copied to every rank (in place)."""
    import torch.distributed as dist

    before = _values(dist.get_rank(), range(4))
    after = before.clone()
    dist.broadcast(after, src=ROOT)
    return _report("broadcast", before, after)


def demo_all_reduce() -> dict:
    """all-reduce: every rank ends with the element-wise sum over ranks (in place)."""
    import torch.distributed as dist

    before = _values(dist.get_rank(), range(4))
    after = before.clone()
    dist.all_reduce(after, op=dist.ReduceOp.SUM)
    return _report("all_reduce", before, after)


def demo_reduce() -> dict:
    """reduce: the sum arrives on rank 0 only.

    The other ranks' buffers are scratch space: gloo happens to leave sums in them,
    other backends do not, so the demo reports nothing (``None``) for them.
    """
    import torch.distributed as dist

    rank = dist.get_rank()
    before = _values(rank, range(4))
    buffer = before.clone()
    dist.reduce(buffer, dst=ROOT, op=dist.ReduceOp.SUM)
    return _report("reduce", before, buffer if rank == ROOT else None)


def demo_scatter() -> dict:
    """scatter: rank 0 holds one slice per rank; rank r receives slice r."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    before = _concat_ranks(n, 2) if rank == ROOT else None
    after = torch.zeros(2, device=rank_device())
    slices = list(before.chunk(n)) if rank == ROOT else None
    dist.scatter(after, scatter_list=slices, src=ROOT)
    return _report("scatter", before, after)


def demo_gather() -> dict:
    """gather: every rank's slice arrives on rank 0, in rank order."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    before = _values(rank, range(2))
    slots = [torch.zeros_like(before) for _ in range(n)] if rank == ROOT else None
    dist.gather(before, gather_list=slots, dst=ROOT)
    return _report("gather", before, torch.cat(slots) if rank == ROOT else None)


def demo_all_gather() -> dict:
    """all-gather: every rank receives every rank's slice, concatenated in rank order."""
    import torch
    import torch.distributed as dist

    from .compat import all_gather_into_tensor  # dist.all_gather_single on torch >= 2.13

    rank, n = dist.get_rank(), dist.get_world_size()
    before = _values(rank, range(2))
    after = torch.zeros(2 * n, device=before.device)
    all_gather_into_tensor(after, before)
    return _report("all_gather", before, after)


def demo_reduce_scatter() -> dict:
    """reduce-scatter: the sum over ranks, cut into N slices; rank r keeps slice r."""
    import torch
    import torch.distributed as dist

    from .compat import reduce_scatter_tensor  # dist.reduce_scatter_single on torch >= 2.13

    rank, n = dist.get_rank(), dist.get_world_size()
    before = _values(rank, range(2 * n))
    after = torch.zeros(2, device=before.device)
    reduce_scatter_tensor(after, before)
    return _report("reduce_scatter", before, after)


def all_reduce_via_rs_ag(tensor):
    """The all-reduce (sum) of ``tensor``, built from a reduce-scatter and an all-gather.

    Works for any number of elements: pad with zeros to a multiple of the world size
    (zeros do not change a sum), reduce-scatter so each rank owns the sum of one
    chunk, all-gather the chunks, strip the padding. Returns a new tensor of the same
    shape; ``tensor`` is left unchanged. Call it on every rank.
    """
    import torch
    import torch.distributed as dist

    from .compat import all_gather_into_tensor, reduce_scatter_tensor

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    n = dist.get_world_size()
    numel = tensor.numel()
    chunk = -(-numel // n)  # ceil(numel / n)
    padded = torch.zeros(chunk * n, dtype=tensor.dtype, device=tensor.device)
    padded[:numel] = tensor.reshape(-1)
    mine = torch.empty(chunk, dtype=tensor.dtype, device=tensor.device)
    reduce_scatter_tensor(mine, padded)           # mine = sum over ranks of my chunk
    gathered = torch.empty_like(padded)
    all_gather_into_tensor(gathered, mine)        # every chunk, on every rank
    return gathered[:numel].reshape(tensor.shape)


_RS_AG_NUMEL = 10  # not a multiple of 3 or 4: the padding matters


def demo_allreduce_as_rs_ag() -> dict:
    """all-reduce == reduce-scatter + all-gather, on 10 elements (padded, then stripped).

    Returns ``{"before", "chunk", "all_reduce", "rs_ag", "equal"}``: this rank's input,
    the chunk of the sum it owned after the reduce-scatter (padding included), both
    results, and whether they are bitwise equal (``torch.equal``). They are: the values
    are small integers in float32, so the sums are exact in any order. With arbitrary
    floats the two could differ in the last bits (the additions happen in another order).
    """
    import torch
    import torch.distributed as dist

    from .compat import reduce_scatter_tensor

    rank, n = dist.get_rank(), dist.get_world_size()
    before = _values(rank, range(_RS_AG_NUMEL))
    direct = before.clone()
    dist.all_reduce(direct)
    chunk = -(-_RS_AG_NUMEL // n)
    padded = torch.zeros(chunk * n, device=before.device)
    padded[:_RS_AG_NUMEL] = before
    mine = torch.empty(chunk, device=before.device)
    reduce_scatter_tensor(mine, padded)
    two_step = all_reduce_via_rs_ag(before)
    equal = torch.equal(direct, two_step)
    width = max(len(_fmt(_expected_demo("allreduce_as_rs_ag", r, n)["chunk"])) for r in range(n))
    print(f"my chunk of the padded sum: {_fmt(mine):<{width}}  rs+ag == all_reduce: {equal}")
    return {"before": before, "chunk": mine, "all_reduce": direct, "rs_ag": two_step, "equal": equal}


DEMOS = {
    "broadcast": demo_broadcast, "all_reduce": demo_all_reduce, "reduce": demo_reduce,
    "scatter": demo_scatter, "gather": demo_gather, "all_gather": demo_all_gather,
    "reduce_scatter": demo_reduce_scatter, "allreduce_as_rs_ag": demo_allreduce_as_rs_ag,
}


# --------------------------------------------------------------- measuring the cost

TIMED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_SIZES = tuple(1024 * 4 ** k for k in range(8))  # 1 KiB, 4 KiB, ..., 16 MiB


def _buffers(op: str, message_bytes: int, n: int):
    """(input, output) float32 buffers for one call of ``op`` on an M-byte message.

    M is the size of the full tensor: the one all-reduced or broadcast, the gathered
    output of all-gather, the input of reduce-scatter. It is rounded down to a whole
    number of float32 elements per rank.
    """
    import torch

    per_rank = max(1, message_bytes // 4 // n)
    full = torch.zeros(per_rank * n, device=rank_device())  # zeros: repeated sums never overflow
    if op == "all_gather":
        return torch.zeros(per_rank, device=full.device), full
    if op == "reduce_scatter":
        return full, torch.zeros(per_rank, device=full.device)
    return full, full


def _call(op: str, inp, out) -> None:
    import torch
    import torch.distributed as dist

    from .compat import all_gather_into_tensor, reduce_scatter_tensor

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
    """In each rank: the fastest call per size; returns the max over ranks, per size."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    fastest = []
    for size in sizes:
        inp, out = _buffers(op, size, n)
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


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def time_collective(op: str, sizes_bytes: Sequence[int] = DEFAULT_SIZES, world_size: int = 4, *,
                    repeats: int = 9, warmup: int = 2, timeout_s: float = 120) -> dict:
    """Measure ``op`` on ``world_size`` real ranks for each message size.

    Launches the ranks once; for each size every rank runs ``warmup`` untimed calls,
    then ``repeats`` timed calls, each after a barrier. A rank's time for a size is its
    fastest call (noise from the scheduler and other programs only ever adds time; on a
    laptop with fewer cores than ranks it adds a lot); the time reported is the
    **maximum over ranks** of those (a collective is finished when its slowest rank is).

    Args:
        op: one of :data:`TIMED_OPS`.
        sizes_bytes: message sizes M in bytes (ints >= 4): the full tensor (the one
            all-reduced or broadcast, the output of all-gather, the input of
            reduce-scatter), float32.
        world_size: ranks (>= 2).

    Returns:
        ``{size: seconds}`` in the order given. Machine-dependent: do not compare
        these numbers across machines, fit them (:func:`fit_alpha_beta`).
    """
    from .launch import launch

    if op not in TIMED_OPS:
        raise ValueError(f"op must be one of {TIMED_OPS}, got {op!r}")
    if isinstance(sizes_bytes, (str, bytes)) or not isinstance(sizes_bytes, Sequence) or not sizes_bytes:
        raise TypeError("sizes_bytes must be a non-empty list of message sizes in bytes")
    for size in sizes_bytes:
        _check_int("each message size", size, 4)
    _check_int("world_size", world_size, 2)
    _check_int("repeats", repeats, 1)
    _check_int("warmup", warmup, 0)
    results = launch(_time_on_rank, world_size, op, list(sizes_bytes), repeats, warmup,
                     quiet=True, timeout_s=timeout_s)
    return dict(zip(sizes_bytes, results[0]))


# ---------------------------------------------------------------- the alpha-beta model

def ring_steps(op: str, world_size: int) -> int:
    """Rounds of a ring collective: 2(N-1) for all-reduce, N-1 for reduce-scatter/all-gather."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS} (the ring collectives), got {op!r}")
    _check_int("world_size", world_size, 1)
    return (2 if op == "all_reduce" else 1) * (world_size - 1)


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def predict_time(op: str, message_bytes, world_size: int, alpha_s: float, bandwidth: float) -> float:
    """The alpha-beta model: ``alpha * steps + bytes_sent / bandwidth`` seconds.

    ``alpha_s``: seconds per step (latency); ``bandwidth``: bytes/s one rank can send.

    >>> predict_time("all_reduce", 1e9, 4, alpha_s=5e-6, bandwidth=100e9)  # 1 GB, 4 GPUs
    0.01503
    """
    _check_positive("alpha_s", alpha_s)
    _check_positive("bandwidth", bandwidth)
    steps = ring_steps(op, world_size)
    return alpha_s * steps + collective_bytes(op, message_bytes, world_size) / bandwidth


def crossover_bytes(op: str, world_size: int, alpha_s: float, bandwidth: float) -> float:
    """The message size at which latency and bandwidth cost the same time.

    Smaller messages are latency-bound (batch them: that is why DDP and FSDP bucket
    gradients); larger ones are bandwidth-bound. For every ring collective this is
    ``N * alpha * bandwidth``.
    """
    _check_positive("alpha_s", alpha_s)
    _check_positive("bandwidth", bandwidth)
    steps = ring_steps(op, world_size)
    if steps == 0:
        raise ValueError("one rank sends nothing: there is no crossover (world_size must be >= 2)")
    return alpha_s * steps * bandwidth / collective_bytes(op, 1, world_size)


@dataclasses.dataclass(frozen=True)
class AlphaBetaFit:
    """A fitted alpha-beta model and the measurements it was fitted to."""

    op: str
    world_size: int
    alpha_s: float          # latency per ring step, seconds
    bandwidth: float        # bytes per second one rank sends (nccl-tests call this "bus bandwidth")
    sizes: tuple            # message sizes M, bytes
    times: tuple            # measured seconds
    fitted: tuple           # the model's seconds at each size

    @property
    def steps(self) -> int:
        return ring_steps(self.op, self.world_size)

    def predict(self, message_bytes) -> float:
        """Seconds the fitted model predicts for an M-byte message."""
        return self.alpha_s * self.steps + collective_bytes(self.op, message_bytes, self.world_size) / self.bandwidth

    def crossover_bytes(self) -> float:
        """Where latency and bandwidth terms are equal (``N * alpha * bandwidth``)."""
        return crossover_bytes(self.op, self.world_size, self.alpha_s, self.bandwidth)

    def describe(self) -> str:
        return (f"{self.op} on {self.world_size} ranks: alpha = {self.alpha_s * 1e6:.1f} us per step "
                f"({self.steps} steps), bandwidth = {self.bandwidth / 1e9:.2f} GB/s per rank; "
                f"latency and bandwidth cost the same at {self.crossover_bytes() / 1024:.0f} KiB")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit_alpha_beta(sizes: Sequence, times: Sequence, op: str = "all_reduce",
                   world_size: int = 4) -> AlphaBetaFit:
    """Least-squares fit of ``t = alpha * steps + bytes_sent(M) / bandwidth``.

    The fit minimises *relative* errors (each equation divided by its measured time),
    so the small messages that pin down alpha weigh as much as the large ones that pin
    down bandwidth. Both parameters are kept positive: if the unconstrained fit makes
    one negative, it is refitted with the other alone.

    Args:
        sizes: message sizes M in bytes (as in :func:`time_collective`).
        times: measured seconds, one per size (e.g. ``list(time_collective(...).values())``).
        op: ``"all_reduce"``, ``"reduce_scatter"`` or ``"all_gather"``.
        world_size: ranks the times were measured on (>= 2).
    """
    import numpy as np

    steps = ring_steps(op, world_size)
    if steps == 0:
        raise ValueError("world_size must be >= 2: one rank sends nothing, there is nothing to fit")
    sizes, times = list(sizes), list(times)
    if len(sizes) != len(times):
        raise ValueError(f"sizes and times must have the same length, got {len(sizes)} and {len(times)}")
    for label, values in (("sizes", sizes), ("times", times)):
        for v in values:
            if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{label} must be positive numbers, got {v!r}")
    if len(set(sizes)) < 2:
        raise ValueError("need at least two different message sizes to separate alpha from bandwidth")
    sent = np.array([collective_bytes(op, m, world_size) for m in sizes], dtype=float)
    t = np.array(times, dtype=float)
    a = np.stack([np.full_like(t, steps), sent], axis=1) / t[:, None]  # relative errors
    alpha, inv_bw = np.linalg.lstsq(a, np.ones_like(t), rcond=None)[0]
    if alpha <= 0:  # all bandwidth: refit t = sent / bandwidth
        alpha, inv_bw = 0.0, float(np.linalg.lstsq(a[:, 1:], np.ones_like(t), rcond=None)[0][0])
    elif inv_bw <= 0:  # all latency: refit t = alpha * steps
        alpha, inv_bw = float(np.linalg.lstsq(a[:, :1], np.ones_like(t), rcond=None)[0][0]), 0.0
    bandwidth = math.inf if inv_bw <= 0 else 1.0 / float(inv_bw)
    fitted = [float(alpha) * steps + float(s) / bandwidth for s in sent]
    return AlphaBetaFit(op=op, world_size=world_size, alpha_s=float(alpha), bandwidth=bandwidth,
                        sizes=tuple(sizes), times=tuple(float(x) for x in times), fitted=tuple(fitted))


def _bytes_label(m: float) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if m >= scale:
            return f"{m / scale:.3g} {unit}"
    return f"{m:g} B"


def plot_alpha_beta(sizes: Sequence, times: Sequence, fit: AlphaBetaFit):
    """Log-log plot: measured times, the fitted model, its latency floor and bandwidth line."""
    import numpy as np
    from matplotlib.figure import Figure

    if not isinstance(fit, AlphaBetaFit):
        raise TypeError(f"fit must be what fit_alpha_beta returns, got {type(fit).__name__}")
    if len(sizes) != len(times) or not len(sizes):
        raise ValueError("sizes and times must be non-empty and of the same length")
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.subplots()
    grid = np.geomspace(min(sizes) / 2, max(sizes) * 2, 200)
    ax.loglog(sizes, [t * 1e3 for t in times], "o", color="#4C72B0", label="measured (best of repeats, slowest rank)")
    ax.loglog(grid, [fit.predict(m) * 1e3 for m in grid], "-", color="#C44E52",
              label=f"fit: {fit.steps}·alpha + bytes sent / bandwidth")
    if fit.alpha_s > 0:
        ax.axhline(fit.alpha_s * fit.steps * 1e3, color="gray", linestyle=":", linewidth=1,
                   label=f"latency: {fit.steps} × {fit.alpha_s * 1e6:.0f} us")
    if math.isfinite(fit.bandwidth):
        ax.loglog(grid, [collective_bytes(fit.op, m, fit.world_size) / fit.bandwidth * 1e3 for m in grid],
                  "--", color="gray", linewidth=1, label=f"bandwidth: {fit.bandwidth / 1e9:.2f} GB/s")
        ax.set_ylim(min(times) * 1e3 / 3, max(times) * 1e3 * 3)
    if fit.alpha_s > 0 and math.isfinite(fit.bandwidth):
        x = fit.crossover_bytes()
        ax.axvline(x, color="black", linestyle=":", linewidth=0.8)
        ax.text(x, ax.get_ylim()[1], f" crossover {_bytes_label(x)}", va="top", fontsize=8)
    ticks = [m for m in (2 ** k for k in range(0, 41, 2)) if grid[0] <= m <= grid[-1]]
    ax.set_xticks(ticks, [_bytes_label(m) for m in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("message size M")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{fit.op} on {fit.world_size} ranks: t = alpha·steps + bytes sent / bandwidth", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
