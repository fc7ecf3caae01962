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

__all__ = ["ring_steps", "predict_time", "crossover_bytes", "AlphaBetaFit", "fit_alpha_beta"]


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
