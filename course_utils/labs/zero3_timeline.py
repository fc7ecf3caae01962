"""ZeRO-3's per-layer memory timeline, measured from outside ``Zero3`` (``notebooks/06_zero3.ipynb``;
``tests/test_figures.py`` checks it against :func:`course_utils.theory.timeline.predicted_timeline`).
"""
from __future__ import annotations

import torch.distributed as dist

from ..harness.experiments import make_adamw
from ..harness.model import SyntheticData, build_model
from ..impl.zero3 import Zero3
from ..runtime.launch import rank_device

__all__ = ["record_timeline", "timeline_on_rank"]


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


def timeline_on_rank(prefetch: bool = False, steps: int = 2) -> list[dict]:
    """Rank side: the course's ``Zero3`` trains the course model (AdamW, global batch 12) for
    ``steps`` steps; the timeline of the last one (:func:`record_timeline`)."""
    rank, world, dev = dist.get_rank(), dist.get_world_size(), rank_device()
    z = Zero3(build_model(seed=0, device=dev), prefetch=prefetch)
    timeline, opt, data = record_timeline(z), make_adamw(z.shard_parameters()), SyntheticData(global_batch=12, seed=0)
    for step in range(steps):
        z(*(t.to(dev) for t in data.shard(step, rank, world))).backward()
        opt.step()
        opt.zero_grad()
    return timeline
