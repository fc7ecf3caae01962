"""ZeRO-3's memory over one training step, predicted from the unit sizes alone.

Taught in ``notebooks/06_zero3.ipynb``, next to the timeline
:func:`course_utils.labs.zero3_timeline.record_timeline` measures.
"""
from __future__ import annotations

from ..checks import check_bool
from .config import COURSE_CONFIG
from .layout import padded_numel

__all__ = ["max_alive", "unit_numels", "predicted_timeline"]


def max_alive(timeline: list[dict], phase: str | None = None) -> int:
    """The most units alive at once in a timeline (optionally only in one phase)."""
    return max((e["alive_units"] for e in timeline if phase is None or e["phase"] == phase), default=0)


def unit_numels(config=None) -> list[int]:
    """Trainable parameters of ZeRO-3's units (:class:`~course_utils.impl.zero3.Zero3`)
    for the course GPT (or the GPT of ``config``): the root (all that is not in a block:
    embeddings, final norm; a tied output layer counts once), then each block."""
    config = COURSE_CONFIG if config is None else config
    blocks = [config.block_params()] * config.layers
    return [config.num_params() - sum(blocks)] + blocks


def predicted_timeline(world_size: int, *, prefetch: bool, config=None) -> list[dict]:
    """The gathers and frees :class:`~course_utils.impl.zero3.Zero3` makes in one training step of the course GPT
    (or the GPT of ``config``), predicted from the unit sizes alone: what
    :func:`~course_utils.labs.zero3_timeline.record_timeline` measures, before running anything.

    One dict per event, with the keys of the measured ones:
    ``phase``, ``unit`` ("root", "blocks.0", ...), ``event`` ("gather" or "free"),
    ``alive_units`` and ``alive_bytes`` (units and fp32 bytes of full, padded parameters
    gathered or in flight after the event). The schedule (``reshard_root=False``): the
    root is gathered at the start of forward and freed at the end of backward; each
    block is gathered just before its forward and freed after it, gathered again just
    before its backward and freed after its reduce-scatter; with ``prefetch`` the next
    block's gather (previous, in backward) is started one block early.
    ``tests/test_figures.py`` checks it against the timeline measured on ranks.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    check_bool("prefetch", prefetch)
    numels = unit_numels(config)
    names = ["root"] + [f"blocks.{i}" for i in range(len(numels) - 1)]
    size = {u: 4 * padded_numel(m, world_size) for u, m in zip(names, numels)}
    blocks = names[1:]
    alive: list[str] = []
    events: list[dict] = []

    def log(phase, unit, event):
        if event == "gather":
            alive.append(unit)
        else:
            alive.remove(unit)
        events.append({"phase": phase, "unit": unit, "event": event, "alive_units": len(alive),
                       "alive_bytes": sum(size[u] for u in alive)})

    for phase, order in (("forward", blocks), ("backward", blocks[::-1])):
        if phase == "forward":
            log(phase, "root", "gather")
        if prefetch and order:
            log(phase, order[0], "gather")
        for i, unit in enumerate(order):
            if not prefetch:
                log(phase, unit, "gather")
            elif i + 1 < len(order):
                log(phase, order[i + 1], "gather")
            log(phase, unit, "free")
    log("backward", "root", "free")
    return events
