"""Exercises of ``notebooks/03_memory_anatomy.ipynb``: bytes per GPU, and the smallest ZeRO stage that fits."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, grade_cases

__all__ = ["check_bytes_per_gpu", "smallest_fitting_stage", "check_smallest_fitting_stage"]


_BYTES_CASES = [dict(num_params=p, world_size=n, stage=s) for p, n, s in (
    (7e9, 4, 0), (7e9, 4, 1), (13e9, 8, 2), (7.5e9, 64, 3), (1.5e9, 3, 3), (70e9, 1, 2))]


def check_bytes_per_gpu(fn: Callable) -> Verdict:
    """Exercise 03.1: ``fn(num_params, world_size, stage)`` -> model-state bytes per GPU (2 + 2 + 12)."""
    from ...theory.memory import model_states
    return grade_cases(fn, _BYTES_CASES,
                       lambda num_params, world_size, stage: model_states(
                           num_params, world_size=world_size, stage=stage).total,
                       name="bytes_per_gpu")


_FIT_CASES = [dict(zip(("model", "gpus", "gpu_gb", "micro_batch", "seq"), case)) for case in (
    ("llama-2-7b", 4, 80, 1, 2048), ("llama-2-7b", 8, 40, 2, 2048), ("llama-2-13b", 8, 80, 1, 4096),
    ("llama-2-70b", 8, 80, 1, 4096), ("llama-2-70b", 64, 80, 1, 1024), ("gpt2-xl", 1, 40, 4, 1024))]


def smallest_fitting_stage(model: str, gpus: int, gpu_gb: float, micro_batch: int, seq: int):
    """Reference for 03.2: the lowest stage that fits (mixed, flash attention, no recompute or offload)."""
    from ...theory.memory import GB, per_gpu
    return next((stage for stage in range(4) if per_gpu(
        model, world_size=gpus, stage=stage, micro_batch=micro_batch, seq=seq, attention="flash"
    ).total <= gpu_gb * GB), None)


def check_smallest_fitting_stage(fn: Callable) -> Verdict:
    """Exercise 03.2: ``fn(model, gpus, gpu_gb, micro_batch, seq)`` -> 0-3 or None."""
    return grade_cases(fn, _FIT_CASES, smallest_fitting_stage, name="smallest_stage")
