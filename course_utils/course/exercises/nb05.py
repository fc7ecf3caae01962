"""Exercise of ``notebooks/05_zero2.ipynb``: ZeRO-2 (graded on nb04's rank side)."""
from __future__ import annotations



from ...labs.grading import Verdict, grade_build
from ...impl.common import DEFAULT_BUCKET_BYTES
from .nb04 import params_right, zero_on_rank

__all__ = ["check_zero2", "ZERO2_BUCKETS"]


# ------------------------------------------------------------ exercise 05.1: build ZeRO-2
#: The bucket sizes the ZeRO-2 grader tries: one bucket per parameter, and 25 MiB.
ZERO2_BUCKETS = (0, DEFAULT_BUCKET_BYTES)


def _zero2_right(values) -> str:
    per = values[0]
    calls = [seen["rs_in_backward"] for _, seen in per]
    last = per[-1][1]                     # 25 MiB: one bucket per group
    return (f"reduce-scatters during backward {calls} (per parameter, 25 MiB), full gradients freed, "
            f"shard gradients 4·P/N = {last['grad_bytes']:,} B (ZeRO-1 keeps 4·P = "
            f"{4 * last['padded']:,} B), {params_right(values)}")


def check_zero2(cls, *, timeout_s: float = 30, world_sizes=(2, 3, 4)) -> Verdict:
    """Exercise 05.1: ``cls(params, optimizer_class, bucket_bytes=..., **defaults)`` is ZeRO-2,
    checked as ``check_zero1`` plus: one reduce-scatter per bucket in backward, no full
    ``.grad`` left, shard gradients of 4·P/N bytes."""
    return grade_build("zero2", "MyZero2", cls, zero_on_rank, ZERO2_BUCKETS, 2, right=_zero2_right,
                       timeout_s=timeout_s, world_sizes=world_sizes)
