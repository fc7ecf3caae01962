"""Exercises of ``notebooks/03_memory_anatomy.ipynb``: bytes per GPU."""
from __future__ import annotations

from typing import Callable

from ...labs.grading import Verdict, grade_cases

__all__ = ["check_bytes_per_gpu"]


_BYTES_CASES = [dict(num_params=p, world_size=n, stage=s) for p, n, s in (
    (7e9, 4, 0), (7e9, 4, 1), (13e9, 8, 2), (7.5e9, 64, 3), (1.5e9, 3, 3), (70e9, 1, 2))]


def check_bytes_per_gpu(fn: Callable) -> Verdict:
    """Exercise 03.1: ``fn(num_params, world_size, stage)`` -> model-state bytes per GPU (2 + 2 + 12)."""
    from ...theory.memory import model_states
    return grade_cases(fn, _BYTES_CASES,
                       lambda num_params, world_size, stage: model_states(
                           num_params, world_size=world_size, stage=stage).total,
                       name="bytes_per_gpu")

