"""FSDP2's options, each run on N ranks and measured against a prediction computed by code: the
facts notebook 07 §5 teaches, checked (tests/test_fsdp_options.py). Each ``measure_*`` launches the course GPT sharded as ``"torch-fsdp"``
(:func:`shard_model`) and returns an :class:`OptionResult`.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import operator
from fractions import Fraction

import torch
import torch.distributed as dist
from torch import nn

from course_utils.checks import check_int, check_module, check_positive, is_int, require_process_group
from course_utils.harness.experiments import (GLOBAL_BATCH, full_grads, local_tensor, make_adamw, reference_grads,
                                              state_bytes, train)
from course_utils.harness.model import Block, SyntheticData, build_model
from course_utils.impl import fsdp
from course_utils.labs.fsdp_api import EventOrder, HeldParams, SavedActivations, batch
from course_utils.labs.fsdp_wrapping import check_run, error_of, exact_number
from course_utils.runtime import compat
from course_utils.runtime.fmt import max_abs_diff, max_rel_diff, num, table
from course_utils.runtime.launch import launch, rank_device, where
from course_utils.runtime.ledger import CommLedger
from course_utils.theory.config import COURSE_CONFIG
from course_utils.theory.memory import activation_bytes
from course_utils.theory.sharding import (calls_per_step, comm_bytes_per_step, fsdp_state_bytes, fsdp_units,
                                          message_numels)

__all__ = ["Check", "OptionResult", "shard_model", "measure_mixed_precision",
           "measure_cpu_offload", "measure_reshard_after_forward", "measure_prefetch",
           "measure_activation_checkpointing", "measure_gradient_clipping",
           "measure_gradient_accumulation", "predicted_prefetch_order",
           "predicted_saved_activation_bytes", "matmul_flops_per_step"]

SEED = 0            #: model weights and data of every experiment here
TIMEOUT_S = 180     #: per launch; 4 CPU ranks on 2 shared cores take a few seconds

# ------------------------------------------------------------------ results

_OPS = {"==": operator.eq, "<=": operator.le, ">=": operator.ge, ">": operator.gt, "~": None}


@dataclasses.dataclass(frozen=True)
class Check:
    """A measured quantity next to its prediction (None: nothing to compare); ``op`` ``"~"``: within ``rel_tol``."""

    quantity: str
    measured: object
    predicted: object
    op: str = "=="
    rel_tol: float = 0.0

    def __post_init__(self):
        if self.op not in _OPS:
            raise ValueError(f"op must be one of {tuple(_OPS)}, got {self.op!r}")

    @property
    def ok(self) -> bool | None:
        m, p = self.measured, self.predicted
        if p is None or m is None:
            return None
        return abs(m - p) <= self.rel_tol * abs(p) if self.op == "~" else _OPS[self.op](m, p)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple, dict)) and len(str(v)) > 48:
        return f"[{len(v)} items]"          # long sequences: compared here, shown in details
    v = exact_number(v) if isinstance(v, Fraction) else v
    if is_int(v):
        return f"{v:,}"
    return num(v) if isinstance(v, float) else str(v)


@dataclasses.dataclass(repr=False)
class OptionResult:
    """What a ``measure_*`` function returns: ``checks`` and ``details`` (raw measurements). What each
    option does and why the numbers are what they are: notebooks 07 and 10, in words."""

    option: str
    where: str
    checks: list
    details: dict

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    def check(self, quantity: str) -> Check:
        named = {c.quantity: c for c in self.checks}
        if quantity not in named:
            raise KeyError(f"no check {quantity!r}; the checks are {list(named)}")
        return named[quantity]

    def table(self) -> str:
        rows = [(c.quantity, _fmt(c.measured), "" if c.predicted is None else
                 c.op if c.op != "~" else f"~ (±{c.rel_tol:g})", _fmt(c.predicted),
                 {True: "ok", False: "DIFFERS", None: ""}[c.ok]) for c in self.checks]
        return f"{self.option}: {self.where}\n" + table(
            ["quantity", "measured", "", "predicted", ""], rows, left=(0, 2, 4))

    __repr__ = table


def _launch(fn, world_size, *args, **kwargs) -> list:
    """``fn(*args, **kwargs)`` on ``world_size`` ranks (>= 2: sharding), a ``steps`` keyword checked too."""
    check_run(world_size, kwargs.get("steps", 1), SEED)
    return launch(fn, world_size, *args, quiet=True, timeout_s=TIMEOUT_S, **kwargs)


# ------------------------------------------------------------------ sharding

def shard_model(model: nn.Module, *, reshard_after_forward: bool | int = True, unit_types=None,
                **fully_shard_kwargs) -> nn.Module:
    """The ``"torch-fsdp"`` layout in place, on a launched rank: rank 0's weights, then ``fully_shard``
    on the blocks and the root; ``reshard_after_forward`` (bool or int) applies to the blocks only."""
    check_module("model", model)
    require_process_group("shard_model")
    _check_reshard(reshard_after_forward, dist.get_world_size())
    return fsdp.wrap_fsdp2(model, lambda params: None, reshard_after_forward=reshard_after_forward,
                           unit_types=unit_types, fully_shard_kwargs=fully_shard_kwargs)[0]


def _check_reshard(value, world_size: int) -> None:
    if isinstance(value, bool):
        return
    if not isinstance(value, int):
        raise TypeError(f"reshard_after_forward must be True, False or an int, got {value!r}")
    if value < 2 or value >= world_size or world_size % value:
        raise ValueError(f"an int reshard_after_forward is the group size to reshard to after "
                         f"forward: a divisor of the world size ({world_size}) other than 1 and "
                         f"{world_size}, got {value} (use True or False otherwise)")


# ------------------------------------------------------------------ the rank side, shared

def _sharded(before=None, **fully_shard_kwargs):
    """The course GPT (``before(model)`` first) sharded by :func:`shard_model`, its AdamW, data, device."""
    device = rank_device()
    model = build_model(COURSE_CONFIG, seed=SEED, device=device)
    if before is not None:
        before(model)
    model = shard_model(model, **fully_shard_kwargs)
    return (model, make_adamw(model.parameters()),
            SyntheticData(COURSE_CONFIG, global_batch=GLOBAL_BATCH, seed=SEED), device)


def _per_step(ledger: CommLedger) -> dict:
    out = {"counts": ledger.counts(), "totals": ledger.totals(),
           "records": [(r.op, r.message_bytes, r.world_size) for r in ledger.records]}
    ledger.reset()
    return out


# ================================================================== 1. mixed precision

def _local(t, attr: str = "dtype") -> str:
    return str(getattr(local_tensor(t), attr)).replace("torch.", "")


def _stored(model, opt, attr: str) -> dict:
    """The ``attr`` (dtype or device) of the sharded parameters, gradients and optimizer states."""
    params = list(model.parameters())
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {key: sorted({_local(t, attr) for t in ts})
            for key, ts in (("param", params), ("grad", [p.grad for p in params]), ("optimizer", states))}


def _rank_mixed_precision(steps: int) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    out = {}
    for name, kwargs in {"fp32": {}, "bf16": {"mp_policy": MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}}.items():
        model, opt, data, device = _sharded(**kwargs)
        inside, stored, losses, comms = {}, {}, [], []
        model.blocks[0].mlp.up.register_forward_pre_hook(      # a block's first MLP layer, in forward
            lambda module, args, inside=inside: inside.update(
                {} if inside else {"weight": _local(module.weight), "input": _local(args[0])}))
        with CommLedger() as ledger:
            for step, loss, _ in train(model, opt, data, steps, device=device, meters=(ledger,)):
                losses.append(loss)
                comms.append(_per_step(ledger))
                if step == 0:
                    stored.update(_stored(model, opt, "dtype"))
        out[name] = {"losses": losses, "comm": comms[0]["totals"], "counts": comms[0]["counts"],
                     "same_every_step": all(c["totals"] == comms[0]["totals"] for c in comms),
                     "inside_forward": inside, "stored": stored}
    return out


def measure_mixed_precision(world_size: int = 2, *, steps: int = 3) -> OptionResult:
    """``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on every unit vs fp32."""
    res = _launch(_rank_mixed_precision, world_size, steps=steps)
    meta = build_model(COURSE_CONFIG, device="meta")
    bf16_bytes = comm_bytes_per_step(meta, world_size, bytes_per_elem=2)
    fp32_bytes = comm_bytes_per_step(meta, world_size, bytes_per_elem=4)
    fp, bf = res[0]["fp32"], res[0]["bf16"]
    diffs = [abs(a - b) for a, b in zip(bf["losses"], fp["losses"])]
    bf16_unit = 2.0 ** -8          # bf16: 8 significant bits, machine epsilon 2^-7, unit roundoff 2^-8
    checks = [
        Check("all-gather B/step, fp32", fp["comm"]["all_gather"], fp32_bytes["all_gather"]),
        Check("all-gather B/step, bf16 params", bf["comm"]["all_gather"], bf16_bytes["all_gather"]),
        Check("reduce-scatter B/step, fp32 reduce", bf["comm"]["reduce_scatter"],
              fp32_bytes["reduce_scatter"]),
        Check("all-gather bf16 / fp32", Fraction(bf["comm"]["all_gather"], fp["comm"]["all_gather"]),
              Fraction(1, 2)),
        Check("collectives per step, bf16 vs fp32", bf["counts"], fp["counts"]),
        *(Check(what, ",".join(bf["stored"][key]), "float32") for what, key in (
            ("sharded param dtype", "param"), ("sharded grad dtype", "grad"),
            ("optimizer state dtype", "optimizer"))),
        Check("block weight dtype in forward", bf["inside_forward"]["weight"], "bfloat16"),
        Check("block input dtype in forward", bf["inside_forward"]["input"], "bfloat16"),
        Check("max |loss bf16 - loss fp32|", max(diffs), 0.0, op=">"),
        Check("max relative loss difference", max_rel_diff(bf["losses"], fp["losses"]),
              bf16_unit, op="<="),
    ]
    return OptionResult("MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)", where(res),
                        checks, {**res[0], "loss_differences": diffs})


# ================================================================== 2. CPU offload

def _offload_run(steps: int, **fully_shard_kwargs) -> dict:
    device = rank_device()
    gc.collect()                            # the previous run's model freed (GPU bytes)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
    model, opt, data, device = _sharded(**fully_shard_kwargs)
    stored, losses = {}, []
    for step, loss, _ in train(model, opt, data, steps, device=device):
        losses.append(loss)
        if step == steps - 1:               # after the last step(), before its zero_grad()
            stored = _stored(model, opt, "device")
            stored["bytes"] = state_bytes(model, opt)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                stored["device_bytes"] = torch.cuda.memory_allocated(device) - base
    return {"losses": losses, "stored": stored}


def _rank_cpu_offload(steps: int) -> dict:
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    out = {"no offload": _offload_run(steps),
           "CPUOffloadPolicy": _offload_run(steps, offload_policy=CPUOffloadPolicy(pin_memory=False)),
           "device": rank_device().type}
    out["pin_memory=True"] = error_of(lambda: fully_shard(       # the default, on this machine
        nn.Linear(4, 4, device=rank_device()), offload_policy=CPUOffloadPolicy(),
        mesh=fsdp.make_mesh(out["device"])))
    return out


def measure_cpu_offload(world_size: int = 2, *, steps: int = 3) -> OptionResult:
    """``CPUOffloadPolicy(pin_memory=False)`` on every unit vs no offload."""
    res = _launch(_rank_cpu_offload, world_size, steps=steps)
    r = res[0]
    base, off = r["no offload"], r["CPUOffloadPolicy"]
    meta = build_model(COURSE_CONFIG, device="meta")
    states = [fsdp_state_bytes(meta, world_size, rank) for rank in range(world_size)]
    checks = [
        Check(f"max |loss diff| over {steps} steps, offload vs not",
              max_abs_diff(off["losses"], base["losses"]), 0.0),
        *(Check(f"{what} on", ",".join(off["stored"][key]), "cpu") for what, key in (
            ("sharded params", "param"), ("sharded grads", "grad"), ("optimizer states", "optimizer"))),
        *(Check(f"rank {rank}: {key} B, offload", v["CPUOffloadPolicy"]["stored"]["bytes"][key],
                states[rank][key]) for rank, v in enumerate(res) for key in ("params", "grads", "optimizer")),
    ]
    if r["device"] == "cuda":   # each allocation rounds up (512 B blocks): at least the state bytes
        saved = base["stored"]["device_bytes"] - off["stored"]["device_bytes"]
        checks.append(Check("rank 0: device B saved >= its state B", saved, sum(states[0].values()),
                            op=">="))
    else:
        checks.append(Check("device B saved (measured on GPUs only)", None, None))
    return OptionResult("CPUOffloadPolicy(pin_memory=False)", where(res), checks, r)


# ================================================================== 3. reshard_after_forward

def _rank_reshard(settings: tuple, steps: int) -> dict:
    out = {}
    for setting in settings:
        model, opt, data, device = _sharded(reshard_after_forward=setting)
        held_now, held, losses, comms = HeldParams(model), [], [], []
        model.register_forward_hook(lambda *_: held.append(held_now()))   # at the end of forward
        with CommLedger() as ledger:
            for _, loss, _ in train(model, opt, data, steps, device=device, meters=(ledger,)):
                losses.append(loss)
                comms.append(_per_step(ledger))
        post = compat.fsdp2_param_group(fsdp_units(model)[0]).post_forward_mesh_info
        out[repr(setting)] = {
            "losses": losses, "held": held, "counts": comms[-1]["counts"],
            "totals": comms[-1]["totals"],
            "gathers": [(m, w) for op, m, w in comms[-1]["records"] if op == "all_gather"],
            "same_every_step": all(c["records"] == comms[0]["records"] for c in comms),
            "backward_group": (None if post is None
                               else dist.get_process_group_ranks(post.shard_process_group))}
    return out


def _reshard_prediction(setting, world_size: int) -> dict:
    """All-gathers per step, each rank's backward group (an int k: FSDP2 views the mesh as (N/k, k)), bytes held."""
    m_root, *m_blocks = message_numels(build_model(COURSE_CONFIG, device="meta"), world_size)
    layers, blocks = len(m_blocks), 4 * sum(m_blocks)
    k = None if setting is False else world_size if setting is True else setting   # backward's group
    groups = [None if k is None else list(range(r // k * k, r // k * k + k)) for r in range(world_size)]
    forward = Fraction(world_size - 1, world_size) * (4 * m_root + blocks)   # every unit over N ranks
    if k is None:
        return {"calls": 1 + layers, "bytes": forward, "held": 4 * m_root + blocks, "groups": groups,
                "group_sizes": [world_size] * (1 + layers)}
    return {"calls": 1 + 2 * layers, "bytes": forward + Fraction(k - 1, k) * blocks,   # every block over k
            "held": 4 * m_root + (0 if setting is True else blocks // k), "groups": groups,
            "group_sizes": [world_size] * (1 + layers) + [k] * layers}


def measure_reshard_after_forward(world_size: int = 4, *, settings=(True, False, 2),
                                  steps: int = 2) -> OptionResult:
    """``reshard_after_forward`` on the blocks, one run per entry of ``settings`` (True, False or an int)."""
    check_run(world_size, steps, SEED)
    if not isinstance(settings, (tuple, list)) or not settings:
        raise TypeError("settings must be a non-empty tuple such as (True, False, 2)")
    for s in settings:
        _check_reshard(s, world_size)
    settings = tuple(settings)
    res = _launch(_rank_reshard, world_size, settings, steps=steps)
    checks = []
    first = res[0][repr(settings[0])]["losses"]
    for i, s in enumerate(settings):
        m = res[0][repr(s)]
        p = _reshard_prediction(s, world_size)
        checks += [
            Check(f"{s!r}: all-gathers/step", m["counts"]["all_gather"], p["calls"]),
            Check(f"{s!r}: all-gathers, over how many ranks", sorted(w for _, w in m["gathers"]),
                  sorted(p["group_sizes"])),
            Check(f"{s!r}: all-gather B/step", m["totals"]["all_gather"], p["bytes"]),
            Check(f"{s!r}: backward all-gather ranks, by rank",
                  [v[repr(s)]["backward_group"] for v in res], p["groups"]),
            Check(f"{s!r}: unsharded param B held fwd->bwd", max(m["held"]), p["held"]),
        ] + ([Check(f"{s!r}: max |loss diff| vs {settings[0]!r}", max_abs_diff(m["losses"], first), 0.0)]
             if i else [])
    return OptionResult("reshard_after_forward", where(res), checks,
                        {repr(s): res[0][repr(s)] for s in settings})


# ================================================================== 4. explicit prefetching

def predicted_prefetch_order(num_blocks: int, forward_depth: int = 0, backward_depth: int = 1) -> list:
    """One step's events, as :class:`~course_utils.labs.fsdp_api.EventOrder` names them, with each block
    prefetching ``forward_depth`` / ``backward_depth`` blocks ahead (FSDP2's defaults: 0 and 1)."""
    for name, v in (("forward_depth", forward_depth), ("backward_depth", backward_depth)):
        check_int(name, v, minimum=0)
    check_int("num_blocks", num_blocks, minimum=1)
    events, issued = ["AG root"], set()

    def gather(j):
        if j not in issued:
            issued.add(j)
            events.append(f"AG block{j}")

    for i in range(num_blocks):
        events.append(f"fwd block{i}")
        for j in range(i, min(num_blocks, i + 1 + forward_depth)):
            gather(j)
    events += ["bwd root", f"AG block{num_blocks - 1}"]     # the root prefetches the last block
    issued = {num_blocks - 1}
    for i in reversed(range(num_blocks)):
        events.append(f"bwd block{i}")
        for j in range(i, max(-1, i - 1 - backward_depth), -1):
            gather(j)
        events.append(f"RS block{i}")
    return events + ["RS root"]


def _rank_prefetch(depth: int, steps: int) -> dict:
    out = {}
    for name, d in (("default", 0), ("explicit", depth)):
        model, opt, data, device = _sharded()
        blocks = fsdp_units(model)
        for i, block in enumerate(blocks if d else ()):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + d])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - d):i][::-1])
        losses = []
        with EventOrder(model) as order:        # events and counts: of the last step
            for step, loss, _ in train(model, opt, data, steps, device=device, meters=(order.ledger,)):
                losses.append(loss)
                if step < steps - 1:
                    order.reset()
        out[name] = {"losses": losses, "events": list(order.events), "peaks": dict(order.gathered),
                     "counts": order.ledger.counts(), "timeline": (order.forward, order.backward)}
    return out


def measure_prefetch(world_size: int = 2, *, depth: int = 2, steps: int = 2) -> OptionResult:
    """FSDP2's default prefetching vs explicit prefetching of the next ``depth`` blocks."""
    layers = COURSE_CONFIG.layers
    check_int("depth", depth, 1, layers - 1, what="blocks ahead; 0 is FSDP2's default")
    res = _launch(_rank_prefetch, world_size, depth, steps=steps)
    default, explicit = res[0]["default"], res[0]["explicit"]
    checks = [
        Check("default: order of events", default["events"], predicted_prefetch_order(layers, 0, 1)),
        Check(f"{depth} ahead: order of events", explicit["events"],
              predicted_prefetch_order(layers, depth, depth)),
        *(Check(f"{label}: units gathered at once, {phase}", run["peaks"][phase],
                1 + min(layers, 1 + d))        # the root + the current block + d prefetched blocks
          for label, run, ds in (("default", default, (0, 1)), (f"{depth} ahead", explicit, (depth, depth)))
          for phase, d in zip(("forward", "backward"), ds)),
        Check("collectives per step, explicit vs default", explicit["counts"], default["counts"]),
        Check(f"max |loss diff| over {steps} steps",
              max_abs_diff(explicit["losses"], default["losses"]), 0.0),
    ]
    return OptionResult(f"explicit prefetching, {depth} blocks ahead", where(res), checks,
                        {"default": default, "explicit": explicit})


# ================================================================== 5. activation checkpointing

def predicted_saved_activation_bytes(micro_batch: int, *, checkpointed: bool) -> dict:
    """Bytes autograd saves for backward (parameters apart) in one forward on ``micro_batch`` sequences
    (fp32, CPU kernels): :func:`~course_utils.theory.memory.activation_bytes`'s 16-bit formula doubled; per
    block ``attention="flash"`` less its dropout masks plus LayerNorm statistics and logsumexp, or the block
    input if checkpointed; outside: norm and head inputs, fp32 log-softmax, int64 ids, the loss weight."""
    check_int("micro_batch", micro_batch, minimum=1)
    cfg = COURSE_CONFIG
    s, b, h, a = cfg.seq, micro_batch, cfg.hidden, cfg.heads
    sbh = s * b * h
    full = activation_bytes(cfg, micro_batch=b)
    if checkpointed:
        per_block = 2 * activation_bytes(cfg, micro_batch=b, recompute="full").per_layer
    else:
        flash = activation_bytes(cfg, micro_batch=b, attention="flash").per_layer
        per_block = 2 * (flash - 2 * sbh) + 4 * (2 * 2 * b * s + a * b * s)
    outside = (2 * (full.outside_layers - full.logits - sbh) + full.logits + 4 * 2 * b * s
               + 8 * (b * s + s + b * s) + 4)
    return {"per_block": per_block, "outside": outside, "total": cfg.layers * per_block + outside}


def matmul_flops_per_step(micro_batch: int, *, checkpointed: bool) -> int:
    """Matmul FLOPs of one forward + backward; non-reentrant checkpointing recomputes every block
    matmul but the last (the MLP's down projection, whose output nothing saves)."""
    check_int("micro_batch", micro_batch, minimum=1)
    cfg = COURSE_CONFIG
    tokens, h, f = micro_batch * cfg.seq, cfg.hidden, cfg.ffn_
    block = 4 * h * h + 2 * h * f                    # q, k, v, o; up, down
    forward = 2 * tokens * (cfg.layers * block + cfg.vocab * h)
    recompute = 2 * tokens * cfg.layers * (block - f * h) if checkpointed else 0
    return 3 * forward + recompute


def _apply_checkpointing(model: nn.Module, method: str) -> None:
    checkpoint, apply_activation_checkpointing = compat.checkpoint_functions()
    if method == "composable":
        for block in fsdp_units(model):
            checkpoint(block)
    elif method == "wrapper":
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))


def _rank_checkpointing(steps: int) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    out = {}
    for method in ("none", "composable", "wrapper"):
        model, opt, data, device = _sharded(before=lambda m: _apply_checkpointing(m, method))
        starts, forward_starts, losses = [0], [], []
        for block in fsdp_units(model):
            block.norm1.register_forward_pre_hook(lambda mod, a: starts.__setitem__(0, starts[0] + 1))
        model.register_forward_hook(lambda *_: forward_starts.append(starts[0]))
        with CommLedger() as ledger, FlopCounterMode(display=False) as flops, \
                SavedActivations(model) as saved:
            for step, loss, _ in train(model, opt, data, steps, device=device, meters=(ledger,)):
                losses.append(loss)
                if step < steps - 1:            # what is saved, run and sent: in the last step
                    ledger.reset()
                    saved.reset()
                    starts[0] = 0
        x, _ = data.shard(0, dist.get_rank(), dist.get_world_size())
        matmul = sum(n for op, n in flops.get_flop_counts()["Global"].items()
                     if str(op).split(".")[-1] in ("mm", "addmm", "bmm")) // steps   # steps alike
        out[method] = {"losses": losses,
                       "saved": {"activations": saved.bytes, "parameters": saved.parameters},
                       "counts": ledger.counts(),
                       "block_forwards": {"forward": forward_starts[-1], "step": starts[0]},
                       "matmul_flops": matmul, "local_batch": x.shape[0], "device": device.type}
    return out


def measure_activation_checkpointing(world_size: int = 2, *, steps: int = 2) -> OptionResult:
    """Checkpointing every block before ``fully_shard``, the two ways that work with FSDP2 (torch 2.13):
    ``_composable.checkpoint`` (names unchanged) and ``apply_activation_checkpointing``, vs none."""
    res = _launch(_rank_checkpointing, world_size, steps=steps)
    r = res[0]
    b = r["none"]["local_batch"]
    no_ac = predicted_saved_activation_bytes(b, checkpointed=False)
    ac = predicted_saved_activation_bytes(b, checkpointed=True)
    exact_kernels = r["none"]["device"] == "cpu"     # the kernels' saved tensors differ on GPUs
    checks = [Check("saved activation B, no checkpointing", r["none"]["saved"]["activations"],
                    no_ac["total"], op="==" if exact_kernels else "~", rel_tol=0.05),
              Check("matmul FLOPs/step, no checkpointing", r["none"]["matmul_flops"],
                    matmul_flops_per_step(b, checkpointed=False))]
    for method in ("composable", "wrapper"):
        m = r[method]
        checks += [
            Check(f"{method}: saved activation B", m["saved"]["activations"], ac["total"]),
            Check(f"{method}: block forwards/step", m["block_forwards"]["step"], 2 * COURSE_CONFIG.layers),
            Check(f"{method}: matmul FLOPs/step", m["matmul_flops"],
                  matmul_flops_per_step(b, checkpointed=True)),
            Check(f"{method}: collectives/step", m["counts"], r["none"]["counts"]),
            Check(f"{method}: max relative loss difference",
                  max_rel_diff(m["losses"], r["none"]["losses"]), 1e-6, op="<="),
        ]
    details = {**r, "predicted_no_checkpointing": no_ac, "predicted_checkpointed": ac,
               "saved_ratio": r["composable"]["saved"]["activations"] / r["none"]["saved"]["activations"],
               "flops_ratio": r["composable"]["matmul_flops"] / r["none"]["matmul_flops"]}
    return OptionResult("activation checkpointing of every block", where(res), checks, details)


# ================================================================== 6. gradient clipping

def _rank_clipping(max_norm: float) -> dict:
    model = _sharded()[0]
    model(*batch(0, seed=SEED)).backward()
    local = torch.linalg.vector_norm(torch.stack(
        [torch.linalg.vector_norm(local_tensor(p.grad)) for p in model.parameters()]))
    with CommLedger() as ledger:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    after = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    return {"total_norm": float(total.full_tensor() if hasattr(total, "full_tensor") else total),
            "total_norm_type": f"{type(total).__name__} {getattr(total, 'placements', '')}".strip(),
            "norm_after": float(after.full_tensor() if hasattr(after, "full_tensor") else after),
            "local_norm": local.item(), "counts": ledger.counts(), "totals": ledger.totals(),
            "messages": ledger.message_bytes(),
            "has_clip_method": hasattr(model, "clip_grad_norm_"),
            "num_param_tensors": sum(1 for p in model.parameters() if p.grad is not None),
            **_full_grads_on_rank0(model)}


def _full_grads_on_rank0(model) -> dict:
    grads = full_grads(model)
    return {"grads": {n: g.cpu() for n, g in grads.items()}} if dist.get_rank() == 0 else {}


def _grad_rel_diff(grads: dict, ref: dict) -> float:
    return (max((grads[n] - g).abs().max().item() for n, g in ref.items())
            / max(g.abs().max().item() for g in ref.values()))


def measure_gradient_clipping(world_size: int = 2, *, max_norm: float = 0.5) -> OptionResult:
    """``clip_grad_norm_`` on FSDP2's DTensor gradients vs one process, and the wrong way (local shard norms)."""
    check_positive("max_norm", max_norm)
    max_norm = float(max_norm)
    res = _launch(_rank_clipping, world_size, max_norm)
    _, ref_norm, ref_grads = reference_grads(max_norm=max_norm)
    r = res[0]
    grad_diff = _grad_rel_diff(r["grads"], ref_grads)
    locals_ = [v["local_norm"] for v in res]
    checks = [
        Check("total norm vs one process", r["total_norm"], ref_norm, op="~", rel_tol=1e-6),
        Check("same total norm on every rank", len({v["total_norm"] for v in res}), 1),
        Check("clipped grads: max |diff| / max |grad|", grad_diff, 1e-6, op="<="),
        Check("global norm after clipping", r["norm_after"], min(max_norm, ref_norm), op="~",
              rel_tol=1e-5),
        Check("all-reduces issued by clipping", r["counts"]["all_reduce"], 1),
        Check("all-reduce message B (one norm per tensor)", r["messages"]["all_reduce"],
              4 * r["num_param_tensors"]),
        Check("sqrt(sum of local shard norms^2)", math.sqrt(sum(n * n for n in locals_)), ref_norm,
              op="~", rel_tol=1e-6),
        Check("largest local shard norm (wrong way)", max(locals_), ref_norm, op="<="),
        Check("FSDP2 module has clip_grad_norm_", r["has_clip_method"], False),
    ]
    details = {**r, "reference_norm": ref_norm, "local_shard_norms": locals_, "grad_max_rel_diff": grad_diff}
    return OptionResult(f"clip_grad_norm_(max_norm={max_norm:g}) on sharded gradients", where(res),
                        checks, details)


# ================================================================== 7. gradient accumulation

def _rank_accumulation(micro_batches: int) -> dict:
    out = {}
    for name in ("sync every micro-batch", "sync on the last only"):
        model, opt, _, _ = _sharded()
        x, y = batch(0, seed=SEED)
        per = []
        for i, (xm, ym) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches))):
            if name == "sync on the last only":
                model.set_requires_gradient_sync(i == micro_batches - 1)
            with CommLedger() as ledger:
                (model(xm, ym) / micro_batches).backward()
            per.append({"counts": ledger.counts(), "totals": ledger.totals(),
                        "unsharded_grad_bytes": compat.fsdp2_unsharded_grad_bytes(model),
                        "sharded_grad_bytes": state_bytes(model, opt)["grads"]})
        out[name] = {"micro_batches": per, **_full_grads_on_rank0(model)}
    return out


def measure_gradient_accumulation(world_size: int = 2, *, micro_batches: int = 3) -> OptionResult:
    """``set_requires_gradient_sync(False)`` on all but the last of ``micro_batches`` vs syncing each."""
    check_run(world_size, 1, SEED)
    check_int("micro_batches", micro_batches, minimum=2)
    rows = GLOBAL_BATCH // world_size
    if rows % micro_batches:
        raise ValueError(f"each of the {world_size} ranks has {rows} sequences; micro_batches must "
                         f"divide {rows}, got {micro_batches}")
    res = _launch(_rank_accumulation, world_size, micro_batches)
    _, _, ref = reference_grads()
    meta = build_model(COURSE_CONFIG, device="meta")
    units = 1 + COURSE_CONFIG.layers
    psi = sum(p.numel() for p in meta.parameters())
    sharded = fsdp_state_bytes(meta, world_size, 0)["grads"]
    k = micro_batches
    nosync, sync = res[0]["sync on the last only"], res[0]["sync every micro-batch"]
    mb, smb = nosync["micro_batches"], sync["micro_batches"]
    diff_nosync, diff_sync = _grad_rel_diff(nosync["grads"], ref), _grad_rel_diff(sync["grads"], ref)
    checks = [
        Check("reduce-scatters per micro-batch, no sync", [m["counts"]["reduce_scatter"] for m in mb],
              [0] * (k - 1) + [units]),
        Check("reduce-scatters per micro-batch, sync", [m["counts"]["reduce_scatter"] for m in smb],
              [units] * k),
        Check("all-gathers per micro-batch, no sync", [m["counts"]["all_gather"] for m in mb],
              [calls_per_step(COURSE_CONFIG.layers)["all_gather"]] * k),
        Check("unsharded grad B held between micro-batches", mb[0]["unsharded_grad_bytes"], 4 * psi),
        Check("sharded grad B held between micro-batches, no sync", mb[0]["sharded_grad_bytes"], 0),
        Check("sharded grad B held, sync every micro-batch", smb[0]["sharded_grad_bytes"], sharded),
        Check("unsharded grad B after the last (reduced)", mb[-1]["unsharded_grad_bytes"], 0),
        Check("sharded grad B after the last", mb[-1]["sharded_grad_bytes"], sharded),
        Check("no sync: max |grad - full batch| / max |grad|", diff_nosync, 1e-6, op="<="),
        Check("sync: max |grad - full batch| / max |grad|", diff_sync, 1e-6, op="<="),
    ]
    details = {"no_sync": mb, "sync": smb, "grad_max_rel_diff_no_sync": diff_nosync,
               "grad_max_rel_diff_sync": diff_sync, "num_params": psi}
    return OptionResult(f"set_requires_gradient_sync(False), {k} micro-batches", where(res),
                        checks, details)
