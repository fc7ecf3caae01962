"""What ZeRO-1 and ZeRO-2 must hold and send, predicted from the buckets' sizes Ψ_b alone.

Held (fp32, B buckets, P = Σ padded P_b): params 4·P; grads 4·P (ZeRO-1) or 4·P/N (ZeRO-2);
optimizer 8·P/N + 4·B (AdamW's m, v and a float32 step counter per shard). Mixed: 2·P, 2·P
or 2·P/N, 12·P/N + 4·B. Sent: DDP's all-reduce exactly when every Ψ_b divides by N.
"""
from __future__ import annotations

from ..checks import check_int
from .comm import collective_bytes
from .layout import padded_numel
from .memory import model_states

__all__ = ["STEP_COUNTER_BYTES", "expected_state_bytes", "expected_comm_bytes", "expected_peak_grad_bytes"]

#: Bytes of AdamW's ``state["step"]``: a 0-dim float32 tensor per parameter it updates.
STEP_COUNTER_BYTES = 4


def expected_state_bytes(bucket_numels, world_size: int, stage: int, *, mixed: bool = False,
                         frozen_bytes: int = 0) -> dict:
    """``model_states(Σ P_b, ...)`` plus a step counter per bucket and the frozen parameters."""
    padded = sum(padded_numel(k, world_size) for k in bucket_numels)
    ms = model_states(padded, world_size=world_size, stage=stage, recipe="mixed" if mixed else "fp32")
    return {"params": int(ms.params) + frozen_bytes, "grads": int(ms.grads),
            "optimizer": int(ms.optimizer) + STEP_COUNTER_BYTES * len(bucket_numels)}


def expected_peak_grad_bytes(bucket_numels, world_size: int, *, bytes_per_elem: int = 4) -> int:
    """ZeRO-2's gradient peak on a rank (05 §4): the shard's gradient, Σ P_b/N, plus the largest
    bucket twice, its ``.grad``s (Ψ_b) and its padded message (P_b), both alive when it is sent."""
    if not bucket_numels:
        raise ValueError("bucket_numels is empty: give each bucket's trainable element count")
    largest = max(bucket_numels)
    shard = sum(padded_numel(k, world_size) // world_size for k in bucket_numels)
    return bytes_per_elem * (shard + largest + padded_numel(largest, world_size))


def expected_comm_bytes(bucket_numels, world_size: int, steps: int = 1, *,
                        variant: str = "reduce_scatter", bytes_per_elem: int = 4,
                        micro_batches: int = 1) -> dict:
    """Bytes one rank sends over ``steps`` steps; ZeRO-2 reduce-scatters ``micro_batches`` times a step."""
    check_int("micro_batches", micro_batches, 1)
    if variant == "allreduce" and micro_batches != 1:
        raise ValueError("variant='allreduce' is ZeRO-1's, which reduces once per step whatever "
                         "the micro-batches: leave micro_batches=1")
    out = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    grad_op = "all_reduce" if variant == "allreduce" else "reduce_scatter"
    for k in bucket_numels:
        m = padded_numel(k, world_size) * bytes_per_elem
        out[grad_op] += steps * micro_batches * collective_bytes(grad_op, m, world_size)
        out["all_gather"] += steps * collective_bytes("all_gather", m, world_size)
    return {k: int(v) if float(v).is_integer() else v for k, v in out.items()}
