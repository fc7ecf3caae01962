"""What each collective sends: ring-algorithm byte counts per rank, per optimizer step.

Taught in ``notebooks/03_memory_anatomy.ipynb``. For M bytes on N ranks a ring all-reduce
sends 2·(N-1)/N·M per rank, a reduce-scatter or all-gather (M: the full tensor) (N-1)/N·M.
Per step (M = Ψ·b): DDP and ZeRO-1/2 2·(N-1)/N·M, ZeRO-3 3·(N-1)/N·M (gathers twice);
the ZeRO paper rounds (N-1)/N to 1 and counts elements (:func:`paper_volume`).
"""
from __future__ import annotations

from numbers import Real

from ..checks import check_bool, check_int, check_positive

__all__ = ["OPS", "GLOO_OPS", "gloo_bytes", "ring_factor", "collective_bytes", "comm_volume", "paper_volume",
           "collective_calls", "sent_bytes"]

OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _check_stage(stage) -> None:
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3 (ZeRO stages), got {stage!r}")


def ring_factor(world_size: int) -> float:
    """(N-1)/N: the share of a message each rank sends in a ring reduce-scatter/all-gather."""
    check_int("world_size", world_size, 1, what="number of ranks")
    return (world_size - 1) / world_size


def collective_bytes(op: str, message_bytes, world_size: int) -> float:
    """Bytes one rank sends for one ring collective on a message of ``message_bytes``."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, Real) or message_bytes < 0:
        raise ValueError(f"message_bytes must be a number >= 0, got {message_bytes!r}")
    f = ring_factor(world_size)
    return (2 if op == "all_reduce" else 1) * f * message_bytes


def _exact(x):
    return int(x) if float(x).is_integer() else x


def comm_volume(num_params, *, world_size: int, stage: int, bytes_per_elem: int = 2,
                num_layers: int | None = None, skip_last_regather: bool = False) -> dict:
    """Bytes one rank sends per optimizer step, per collective and ``"total"`` (ring algorithms).

    ZeRO-3: ``num_layers`` counts equal-sized *units* U; with ``skip_last_regather`` the unit
    used last in forward stays gathered, so all-gathers send (2U-1)/U·(N-1)/N·M.
    """
    check_positive("num_params", num_params)
    check_int("world_size", world_size, 1, what="number of ranks")
    _check_stage(stage)
    check_int("bytes_per_elem", bytes_per_elem, 1, what="2 for bf16, 4 for fp32")
    if skip_last_regather and stage != 3:
        raise ValueError("skip_last_regather only applies to ZeRO-3 (stage=3)")
    if skip_last_regather and (isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1):
        raise ValueError("skip_last_regather needs num_layers, an int >= 1")
    message = num_params * bytes_per_elem
    out = dict.fromkeys(OPS, 0)
    if stage == 0:
        out["all_reduce"] = collective_bytes("all_reduce", message, world_size)
    else:
        out["reduce_scatter"] = collective_bytes("reduce_scatter", message, world_size)
        gathers = 1.0
        if stage == 3:
            gathers = 2.0 - (1.0 / num_layers if skip_last_regather else 0.0)
        out["all_gather"] = gathers * collective_bytes("all_gather", message, world_size)
    out = {k: _exact(v) for k, v in out.items()}
    out["total"] = _exact(sum(out[k] for k in OPS))
    return out


def paper_volume(num_params, *, stage: int) -> float:
    """The ZeRO paper's elements moved per rank ((N-1)/N taken as 1): 2Ψ, or 3Ψ for ZeRO-3."""
    _check_stage(stage)
    check_positive("num_params", num_params)
    return _exact((3 if stage == 3 else 2) * num_params)


def collective_calls(stage: int, *, num_layers: int = 1, buckets: int = 1,
                     skip_last_regather: bool = False, num_blocks: int | None = None,
                     reshard_root: bool = False) -> dict:
    """Collective calls per optimizer step, per op: stages 0-2 one per gradient bucket.

    ZeRO-3 gathers each unit in forward and again in backward and reduce-scatters every
    unit once. ``num_blocks=L`` (the course's convention): L blocks plus a root unit kept
    gathered from forward to backward (as ``Zero3`` and FSDP2): 2L + 1 all-gathers, 2L + 2
    with ``reshard_root``. ``num_layers=U`` units: 2U, or 2U - 1 with ``skip_last_regather``.
    """
    _check_stage(stage)
    check_int("num_layers", num_layers, 1)
    check_int("buckets", buckets, 1)
    check_bool("reshard_root", reshard_root)
    if num_blocks is not None:
        check_int("num_blocks", num_blocks, 1, what="transformer blocks; the root unit comes on top")
        if stage != 3:
            raise ValueError("num_blocks only applies to ZeRO-3 (stage=3); stages 0-2 count buckets")
        if num_layers != 1 or skip_last_regather:
            raise ValueError("give either num_blocks (blocks, plus the root; reshard_root=True frees "
                             "the root after forward) or num_layers and skip_last_regather (units), "
                             "not both")
        num_layers, skip_last_regather = num_blocks + 1, not reshard_root
    elif reshard_root:
        raise ValueError("reshard_root needs num_blocks (use num_layers=units without "
                         "skip_last_regather for every unit gathered twice)")
    if stage == 0:
        return {"all_reduce": buckets, "reduce_scatter": 0, "all_gather": 0}
    if stage in (1, 2):
        return {"all_reduce": 0, "reduce_scatter": buckets, "all_gather": buckets}
    return {"all_reduce": 0, "reduce_scatter": num_layers,
            "all_gather": 2 * num_layers - (1 if skip_last_regather else 0)}


def sent_bytes(op: str, message: int, world: int, rank: int, root: int, own: int):
    """Bytes ``rank`` sends for one call of ``op`` on ``message`` bytes, as :class:`CommLedger`
    records it; ``own``: this rank's own chunk (all_to_all); 0 on one rank."""
    if world <= 1 or message == 0:
        return 0
    if op in OPS:
        return _exact(collective_bytes(op, message, world))
    return {"broadcast": 0 if (rank - root) % world == world - 1 else message,  # pipelined ring from the root
            "reduce": 0 if rank == root else message,                          # pipelined ring to the root
            "scatter": (world - 1) * message if rank == root else 0,
            "gather": 0 if rank == root else message,
            "all_to_all": message - own,                                       # all but the chunk it keeps
            "send": message}.get(op, 0)                                        # recv, barrier: 0


#: The collectives whose algorithm on gloo :func:`gloo_bytes` models.
GLOO_OPS = OPS + ("broadcast",)


def gloo_bytes(op: str, message_bytes, world_size: int, rank: int = 0, root: int = 0):
    """Payload bytes ``rank`` sends for one call of ``op`` on gloo, as measured on the wire
    (``tests/test_wire.py``): all-reduce and all-gather as the ring; reduce-scatter runs a
    full all-reduce (twice the ring's bytes); broadcast is a binomial tree (4 ranks: 2M, M,
    0, 0). NCCL picks ring, tree, NVLS or CollNet by size and topology: a model there too.
    """
    if op not in GLOO_OPS:
        raise ValueError(f"op must be one of {GLOO_OPS}, got {op!r}")
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    if world_size == 1 or message_bytes == 0:
        return 0
    if op == "broadcast":
        rel = (rank - root) % world_size
        children = sum(1 for k in range(world_size.bit_length() + 1)
                       if 2 ** k > rel and rel + 2 ** k < world_size)
        return children * message_bytes
    return _exact(collective_bytes("all_reduce" if op == "reduce_scatter" else op, message_bytes,
                                   world_size))
