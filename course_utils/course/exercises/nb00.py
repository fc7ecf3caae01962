"""Exercises of ``notebooks/00_orientation.ipynb``: a rank sum."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, grade_on_ranks

__all__ = ["check_rank_sum"]


def check_rank_sum(fn: Callable) -> Verdict:
    """Exercise 00.1: every rank returns the sum over ranks of (rank + 1)."""
    return grade_on_ranks(fn, lambda r, n: float(n * (n + 1) // 2),
                          world_sizes=(2, 4), name="rank_sum")

