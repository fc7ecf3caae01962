"""The ring all-reduce: simulated step by step, drawn, and run for real with send/recv.

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

:func:`ring_all_reduce_steps` simulates this symbolically (which ranks' contributions
each chunk holds), :func:`draw_ring_step` and :func:`draw_ring_sequence` draw it,
:func:`ring_step_widget` steps through it, and :func:`ring_all_reduce` does it for real
with ``dist.isend``/``dist.recv`` (the reference solution of the exercise).
"""
from __future__ import annotations

import base64
import io
import string

from ..checks import check_int
from ..runtime import widgets

__all__ = ["ring_all_reduce_steps", "bytes_sent_per_rank", "chunk_label", "describe_step",
           "describe_ring", "ring_all_reduce", "draw_ring_step", "draw_ring_sequence",
           "ring_figure_data", "ring_figure_draw", "RingStepper", "ring_step_widget"]

MAX_SIM_RANKS = 26  # one letter per chunk
MAX_DRAW_RANKS = 8  # beyond this the boxes get too small to read

_FULL = "#D5ECD4"      # a chunk that holds the complete sum
_NEW = "#F6C28B"       # the chunk a rank just received
_ARROW = "#C44E52"


# ----------------------------------------------------------------- the simulation

def _record(index: int, phase: str, phase_step: int, world_size: int, sends: list, state: list) -> dict:
    return {"index": index, "phase": phase, "phase_step": phase_step, "phase_steps": world_size - 1,
            "sends": sends, "state": [[list(c) for c in rank] for rank in state]}


def ring_all_reduce_steps(world_size: int) -> list[dict]:
    """Simulate the ring all-reduce on ``world_size`` ranks; one record per step.

    Each record (plain lists, dicts, ints and strings: JSON-able) has

    * ``index`` (0-based over all steps), ``phase`` (``"reduce-scatter"`` or
      ``"all-gather"``), ``phase_step`` (1-based) and ``phase_steps`` (N-1);
    * ``sends``: one ``{"src", "dst", "chunk", "contributors"}`` per rank: the chunk
      index it sends to its right neighbour and whose contributions that chunk held;
    * ``state``: after the step, ``state[rank][chunk]`` is the sorted list of ranks whose
      contributions the rank's copy of the chunk now sums (``[0, 1]`` is ``a0+a1``).

    There are 2(N-1) records: N-1 reduce-scatter steps, then N-1 all-gather steps.
    """
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
            steps.append(_record(len(steps), phase, s + 1, n, sends, state))
    return steps


def bytes_sent_per_rank(world_size: int, message_bytes) -> float:
    """Bytes each rank sends in a ring all-reduce of M bytes, counted from the simulation.

    Every send is one chunk of M/N bytes; this counts them. It equals
    ``comm.collective_bytes("all_reduce", M, N)`` = 2(N-1)/N·M.
    """
    if isinstance(message_bytes, bool) or not isinstance(message_bytes, (int, float)) or message_bytes < 0:
        raise ValueError(f"message_bytes must be a number >= 0, got {message_bytes!r}")
    steps = ring_all_reduce_steps(world_size)
    sends = [0] * world_size
    for step in steps:
        for send in step["sends"]:
            sends[send["src"]] += 1
    assert len(set(sends)) == 1, "in a ring every rank sends the same amount"
    return sends[0] * message_bytes / world_size


def chunk_label(chunk: int, contributors) -> str:
    """``"a0+a1"``: chunk ``a`` summed over ranks 0 and 1 (``"Σb"`` for all of 5+ ranks)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk < MAX_SIM_RANKS:
        raise ValueError(f"chunk must be an int in 0..{MAX_SIM_RANKS - 1}, got {chunk!r}")
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
            f"rank r sends only to rank r+1 mod {n}. 'a0+a1' is the sum of chunk a of ranks 0 and 1."]
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
    size = -(-numel // n)  # elements per chunk, ceil(numel / n)
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


# ------------------------------------------------------------------------- drawings

def _positions(n: int):
    """Box centres on a circle, rank 0 at the top, going clockwise."""
    import math

    return [(math.sin(2 * math.pi * r / n), math.cos(2 * math.pi * r / n)) for r in range(n)]


def draw_ring_step(steps: list[dict], index: int, ax=None):
    """Draw step ``steps[index]``: each rank's chunks after the step, arrows for its sends.

    A chunk holding the complete sum is green, the chunk a rank just received is orange.
    Returns the matplotlib Figure (a new one when ``ax`` is None).
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if not isinstance(steps, list) or not steps:
        raise ValueError("steps must be the non-empty list ring_all_reduce_steps(world_size) returns")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(steps):
        raise ValueError(f"index must be an int in 0..{len(steps) - 1}, got {index!r}")
    step = steps[index]
    n = len(step["state"])
    if n > MAX_DRAW_RANKS:
        raise ValueError(f"drawings are readable up to {MAX_DRAW_RANKS} ranks, got {n}")
    if ax is None:
        ax = Figure(figsize=(4.2, 4.2)).subplots()
    radius = 1.4 if n <= 4 else 2.0
    width, row = (0.95, 0.17) if n <= 4 else (0.9, 0.13)
    font = 7.5 if n <= 4 else 6
    height = row * n + 0.06
    received = {(s["dst"], s["chunk"]) for s in step["sends"]}
    boxes = []
    for rank, (x, y) in enumerate(_positions(n)):
        x, y = radius * x, radius * y
        box = FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                             boxstyle="round,pad=0.02", facecolor="white", edgecolor="black", linewidth=0.8)
        ax.add_patch(box)
        boxes.append((box, (x, y)))
        ax.text(x, y + height / 2 + 0.04, f"rank {rank}", ha="center", va="bottom", fontsize=font + 0.5,
                fontweight="bold")
        for c, who in enumerate(step["state"][rank]):
            cy = y + height / 2 - 0.03 - row * (c + 0.5)
            face = _NEW if (rank, c) in received else (_FULL if len(who) == n else "white")
            ax.add_patch(FancyBboxPatch((x - width / 2 + 0.03, cy - row * 0.42), width - 0.06, row * 0.84,
                                        boxstyle="square,pad=0", facecolor=face, edgecolor="none"))
            ax.text(x, cy, chunk_label(c, who), ha="center", va="center", fontsize=font, family="monospace")
    for send in step["sends"]:
        (box_a, (xa, ya)), (box_b, (xb, yb)) = boxes[send["src"]], boxes[send["dst"]]
        ax.add_patch(FancyArrowPatch((xa, ya), (xb, yb), patchA=box_a, patchB=box_b,
                                     connectionstyle="arc3,rad=-0.3", arrowstyle="-|>", mutation_scale=10,
                                     color=_ARROW, linewidth=1.2))
        # The label sits on the curve: its midpoint bulges out by rad/2 of the chord.
        mx, my = (xa + xb) / 2 + 0.15 * (ya - yb), (ya + yb) / 2 + 0.15 * (xb - xa)
        ax.text(mx, my, chunk_label(send["chunk"], send["contributors"]), ha="center", va="center",
                fontsize=font, color=_ARROW, family="monospace",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.9})
    lim = radius + width / 2 + 0.2
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim + 0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"step {index + 1}/{len(steps)}: {step['phase']} {step['phase_step']}/{step['phase_steps']}",
                 fontsize=font + 2)
    return ax.figure


def ring_figure_data(world_size: int = 4) -> dict:
    """The numbers the ``ring_all_reduce`` figure draws (JSON-able)."""
    check_int("world_size", world_size, 1, MAX_DRAW_RANKS)
    if world_size < 2:
        raise ValueError("a ring needs at least 2 ranks")
    return {"world_size": world_size, "steps": ring_all_reduce_steps(world_size)}


def ring_figure_draw(data: dict):
    """All 2(N-1) steps as panels: reduce-scatter on the top row, all-gather below."""
    from matplotlib.figure import Figure

    n, steps = data["world_size"], data["steps"]
    cols = n - 1
    fig = Figure(figsize=(3.6 * max(cols, 2), 7.8))
    axes = fig.subplots(2, cols, squeeze=False)
    for i in range(len(steps)):
        draw_ring_step(steps, i, ax=axes[i // cols][i % cols])
    fig.suptitle(f"Ring all-reduce on {n} ranks: top row reduce-scatter, bottom row all-gather.\n"
                 f"Each arrow carries one chunk (M/{n} bytes); orange = just received, "
                 "green = complete sum.", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def draw_ring_sequence(world_size: int = 4):
    """A figure with every step of the ring all-reduce on ``world_size`` ranks (2 to 8)."""
    return ring_figure_draw(ring_figure_data(world_size))


# --------------------------------------------------------------------------- widget

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return base64.b64encode(buf.getvalue()).decode()


class RingStepper:
    """A slider that steps through the ring all-reduce, one drawing per step.

    Without a widget frontend (nbval, GitHub) it shows as the text of every step and a
    figure of all the steps.
    """

    def __init__(self, world_size: int = 4):
        import ipywidgets as w

        self.data = ring_figure_data(world_size)
        self.steps = self.data["steps"]
        self.slider = w.IntSlider(value=1, min=1, max=len(self.steps), description="step",
                                  continuous_update=False)
        self.out = w.Output()
        self.slider.observe(lambda _change: self._render(), names="value")
        self.box = w.VBox([self.slider, self.out])
        self._render()

    def _render(self):
        # Set the Output widget's content directly (not `with out:` + display), so nothing
        # leaks into the cell's own outputs.
        index = self.slider.value - 1
        step = self.steps[index]
        self.out.outputs = (
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": _png(draw_ring_step(self.steps, index)),
                      "text/plain": f"<ring step {index + 1}>"}},
            {"output_type": "stream", "name": "stdout", "text": describe_step(step) + "\n"},
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return widgets.bundle(self.box, describe_ring(self.steps), {"image/png": _png(ring_figure_draw(self.data))})


def ring_step_widget(world_size: int = 4) -> RingStepper:
    """A :class:`RingStepper` for ``world_size`` ranks (2 to 8); display it in a notebook."""
    return RingStepper(world_size)
