"""ZeRO-3's memory over one training step, predicted from the unit sizes alone (``notebooks/06_zero3.ipynb``)."""
from __future__ import annotations

from ..checks import check_bool, check_int
from .config import COURSE_CONFIG
from .layout import padded_numel

__all__ = ["max_alive", "unit_numels", "predicted_timeline"]


def max_alive(timeline: list[dict], phase: str | None = None) -> int:
    """The most units alive at once in a timeline (optionally only in one phase)."""
    return max((e["alive_units"] for e in timeline if phase is None or e["phase"] == phase), default=0)


def unit_numels(config=None) -> list[int]:
    """Trainable parameters of ZeRO-3's units for the course GPT (or ``config``): root, then blocks."""
    config = COURSE_CONFIG if config is None else config
    blocks = [config.block_params()] * config.layers
    return [config.num_params() - sum(blocks)] + blocks


def predicted_timeline(world_size: int, *, prefetch: bool, config=None) -> list[dict]:
    """The events :func:`~course_utils.labs.zero3_timeline.record_timeline` measures, predicted
    from the unit sizes: the root is gathered at the start of forward and freed at the end of
    backward; each block gathered before its forward and its backward, freed after each; with
    ``prefetch`` the next block's gather starts one block early."""
    check_int("world_size", world_size, 1)
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
