"""The ring all-reduce of :mod:`course_utils.impl.ring` drawn: one step, every step (the
``ring_all_reduce`` figure of notebook 01), and a slider that steps through it."""
from __future__ import annotations

import math

from ..checks import check_int
from ..impl.ring import chunk_label, describe_ring, describe_step, ring_all_reduce_steps
from . import widgets

__all__ = ["draw_ring_step", "draw_ring_sequence", "RingStepper", "ring_step_widget"]

MAX_DRAW_RANKS = 8  # beyond this the boxes get too small to read

_FULL = "#D5ECD4"      # a chunk that holds the complete sum
_NEW = "#F6C28B"       # the chunk a rank just received
_ARROW = "#C44E52"


def draw_ring_step(steps: list[dict], index: int, ax=None):
    """Step ``steps[index]``: each rank's chunks after it (green: the complete sum, orange: just
    received), arrows for its sends. Returns the Figure (a new one when ``ax`` is None)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if not isinstance(steps, list) or not steps:
        raise ValueError("steps must be the non-empty list ring_all_reduce_steps(world_size) returns")
    check_int("index", index, 0, len(steps) - 1)
    step = steps[index]
    n = len(step["state"])
    if n > MAX_DRAW_RANKS:
        raise ValueError(f"drawings are readable up to {MAX_DRAW_RANKS} ranks, got {n}")
    if ax is None:
        ax = Figure(figsize=(4.2, 4.2)).subplots()
    radius, width, row, font = (1.4, 0.95, 0.17, 7.5) if n <= 4 else (2.0, 0.9, 0.13, 6)
    height = row * n + 0.06
    received = {(s["dst"], s["chunk"]) for s in step["sends"]}
    boxes = []
    for rank in range(n):  # on a circle, rank 0 at the top, clockwise
        x, y = radius * math.sin(2 * math.pi * rank / n), radius * math.cos(2 * math.pi * rank / n)
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
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim + 0.1), aspect="equal")
    ax.axis("off")
    ax.set_title(f"step {index + 1}/{len(steps)}: {step['phase']} {step['phase_step']}/{step['phase_steps']}",
                 fontsize=font + 2)
    return ax.figure


def draw_ring_sequence(steps: list[dict]):
    """All 2(N-1) steps as panels: reduce-scatter on the top row, all-gather below."""
    from matplotlib.figure import Figure

    n = len(steps[0]["state"])
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


class RingStepper:
    """A slider that steps through the ring all-reduce, one drawing per step. Without a widget
    frontend (nbval, GitHub) it shows as the text of every step and a figure of all of them."""

    def __init__(self, world_size: int = 4):
        import ipywidgets as w

        check_int("world_size", world_size, 2, MAX_DRAW_RANKS)
        self.steps = ring_all_reduce_steps(world_size)
        self.slider = w.IntSlider(value=1, min=1, max=len(self.steps), description="step",
                                  continuous_update=False)
        self.out = w.Output()
        self.slider.observe(lambda _change: self._render(), names="value")
        self.box = w.VBox([self.slider, self.out])
        self._render()

    def _render(self):   # set directly (not `with out:`): nothing leaks into the cell's outputs
        index = self.slider.value - 1
        step = self.steps[index]
        self.out.outputs = (
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": widgets.png_b64(draw_ring_step(self.steps, index)),
                      "text/plain": f"<ring step {index + 1}>"}},
            {"output_type": "stream", "name": "stdout", "text": describe_step(step) + "\n"},
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return widgets.bundle(self.box, f"{widgets.LIVE_NOTE}\n{describe_ring(self.steps)}",
                              {"image/png": widgets.static_png(draw_ring_sequence(self.steps))})


def ring_step_widget(world_size: int = 4) -> RingStepper:
    """A :class:`RingStepper` for ``world_size`` ranks (2 to 8); display it in a notebook."""
    return RingStepper(world_size)
