"""The ring all-reduce: simulated step by step, and run for real with send/recv.

Taught in ``notebooks/01_collectives.ipynb``. N ranks stand in a ring; each sends only
to its right-hand neighbour (rank r -> r+1 mod N). Each rank cuts its vector into N
chunks, named a, b, c, ...; ``b2`` is rank 2's chunk b.

* Reduce-scatter, N-1 steps: at step s (from 0) rank r sends chunk (r - 1 - s) mod N
  to rank r+1, which adds it to its own copy of that chunk. Afterwards rank r holds the
  complete sum of chunk r: exactly what ``dist.reduce_scatter`` leaves on rank r.
* All-gather, N-1 steps: at step s rank r sends chunk (r - s) mod N, complete, to rank
  r+1, which overwrites its copy. Afterwards every rank holds every complete sum.

Every step, every rank sends one chunk of M/N bytes: 2(N-1) chunks in all, so
2(N-1)/N·M bytes per rank, whatever N (``comm.collective_bytes("all_reduce", M, N)``).

:mod:`course_utils.course.ring_view` draws the simulation.
"""
from __future__ import annotations

import string

from ..checks import check_int, check_number
from ..theory.layout import padded_numel

__all__ = ["ring_all_reduce_steps", "bytes_sent_per_rank", "chunk_label", "describe_step",
           "describe_ring", "ring_all_reduce"]

MAX_SIM_RANKS = 26  # one letter per chunk


# ----------------------------------------------------------------- the simulation

def ring_all_reduce_steps(world_size: int) -> list[dict]:
    """The 2(N-1) steps of the ring all-reduce on ``world_size`` ranks, as JSON-able records:
    ``index``, ``phase``, ``phase_step`` (from 1), ``phase_steps`` (N-1); ``sends``, one
    ``{"src", "dst", "chunk", "contributors"}`` per rank; ``state[rank][chunk]``, after the
    step, the sorted ranks whose contributions that copy sums (``[0, 1]`` is ``a0+a1``)."""
    check_int("world_size", world_size, 1, MAX_SIM_RANKS)
    n = world_size
    state = [[[rank] for _chunk in range(n)] for rank in range(n)]  # nothing summed yet
    steps = []
    for phase, first_chunk in (("reduce-scatter", -1), ("all-gather", 0)):
        for s in range(n - 1):
            # Everyone sends at once: read every payload before anyone receives.
            sends = [{"src": r, "dst": (r + 1) % n, "chunk": (r + first_chunk - s) % n}
                     for r in range(n)]
            for send in sends:
                send["contributors"] = list(state[send["src"]][send["chunk"]])
            for send in sends:
                mine = state[send["dst"]][send["chunk"]]
                if phase == "reduce-scatter":  # add: the two partial sums never overlap
                    assert not set(mine) & set(send["contributors"])
                    state[send["dst"]][send["chunk"]] = sorted(mine + send["contributors"])
                else:  # all-gather: overwrite with the complete sum
                    state[send["dst"]][send["chunk"]] = list(send["contributors"])
            steps.append({"index": len(steps), "phase": phase, "phase_step": s + 1, "phase_steps": n - 1,
                          "sends": sends, "state": [[list(c) for c in rank] for rank in state]})
    return steps


def bytes_sent_per_rank(world_size: int, message_bytes) -> float:
    """Bytes each rank sends in a ring all-reduce of M bytes, counting the simulation's sends
    of M/N bytes each: 2(N-1)/N·M, ``comm.collective_bytes("all_reduce", M, N)``."""
    check_number("message_bytes", message_bytes, minimum=0)
    steps = ring_all_reduce_steps(world_size)
    sends = [0] * world_size
    for step in steps:
        for send in step["sends"]:
            sends[send["src"]] += 1
    assert len(set(sends)) == 1, "in a ring every rank sends the same amount"
    return sends[0] * message_bytes / world_size


def chunk_label(chunk: int, contributors) -> str:
    """``"a0+a1"``: chunk ``a`` summed over ranks 0 and 1 (``"Σb"`` for all of 5+ ranks)."""
    check_int("chunk", chunk, 0, MAX_SIM_RANKS - 1)
    letter = string.ascii_lowercase[chunk]
    ranks = list(contributors)
    if len(ranks) > 4:
        return f"{letter}{ranks[0]}+…+{letter}{ranks[-1]}"
    return "+".join(f"{letter}{r}" for r in ranks)


def _send_text(send: dict) -> str:
    return f"{send['src']}->{send['dst']} {chunk_label(send['chunk'], send['contributors'])}"


def describe_step(step: dict) -> str:
    """One step in words: the sends, then what each rank holds afterwards."""
    n = len(step["state"])
    lines = [f"step {step['index'] + 1} of {2 * (n - 1)}, {step['phase']} "
             f"{step['phase_step']}/{step['phase_steps']}: "
             + ", ".join(_send_text(s) for s in step["sends"])]
    for rank, chunks in enumerate(step["state"]):
        lines.append(f"  rank {rank}: " + " | ".join(chunk_label(c, who) for c, who in enumerate(chunks)))
    return "\n".join(lines)


def describe_ring(steps: list[dict]) -> str:
    """The whole ring all-reduce in words (deterministic: what notebooks show as text)."""
    if not steps:
        return "ring all-reduce on 1 rank: nothing to send"
    n = len(steps[0]["state"])
    names = ", ".join(string.ascii_lowercase[:n])
    head = [f"ring all-reduce on {n} ranks: each rank cuts its vector into {n} chunks ({names});",
            f"rank r sends only to rank r+1 mod {n}. 'a0+a1' is the sum of chunk a of ranks 0 and 1.",
            f"Rank r starts with the chunk before its own, so after {n - 1} steps it holds the whole sum of "
            f"chunk r (the reduce-scatter); {n - 1} more pass the sums on (the all-gather)."]
    tail = [f"each rank sent {len(steps)} chunks of M/{n}: {len(steps)}/{n}·M = 2(N-1)/N·M bytes."]
    return "\n".join(head + [describe_step(s) for s in steps] + tail)


# ------------------------------------------------------------------- the real thing

def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks, in place, with a ring of point-to-point messages.

    Call it on every rank of the current process group. Any number of elements: the
    flat tensor is padded with zeros to N equal chunks. Returns ``tensor``.
    Same result as ``dist.all_reduce(tensor)``: exactly for small integers in float32,
    up to rounding otherwise (the additions happen in another order).
    """
    import torch
    import torch.distributed as dist

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not dist.is_initialized():
        raise RuntimeError("no process group: run this on ranks, e.g. launch(fn, 4)")
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return tensor
    numel = tensor.numel()
    size = padded_numel(numel, n) // n  # elements per chunk
    chunks = torch.zeros(n, size, dtype=tensor.dtype, device=tensor.device)
    chunks.view(-1)[:numel] = tensor.reshape(-1)
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty(size, dtype=tensor.dtype, device=tensor.device)

    for s in range(n - 1):  # reduce-scatter: add what arrives
        send_c, recv_c = (rank - 1 - s) % n, (rank - 2 - s) % n
        request = dist.isend(chunks[send_c], dst=right)  # isend: if all ranks blocked in send, none would recv
        dist.recv(incoming, src=left)
        request.wait()
        chunks[recv_c] += incoming
    # Now chunks[rank] holds the complete sum of chunk `rank`.
    for s in range(n - 1):  # all-gather: overwrite with the complete sum
        send_c, recv_c = (rank - s) % n, (rank - 1 - s) % n
        request = dist.isend(chunks[send_c], dst=right)
        dist.recv(chunks[recv_c], src=left)
        request.wait()

    tensor.copy_(chunks.view(-1)[:numel].reshape(tensor.shape))
    return tensor
