"""Step-time arithmetic for data parallelism (``notebooks/02_data_parallelism.ipynb``), explaining
a published benchmark's gpt2-xl runs (Megatron-LM, H100, bf16 weights, fp32 gradients):
one GPU vs DP=4 costs +30 ms (+14 %) at batch 1 and +28 ms at batch 15 (393 vs 421 ms),
the same all-reduce bytes whatever the batch; 4-way accumulation at batch 15 takes 1470 ms.
"""
from __future__ import annotations

from ..checks import check_positive
from .comm import comm_volume

__all__ = ["GPT2XL_RUNS", "split_accumulation", "allreduce_seconds", "implied_bandwidth",
           "overhead_share"]

#: Step times that benchmark reports (milliseconds); R1/R2 only as "+30 ms, +14 %".
GPT2XL_RUNS = {
    "params": 1.56e9, "grad_bytes": 4, "dp": 4,
    "overhead_batch1_ms": 30, "overhead_batch1_share": 0.14,
    "single_batch15_ms": 393, "dp4_batch15_ms": 421,
    "accum_k": 4, "accum_ms": 1470,
}


def split_accumulation(step_s: float, accumulated_s: float, k: int) -> tuple[float, float]:
    """Solve ``fb + opt = step_s``, ``k·fb + opt = accumulated_s``: (fb of one micro-batch, the rest)."""
    check_positive("step_s", step_s)
    check_positive("accumulated_s", accumulated_s)
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"k (micro-batches accumulated) must be an int >= 2, got {k!r}")
    fb = (accumulated_s - step_s) / (k - 1)
    return fb, step_s - fb


def allreduce_seconds(num_params, world_size: int, *, bytes_per_elem: int = 4,
                      bandwidth: float, alpha: float = 0.0, messages: int = 1) -> float:
    """Seconds of the gradient all-reduce (alpha-beta ring model): ``bandwidth`` bytes/s per
    rank, ``alpha`` s per ring step, ``messages`` calls (buckets) each paying 2(N-1) latencies."""
    check_positive("bandwidth", bandwidth)
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    sent = comm_volume(num_params, world_size=world_size, stage=0, bytes_per_elem=bytes_per_elem)["total"]
    return messages * 2 * (world_size - 1) * alpha + sent / bandwidth


def implied_bandwidth(num_params, world_size: int, seconds: float, *, bytes_per_elem: int = 4) -> float:
    """The per-rank send bandwidth (bytes/s) at which the ring all-reduce takes ``seconds``."""
    check_positive("seconds", seconds)
    sent = comm_volume(num_params, world_size=world_size, stage=0, bytes_per_elem=bytes_per_elem)["total"]
    return sent / seconds


def overhead_share(compute_s: float, comm_s: float) -> float:
    """Fraction of the data-parallel step spent on (non-overlapped) communication."""
    check_positive("compute_s", compute_s)
    if comm_s < 0:
        raise ValueError("comm_s must be >= 0")
    return comm_s / (compute_s + comm_s)
