"""ZeRO-3's per-layer memory timeline, measured from outside ``Zero3`` (``notebooks/06_zero3.ipynb``;
``tests/test_figures.py`` checks it against :func:`course_utils.theory.timeline.predicted_timeline`).
"""
from __future__ import annotations

__all__ = ["record_timeline"]


def record_timeline(model) -> list[dict]:
    """Wrap each unit's ``gather`` and ``free`` of a ``Zero3`` ``model``; returns the list of the
    current (or last) step's events (``phase``, ``unit``, ``event``, ``alive_units``,
    ``alive_bytes`` after it), emptied when the next forward starts."""
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
