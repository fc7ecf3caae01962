"""What each collective sends: ring-algorithm byte counts per rank, per optimizer step.

Taught in ``notebooks/03_memory_anatomy.ipynb`` (the cost side of each ZeRO stage) and
measured in notebooks 01-07.

For a message of M bytes on N ranks, the ring algorithms send, per rank:

* all-reduce: 2·(N-1)/N·M   (a reduce-scatter followed by an all-gather)
* reduce-scatter: (N-1)/N·M
* all-gather: (N-1)/N·M      (M is the size of the full, gathered tensor)

Per optimizer step with Ψ parameters of ``bytes_per_elem`` bytes each (M = Ψ·b):

===========  =====================================  ==========================
stage        collectives                            bytes sent per rank
===========  =====================================  ==========================
0 (DDP)      all-reduce of the gradients            2·(N-1)/N·M
1, 2         reduce-scatter grads, all-gather params 2·(N-1)/N·M
3            all-gather params in forward and       3·(N-1)/N·M
             again in backward, reduce-scatter grads
===========  =====================================  ==========================

The ZeRO paper rounds (N-1)/N to 1 and counts elements: 2Ψ for DDP and ZeRO-1/2,
3Ψ for ZeRO-3 (:func:`paper_volume`).
"""
from __future__ import annotations

import math
from numbers import Real

from ..checks import check_int

__all__ = ["OPS", "GLOO_OPS", "gloo_bytes", "ring_factor", "collective_bytes", "comm_volume", "paper_volume",
           "collective_calls", "sent_bytes"]

OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _check_stage(stage) -> None:
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3 (ZeRO stages), got {stage!r}")


def ring_factor(world_size: int) -> float:
    """(N-1)/N: the share of a message each rank must send in a ring reduce-scatter/all-gather."""
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

    Args:
        num_params: Ψ, the number of parameters (> 0).
        world_size: data-parallel ranks N (>= 1; one rank sends nothing).
        stage: 0 (DDP), 1, 2 or 3.
        bytes_per_elem: bytes per gradient/parameter element communicated (2 for bf16).
        num_layers, skip_last_regather: ZeRO-3 only. ``num_layers`` counts *units*
            (groups gathered separately; a transformer wrapped per block plus a root is
            L blocks + 1 units), assumed equal in size. With ``skip_last_regather`` the
            unit used last in forward is not freed (backward needs it at once), so
            backward re-gathers U-1 of the U units: all-gather volume (2U-1)/U·(N-1)/N·M.
    """
    if isinstance(num_params, bool) or not isinstance(num_params, Real) or not math.isfinite(num_params) \
            or num_params <= 0:
        raise ValueError(f"num_params must be a number > 0 such as 7e9, got {num_params!r}")
    check_int("world_size", world_size, 1, what="number of ranks")
    _check_stage(stage)
    if isinstance(bytes_per_elem, bool) or not isinstance(bytes_per_elem, int) or bytes_per_elem < 1:
        raise ValueError(f"bytes_per_elem must be an int >= 1 (2 for bf16, 4 for fp32), got {bytes_per_elem!r}")
    if skip_last_regather:
        if stage != 3:
            raise ValueError("skip_last_regather only applies to ZeRO-3 (stage=3)")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
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
    """The ZeRO paper's convention: elements moved per rank, (N-1)/N taken as 1.

    2Ψ for DDP and ZeRO-1/2 (reduce-scatter + all-gather = all-reduce), 3Ψ for ZeRO-3.
    """
    _check_stage(stage)
    if isinstance(num_params, bool) or not isinstance(num_params, Real) or num_params <= 0:
        raise ValueError(f"num_params must be a number > 0, got {num_params!r}")
    return _exact((3 if stage == 3 else 2) * num_params)


def collective_calls(stage: int, *, num_layers: int = 1, buckets: int = 1,
                     skip_last_regather: bool = False, num_blocks: int | None = None,
                     reshard_root: bool = False) -> dict:
    """How many collective calls one optimizer step issues, per op.

    Stages 0-2 issue one call per gradient bucket (DDP all-reduces each bucket; ZeRO-1/2
    reduce-scatter each bucket, then all-gather each bucket of updated parameters).

    ZeRO-3 works unit by unit: a *unit* is a group of parameters gathered, freed and
    reduce-scattered together. Each unit is gathered in forward and again in backward, and
    every unit's gradients are reduce-scattered once (not just one unit's). Two ways to say
    how many units:

    - ``num_blocks=L``, the course's convention: a transformer of L blocks, wrapped per
      block plus a *root* unit (embeddings, final norm, the tied output layer), so L + 1
      units. The root is kept gathered from forward to backward, as the course's
      ``Zero3`` and PyTorch FSDP2 do: **2L + 1** all-gathers (each block twice, the root
      once) and L + 1 reduce-scatters; ``reshard_root=True`` frees it after forward too:
      2L + 2 all-gathers. The course GPT (L = 4): 9, or 10.
    - ``num_layers=U``: U units of any kind (blocks and root alike): 2U all-gathers, or
      2U - 1 with ``skip_last_regather=True`` (the unit used last in forward, and so first
      in backward, stays gathered). ``num_layers=L + 1, skip_last_regather=True`` is
      ``num_blocks=L``.
    """
    _check_stage(stage)
    for name, value in (("num_layers", num_layers), ("buckets", buckets)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(reshard_root, bool):
        raise TypeError(f"reshard_root must be True or False, got {reshard_root!r}")
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
    """Bytes rank ``rank`` of ``world`` sends for one call of ``op`` (a name of
    :data:`LEDGER_OPS`) on a message of ``message`` bytes, as :class:`CommLedger` records it
    (``CommRecord.sent_bytes``): ``root`` is the root rank of broadcast, reduce, scatter and
    gather, ``own`` the bytes of this rank's own chunk (all_to_all). Ring ops:
    :func:`collective_bytes` (an int when whole); 0 on one rank or for an empty message."""
    if world <= 1 or message == 0:
        return 0
    if op in OPS:
        return _exact(collective_bytes(op, message, world))
    if op == "broadcast":   # pipelined ring root -> root+1 -> ...: the last one forwards nothing
        return 0 if (rank - root) % world == world - 1 else message
    if op == "reduce":      # pipelined ring ending at the root: everyone but the root sends M
        return 0 if rank == root else message
    if op == "scatter":     # the root sends every other rank its chunk of M bytes
        return (world - 1) * message if rank == root else 0
    if op == "gather":      # every rank but the root sends its chunk
        return 0 if rank == root else message
    if op == "all_to_all":  # everything except the chunk this rank keeps
        return message - own
    if op == "send":
        return message
    return 0                # recv, barrier


#: The collectives whose algorithm on gloo :func:`gloo_bytes` models.
GLOO_OPS = OPS + ("broadcast",)


def gloo_bytes(op: str, message_bytes, world_size: int, rank: int = 0, root: int = 0):
    """Bytes rank ``rank`` sends for one call of ``op`` on gloo's CPU backend, with the
    algorithms gloo actually runs (payload only, no headers), as measured on the wire
    (:mod:`course_utils.runtime.wire`, ``tests/test_wire.py``):

    * all-reduce: ring, 2·(N-1)/N·M, as :func:`collective_bytes`;
    * all-gather: ring, (N-1)/N·M (M the gathered size), as :func:`collective_bytes`;
    * reduce-scatter (``reduce_scatter_tensor``): gloo runs a full all-reduce and keeps the
      rank's chunk, 2·(N-1)/N·M: **twice** the ring reduce-scatter's (N-1)/N·M;
    * broadcast: a binomial tree. In round k the ranks that have the message (relative
      ranks below 2^k) send it to relative rank + 2^k: the root sends M to ⌈log2 N⌉
      ranks, a leaf sends nothing (4 ranks: 2M, M, 0, 0), where a pipelined ring sends
      about M from every rank but the last.

    NCCL picks among ring, tree, NVLS (NVSwitch) and CollNet algorithms by size and
    topology, so on GPUs the ring formulas are a model, not a rule either.
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
