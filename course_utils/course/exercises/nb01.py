"""Exercises of ``notebooks/01_collectives.ipynb``: all-reduce from RS + AG, and a ring all-reduce."""
from __future__ import annotations

from typing import Callable, Sequence

from ...harness.grading import Verdict, compare_brief, judge_on_ranks, refuse_non_function

__all__ = ["NotAllowed", "check_all_reduce_from_rs_ag", "check_ring_all_reduce"]


class NotAllowed(RuntimeError):
    """Raised on a rank when an exercise's function calls a collective it must build itself."""


# Collectives the learner may not call (looked up on ``torch.distributed`` at call time).
_REDUCTIONS = ("all_reduce", "all_reduce_coalesced", "reduce")
_NOT_IN_RS_AG = _REDUCTIONS + ("broadcast", "scatter", "gather", "all_to_all", "all_to_all_single",
                               "send", "recv", "isend", "irecv", "batch_isend_irecv")
_NOT_IN_RING = _REDUCTIONS + ("broadcast", "scatter", "gather", "all_to_all", "all_to_all_single",
                              "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
                              "_reduce_scatter_base", "all_gather", "all_gather_single",
                              "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced")


def _exercise_input(rank: int, numel: int, device=None):
    """Rank r's input: ``100*(r+1) + i`` at position i, float32 (sums are exact)."""
    import torch
    return torch.arange(numel, dtype=torch.float32, device=device) + 100.0 * (rank + 1)


def _run_without(fn: Callable, numels: Sequence[int], forbidden: tuple, rule: str) -> list:
    """Per size, what ``fn`` returned (or its input, when None) while ``forbidden`` collectives raise,
    and the collectives it called (``CommLedger.counts()``)."""
    import torch.distributed as dist
    from ...runtime.launch import rank_device
    from ...runtime.ledger import CommLedger
    def refuse(name):
        def blocked(*args, **kwargs):
            raise NotAllowed(f"dist.{name} is not allowed in this exercise: {rule}")
        return blocked
    saved = {name: getattr(dist, name) for name in forbidden if hasattr(dist, name)}
    results = []
    for numel in numels:
        tensor = _exercise_input(dist.get_rank(), numel, rank_device())  # the CPU: graders run gloo
        for name in saved:
            setattr(dist, name, refuse(name))
        try:
            with CommLedger() as ledger:
                result = fn(tensor)
        except Exception as exc:
            if exc.args and isinstance(exc.args[0], str):    # say which size failed, keep the type
                exc.args = (f"with {numel} elements: {exc.args[0]}",) + exc.args[1:]
            raise
        finally:
            for name, original in saved.items():
                setattr(dist, name, original)
        results.append((tensor if result is None else result, ledger.counts()))
    return results


def _sizes(numels: Sequence[int]) -> str:        # "5, 7 and 13 elements"
    words = [str(k) for k in numels]
    return (", ".join(words[:-1]) + " and " if len(words) > 1 else "") + f"{words[-1]} elements"


def _grade_sums(fn: Callable, *, numels: Sequence[int], forbidden: tuple, rule: str, name: str,
                calls: dict | None = None) -> Verdict:
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    tensors = "a tensor" if len(numels) == 1 else "tensors"
    print(f"rank r gets {tensors} of {_sizes(numels)}, 100*(r+1) + i at position i; "
          "the sums are compared exactly:")
    def judge(values, rank, n):
        for numel, (got, counts) in zip(numels, values):
            if why := compare_brief(got, sum(_exercise_input(r, numel) for r in range(n)), atol=0):
                return f"{numel} elements: {why}", ""
            for op, want in (calls or {}).items():
                if counts.get(op, 0) != want:
                    return (f"{numel} elements: {counts.get(op, 0)} {op.replace('_', '-')} call(s), expected "
                            f"{want}: {rule}"), ""
        return "", f"returned the sum ({_sizes(numels)})"
    return judge_on_ranks(_run_without, judge, world_sizes=(2, 3, 4), name=name,
                          args=(fn, tuple(numels), forbidden, rule), timeout_s=20)


def check_all_reduce_from_rs_ag(fn: Callable) -> Verdict:
    """Exercise 01.1: an all-reduce from a reduce-scatter and an all-gather (10 elements: pad, strip)."""
    return _grade_sums(fn, numels=(10,), forbidden=_NOT_IN_RS_AG, name="all_reduce_from_rs_ag",
                       rule="one reduce-scatter (each rank sums its own chunk), then one all-gather",
                       calls={"reduce_scatter": 1, "all_gather": 1})


def check_ring_all_reduce(fn: Callable) -> Verdict:
    """Exercise 01.2: a ring all-reduce (5 elements on 4 ranks catch ``chunk(n)`` without padding)."""
    return _grade_sums(fn, numels=(5, 7, 13), forbidden=_NOT_IN_RING, name="ring_all_reduce",
                       rule="use only send/recv (or isend/irecv) between neighbours")
