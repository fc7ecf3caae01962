"""Exercise of ``notebooks/12_appendix_zero3_in_depth.ipynb``: ZeRO-3's bytes per step, unit by unit."""
from __future__ import annotations

from typing import Callable

from ...labs.grading import Verdict, grade_cases
from ...theory.comm import collective_bytes
from ...theory.layout import padded_numel

__all__ = ["check_zero3_step_bytes", "zero3_step_bytes"]

#: the course GPT (root, then its 4 blocks), exercise 06.1's units, a 24-block model
_COURSE, _BUILD, _DEEP = [6750] + [30650] * 4, [35, 47, 35], [1000] + [999] * 24
_CASES = [dict(unit_numels=u, world=n, reshard_root=r) for u, n, r in (
    (_COURSE, 2, False), (_COURSE, 4, False), (_COURSE, 4, True), (_BUILD, 3, False), (_DEEP, 8, False))]


def zero3_step_bytes(unit_numels, world, reshard_root=False) -> float:
    """Ring-model bytes one rank sends per step in fp32: each unit padded to a multiple of
    ``world``, all-gathered twice (the root, ``unit_numels[0]``, once unless ``reshard_root``)
    and reduce-scattered once."""
    total = 0.0
    for i, numel in enumerate(unit_numels):
        size = 4 * padded_numel(numel, world)
        gathers = 1 if i == 0 and not reshard_root else 2
        total += gathers * collective_bytes("all_gather", size, world) + collective_bytes("reduce_scatter", size, world)
    return total


def check_zero3_step_bytes(fn: Callable) -> Verdict:
    """Exercise 12.1: ``fn(unit_numels, world, reshard_root)`` -> bytes one rank sends per step."""
    return grade_cases(fn, _CASES, zero3_step_bytes, name="zero3_step_bytes")
