"""The alpha-beta (latency-bandwidth) model of a collective's time (``notebooks/01_collectives.ipynb``):
``t(M) = alpha * steps + comm.collective_bytes(op, M, N) / bandwidth``, steps = 2(N-1) for
all-reduce and N-1 for reduce-scatter and all-gather.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from ..checks import check_int, check_positive
from .comm import OPS, collective_bytes
from .text import fmt_bytes

__all__ = ["ring_steps", "predict_time", "crossover_bytes", "AlphaBetaFit", "fit_alpha_beta",
           "plot_alpha_beta"]


def ring_steps(op: str, world_size: int) -> int:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS} (the ring collectives), got {op!r}")
    check_int("world_size", world_size, 1)
    return (2 if op == "all_reduce" else 1) * (world_size - 1)


def predict_time(op: str, message_bytes, world_size: int, alpha_s: float, bandwidth: float) -> float:
    """Seconds: ``alpha_s`` per step (latency), ``bandwidth`` bytes/s one rank can send."""
    check_positive("alpha_s", alpha_s)
    check_positive("bandwidth", bandwidth)
    steps = ring_steps(op, world_size)
    return alpha_s * steps + collective_bytes(op, message_bytes, world_size) / bandwidth


def crossover_bytes(op: str, world_size: int, alpha_s: float, bandwidth: float) -> float:
    """The message size where latency and bandwidth cost the same (``N * alpha * bandwidth``):
    smaller ones are latency-bound, which is why DDP and FSDP bucket gradients."""
    check_positive("alpha_s", alpha_s)
    check_positive("bandwidth", bandwidth)
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
        return self.alpha_s * self.steps + collective_bytes(self.op, message_bytes, self.world_size) / self.bandwidth

    def crossover_bytes(self) -> float:
        return crossover_bytes(self.op, self.world_size, self.alpha_s, self.bandwidth)

    def describe(self) -> str:
        return (f"{self.op} on {self.world_size} ranks: alpha = {self.alpha_s * 1e6:.1f} us per step "
                f"({self.steps} steps), bandwidth = {self.bandwidth / 1e9:.2f} GB/s per rank; "
                f"latency and bandwidth cost the same at {self.crossover_bytes() / 1024:.0f} KiB")


def fit_alpha_beta(sizes: Sequence, times: Sequence, op: str = "all_reduce",
                   world_size: int = 4) -> AlphaBetaFit:
    """Least-squares fit of alpha and bandwidth to measured ``times`` (s) per size M (bytes).

    It minimises *relative* errors, so the small messages that pin down alpha weigh as much
    as the large ones that pin down bandwidth; a negative parameter is refitted as zero.
    """
    import numpy as np
    steps = ring_steps(op, world_size)
    if steps == 0:
        raise ValueError("world_size must be >= 2: one rank sends nothing, there is nothing to fit")
    sizes, times = list(sizes), list(times)
    if len(sizes) != len(times):
        raise ValueError(f"sizes and times must have the same length, got {len(sizes)} and {len(times)}")
    for label, v in [("sizes", v) for v in sizes] + [("times", v) for v in times]:
        check_positive(label, v)
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
    return fmt_bytes(m, "auto", 3, sig=True, largest="MiB")


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
    ax.set(xlabel="message size M", ylabel="time (ms)")
    ax.set_title(f"{fit.op} on {fit.world_size} ranks: t = alpha·steps + bytes sent / bandwidth", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
