"""Notebook 07's wrapping experiments on launched ranks, each next to its prediction: 1. wrapping
granularity; 2./3. FSDP1's ShardingStrategy -> FSDP2, FULL_SHARD also with FSDP1's other auto-wrap
policy (the block class is an argument of the *policy*; HYBRID_SHARD without a mesh silently trains
unsynchronised ranks on CPU); 4. a tutorial's "Common issues", reproduced and fixed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
import warnings
from fractions import Fraction

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_choice, check_int, check_module
from ..harness import experiments, strategies
from ..harness.model import GPT, Block, SyntheticData, build_model, rows_per_rank
from ..impl import fsdp
from ..theory import sharding
from ..impl.common import broadcast_from_rank0
from ..runtime import compat
from ..runtime.fmt import LOSS_RTOL, bound, max_rel_diff, nums, table
from ..runtime.launch import launch, rank_device, where
from ..runtime.ledger import CommLedger
from ..theory.comm import OPS
from ..theory.config import COURSE_CONFIG, TransformerConfig
from ..theory.layout import padded_numel as flat_padded_numel

__all__ = ["GRANULARITIES", "UnshardedProbe", "predict_unsharded_peak", "measure_granularity",
           "GranularityReport", "STRATEGY_MAP", "strategy_table",
           "predict_strategy", "StrategyReport", "IssueReport", "issue_oom", "issue_slow",
           "issue_inconsistent_init", "check_run", "exact_number", "error_of"]

#: name -> (unit types given to :func:`course_utils.theory.sharding.fsdp_units` (None: the blocks;
#: (): none, fully_shard(model) only), reshard_after_forward of the units); each wrapping is then
#: finished by fully_shard(model). What each is: notebook 07 §3.
GRANULARITIES = {"root-only": ((), True), "per-block": (None, True),
                 "per-leaf": ((nn.Linear, nn.LayerNorm), True), "per-block-zero2": (None, False)}

_VIEW_WARNING = r"FSDP2-wrapped module .* returned a view tensor"


def check_run(world_size, steps, seed, *, min_world: int = 2, min_steps: int = 1) -> None:
    """The arguments of a launched experiment: at least ``min_world`` ranks that divide the
    course's global batch, at least ``min_steps`` steps, a seed >= 0."""
    check_int("world_size", world_size, min_world)
    check_int("steps", steps, min_steps)
    check_int("seed", seed, 0)
    rows_per_rank(experiments.GLOBAL_BATCH, world_size)


def _check_names(name: str, given, known) -> tuple:
    given = (given,) if isinstance(given, str) else tuple(given)
    if not given or any(g not in known for g in given):
        raise ValueError(f"{name} must be a non-empty selection of {list(known)}, got {list(given)}")
    return given


def exact_number(x):
    """An exact count (a Fraction, an int, a float) as an int when it is whole, else a float."""
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


# ================================================================ 1. unsharded bytes, measured

class UnshardedProbe:
    """``with UnshardedProbe(model) as probe:`` around a step of a ``fully_shard`` model: ``.peak_params``,
    ``.peak_total`` (+ all-gather buffers), ``.timeline``, ``.forward_order``. It samples FSDP2's own
    unsharded tensors around every call that allocates or frees them: the maximum is the exact peak."""

    #: FSDPParamGroup method -> (label of the sample before it, label after it); None: no sample
    _WRAPPED = {
        "unshard": (None, "all-gather issued"),
        "_to_unsharded": ("copied out", None),           # its buffer and parameters both live
        "wait_for_unshard": (None, "unsharded"),
        "reshard": ("before reshard", "resharded"),
        "pre_backward": ("pre-backward", "pre-backward done"),
        "post_backward": ("post-backward", "post-backward done"),
    }

    def __init__(self, model: nn.Module):
        self.groups = list(compat.fsdp2_param_groups(check_module("model", model)).items())
        if not self.groups:
            raise ValueError("the model has no fully_shard units with parameters: call "
                             "fully_shard(...) on it (e.g. course_utils.harness.strategies.wrap_torch_fsdp) first")
        self.timeline, self.forward_order, self._watch = [], [], None
        self.peak_params = self.peak_total = 0

    def sample(self, event: str, unit: str = "") -> tuple[int, int]:
        params, buffers = compat.fsdp2_unsharded_bytes(g for _, g in self.groups)
        self.timeline.append((event, unit, params, buffers))
        self.peak_params = max(self.peak_params, params)
        self.peak_total = max(self.peak_total, params + buffers)
        return params, buffers

    def _on_call(self, name: str, group, method: str, call):
        before, after = self._WRAPPED[method]
        if method == "wait_for_unshard" and compat.fsdp2_training_state(group) == "FORWARD":
            self.forward_order.append(name)
        if before:
            self.sample(before, name)
        out = call()
        if after:
            self.sample(after, name)
        return out

    def __enter__(self) -> "UnshardedProbe":
        if self._watch is not None:
            raise RuntimeError("this UnshardedProbe is already attached")
        self._watch = compat.watch_fsdp2(dict(self.groups), self._WRAPPED, self._on_call)
        self._watch.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        watch, self._watch = self._watch, None
        return bool(watch.__exit__(*exc))


# ============================================================= 1. unsharded bytes, predicted

def _replay(root: int, units: list[tuple[str, int]], reshard_after_forward: bool) -> list[tuple]:
    """FSDP2's default schedule for one forward + backward, as (event, unit, params, buffers)."""
    size, params, buffers, trace = dict([("root", root), *units]), {}, {}, []   # unit -> bytes held
    order = ["root"] + [u for u, _ in units]                       # forward order

    def step(event, u, held, add=True):
        if add:
            held[u] = size[u]
        else:
            del held[u]
        trace.append((event, u, sum(params.values()), sum(buffers.values())))

    for i, u in enumerate(order):                                  # forward
        step("all-gather issued", u, buffers)                      # unshard(): the flat buffer
        if i:
            del buffers[order[i - 1]]                              # the previous unit's buffer goes now
        step("copied out", u, params)
        if reshard_after_forward and i:
            step("resharded after forward", u, params, add=False)
    step("buffer freed", order[-1], buffers, add=False)            # by the root's post-forward
    if reshard_after_forward and units:                            # backward: the root prefetches the last
        step("all-gather issued", order[-1], buffers)
    for i in range(len(order) - 1, 0, -1):
        if reshard_after_forward:
            step("copied out", order[i], params)
            step("buffer freed", order[i], buffers, add=False)
            if i > 1:
                step("all-gather issued", order[i - 1], buffers)   # prefetch the next unit in backward
        step("resharded after backward", order[i], params, add=False)
    step("resharded after backward", "root", params, add=False)
    return trace


def predict_unsharded_peak(granularity: str = "per-block", world_size: int = 2, *,
                           config: TransformerConfig = COURSE_CONFIG) -> dict:
    """What :class:`UnshardedProbe` should measure (fp32 bytes), replaying FSDP2's schedule on the
    padded unit sizes: ``{"params", "total", "units" (with the root), "forward_order", "timeline"}``."""
    granularity = _check_names("granularity", granularity, GRANULARITIES)[0]
    check_int("world_size", world_size, 1)
    unit_types, reshard = GRANULARITIES[granularity]
    model = build_model(config, device="meta")                 # checks config
    root, *sizes = sharding.message_numels(model, world_size, unit_types)   # padded, per unit
    size = {id(u): 4 * s for u, s in zip(sharding.fsdp_units(model, unit_types), sizes)}
    units = [(n, size[id(m)]) for n, m in model.named_modules() if id(m) in size]  # forward order
    trace = _replay(4 * root, units, reshard)
    return {"params": max(p for *_, p, _b in trace), "total": max(p + b for *_, p, b in trace),
            "units": len(units) + 1, "forward_order": ["root"] + [u for u, _ in units],
            "timeline": trace}


# ================================================================= 1. granularity, measured

def _measured_run(model, optimizer, data, steps: int, device, probe: UnshardedProbe | None = None,
                  **extra) -> dict:
    """Losses, times, the last step's collectives and state bytes; ``probe`` watches the last step (steps >= 2)."""
    run = {"losses": [], "times": [], "counts": [], "totals": []}
    with CommLedger() as ledger, contextlib.ExitStack() as last_step:
        for step, loss, seconds in experiments.train(model, optimizer, data, steps, device=device,
                                                     meters=(ledger,)):
            for key, value in zip(run, (loss, seconds, ledger.counts(), ledger.totals(exact=True))):
                run[key].append(value)
            if step < steps - 1:
                ledger.reset()
            else:
                run["state_bytes"] = experiments.state_bytes(model, optimizer)
            if probe is not None and step == steps - 2:
                last_step.enter_context(probe)
    counts, totals = run["counts"], run["totals"]
    return dict(run, calls={op: counts[-1].get(op, 0) for op in OPS},
                bytes={op: exact_number(totals[-1].get(op, 0)) for op in OPS},
                every_step_same=all(c == counts[-1] for c in counts) and all(t == totals[-1] for t in totals),
                functions=sorted({rec.function for rec in ledger.records}),
                group_sizes=sorted({(rec.op, rec.world_size) for rec in ledger.records}), **extra)


def _granularity_rank(names, steps: int, seed: int, config: TransformerConfig) -> dict:
    device = rank_device()
    data = SyntheticData(config, global_batch=experiments.GLOBAL_BATCH, seed=seed)
    out = {}
    for name in names:
        unit_types, reshard = GRANULARITIES[name]
        wrap = strategies.wrap_torch_fsdp if reshard else strategies.wrap_torch_fsdp_zero2
        model, optimizer = wrap(build_model(config, seed=seed, device=device),
                                experiments.make_adamw, unit_types=unit_types)
        probe = UnshardedProbe(model)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_VIEW_WARNING)   # per-leaf: harmless here
            run = _measured_run(model, optimizer, data, steps, device, probe)
        timed = run["times"][1:-1] or run["times"]     # not the warm-up, not the probed step
        out[name] = {**{k: run[k] for k in ("losses", "calls", "bytes", "every_step_same")},
                     **{k: getattr(probe, k) for k in ("peak_params", "peak_total", "forward_order",
                                                       "timeline")},
                     "units": len(probe.groups), "step_time_s": statistics.median(timed),
                     "cuda_peak_allocated": (torch.cuda.max_memory_allocated(device)
                                             if device.type == "cuda" else None)}
    return out


@dataclasses.dataclass
class _Rows:
    """Rows measured on ``world_size`` ranks, compared with ``"single"``."""

    rows: list
    world_size: int
    steps: int
    where: str
    single_losses: list
    _key = "name"

    def row(self, name: str) -> dict:
        for r in self.rows:
            if r[self._key] == name:
                return r
        raise KeyError(f"no row {name!r}; rows: {[r[self._key] for r in self.rows]}")


@dataclasses.dataclass
class GranularityReport(_Rows):
    """What :func:`measure_granularity` measured on rank 0, one row per granularity, with ``predicted_*``."""

    _key = "granularity"

    def table(self, *, include_time: bool = False) -> str:
        header = ["granularity", "units", "params peak B", "predicted", "+buffers peak B",
                  "predicted", "AG/step", "RS/step", "sent B/step", "= single"]
        rows = [[r["granularity"], r["units"], r["peak_params"], r["predicted_params"],
                 r["peak_total"], r["predicted_total"], r["calls"]["all_gather"],
                 r["calls"]["reduce_scatter"], sum(r["bytes"].values()),
                 r["max_rel_loss_diff"] <= 1e-6] + ([round(1e3 * r["step_time_s"], 1)] if include_time else [])
                for r in self.rows]
        notes = [f"fp32 bytes on one rank of {self.where}; params = unsharded parameters, "
                 f"+buffers = with the flat all-gather buffers; {self.steps} steps."]
        return table(header + ["step ms (varies)"] * include_time, rows, notes=notes)


def measure_granularity(world_size: int = 2, *, granularities=tuple(GRANULARITIES),
                        steps: int = 4, seed: int = 0, config: TransformerConfig = COURSE_CONFIG,
                        timeout_s: float = 180.0) -> GranularityReport:
    """Train with each wrapping of :data:`GRANULARITIES` (one launch): peak unsharded bytes, collectives,
    median step time (steps 1..steps-2), on GPUs ``max_memory_allocated``; ``steps`` >= 3."""
    check_run(world_size, steps, seed, min_steps=3)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig (e.g. COURSE_CONFIG), got {type(config).__name__}")
    names = _check_names("granularities", granularities, GRANULARITIES)
    single = experiments.run("single", 1, steps=steps, seed=seed, config=config, quiet=True)[0].losses
    results = launch(_granularity_rank, world_size, names, steps, seed, config, quiet=True,
                     timeout_s=timeout_s)
    model = build_model(config, device="meta")
    rows = []
    for name in names:
        unit_types, reshard = GRANULARITIES[name]
        r = dict(results[0][name])
        if any(results[k][name]["peak_total"] != r["peak_total"] for k in range(world_size)):
            raise RuntimeError(f"{name}: the ranks measured different peaks: this should not happen")
        pred = predict_unsharded_peak(name, world_size, config=config)
        pred_bytes = sharding.comm_bytes_per_step(model, world_size, reshard_after_forward=reshard,
                                                  unit_types=unit_types)
        r.update(granularity=name, predicted_params=pred["params"], predicted_total=pred["total"],
                 predicted_forward_order=pred["forward_order"],
                 predicted_calls=sharding.calls_per_step(len(sharding.fsdp_units(model, unit_types)),
                                                         reshard_after_forward=reshard),
                 predicted_bytes={op: exact_number(v) for op, v in pred_bytes.items()},
                 max_rel_loss_diff=max_rel_diff(r["losses"], single))
        rows.append(r)
    return GranularityReport(rows, world_size, steps, where(results), single)


# ============================================= 2. FSDP1 (both auto-wrap policies), run and measured

def _fsdp1(model, device, *, policy="module", strategy="FULL_SHARD", mesh=None, **kwargs):
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, transformer_auto_wrap_policy

    auto_wrap = (ModuleWrapPolicy({Block}) if policy == "module"   # else the tutorial's call, right:
                 else functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}))
    return FullyShardedDataParallel(model, auto_wrap_policy=auto_wrap, device_id=device,
                                    sharding_strategy=getattr(ShardingStrategy, strategy),
                                    **kwargs, **({} if mesh is None else {"device_mesh": mesh}))


def _run_api(model, opt, data, steps: int, device, api: str) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel

    units = (sum(isinstance(m, FullyShardedDataParallel) for m in model.modules()) if api == "fsdp1"
             else len(compat.fsdp2_param_groups(model)))
    return _measured_run(model, opt, data, steps, device, units=units)


def error_of(fn) -> str:
    """``"TypeName: message"`` of what ``fn()`` raises, or ``"no error"``."""
    try:
        fn()
    except Exception as exc:      # noqa: BLE001 - we report what torch says
        return f"{type(exc).__name__}: {exc}"
    return "no error"


# ================================================================ 3. ShardingStrategy table

#: FSDP1 ShardingStrategy -> (ZeRO stage, mesh: "1-D" over all ranks, "2-D" (replicate, shard) =
#: (2, N/2), "N x 1" (replicate over all, shard size 1)); the FSDP2 form of each: notebook 10's table.
STRATEGY_MAP = {"FULL_SHARD": (3, "1-D"), "SHARD_GRAD_OP": (2, "1-D"), "NO_SHARD": (0, "N x 1"),
                "HYBRID_SHARD": (3, "2-D"), "_HYBRID_SHARD_ZERO2": (2, "2-D")}
_TABLE_ROWS = tuple(STRATEGY_MAP) + ("HYBRID_SHARD (no mesh)",)
#: the APIs a row of :func:`strategy_table` may measure ("fsdp1-transformer": FULL_SHARD only, FSDP1
#: with ``transformer_auto_wrap_policy``; "replicate": NO_SHARD only,
#: ``torch.distributed._composable.replicate_with_fsdp.replicate`` per block and root)
_APIS = ("fsdp1", "fsdp1-transformer", "fsdp2", "replicate")


def _mesh_shape(kind: str, world: int) -> tuple[int, int]:
    return {"1-D": (1, world), "2-D": (2, world // 2), "N x 1": (world, 1)}[kind]


def _strategy_rank(names, steps: int, seed: int) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy as policy

    device = rank_device()
    data = SyntheticData(global_batch=experiments.GLOBAL_BATCH, seed=seed)
    out = {"errors": {     # what a tutorial's two spellings of the transformer policy do
        "FSDP(model, auto_wrap_policy=transformer_auto_wrap_policy, transformer_layer_cls={Block})":
            error_of(lambda: FSDP(build_model(device=device), auto_wrap_policy=policy,
                                   transformer_layer_cls={Block}, device_id=device)),
        "FSDP(model, auto_wrap_policy=transformer_auto_wrap_policy)":
            error_of(lambda: FSDP(build_model(device=device), auto_wrap_policy=policy, device_id=device))}}

    def digest(model, api):             # of the full parameters this rank would train
        if api == "fsdp1":
            with FSDP.summon_full_params(model, writeback=False):
                return experiments.param_digest({n: p.detach().cpu().clone()
                                                 for n, p in model.named_parameters()})
        return experiments.param_digest(experiments.full_parameters(model))

    for name in names:
        row = out[name] = {}
        base, mesh_less = name.split(" ")[0], name.endswith("(no mesh)")
        stage, kind = STRATEGY_MAP[base]
        shards = _mesh_shape(kind, dist.get_world_size())[1]
        mesh = fsdp.make_mesh(device.type, shards=shards) if kind == "2-D" and not mesh_less else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = _fsdp1(build_model(seed=seed, device=device), device, strategy=base, mesh=mesh)
            row["fsdp1"] = _run_api(model, experiments.make_adamw(model.parameters()), data, steps, device,
                                    "fsdp1")
        row["fsdp1"]["warnings"] = sorted({str(w.message) for w in caught
                                           if "FSDP" in str(w.message) or "NO_SHARD" in str(w.message)})
        row["fsdp1"]["digest"] = digest(model, "fsdp1")
        if name == "FULL_SHARD":        # the same units, found by the other policy
            model = _fsdp1(build_model(seed=seed, device=device), device, policy="transformer")
            row["fsdp1-transformer"] = dict(_run_api(model, experiments.make_adamw(model.parameters()), data,
                                                     steps, device, "fsdp1"), digest=digest(model, "fsdp1"))
        if not mesh_less:
            if kind != "1-D" and mesh is None:
                mesh = fsdp.make_mesh(device.type, shards=shards)
            model, opt = fsdp.wrap_fsdp2(build_model(seed=seed, device=device), experiments.make_adamw,
                                         reshard_after_forward=stage == 3, mesh=mesh)
            row["fsdp2"] = dict(_run_api(model, opt, data, steps, device, "fsdp2"), digest=digest(model, "fsdp2"))
        if base == "NO_SHARD":          # FSDP2's own replicate (private; the row is left out
            model = build_model(seed=seed, device=device)      # where torch has none)
            broadcast_from_rank0(model)
            if compat.fsdp2_replicate([*sharding.fsdp_units(model), model]):
                run = _run_api(model, experiments.make_adamw(model.parameters()), data, steps, device,
                               "replicate")
                row["replicate"] = dict(run, digest=digest(model, "replicate"))
    return out


def predict_strategy(strategy: str, world_size: int = 4, *, flavour: str = "fsdp2",
                     config: TransformerConfig = COURSE_CONFIG) -> dict:
    """``{"calls", "bytes", "state_bytes", "mesh": (R, S), "zero_stage"}`` per step (fp32, AdamW). FSDP1
    pads each unit's flat parameter once to a multiple of S (+ one step counter per unit), FSDP2
    every parameter's dim 0; R > 1 replicas all-reduce each shard."""
    check_choice("strategy", strategy, STRATEGY_MAP, kind="strategy", kinds="strategies")
    check_choice("flavour", flavour, ("fsdp1", "fsdp2"), kind="flavour", kinds="flavours")
    check_int("world_size", world_size, 2)
    stage, kind = STRATEGY_MAP[strategy]
    if kind == "2-D" and world_size % 2:
        raise ValueError(f"{strategy} uses a (2, N/2) mesh: world_size must be even, got {world_size}")
    R, S = _mesh_shape(kind, world_size)
    model = build_model(config, device="meta")
    units = sharding.fsdp_units(model)
    if flavour == "fsdp2":
        messages = sharding.message_numels(model, S)
        state = sharding.fsdp_state_bytes(model, S, 0)
    else:
        messages = [flat_padded_numel(sum(p.numel() for p in ps), S) for ps in sharding.unit_params(model)]
        shard = 4 * sum(m // S for m in messages)
        state = {"params": shard, "grads": shard, "optimizer": 2 * shard + 4 * len(messages)}
    g = 2 if stage == 3 else 1                    # gathers of each block per step
    calls = dict.fromkeys(OPS, 0)
    sent = dict.fromkeys(OPS, Fraction(0))
    if S > 1:
        calls.update(all_gather=g * len(units) + 1, reduce_scatter=len(units) + 1)
        sent["all_gather"] = Fraction(S - 1, S) * 4 * (messages[0] + g * sum(messages[1:]))
        sent["reduce_scatter"] = Fraction(S - 1, S) * 4 * sum(messages)
    if R > 1:
        calls["all_reduce"] = len(units) + 1
        sent["all_reduce"] = 2 * Fraction(R - 1, R) * 4 * Fraction(sum(messages), S)
    return {"calls": calls, "bytes": {op: exact_number(v) for op, v in sent.items()},
            "state_bytes": state, "mesh": (R, S), "zero_stage": stage}


@dataclasses.dataclass
class StrategyReport(_Rows):
    """What :func:`strategy_table` measured: one row per FSDP1 strategy, one entry per API of :data:`_APIS`;
    ``errors``: what a tutorial's two spellings of FSDP1's transformer policy raise."""

    errors: dict = dataclasses.field(default_factory=dict)
    _key = "strategy"

    def table(self) -> str:
        header = ["FSDP1 strategy", "API", "stage", "mesh", "AG", "RS", "AR", "sent B/step",
                  "= predicted", "state B/rank", "= single", "replicas agree"]
        rows = [[r["strategy"] if api == "fsdp1" else "", api, r["zero_stage"],
                 "x".join(map(str, r["mesh"])) if api == "fsdp2" or "no mesh" not in r["strategy"] else "none",
                 m["calls"]["all_gather"], m["calls"]["reduce_scatter"], m["calls"]["all_reduce"],
                 sum(m["bytes"].values()), None if m["predicted"] is None else
                 all(m[k] == m["predicted"][k] for k in ("calls", "bytes", "state_bytes")),
                 sum(m["state_bytes"].values()), m["max_rel_loss_diff"] <= 1e-6, m["replicas_agree"]]
                for r in self.rows for api in _APIS if (m := r.get(api)) is not None]
        return table(header, rows, notes=[f"fp32, per rank and step, {self.where}, {self.steps} steps."])


def strategy_table(world_size: int = 4, *, steps: int = 2, seed: int = 0,
                   strategies=_TABLE_ROWS, timeout_s: float = 240.0) -> StrategyReport:
    """Every FSDP1 ``ShardingStrategy`` and its FSDP2 form in one launch (HYBRID rows on a (2, N/2)
    mesh, or none for ``"HYBRID_SHARD (no mesh)"``); world_size: even, >= 4."""
    check_run(world_size, steps, seed, min_world=4)
    names = _check_names("strategies", strategies, _TABLE_ROWS)
    if world_size % 2:
        raise ValueError(f"world_size must be even (a 2 x N/2 mesh): use 4, 6 or 12, got {world_size}")
    single = experiments.run("single", 1, steps=steps, seed=seed, quiet=True)[0].losses
    results = launch(_strategy_rank, world_size, names, steps, seed, quiet=True, timeout_s=timeout_s)
    rows = []
    for name in names:
        base, mesh_less = name.split(" ")[0], "no mesh" in name
        stage, kind = STRATEGY_MAP[base]
        row = {"strategy": name, "zero_stage": None if mesh_less else stage,
               "mesh": _mesh_shape(kind, world_size)}
        for api in _APIS:
            m = results[0][name].get(api)
            row[api] = None if m is None else dict(
                m, replicas_agree=len({results[k][name][api]["digest"] for k in range(world_size)}) == 1,
                max_rel_loss_diff=max_rel_diff(m["losses"], single),
                predicted=None if mesh_less else predict_strategy(
                    base, world_size, flavour="fsdp1" if api.startswith("fsdp1") else "fsdp2"))
        rows.append(row)
    return StrategyReport(rows, world_size, steps, where(results), single, results[0]["errors"])


# =================================================================== 4. common issues

@dataclasses.dataclass
class IssueReport:
    """A tutorial's "Common issue", reproduced (``before``) and fixed (``after``); :meth:`brief` prints
    ``summary``, its computed lines (notebook 10's markdown says what they mean)."""

    issue: str
    before: dict
    after: dict
    where: str
    summary: list

    def brief(self) -> str:
        return "\n".join(self.summary)


def _require(report, names, world_size: int) -> GranularityReport:
    """``report``, checked to hold the rows ``names``; measured on ``world_size`` ranks if None."""
    if report is None:
        return measure_granularity(world_size, granularities=names)
    if not isinstance(report, GranularityReport):
        raise TypeError("report must be the GranularityReport of measure_granularity(...)")
    missing = [n for n in names if n not in [r["granularity"] for r in report.rows]]
    if missing:
        raise ValueError(f"report has no rows {missing}: measure it with "
                         f"measure_granularity(granularities={tuple(names)!r})")
    return report


def issue_oom(report: GranularityReport | None = None, *, world_size: int = 2,
              budget_bytes: int | None = None) -> IssueReport:
    """"OOM with FSDP": with a budget between the two measured peaks (default: their midpoint),
    root-only exceeds it (at the probe's event) and per-block fits; ``report`` is reused if given."""
    report = _require(report, ("root-only", "per-block"), world_size)
    coarse, fine = report.row("root-only"), report.row("per-block")
    if budget_bytes is None:
        budget_bytes = (coarse["peak_total"] + fine["peak_total"]) // 2
    check_int("budget_bytes", budget_bytes, 1)

    def side(r):
        over = next((s for s in r["timeline"] if s[2] + s[3] > budget_bytes), None)
        return {"wrapping": r["granularity"], "peak unsharded params + buffers (B)": r["peak_total"],
                "budget (B)": budget_bytes, "fits": r["peak_total"] <= budget_bytes,
                "first event over budget": None if over is None else f"{over[0]} ({over[1]})"}

    def verdict(s):
        return "fits" if s["fits"] else f"out of memory at '{s['first event over budget']}'"

    before, after = side(coarse), side(fine)
    summary = [f"{coarse['granularity']}: peak {coarse['peak_total']:,} B of unsharded parameters + "
               f"buffers, budget {budget_bytes:,} B: " + verdict(before),
               f"{fine['granularity']}: peak {fine['peak_total']:,} B: " + verdict(after)]
    return IssueReport("OOM with FSDP", before, after, report.where, summary)


def issue_slow(report: GranularityReport | None = None, strategies: StrategyReport | None = None,
               *, world_size: int = 2) -> IssueReport:
    """"Slow training": per-leaf multiplies the calls per step against per-block; SHARD_GRAD_OP
    gathers each block once, not twice, but holds it. ``strategies`` adds FSDP1's all-gathers."""
    needed = ("per-block", "per-leaf", "per-block-zero2")
    report = _require(report, needed, world_size)
    if strategies is not None and not isinstance(strategies, StrategyReport):
        raise TypeError("strategies must be the StrategyReport of strategy_table(...) or None")
    block, leaf, zero2 = (report.row(n) for n in needed)

    def calls(r):
        c = r["calls"]
        return (f"{r['granularity']}: {r['units']} units, {c['all_gather']} all-gathers + "
                f"{c['reduce_scatter']} reduce-scatters = {sum(c.values())} calls/step for "
                f"{sum(r['bytes'].values()):,} B")

    before, after = leaf, dict(block, SHARD_GRAD_OP=zero2)          # the granularity rows
    if strategies is not None:
        after["FSDP1 all-gathers/step, FULL_SHARD and SHARD_GRAD_OP"] = tuple(
            strategies.row(n)["fsdp1"]["calls"]["all_gather"] for n in ("FULL_SHARD", "SHARD_GRAD_OP"))
    summary = [calls(leaf), calls(block),
               f"{zero2['granularity']} (SHARD_GRAD_OP): {zero2['calls']['all_gather']} all-gathers, "
               f"{sum(zero2['bytes'].values()):,} B/step, but an unsharded peak of "
               f"{zero2['peak_total']:,} B instead of {block['peak_total']:,} B"]
    return IssueReport("Slow training (too much communication)", before, after, report.where, summary)


def _losses(model, steps: int, seed: int) -> list:
    data = SyntheticData(global_batch=experiments.GLOBAL_BATCH, seed=seed)
    optimizer = experiments.make_adamw(model.parameters())
    return [loss for _, loss, _ in experiments.train(model, optimizer, data, steps)]


def _seed_rank(steps: int, seed: int, lift_guard: bool) -> dict:
    rank, device = dist.get_rank(), rank_device()

    def seeded(s):
        torch.manual_seed(s)
        return GPT(COURSE_CONFIG).to(device)     # PyTorch's default init: the global RNG

    def fsdp2_run(model):
        fsdp.shard_per_unit(model)               # fully_shard per block, then the root
        return _losses(model, steps, seed)

    out = {"device": device.type, "guard lifted": device.type == "cpu" and lift_guard}
    # the bug: every rank seeds differently, then shards its own initialisation (no broadcast)
    model = seeded(seed + rank)
    mine = model.tok_emb.weight.detach().clone()
    fsdp.shard_per_unit(model)
    full = model.tok_emb.weight.full_tensor()
    out.update(rows_from_this_rank=int((full == mine).all(dim=1).sum()), rows=int(full.shape[0]))
    out["seed+rank, FSDP2"] = _losses(model, steps, seed)
    # fix 1: one seed for the model; per-rank seeds only afterwards (data order, dropout)
    model = seeded(seed)
    torch.manual_seed(seed + rank)
    out["same seed for the model, FSDP2"] = fsdp2_run(model)
    # fix 2: keep the per-rank seed, broadcast rank 0's weights before sharding
    model = seeded(seed + rank)
    broadcast_from_rank0(model)
    out["seed+rank, broadcast_from_rank0, FSDP2"] = fsdp2_run(model)
    # FSDP1: sync_module_states=False (the default) shards each rank's own init too
    out["seed+rank, FSDP1"] = _losses(_fsdp1(seeded(seed + rank), device), steps, seed)
    # fix 3: FSDP1's sync_module_states=True broadcasts rank 0's weights
    out["sync_module_states error"] = error_of(
        lambda: _fsdp1(seeded(seed + rank), device, sync_module_states=True))
    with (compat.fsdp1_allow_cpu_sync_module_states() if out["guard lifted"]   # FSDP1 refuses CPU
          else contextlib.nullcontext()), CommLedger() as ledger:               # tensors (NCCL's limit)
        model = _fsdp1(seeded(seed + rank), device, sync_module_states=True)
    out["sync broadcasts"] = ledger.counts().get("broadcast", 0)
    out["seed+rank, FSDP1 sync_module_states=True"] = _losses(model, steps, seed)
    return out


def issue_inconsistent_init(world_size: int = 2, *, steps: int = 3, seed: int = 0,
                            lift_fsdp1_cpu_guard: bool = True, timeout_s: float = 120.0) -> IssueReport:
    """"Inconsistent results": ``manual_seed(seed + rank)`` before building; ``fully_shard`` does not
    broadcast. ``lift_fsdp1_cpu_guard``: lets ``sync_module_states=True`` run on CPU (NCCL's limit)."""
    check_run(world_size, steps, seed)
    with torch.random.fork_rng(devices=[]):         # this process's global RNG is left as it was
        torch.manual_seed(seed)
        model = GPT(COURSE_CONFIG)
    single = _losses(model, steps, seed)
    results = launch(_seed_rank, world_size, steps, seed, bool(lift_fsdp1_cpu_guard), quiet=True,
                     timeout_s=timeout_s)
    r0 = results[0]

    def verdict(key):
        rel = max_rel_diff(r0[key], single)
        # a real difference in per cent; float32 noise as the bound it meets
        shown = f"{100 * rel:.1f} %" if rel > LOSS_RTOL else bound(rel, LOSS_RTOL)
        return {"losses": nums(r0[key]), "max rel. diff from single": shown, "= single": rel <= LOSS_RTOL}

    bugs = ("seed+rank, FSDP2", "seed+rank, FSDP1")
    fixes = ("same seed for the model, FSDP2", "seed+rank, broadcast_from_rank0, FSDP2",
             "seed+rank, FSDP1 sync_module_states=True")
    v = {key: verdict(key) for key in bugs + fixes}
    mix = ", ".join(f"rank {k}: {results[k]['rows_from_this_rank']}" for k in range(world_size))
    before = {"single (torch.manual_seed(seed); GPT())": nums(single), **{key: v[key] for key in bugs},
              "tok_emb rows each rank's init supplies": f"{mix} (of {r0['rows']})"}
    after = {key: v[key] for key in fixes}
    after["sync_module_states broadcasts"] = r0["sync broadcasts"]
    after[f"sync_module_states=True on {r0['device'].upper()} modules"] = r0["sync_module_states error"]
    after["check lifted for the demo (CPU)"] = r0["guard lifted"]
    diff = {key: v[key]["max rel. diff from single"] for key in v}
    summary = [
        f"manual_seed(seed + rank), then fully_shard: losses {v['seed+rank, FSDP2']['losses']}, one "
        f"process {nums(single)}: {diff['seed+rank, FSDP2']} off "
        f"(FSDP1 without sync_module_states: {diff['seed+rank, FSDP1']})",
        f"fix 1, the same manual_seed(seed) for the model on every rank: rel. diff from one process "
        f"{diff['same seed for the model, FSDP2']}",
        f"fix 2, broadcast_from_rank0 before fully_shard: rel. diff "
        f"{diff['seed+rank, broadcast_from_rank0, FSDP2']}; fix 3, FSDP1's "
        f"sync_module_states=True: {diff['seed+rank, FSDP1 sync_module_states=True']}"]
    return IssueReport("Inconsistent results (per-rank seed before building)", before, after,
                       where(results), summary)
