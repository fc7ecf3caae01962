"""ZeRO-3's per-layer memory timeline, measured from outside :class:`~course_utils.impl.zero3.Zero3`.

Taught in ``notebooks/06_zero3.ipynb``; :func:`course_utils.theory.timeline.predicted_timeline`
predicts the same events from the unit sizes alone, and ``tests/test_figures.py`` checks
that they agree.
"""
from __future__ import annotations

__all__ = ["record_timeline"]


def record_timeline(model) -> list[dict]:
    """Record every gather and free of ``model`` (a :class:`~course_utils.impl.zero3.Zero3`).

    Returns the list that holds the events of the current (or last) step, emptied when the
    next forward starts: dicts with ``phase`` ("forward", then "backward" once forward
    returned), ``unit`` ("root", "blocks.0", ...), ``event`` ("gather": the unit's buffer
    got its memory, an all-gather started; "free": the memory went back), ``alive_units``
    and ``alive_bytes`` (units and bytes of full parameters gathered or in flight after it).
    Each unit's ``gather`` and ``free`` are wrapped; nothing inside ``Zero3`` changes.
    """
    events: list[dict] = []
    phase = ["forward"]
    names = {id(m): n or "root" for n, m in model.module.named_modules()}

    def held(unit) -> int:
        return unit.full.untyped_storage().nbytes()

    def watch(unit, method, event):
        def watched(*args, **kwargs):
            before = held(unit)
            method(*args, **kwargs)
            if bool(held(unit)) != bool(before):
                alive = [held(u) for u in model.units if held(u)]
                events.append({"phase": phase[0], "unit": names[id(unit.module)], "event": event,
                               "alive_units": len(alive), "alive_bytes": sum(alive)})
        return watched

    def step_starts(module, args):
        events.clear()
        phase[0] = "forward"

    def forward_done(module, args, output):
        phase[0] = "backward"

    for unit in model.units:
        unit.gather, unit.free = watch(unit, unit.gather, "gather"), watch(unit, unit.free, "free")
    model.register_forward_pre_hook(step_starts, prepend=True)
    model.register_forward_hook(forward_done)
    return events
