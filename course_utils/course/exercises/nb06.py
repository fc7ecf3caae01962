"""Exercises of ``notebooks/06_zero3.ipynb``: a ZeRO-3 linear forward."""
from __future__ import annotations

from typing import Callable

from ...harness.grading import Verdict, on_world_sizes, refuse_non_function, report_ranks

__all__ = ["check_zero3_forward"]


def _zero3_weight(numel: int):
    """The full weight of exercise 06.1 (flat, unpadded): the same on every rank."""
    import torch

    return (torch.arange(numel, dtype=torch.float32) % 7 - 3) / 4


def _alive_after(refs, gc, patience_s: float = 1.0) -> int:
    """How many weakly referenced gathered buffers still hold memory. The backend's work
    object may keep the output alive for a moment after the collective returns (gloo
    releases it from its worker thread), so a buffer counts as kept only if it is still
    alive after ``patience_s``."""
    import time

    def count():
        gc.collect()
        return sum(1 for ref in refs if ref() is not None and ref().untyped_storage().nbytes() > 0)

    deadline = time.monotonic() + patience_s
    alive = count()
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = count()
    return alive


def _zero3_forward_on_rank(fn: Callable) -> list:
    """Rank side of :func:`check_zero3_forward`: run ``fn`` on this rank's shard of a few
    odd-sized Linear weights; report the output's first wrong element, how many
    all-gathers it issued and whether the gathered buffer outlived the call."""
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    gathered: list = []

    def spy(original):
        def wrapper(output, *args, **kwargs):
            outs = output if isinstance(output, (list, tuple)) else [output]
            gathered.extend(weakref.ref(t) for t in outs)
            return original(output, *args, **kwargs)
        return wrapper

    names = [n for n in ("all_gather_single", "all_gather_into_tensor", "all_gather") if hasattr(dist, n)]
    saved = {n: getattr(dist, n) for n in names}
    report = []
    try:
        for n in names:
            setattr(dist, n, spy(saved[n]))
        for shape in ((3, 5), (4, 7), (2, 9)):
            numel = shape[0] * shape[1]
            padded = -(-numel // world) * world
            flat = torch.zeros(padded)
            flat[:numel] = _zero3_weight(numel)
            size = padded // world
            shard = flat[rank * size:(rank + 1) * size].clone()
            x = torch.linspace(-1, 1, 2 * shape[1]).reshape(2, shape[1]) + rank
            expected = x @ flat[:numel].view(shape).T
            gathered.clear()
            with torch.no_grad():
                got = fn(shard, numel, shape, x)
            alive = _alive_after(gathered, gc)
            first = ""
            if not isinstance(got, torch.Tensor):
                first = f"returned {type(got).__name__}, expected a tensor of shape {tuple(expected.shape)}"
            elif got.shape != expected.shape:
                first = f"output shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            else:
                bad = ((got - expected).abs() > 1e-5).nonzero()
                if len(bad):
                    i, j = bad[0].tolist()
                    first = (f"first difference at out[{i}, {j}]: got {got[i, j].item():.6g}, "
                             f"expected {expected[i, j].item():.6g}")
            report.append({"shape": shape, "first_diff": first, "gathers": len(gathered),
                           "alive": alive})
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
    return report


def check_zero3_forward(fn: Callable) -> Verdict:
    """Exercise 06.1: ``fn(shard, numel, shape, x)`` is a ZeRO-3 Linear forward (no bias).

    ``shard`` is this rank's chunk of the weight flattened and zero-padded to a multiple
    of the world size; ``fn`` must all-gather the full flat weight (one collective),
    drop the padding, view it as ``shape``, return ``x @ W.T`` and free the gathered
    buffer (nothing of it may stay alive after the call). Checked on 2, 3 and 4 ranks
    with 15-, 28- and 18-element weights (padding needed), exactly (1e-5)."""
    name = "zero3_forward"
    if (refused := refuse_non_function(fn, name, '(shard, numel, shape, x)')) is not None:
        return refused
    all_right = True
    for n, values in (runs := on_world_sizes(_zero3_forward_on_rank, (2, 3, 4), fn, timeout_s=30)):
        findings = []
        for cases in values:
            problems = []
            for c in cases:
                if c["first_diff"]:
                    problems.append(f"weight {c['shape']}: {c['first_diff']}")
                elif c["gathers"] != 1:
                    problems.append(f"weight {c['shape']}: {c['gathers']} all-gathers, expected exactly 1 "
                                    "(gather the whole flat weight at once)")
                elif c["alive"]:
                    problems.append(f"weight {c['shape']}: the gathered weight is still alive after "
                                    "forward; ZeRO-3 frees it (do not keep it in a global or attribute)")
            findings.append((problems[0] if problems else "",
                             f"gathered, computed, freed for {len(cases)} weights"))
        all_right &= report_ranks(f"{n} ranks", findings)
    return Verdict(name, all_right and runs.completed)
