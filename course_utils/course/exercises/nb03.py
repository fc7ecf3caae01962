"""Exercises of ``notebooks/03_memory_anatomy.ipynb``: bytes per GPU, and the smallest ZeRO stage that fits."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, grade_cases

__all__ = ["check_bytes_per_gpu", "smallest_fitting_stage", "check_smallest_fitting_stage"]


_BYTES_CASES = [
    dict(num_params=7e9, world_size=4, stage=0), dict(num_params=7e9, world_size=4, stage=1),
    dict(num_params=13e9, world_size=8, stage=2), dict(num_params=7.5e9, world_size=64, stage=3),
    dict(num_params=1.5e9, world_size=3, stage=3), dict(num_params=70e9, world_size=1, stage=2),
]


def check_bytes_per_gpu(fn: Callable) -> Verdict:
    """Exercise 03.1: ``fn(num_params, world_size, stage)`` -> model-state bytes per GPU (2 + 2 + 12)."""
    from ...theory.memory import model_states
    return grade_cases(fn, _BYTES_CASES,
                       lambda num_params, world_size, stage: model_states(
                           num_params, world_size=world_size, stage=stage).total,
                       name="bytes_per_gpu")


_FIT_CASES = [
    dict(model="llama-2-7b", gpus=4, gpu_gb=80, micro_batch=1, seq=2048),
    dict(model="llama-2-7b", gpus=8, gpu_gb=40, micro_batch=2, seq=2048),
    dict(model="llama-2-13b", gpus=8, gpu_gb=80, micro_batch=1, seq=4096),
    dict(model="llama-2-70b", gpus=8, gpu_gb=80, micro_batch=1, seq=4096),
    dict(model="llama-2-70b", gpus=64, gpu_gb=80, micro_batch=1, seq=1024),
    dict(model="gpt2-xl", gpus=1, gpu_gb=40, micro_batch=4, seq=1024),
]


def smallest_fitting_stage(model: str, gpus: int, gpu_gb: float, micro_batch: int, seq: int):
    """Reference for exercise 03.2: the lowest stage whose per-GPU total (mixed recipe,
    flash attention, no recomputation, no offload) fits in ``gpu_gb`` GB; None if none."""
    from ...theory.memory import GB, per_gpu
    for stage in (0, 1, 2, 3):
        m = per_gpu(model, world_size=gpus, stage=stage, micro_batch=micro_batch, seq=seq,
                    attention="flash")
        if m.total <= gpu_gb * GB:
            return stage
    return None


def check_smallest_fitting_stage(fn: Callable) -> Verdict:
    """Exercise 03.2: ``fn(model, gpus, gpu_gb, micro_batch, seq)`` -> 0-3 or None."""
    return grade_cases(fn, _FIT_CASES, smallest_fitting_stage, name="smallest_stage")
