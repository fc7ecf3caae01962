"""Exercise of ``notebooks/09_appendix_forensics.ipynb``: Megatron's weight-and-optimizer figure."""
from __future__ import annotations

from typing import Callable

from ...labs.grading import Verdict, grade_cases

__all__ = ["check_megatron_states_gb", "megatron_states_gb"]

#: gpt2-xl as Megatron counts it (its "most loaded shard"), and a 7B model.
_CASES = [dict(num_params=p, dp=dp, distributed_optimizer=d) for p, dp, d in (
    (1_555_356_800, 1, False), (1_555_356_800, 4, False), (1_555_356_800, 4, True),
    (1_555_356_800, 8, True), (7_000_000_000, 1, True), (7_000_000_000, 64, True))]


def megatron_states_gb(num_params: float, dp: int, distributed_optimizer: bool) -> float:
    """Megatron-LM's "weight and optimizer" GB per GPU (bf16 weights, fp32 grads): 18 B per
    parameter, or 6 + 12/dp with ``--use-distributed-optimizer`` (master copy and moments sharded)."""
    return num_params * ((6 + 12 / dp) if distributed_optimizer else 18) / 1e9


def check_megatron_states_gb(fn: Callable) -> Verdict:
    """Exercise 09.1: ``fn(num_params, dp, distributed_optimizer)`` -> GB per GPU."""
    return grade_cases(fn, _CASES, megatron_states_gb, name="megatron_states_gb")
