"""Exercises of ``notebooks/00_orientation.ipynb``: a rank sum."""
from __future__ import annotations

from typing import Callable

from ...labs.grading import Verdict, brief, compare_brief, judge_on_ranks, refuse_non_function

__all__ = ["check_rank_sum"]


def _with_calls(fn: Callable):
    """On a rank: ``fn()`` and how many collectives it called (``CommLedger``)."""
    from ...runtime.ledger import CommLedger
    with CommLedger() as ledger:
        value = fn()
    return value, sum(ledger.counts().values())


def check_rank_sum(fn: Callable) -> Verdict:
    """Exercise 00.1: every rank returns the sum over ranks of (rank + 1), through a collective
    (the formula n(n+1)/2 gives the number without one, and is refused)."""
    if (refused := refuse_non_function(fn, "rank_sum")) is not None:
        return refused

    def judge(out, rank, n):
        value, calls = out
        if why := compare_brief(value, float(n * (n + 1) // 2), atol=1e-6):
            return why, ""
        if not calls:
            return ("the right number, but no collective was called: each rank knows only its own "
                    "rank + 1; combine the ranks' values with one collective"), ""
        return "", f"returned {brief(value)}"

    return judge_on_ranks(_with_calls, judge, world_sizes=(2, 4), name="rank_sum", args=(fn,), timeout_s=30)
