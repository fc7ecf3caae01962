"""Exercise of ``notebooks/07_fsdp.ipynb``: one FSDP2 step composed of wrapping, gradient
accumulation without syncing and clipping to a global norm."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ...harness.experiments import GLOBAL_BATCH, full_grads, reference_grads
from ...harness.model import SyntheticData, build_model
from ...runtime.ledger import CommLedger
from ...labs.grading import (GRADER_BACKEND, Verdict, on_world_sizes,
                             refuse_non_function, report_problems)
from ...runtime.launch import where
from ...runtime.fmt import num

__all__ = ["check_fsdp_step"]


def _grad_problem(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-7) -> str:
    """'' when every gradient matches, else the first parameter that differs and by how much."""
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            return f"{name} has no gradient"
        if not torch.allclose(g, w, rtol=rtol, atol=atol):
            return (f"{name}: largest difference {(g - w).abs().max().item():.3g} "
                    f"(gradient norm {w.norm().item():.3g})")
    return ""


def _unit_problems(units: list, blocks: list) -> list[str]:
    """What is wrong with the FSDP units found (one per block, then the root, is right)."""
    problems = []
    missing = [b for b in blocks if b not in units]
    extra = [u for u in units if u not in blocks and u != "<root>"]
    if "<root>" not in units:
        problems.append("the root is not sharded: the embeddings and final norm stay whole on "
                        "every rank (call fully_shard(model) last)")
    if missing:
        problems.append(f"not sharded on their own: {', '.join(missing)}")
    if extra:
        problems.append(f"sharded too finely: {', '.join(extra[:3])}"
                        f"{' ...' if len(extra) > 3 else ''} (one unit per block is enough)")
    return problems


def _fsdp_step_on_rank(fn: Callable, k: int, max_norm: float) -> dict:
    """The learner's step on the course GPT, unsharded when handed over: k micro-batches of this
    rank's rows of step 0; returns the units, the collectives, the norm and the full gradients."""
    from torch.distributed.fsdp import FSDPModule
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(seed=0)
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, rank, world)
    norm, error = None, ""
    with CommLedger() as ledger:
        try:                # the same on every rank: a wrong wrapping raises in clipping, say
            norm = fn(model, list(zip(x.chunk(k), y.chunk(k))), max_norm)
        except Exception as exc:  # noqa: BLE001 - reported with the units found
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    ok = isinstance(model, FSDPModule) and not error
    return {"units": [name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)],
            "blocks": [f"blocks.{i}" for i in range(len(model.blocks))], "counts": ledger.counts(),
            "norm": None if norm is None else float(norm), "error": error,
            "grads": {n: g.tolist() for n, g in full_grads(model).items()} if ok else {}}


def check_fsdp_step(fn: Callable) -> Verdict:
    """Exercise 07.1: ``fn(model, micro_batches, max_norm)`` shards the course GPT (a unit per block,
    then the root), accumulates the micro-batches with one reduce-scatter per unit, clips to a
    global norm and returns the norm before clipping."""
    name = "fsdp_step"
    if (refused := refuse_non_function(fn, name, "(model, micro_batches, max_norm) -> norm")) is not None:
        return refused
    k, max_norm = 2, 0.5
    _, norm, grads = reference_grads(max_norm=max_norm)
    all_right = True
    for n, values in (runs := on_world_sizes(_fsdp_step_on_rank, (2, 3), fn, k, max_norm, timeout_s=60,
                                             quiet=True)):
        v = values[0]
        problems = _unit_problems(v["units"], v["blocks"]) + ([f"it raised {v['error']}"] if v["error"] else [])
        rs = v["counts"].get("reduce_scatter", 0)
        if not problems and rs != 5:
            problems.append(f"{rs} reduce-scatters, expected 5 (one per unit, after the last micro-batch "
                            f"only: turn gradient sync off for the first {k - 1})")
        if not problems and v["norm"] is None:
            problems.append(f"returned None; return the total norm before clipping (one process "
                            f"gets {num(norm)})")
        elif not problems and abs(v["norm"] - norm) > 1e-5 * norm:
            problems.append(f"returned norm {num(v['norm'])}, the global norm of the whole batch's "
                            f"gradient is {num(norm)} (a norm of the local shards only is smaller; "
                            "micro-batch losses not divided by their number give a larger one)")
        if not problems and (why := _grad_problem({p: torch.tensor(g) for p, g in v["grads"].items()}, grads)):
            problems.append(f"clipped gradients differ from one process's: {why}")
        all_right &= report_problems(
            f"{where(n, GRADER_BACKEND, backend_first=True)}, {k} micro-batches", problems,
            f"units {', '.join(v['units'])}; {rs} reduce-scatters; norm {num(v['norm'] or 0)} = one "
            f"process's, clipped gradients = one process's")
    return Verdict(name, all_right and runs.completed)
