"""Exercises of ``notebooks/07_fsdp.ipynb``: wrapping, sharded clipping, gradient accumulation."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ...harness.experiments import GLOBAL_BATCH, full_grads, global_loss, make_adamw, reference_grads, wrap
from ...harness.model import SyntheticData, build_model
from ...runtime.ledger import CommLedger
from ...harness.grading import (GRADER_BACKEND, Verdict, judge_on_ranks, launch_or_report, on_world_sizes,
                                refuse_non_function, report_problems)
from ...runtime.launch import where
from ...runtime.fmt import bound, num

__all__ = ["check_fsdp_wrap", "check_sharded_clip", "check_accumulation"]


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


def _fsdp_wrap_on_rank(fn: Callable) -> dict:
    from torch.distributed.fsdp import FSDPModule
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(seed=0)
    out = fn(model)
    model = model if out is None else out
    units = [name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, rank, world)
    with CommLedger() as ledger:
        loss = model(x, y)
        loss.backward()
    return {"units": units, "blocks": blocks, "counts": ledger.counts(),
            "loss": global_loss(loss)}


def check_fsdp_wrap(fn: Callable) -> Verdict:
    """Exercise 07.1: ``fn(model)``: one ``fully_shard`` per block, then the root."""
    name = "fsdp_wrap"
    if (refused := refuse_non_function(fn, name, '(model) -> model')) is not None:
        return refused
    loss, _, _ = reference_grads()
    all_right = True
    for n, values in (runs := on_world_sizes(_fsdp_wrap_on_rank, (2, 3), fn, timeout_s=60, quiet=True)):
        v = values[0]
        problems = []
        missing = [b for b in v["blocks"] if b not in v["units"]]
        extra = [u for u in v["units"] if u not in v["blocks"] and u != "<root>"]
        if "<root>" not in v["units"]:
            problems.append("the root is not sharded: the embeddings and final norm stay whole on "
                            "every rank (call fully_shard(model) last)")
        if missing:
            problems.append(f"not sharded on their own: {', '.join(missing)}")
        if extra:
            problems.append(f"sharded too finely: {', '.join(extra[:3])}"
                            f"{' ...' if len(extra) > 3 else ''} (one unit per block is enough)")
        if not problems and v["counts"].get("all_gather") != 9:
            problems.append(f"{v['counts'].get('all_gather')} all-gathers in one forward + backward, "
                            "expected 9 (use the default reshard_after_forward=True on the blocks)")
        if not problems and abs(v["loss"] - loss) > 1e-6 * abs(loss):
            problems.append(f"loss {v['loss']:.7g}, one process gives {loss:.7g}")
        all_right &= report_problems(
            where(n, GRADER_BACKEND, backend_first=True), problems,
            f"units {', '.join(v['units'])}; {v['counts']['all_gather']} all-gathers, "
            f"{v['counts']['reduce_scatter']} reduce-scatters; loss {num(v['loss'])} = one process "
            f"(rel. {bound(abs(v['loss'] - loss) / abs(loss), 1e-6)})")
    return Verdict(name, all_right and runs.completed)


def _sharded_gpt_and_batch():
    model, _ = wrap("torch-fsdp", build_model(seed=0), make_adamw)
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, dist.get_rank(), dist.get_world_size())
    return model, x, y


def _clip_on_rank(fn: Callable, max_norm: float) -> dict:
    """One FSDP2 backward, then the learner's clipping."""
    model, x, y = _sharded_gpt_and_batch()
    model(x, y).backward()
    norm = fn(model, max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    norm = float(norm) if norm is not None else None
    return {"norm": norm, "grads": {k: v.tolist() for k, v in full_grads(model).items()}}


def check_sharded_clip(fn: Callable) -> Verdict:
    """Exercise 07.2: clip FSDP2 gradients to a *global* norm, return the norm before clipping."""
    name = "sharded_clip"
    if (refused := refuse_non_function(fn, name, '(model, max_norm) -> norm')) is not None:
        return refused
    max_norm = 0.5
    _, norm, grads = reference_grads(max_norm=max_norm)
    def judge(v, rank, n):
        if v["norm"] is None:
            return (f"returned None; return the total norm before clipping (one process gets "
                    f"{num(norm)})"), ""
        if abs(v["norm"] - norm) > 1e-5 * norm:
            return (f"returned norm {num(v['norm'])}, the global norm is {num(norm)} (a norm of "
                    "the local shards only is smaller and differs per rank)"), ""
        why = _grad_problem({k: torch.tensor(g) for k, g in v["grads"].items()}, grads)
        if why:
            return f"norm right, clipped gradients differ: {why}", ""
        return "", f"norm {num(v['norm'])} = one process's, gradients scaled by {num(max_norm / norm)}"
    return judge_on_ranks(_clip_on_rank, judge, world_sizes=(2, 3), name=name, args=(fn, max_norm),
                          timeout_s=60)


def _accumulate_on_rank(fn: Callable, k: int) -> dict:
    model, x, y = _sharded_gpt_and_batch()
    micro = list(zip(x.chunk(k), y.chunk(k)))
    with CommLedger() as ledger:
        fn(model, micro)
    return {"counts": ledger.counts(), "grads": {n: g.tolist() for n, g in full_grads(model).items()}}


def check_accumulation(fn: Callable) -> Verdict:
    """Exercise 07.3: accumulate micro-batches with one reduce-scatter per unit, after the last."""
    name = "accumulation"
    if (refused := refuse_non_function(fn, name, '(model, micro_batches)')) is not None:
        return refused
    _, _, grads = reference_grads()
    all_right = True
    for k in (2, 3):
        values = launch_or_report(_accumulate_on_rank, 2, fn, k, timeout_s=60, quiet=True)
        if values is None:
            all_right = False
            continue
        v = values[0]
        rs = v["counts"].get("reduce_scatter", 0)
        problems = []
        if rs != 5:
            problems.append(f"{rs} reduce-scatters, expected 5 (one per unit, only after the last "
                            f"micro-batch; turn gradient sync off for the first {k - 1})")
        why = _grad_problem({n: torch.tensor(g) for n, g in v["grads"].items()}, grads)
        if why:
            problems.append(f"gradients differ from the full batch's: {why}")
        all_right &= report_problems(f"k = {k} micro-batches, {where(2, GRADER_BACKEND, backend_first=True)}", problems,
                                     f"{rs} reduce-scatters, gradients = full batch")
    return Verdict(name, all_right)
