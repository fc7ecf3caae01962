"""Exercises of ``notebooks/01_collectives.ipynb``: all-reduce from RS + AG, and a ring all-reduce."""
from __future__ import annotations

from typing import Callable, Sequence

from ...labs.grading import Verdict, compare_brief, dist_replaced, judge_on_ranks, refuse_non_function

__all__ = ["NotAllowed", "check_all_reduce_from_rs_ag", "check_ring_all_reduce"]


class NotAllowed(RuntimeError):
    """Raised on a rank when an exercise's function calls a collective it must build itself."""


# Collectives the learner may not call (looked up on ``torch.distributed`` at call time).
_REDUCTIONS = ("all_reduce", "all_reduce_coalesced", "reduce")
# the pickling collectives move whole objects: an all_gather_object of every tensor then a local sum
# is not the algorithm either
_OBJECTS = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
            "send_object_list", "recv_object_list")
_NOT_IN_RS_AG = _REDUCTIONS + _OBJECTS + ("broadcast", "scatter", "gather", "all_to_all", "all_to_all_single",
                                          "send", "recv", "isend", "irecv", "batch_isend_irecv")
_NOT_IN_RING = _REDUCTIONS + _OBJECTS + ("broadcast", "scatter", "gather", "all_to_all", "all_to_all_single",
                              "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
                              "_reduce_scatter_base", "all_gather", "all_gather_single",
                              "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced")


def _exercise_input(rank: int, numel: int, device=None, dtype: str = "float32"):
    """Rank r's input: ``100*(r+1) + i`` at position i, of ``dtype`` (sums are exact)."""
    import torch
    return torch.arange(numel, dtype=getattr(torch, dtype), device=device) + 100.0 * (rank + 1)


# checked for their peer; isend and irecv are left as they are, since P2POp accepts only the real ones
_POINT_TO_POINT = ("send", "recv", "batch_isend_irecv")


def _to_neighbours(call: Callable, name: str, rule: str) -> Callable:
    """``call`` (dist.send, ...), refusing a peer that is not this rank's left or right neighbour."""
    import torch.distributed as dist
    def peers(args, kwargs):
        if name == "batch_isend_irecv":
            return [op.peer for op in (args[0] if args else kwargs["p2p_op_list"])]
        peer = args[1] if len(args) > 1 else kwargs.get("dst", kwargs.get("src"))
        return [peer]
    def checked(*args, **kwargs):
        rank, n = dist.get_rank(), dist.get_world_size()
        for peer in peers(args, kwargs):
            if peer is not None and peer not in ((rank + 1) % n, (rank - 1) % n):
                raise NotAllowed(f"dist.{name} between rank {rank} and rank {peer}, not neighbours "
                                 f"on the ring of {n}: {rule}")
        return call(*args, **kwargs)
    return checked


def _run_without(fn: Callable, numels: Sequence[int], forbidden: tuple, rule: str,
                 neighbours_only: bool = False, dtype: str = "float32") -> list:
    """Per size, what ``fn`` returned (or its input, when None) while ``forbidden`` collectives raise
    (and, ``neighbours_only``, point-to-point calls to any rank but the two neighbours), and the
    collectives it called (``CommLedger.counts()``)."""
    import torch.distributed as dist
    from ...runtime.launch import rank_device
    from ...runtime.ledger import CommLedger
    def refuse(name):
        def blocked(*args, **kwargs):
            raise NotAllowed(f"dist.{name} is not allowed in this exercise: {rule}")
        return blocked
    patched = {name: refuse(name) for name in forbidden if hasattr(dist, name)}
    if neighbours_only:                          # allowed, but only between neighbours
        patched.update({name: _to_neighbours(getattr(dist, name), name, rule) for name in _POINT_TO_POINT})
    results = []
    for numel in numels:
        tensor = _exercise_input(dist.get_rank(), numel, rank_device(), dtype)  # the CPU: graders run gloo
        try:
            with dist_replaced(patched), CommLedger() as ledger:
                result = fn(tensor)
        except Exception as exc:
            if exc.args and isinstance(exc.args[0], str):    # say which size failed, keep the type
                exc.args = (f"with {numel} elements: {exc.args[0]}",) + exc.args[1:]
            raise
        results.append((tensor if result is None else result, ledger.counts()))
    return results


def _sizes(numels: Sequence[int]) -> str:        # "5, 7 and 13 elements"
    words = [str(k) for k in numels]
    return (", ".join(words[:-1]) + " and " if len(words) > 1 else "") + f"{words[-1]} elements"


def _grade_sums(fn: Callable, *, numels: Sequence[int], forbidden: tuple, rule: str, name: str,
                calls: dict | None = None, neighbours_only: bool = False, dtype: str = "float32") -> Verdict:
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    tensors = (f"a {dtype} tensor" if dtype != "float32" else "a tensor") if len(numels) == 1 else "tensors"
    print(f"rank r gets {tensors} of {_sizes(numels)}, 100*(r+1) + i at position i; "
          "the sums are compared exactly:")
    def judge(values, rank, n):
        for numel, (got, counts) in zip(numels, values):
            if why := compare_brief(got, sum(_exercise_input(r, numel, dtype=dtype) for r in range(n)), atol=0):
                return f"{numel} elements: {why}", ""
            if str(got.dtype) != f"torch.{dtype}":
                return (f"{numel} elements: the right sum, but as {str(got.dtype).removeprefix('torch.')} for a {dtype} input: "
                        "make each buffer with the input's dtype"), ""
            for op, want in (calls or {}).items():
                if counts.get(op, 0) != want:
                    return (f"{numel} elements: {counts.get(op, 0)} {op.replace('_', '-')} call(s), expected "
                            f"{want}: {rule}"), ""
        return "", f"returned the sum ({_sizes(numels)})"
    return judge_on_ranks(_run_without, judge, world_sizes=(2, 3, 4), name=name,
                          args=(fn, tuple(numels), forbidden, rule, neighbours_only, dtype), timeout_s=20)


def check_all_reduce_from_rs_ag(fn: Callable) -> Verdict:
    """Exercise 01.1: an all-reduce from a reduce-scatter and an all-gather (10 elements: pad, strip;
    float64, so that a buffer made without the input's dtype is caught)."""
    return _grade_sums(fn, numels=(10,), forbidden=_NOT_IN_RS_AG, name="all_reduce_from_rs_ag", dtype="float64",
                       rule="one reduce-scatter (each rank sums its own chunk), then one all-gather",
                       calls={"reduce_scatter": 1, "all_gather": 1})


def check_ring_all_reduce(fn: Callable) -> Verdict:
    """Exercise 01.2: a ring all-reduce (5 elements on 4 ranks catch ``chunk(n)`` without padding)."""
    return _grade_sums(fn, numels=(5, 7, 13), forbidden=_NOT_IN_RING, name="ring_all_reduce",
                       rule="use only send/recv (or isend/irecv) between neighbours", neighbours_only=True)
