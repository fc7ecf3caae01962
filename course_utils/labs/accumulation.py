"""Gradient accumulation under DDP, ZeRO-2, ZeRO-3 and FSDP2 (notebooks 05, 06, 07 §5.5): what a step of k
micro-batches sends (ring and gloo models; the wire, measured: None off Linux and under NCCL) and the gradient
bytes held between micro-batches, measured (:func:`measure_accumulation`) and predicted (:func:`predicted`).
"""
from __future__ import annotations

import contextlib
import textwrap
from fractions import Fraction

import torch.distributed as dist

from ..checks import check_bool, check_int
from ..harness.experiments import make_adamw, state_bytes, wrap
from ..harness.model import SyntheticData, build_model
from ..theory import sharding
from ..runtime import compat
from ..runtime.fmt import num
from ..runtime.launch import launch, rank_device, where
from ..runtime.ledger import CommLedger
from ..runtime.wire import WireMeter, group_wire_bytes
from ..theory.comm import OPS, gloo_bytes
from ..theory.config import COURSE_CONFIG
from ..theory.layout import padded_numel
from .fsdp_wrapping import _check_names

__all__ = ["SETUPS", "GLOBAL_BATCH", "accumulate", "measure_accumulation", "predicted", "accumulation_table"]

#: setup -> (strategy, how the first k-1 micro-batches turn gradient sync off, in words).
SETUPS = {
    "ddp-no_sync": ("ddp", "no_sync", "DDP, no_sync() on the first k-1"),
    "ddp": ("ddp", None, "DDP, all-reduce every micro-batch"),
    "zero2": ("zero2", None, "ZeRO-2, reduce-scatter every micro-batch"),
    "zero3": ("zero3", None, "ZeRO-3, gather + reduce-scatter every micro-batch"),
    "fsdp2": ("torch-fsdp", None, "FSDP2, sync every micro-batch"),
    "fsdp2-no_sync": ("torch-fsdp", "set_requires_gradient_sync",
                      "FSDP2, set_requires_gradient_sync(False) on the first k-1"),
}
SYNC_OFF = (None, "no_sync", "set_requires_gradient_sync")
#: Rows of the global batch: 2 ranks x 4 micro-batches x 3 rows (divisible by 2, 3, 4 ranks).
GLOBAL_BATCH = 24
SEED = 0
TIMEOUT_S = 180
#: How far the wire may be from the gloo model (gloo's headers and control messages).
WIRE_TOL = 0.02


def _check(setups, world_size, micro_batches, global_batch) -> tuple:
    setups = _check_names("setups", setups, SETUPS)
    check_int("world_size", world_size, 2, what="ranks; accumulation is compared across ranks")
    check_int("micro_batches", micro_batches, 1)
    check_int("global_batch", global_batch, 1)
    if global_batch % (world_size * micro_batches):
        raise ValueError(f"global_batch ({global_batch}) must split into world_size x micro_batches "
                         f"= {world_size} x {micro_batches} equal micro-batches: pick a global_batch "
                         f"divisible by {world_size * micro_batches}")
    return setups


def accumulate(model, micro_batches, sync_off: str | None = None, after_backward=None) -> None:
    """Forward and backward of one step's ``micro_batches`` (``[(x, y), ...]``), each loss
    divided by k so the gradients sum to the mean over the whole batch. ``sync_off``: None
    (every backward syncs), ``"no_sync"`` (DDP) or ``"set_requires_gradient_sync"`` (FSDP2):
    no gradient sync on the first k-1. ``after_backward(i)`` runs after each backward."""
    if sync_off not in SYNC_OFF:
        raise ValueError(f"sync_off must be one of {SYNC_OFF}, got {sync_off!r}")
    k = len(micro_batches)
    if not k:
        raise ValueError("micro_batches is empty: pass a list of (x, y) pairs")
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        if sync_off == "set_requires_gradient_sync":
            model.set_requires_gradient_sync(last)          # FSDP2: reduce-scatter on the last only
        off = sync_off == "no_sync" and not last             # DDP: all-reduce on the last only
        with model.no_sync() if off else contextlib.nullcontext():
            (model(x, y) / k).backward()
        if after_backward is not None:
            after_backward(i)


def _counts(records) -> dict:
    return {op: sum(r.op == op for r in records) for op in OPS}


def _rank(setups: tuple, k: int, global_batch: int) -> dict:
    device = rank_device()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name in setups:
        strategy, how, _ = SETUPS[name]
        model, opt = wrap(strategy, build_model(COURSE_CONFIG, seed=SEED, device=device), make_adamw)
        x, y = SyntheticData(COURSE_CONFIG, global_batch=global_batch, seed=SEED).shard(0, rank, world)
        per, held = [], []
        ledger = CommLedger()
        starts = [0]

        def after_backward(i):
            per.append(_counts(ledger.records[starts[-1]:]))
            fsdp = compat.fsdp2_unsharded_grad_bytes(model) if strategy == "torch-fsdp" else 0
            held.append(int(state_bytes(model, opt)["grads"] + fsdp))  # every gradient storage once
            starts.append(len(ledger.records))
        with ledger, WireMeter() as wire:
            accumulate(model, list(zip(x.to(device).chunk(k), y.to(device).chunk(k))), how, after_backward)
            first = len(ledger.records)
            opt.step()
            in_step = _counts(ledger.records[first:])
        opt.zero_grad()
        gloo = sum(gloo_bytes(r.op, r.message_bytes, r.world_size, r.rank) for r in ledger.records)
        out[name] = {"what": SETUPS[name][2], "calls_per_micro_batch": per, "calls_in_step": in_step,
                     "calls": ledger.counts(), "ring_bytes": ledger.totals(), "gloo_bytes": int(gloo),
                     "wire_bytes": group_wire_bytes(wire), "grad_bytes": held}
    return out


def measure_accumulation(setups=tuple(SETUPS), *, world_size: int = 2, micro_batches: int = 4,
                         global_batch: int = GLOBAL_BATCH, quiet: bool = True) -> dict:
    """One step of the course GPT per setup, each rank's rows cut into ``micro_batches``;
    rank 0's calls, ring/gloo/wire bytes and ``grad_bytes`` (held after each backward: the
    first k-1 are what waits between micro-batches), with :func:`predicted`."""
    setups = _check(setups, world_size, micro_batches, global_batch)
    res = launch(_rank, world_size, setups, micro_batches, global_batch, quiet=quiet,
                 timeout_s=TIMEOUT_S)
    out = {name: {**res[0][name], "predicted": predicted(name, world_size=world_size,
                                                         micro_batches=micro_batches)} for name in setups}
    return {"where": where(res), "world_size": world_size, "micro_batches": micro_batches,
            "setups": out}


def predicted(setup: str, *, world_size: int = 2, micro_batches: int = 4) -> dict:
    """What :func:`measure_accumulation` must find for ``setup``, from sizes alone (gloo runs a
    reduce-scatter as a whole all-reduce; DDP and ZeRO-2: one 25 MiB bucket of Ψ = 129,350)."""
    _check(setup, world_size, micro_batches, world_size * micro_batches)
    n, k = world_size, micro_batches
    strategy, how, _ = SETUPS[setup]
    meta = build_model(COURSE_CONFIG, device="meta")
    psi = sum(p.numel() for p in meta.parameters())
    z3 = [padded_numel(sum(p.numel() for p in ps), n) for ps in sharding.unit_params(meta)]   # flat units
    f = Fraction(4 * (n - 1), n)                         # ring bytes per element of a message
    calls = dict.fromkeys(OPS, 0)
    ring = dict.fromkeys(OPS, Fraction(0))
    syncs = 1 if how else k                              # backwards that send gradients
    if strategy == "ddp":
        calls["all_reduce"] = syncs
        ring["all_reduce"] = syncs * 2 * f * psi
        between = 4 * psi                                # the full .grad (no_sync: the running sum)
    elif strategy == "zero2":                            # k reduce-scatters, one all-gather
        p = padded_numel(psi, n)
        calls.update(reduce_scatter=k, all_gather=1)
        ring.update(reduce_scatter=k * f * p, all_gather=f * p)
        between = 4 * p // n                             # the shard gradient only
    elif strategy == "zero3":                            # every micro-batch: 2L+1 gathers, L+1 scatters (L blocks + the root)
        calls.update(reduce_scatter=k * len(z3), all_gather=k * (2 * len(z3) - 1))
        ring.update(reduce_scatter=k * f * sum(z3), all_gather=k * f * (2 * sum(z3) - z3[0]))
        between = 4 * sum(z3) // n
    else:                                                # torch-fsdp
        per = sharding.calls_per_step(COURSE_CONFIG.layers)
        one = sharding.comm_bytes_per_step(meta, n)
        calls.update(reduce_scatter=syncs * per["reduce_scatter"], all_gather=k * per["all_gather"])
        ring.update(reduce_scatter=syncs * one["reduce_scatter"], all_gather=k * one["all_gather"])
        between = 4 * psi if how else sharding.fsdp_state_bytes(meta, n, 0)["grads"]
    gloo = sum(ring.values()) + ring["reduce_scatter"]
    plain = {op: int(v) if v.denominator == 1 else float(v) for op, v in ring.items()}  # as CommLedger.totals()
    return {"calls": calls, "ring_bytes": plain, "gloo_bytes": int(gloo), "grad_bytes_between": int(between)}


def accumulation_table(result: dict, *, wire: bool = True) -> str:
    """:func:`measure_accumulation`'s result as rows, ✓ where it equals :func:`predicted`;
    ``wire=False``: without gloo's model and the measured wire (calls, ring bytes, grads held)."""
    if not isinstance(result, dict) or "setups" not in result:
        raise TypeError("accumulation_table takes what measure_accumulation() returned")
    check_bool("wire", wire)
    k = result["micro_batches"]
    ok = {True: " ✓", False: " ✗"}.get
    lines = [f"one step of {k} micro-batches, {result['where']}; bytes sent by one rank",
             f"{'setup':<15}{'calls AG/RS/AR':>16}{'ring model B':>14}"
             + (f"{'gloo model B':>15}{'wire MB':>10}" if wire else "") + f"{'grads held B':>15}"]
    for name, r in result["setups"].items():
        want, c, sent = r["predicted"], r["calls"], r["wire_bytes"]
        calls = f"{c['all_gather']}/{c['reduce_scatter']}/{c['all_reduce']}" + ok(c == want["calls"])
        between = r["grad_bytes"][0] if k > 1 else r["grad_bytes"][-1]
        close = sent is not None and abs(sent - r["gloo_bytes"]) <= WIRE_TOL * r["gloo_bytes"]
        lines.append(f"{name:<15}{calls:>16}{sum(r['ring_bytes'].values()):>12,}"
                     f"{ok(r['ring_bytes'] == want['ring_bytes'])}"
                     + (f"{r['gloo_bytes']:>15,}{'n/a' if sent is None else num(sent / 1e6) + ok(close):>10}"
                        if wire else "")
                     + f"{between:>13,}{ok(between == want['grad_bytes_between'])}")
    lines.append(textwrap.fill(
        "Calls and ring-model bytes: the ledger (the ring formula applied to each call); "
        + ("gloo model: gloo's algorithms for the same calls (a reduce-scatter is a whole all-reduce); "
           f"wire: this rank's sockets, measured (✓: within {WIRE_TOL:.0%} of the gloo model); " if wire else "")
        + "grads held: gradient storages after a micro-batch's backward, before the next, "
        "measured; ✓: equal to accumulation.predicted, computed from the model's sizes.", 100))
    return "\n".join(lines)
