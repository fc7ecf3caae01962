"""Exercise of ``notebooks/10_appendix_fsdp_in_depth.ipynb``: the rows of dim 0 each rank owns under FSDP2."""
from __future__ import annotations

from typing import Callable

from ...labs.grading import Verdict, grade_cases
from ...theory.layout import local_rows

__all__ = ["check_real_rows"]

#: (d0, world_size, rank): the course GPT's embedding (101 rows), a bias (50), an MLP weight (200),
#: and short dims where the last ranks own nothing.
_CASES = [dict(d0=d, world_size=n, rank=r) for d, n, r in (
    (101, 4, 0), (101, 4, 3), (50, 4, 3), (200, 4, 2), (5, 4, 2), (5, 4, 3), (7, 3, 2), (1, 2, 1))]


def _expected(d0: int, world_size: int, rank: int) -> int:
    return local_rows(d0, world_size, rank)


def check_real_rows(fn: Callable) -> Verdict:
    """Exercise 10.1: ``fn(d0, world_size, rank)`` -> the rows of dim 0 that ``rank`` really owns."""
    return grade_cases(fn, _CASES, _expected, name="real_rows")
