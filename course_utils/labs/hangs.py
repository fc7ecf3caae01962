"""A hang-debugging lab (notebook 08): four real distributed bugs on 2 ranks, caught, diagnosed, fixed.

The bugs are in :data:`SCENARIOS`. On gloo (torch 2.13, measured by the tests) a collective some
rank never calls **hangs**, so do two ops met in the wrong order; a size mismatch **crashes** the
rank receiving more bytes; DDP **raises** when built on unequal shapes; two swapped collectives
of one op and size **complete with wrong numbers**. :func:`diagnose` names rank, collective and
line (from the launcher's stacks, faulthandler's dump or the traceback). ``detail=True``
(``TORCH_DISTRIBUTED_DEBUG=DETAIL``) raises on unequal collective fingerprints instead (the
closing barrier shows as ``OpType=REDUCE``), blind to equal swapped ones. Reports hold no pids,
ports or times.
"""
from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import io
import linecache
import os
import pickle
import re
import signal
import sys
import tempfile
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

from torch.nn.parallel import DistributedDataParallel

from ..checks import check_choice, check_int, check_timeout
from ..harness.experiments import GLOBAL_BATCH, make_adamw, run, wrap
from .grading import compare, grade_on_ranks
from ..harness.model import SyntheticData, build_model, warm_up
from ..runtime import compat
from ..runtime.fmt import show as _show
from ..runtime.launch import LaunchError, LaunchTimeout, launch, rank_device, resolve_backend, where
from ..theory.config import COURSE_CONFIG

__all__ = ["DEFAULT_TIMEOUT_S", "SCENARIOS", "Scenario", "Outcome", "RankState", "Diagnosis", "FixedRun",
           "skipped_collective", "skipped_collective_fixed", "uneven_batches", "uneven_batches_fixed",
           "shape_mismatch", "shape_mismatch_fixed", "collective_order", "collective_order_fixed",
           "run_broken", "diagnose", "run_fixed", "detail_message", "clean_message", "check_hang_fix", "graded_rank",
           "rank_batches", "ddp_steps", "order_tensors", "sync_one",
           "FR_ENV", "flight_recorder_dumps", "first_mismatch", "flight_recorder"]

DEFAULT_TIMEOUT_S = 5.0   # seconds a broken run may take before the launcher kills it
WORLD_SIZE = 2            # ranks the broken versions run on
BATCHES = 4               # batches of rank 0 in uneven_batches; rank r has BATCHES - r
VIAS = ("torch-ddp", "torch-fsdp", "all_reduce")    # shape_mismatch's ways to synchronise
ORDER_VARIANTS = ("sizes", "same_sizes", "ops")     # collective_order's variants
_STEPS = 2


def skipped_collective() -> float:
    """Average this rank's loss over the ranks, print it once. BUG: the all-reduce is inside
    ``if rank == 0``, so rank 1 never calls it; rank 0 waits for it forever."""
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.tensor(float(rank + 1), device=rank_device())
    if rank == 0:                        # only the rank that prints...
        dist.all_reduce(loss)            # ...averages: the other ranks never get here
        loss /= world
        print(f"mean loss {loss.item():.3f}")
    return loss.item()


def skipped_collective_fixed() -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.tensor(float(rank + 1), device=rank_device())
    dist.all_reduce(loss)
    loss /= world
    if rank == 0:
        print(f"mean loss {loss.item():.3f}")
    return loss.item()


def rank_batches(rank: int) -> list:
    """Rank ``rank``'s data loader: ``BATCHES - rank`` batches of 2 rows (x, y = sum of x)."""
    xs = [torch.randn(2, 4, generator=torch.Generator().manual_seed(1000 * rank + step))
          for step in range(BATCHES - rank)]
    return [(x, x.sum(dim=1, keepdim=True)) for x in xs]


def _small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def ddp_steps(batches) -> torch.Tensor:
    """torch DDP + SGD over ``batches``; the final weights."""
    device = rank_device()
    model = DistributedDataParallel(_small_model().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    print(f"{len(batches)} batches")
    for x, y in batches:     # the loop written out: how many batches each rank loops over is the bug
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()                  # DDP all-reduces the gradients in here
        optimizer.step()
        optimizer.zero_grad()
    return _weights(model)


def uneven_batches() -> torch.Tensor:
    """BUG: rank 1 has one batch fewer, leaves the loop; rank 0's last backward waits."""
    return ddp_steps(rank_batches(dist.get_rank()))


def uneven_batches_fixed() -> torch.Tensor:
    """Agree on the steps every rank can take (all-reduce with MIN); torch's ``Join`` is the other fix."""
    batches = rank_batches(dist.get_rank())
    steps = torch.tensor(len(batches), device=rank_device())
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    return ddp_steps(batches[:int(steps)])


def _average_gradients(model: torch.nn.Module) -> None:
    """Data parallelism by hand: one all-reduce of all gradients, flattened."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.nn.utils.parameters_to_vector(grads)
    dist.all_reduce(flat)
    for g, avg in zip(grads, torch.split(flat / dist.get_world_size(), [g.numel() for g in grads])):
        g.copy_(avg.view_as(g))


def _train_course_gpt(hidden: int, via: str) -> torch.Tensor:
    """2 AdamW steps of the course GPT (``hidden`` wide); the global batch's losses."""
    check_choice("via", via, VIAS, kind="way to synchronise", kinds="ways")
    rank, world, device = dist.get_rank(), dist.get_world_size(), rank_device()
    model = build_model(dataclasses.replace(COURSE_CONFIG, hidden=hidden), seed=0, device=device)
    model, optimizer = ((model, make_adamw(model.parameters())) if via == "all_reduce"
                        else wrap(via, model, make_adamw))
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=0)
    losses = []
    for step in range(_STEPS):   # written out: the hand all-reduce runs between backward and step
        x, y = (t.to(device) for t in data.shard(step, rank, world))
        loss = model(x, y)
        loss.backward()
        if via == "all_reduce":
            _average_gradients(model)
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach()
        dist.all_reduce(total)
        losses.append(total / world)
    return torch.stack(losses).cpu()


def shape_mismatch(via: str = "torch-ddp") -> torch.Tensor:
    """Train the course GPT. BUG: rank 1 reads another config: hidden 60 instead of 50."""
    return _train_course_gpt(50 if dist.get_rank() == 0 else 60, via)


def shape_mismatch_fixed(via: str = "torch-ddp") -> torch.Tensor:
    return _train_course_gpt(COURSE_CONFIG.hidden, via)


def order_tensors(variant: str):
    """``loss`` (1 value, rank + 1) and ``stats`` (8 values of 10·(rank + 1); 1 with "same_sizes")."""
    check_choice("variant", variant, ORDER_VARIANTS, kind="variant", kinds="variants")
    rank, device = dist.get_rank(), rank_device()
    loss = torch.full((1,), float(rank + 1), device=device)
    stats = torch.full((1 if variant == "same_sizes" else 8,), 10.0 * (rank + 1), device=device)
    return loss, stats


def sync_one(name: str, tensor: torch.Tensor, variant: str) -> None:
    """All-reduce one of :func:`order_tensors`' tensors (``stats`` is broadcast with "ops")."""
    if name == "stats" and variant == "ops":
        dist.broadcast(tensor, src=0)    # rank 0's statistics to every rank
    else:
        dist.all_reduce(tensor)


def collective_order(variant: str = "sizes") -> torch.Tensor:
    """BUG: the order depends on the rank (rank 0 syncs loss first, the others stats first)."""
    loss, stats = order_tensors(variant)
    tensors = {"loss": loss, "stats": stats}
    for name in (["loss", "stats"] if dist.get_rank() == 0 else ["stats", "loss"]):
        sync_one(name, tensors[name], variant)
    return torch.cat([loss, stats]).cpu()


def collective_order_fixed(variant: str = "sizes") -> torch.Tensor:
    loss, stats = order_tensors(variant)
    sync_one("loss", loss, variant)
    sync_one("stats", stats, variant)
    return torch.cat([loss, stats]).cpu()


@functools.lru_cache(maxsize=None)
def _uneven_reference(world_size: int) -> torch.Tensor:
    """The weights DDP must reach, in one process, as many steps as the shortest loader has."""
    model = _small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loaders = [rank_batches(r) for r in range(world_size)]
    for step in range(min(len(b) for b in loaders)):   # a reference in one process, written out
        loss = sum(torch.nn.functional.mse_loss(model(b[step][0]), b[step][1]) for b in loaders)
        (loss / world_size).backward()
        optimizer.step()
        optimizer.zero_grad()
    return _weights(model)


@functools.lru_cache(maxsize=None)
def _single_losses() -> torch.Tensor:
    return torch.tensor(run("single", 1, steps=_STEPS)[0].losses, dtype=torch.float32)


def _expected_order(rank: int, world_size: int, variant: str = "sizes") -> torch.Tensor:
    total = world_size * (world_size + 1) / 2     # loss all-reduced; stats too, or broadcast ("ops")
    return torch.tensor([total] + [10.0 if variant == "ops" else 10.0 * total] * (1 if variant == "same_sizes" else 8))


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One bug: broken and fixed rank functions, ``variants`` (their one argument; empty: none),
    ``expected(rank, world_size, variant)`` (what the fixed one returns), the fault and fix in words."""
    name: str
    title: str
    broken: Callable
    fixed: Callable
    variants: tuple
    expected: Callable
    fault: str
    fix: str
    atol: float = 1e-6


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("skipped_collective", "a collective that only rank 0 calls",
             skipped_collective, skipped_collective_fixed, (), lambda rank, n, v=None: (n + 1) / 2,
             "the all-reduce sits inside `if rank == 0`: the ranks that skip it run on to the "
             "next collective (here the launcher's closing barrier) and wait there, rank 0 waits "
             "in the all-reduce: each waits for a collective the other never calls",
             "call the collective on every rank and keep only the printing under `if rank == 0`"),
    Scenario("uneven_batches", "a data loader one batch shorter on rank 1",
             uneven_batches, uneven_batches_fixed, (),
             lambda rank, world_size, variant=None: _uneven_reference(world_size),
             "rank 1 ran out of batches and left the training loop; rank 0's next backward "
             "starts DDP's gradient all-reduce, which no other rank joins",
             "agree on the number of steps first (all_reduce of the loader lengths with MIN), or "
             "give every rank as many batches (DistributedSampler pads), or wrap the loop in torch's "
             "Join, which has a finished rank shadow the others' collectives (DDP's: all-reduces of zeros)",
             atol=1e-5),
    Scenario("shape_mismatch", "rank 1 builds the model with hidden 60 instead of 50",
             shape_mismatch, shape_mismatch_fixed, VIAS,
             lambda rank, world_size, variant=None: _single_losses(),
             "the ranks' parameters differ in shape, so the messages of every collective "
             "over them differ in size",
             "build the model from one config on every rank (rank 0's, broadcast if needed)",
             atol=1e-5),
    Scenario("collective_order", "two collectives in opposite orders on rank 0 and rank 1",
             collective_order, collective_order_fixed, ORDER_VARIANTS, _expected_order,
             "rank 0 issues loss then stats, the other ranks stats then loss: collectives are "
             "matched by the order they are called in, so each rank's first call meets the "
             "other's first call, whatever tensor it holds",
             "issue the collectives in one fixed order on every rank (never depending on the "
             "rank or on a set's iteration order)"),
)}


def _scenario(name) -> Scenario:
    """The scenario ``name``, FSDP2 and DDP imported here for the forked ranks to inherit
    (not inside the timeout)."""
    check_choice("name", name, SCENARIOS, kind="scenario", kinds="scenarios")
    warm_up(imports=("torch.distributed.fsdp", "torch.nn.parallel"))
    return SCENARIOS[name]


def _variants(spec: Scenario, variant) -> tuple:
    if variant is None:
        return spec.variants or (None,)
    if variant not in spec.variants:
        allowed = ", ".join(map(repr, spec.variants)) or "none (it takes no variant)"
        raise ValueError(f"scenario {spec.name!r} has no variant {variant!r}; variants: {allowed}")
    return (variant,)


@dataclasses.dataclass(frozen=True)
class RankState:
    """Where one rank was: ``collective`` (torch.distributed function, ``"backward"`` or None), ``function``/``code``
    (the scenario's innermost frame, its line), ``via`` (the non-torch function that line called, e.g. ``wrap()``)."""
    rank: int
    collective: str | None
    function: str | None
    code: str | None
    via: str | None = None

    def describe(self) -> str:
        what = ("in autograd's backward (where DDP waits for its gradient all-reduce)"
                if self.collective == "backward" else f"in {self.collective or 'its own code'}")
        if self.function is None:
            return f"rank {self.rank}: {what}, after its function returned (the launcher's closing barrier)"
        via = f" via {self.via}" if self.via else ""
        return f"rank {self.rank}: {what}{via}, called from {self.function}(): {self.code}"


@dataclasses.dataclass
class Outcome:
    """What one run did. kind: "hang" (killed at ``timeout_s``), "crash" (a signal), "error", "wrong result" or
    "ok"; ranks: :class:`RankState` of each rank seen stuck or failing; elapsed_s: not in the report."""
    scenario: str
    variant: str | None
    kind: str
    where: str
    timeout_s: float
    elapsed_s: float
    ranks: dict = dataclasses.field(default_factory=dict)
    failed_rank: int | None = None
    message: str = ""
    results: list | None = None
    wrong: list = dataclasses.field(default_factory=list)
    outputs: dict = dataclasses.field(default_factory=dict)
    detail: bool = False


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_TENSOR_OPTIONS = re.compile(r"TensorOptions\((?:[^()]|\([^()]*\))*\)")


def _frames(text: str, innermost_first: bool) -> list[tuple[str, int, str]]:
    frames = [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(text)]
    return frames if innermost_first else frames[::-1]


def _is_torch(path: str) -> bool:
    return "/torch/" in path.replace("\\", "/")


def _rank_state(rank: int, frames: list) -> RankState:
    """From a stack (innermost first): the torch.distributed function, this module's frame."""
    ends = [i for i, f in enumerate(frames) if f[2] in ("_rank_main", "_on_rank")]
    kept = frames[:ends[0]] if ends else frames    # cut where the wrapper and launcher begin
    torch_frames = [(path, func) for path, _, func in kept if _is_torch(path)]
    collective = (next((f for p, f in torch_frames if p.endswith("distributed_c10d.py")), None)
                  or ("backward" if any("/autograd/" in p for p, _ in torch_frames) else None)
                  or next((f for p, f in torch_frames if "/distributed/" in p), None))   # e.g. DDP's check
    mine = [i for i, f in enumerate(kept) if f[0] == __file__]
    if not mine:
        return RankState(rank, collective, None, None)
    path, line, func = kept[mine[0]]
    inner = [f for f in kept[:mine[0]] if not _is_torch(f[0])]
    via = f"{inner[-1][2]}()" if inner else None
    code = re.sub(r"\s+#.*$", "", linecache.getline(path, line)).strip()   # no comment
    return RankState(rank, collective, func, code, via)


def clean_message(text: str) -> str:
    """A collective error message without what changes between runs and machines (paths, addresses, devices)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = re.sub(r"\[enforce fail at [^\]]*\]\s*", "", text)
    text = re.sub(r"\s*Tensor Tensor devices: .*?(?=(?:\s{2}|\t)|$)", "", text)
    text = re.sub(r",?\s*TensorDeviceTypes=" + _TENSOR_OPTIONS.pattern, "", text)
    text = _TENSOR_OPTIONS.sub("TensorOptions(...)", text)
    text = re.sub(r"0x[0-9a-fA-F]+", "0x...", text)
    text = re.sub(r"\.Collectives differ", ". Collectives differ", text)
    text = re.sub(r"(\S)vs(?=\s|$)", r"\1 vs", text)
    text = re.sub(r"(SequenceNumber=\d+)(?=OpType)", r"\1, ", text)
    return re.sub(r"\s+", " ", text).strip()


def _on_rank(fn: Callable, args: tuple, detail: bool):
    """Dump every thread's stack if the process aborts (gloo aborts from C++), run ``fn``."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if detail and dist.get_debug_level() != dist.DebugLevel.DETAIL:
        raise RuntimeError("TORCH_DISTRIBUTED_DEBUG=DETAIL is not set in this rank's environment")
    return fn(*args)


def _wrong_values(spec: Scenario, results: list, variant) -> list[str]:
    n = len(results)
    return [f"rank {r}: {why}" for r, value in enumerate(results)
            if (why := compare(value, spec.expected(r, n, variant), atol=spec.atol))]


def run_broken(name: str, variant=None, *, detail: bool = False,
               timeout_s: float = DEFAULT_TIMEOUT_S, backend: str = "gloo") -> Outcome:
    """Run a broken version on 2 ranks (default: its first variant); a hang, crash or error is returned, not raised."""
    spec = _scenario(name)
    (variant,) = _variants(spec, variant)[:1]
    check_timeout(timeout_s)
    chosen = resolve_backend(WORLD_SIZE, backend)
    err, t0 = io.StringIO(), time.monotonic()
    outcome = Outcome(name, variant, "ok", where(WORLD_SIZE, chosen, backend_first=True),
                      float(timeout_s), 0.0, detail=detail)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            results = launch(_on_rank, WORLD_SIZE, spec.broken, () if variant is None else (variant,),
                             detail, backend=chosen, timeout_s=timeout_s, quiet=True,
                             env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if detail else None)
        outcome.results, outcome.outputs = list(results), dict(results.outputs)
        outcome.wrong = _wrong_values(spec, outcome.results, variant)
        outcome.kind = "wrong result" if outcome.wrong else "ok"
    except LaunchTimeout as exc:
        outcome.kind, outcome.outputs = "hang", dict(exc.outputs)
        stuck = str(exc).split("Where they were stuck:", 1)[-1]
        parts = re.split(r"--- rank (\d+) ---", stuck)
        for rank, text in zip(parts[1::2], parts[2::2]):
            outcome.ranks[int(rank)] = _rank_state(int(rank), _frames(text, True))
        outcome.failed_rank = exc.rank
        outcome.message = f"ranks {sorted(outcome.ranks)} still running at timeout_s={timeout_s:g}"
    except LaunchError as exc:
        outcome.outputs, outcome.failed_rank = dict(exc.outputs), exc.rank
        if exc.exc_type is None:             # died from a signal (gloo aborts from C++)
            outcome.kind = "crash"
            text = "\n".join(m[1] for m in re.finditer(rf"^\[rank {exc.rank}\] ?(.*)$",
                                                       err.getvalue(), re.M))
            said = re.search(r"what\(\):\s*(.*)", text) or re.search(r"Fatal Python error: (.*)", text)
            number = re.search(r"killed by signal (\d+)", str(exc))
            name = signal.Signals(int(number[1])).name if number else "a signal"
            outcome.message = f"{name}: " + (clean_message(said[1]) if said else "no message")
            dumps = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)   # faulthandler's threads
            frames = _frames(next((b for b in dumps if "_rank_main" in b and "most recent call first"
                                   in b), ""), True)
        else:
            outcome.kind = "error"
            first = str(exc).split("\n--- traceback", 1)[0]
            outcome.message = clean_message(first.split(": ", 1)[-1])
            frames = _frames(exc.rank_traceback, False)
        if frames:
            outcome.ranks[exc.rank] = _rank_state(exc.rank, frames)
    outcome.elapsed_s = time.monotonic() - t0
    return outcome


def _outcome_lines(spec: Scenario, o: Outcome) -> list[str]:
    head = f"{spec.name}" + (f" ({o.variant})" if o.variant else "") + \
        (" with TORCH_DISTRIBUTED_DEBUG=DETAIL" if o.detail else "") + f", {o.where}:"
    said = {"hang": f"hang: caught by the launcher's timeout_s={o.timeout_s:g}; where each rank waited:",
            "crash": f"crash: rank {o.failed_rank} was killed by {o.message}",
            "error": f"error: rank {o.failed_rank} raised: {o.message}",
            "wrong result": "no error, no hang, but wrong numbers:", "ok": "completed with the right result"}
    return ([head, f"  {said[o.kind]}"] + [f"    {w}" for w in o.wrong]
            + [f"  {o.ranks[r].describe()}" for r in sorted(o.ranks)]
            + [f"  rank {r} printed: {line}" for r in sorted(o.outputs) for line in o.outputs[r].splitlines()])


def _summary(o: Outcome) -> str:
    if o.kind == "hang":
        inside = [s for s in o.ranks.values() if s.function is not None]
        left = [s.rank for s in o.ranks.values() if s.function is None]
        if inside and left:
            s = inside[0]
            return (f"rank {s.rank} waits in {s.collective} at `{s.code}`, a collective that "
                    f"rank(s) {left} never call: they already left {s.function}()")
        calls = sorted({(s.collective, s.code) for s in inside})
        if len(calls) > 1:
            return ("the ranks wait in different collectives: " +
                    "; ".join(f"rank {s.rank} in {s.collective} at `{s.code}`" for s in inside))
        return "every rank waits in the same place: a collective some rank never reached"
    if o.kind in ("crash", "error"):
        s = o.ranks.get(o.failed_rank)
        place = f" in {s.collective}" if s and s.collective else ""
        return f"rank {o.failed_rank} failed{place}" + (f" at `{s.code}`" if s and s.code else "")
    if o.kind == "wrong result":
        return "the collectives completed but combined the wrong tensors"
    return "nothing went wrong"


@dataclasses.dataclass(repr=False)
class Diagnosis:
    """:func:`diagnose`'s result: the :class:`Outcome` of every variant; ``repr`` is the report."""
    scenario: str
    outcomes: list
    report: str
    __repr__ = lambda self: self.report   # noqa: E731 - a notebook cell shows the report


def diagnose(name: str, variant=None, *, detail: bool = False,
             timeout_s: float = DEFAULT_TIMEOUT_S, backend: str = "gloo") -> Diagnosis:
    """Run a broken version (every variant, or ``variant``); report rank, collective, line, fault and fix."""
    spec = _scenario(name)
    outcomes = [run_broken(name, v, detail=detail, timeout_s=timeout_s, backend=backend)
                for v in _variants(spec, variant)]
    lines = [f"== {spec.name}: {spec.title} =="]
    for o in outcomes:
        lines += _outcome_lines(spec, o)
        lines.append(f"  => {_summary(o)}")
    lines += [f"fault: {spec.fault}", f"fix: {spec.fix} (run_fixed({spec.name!r}))"]
    return Diagnosis(name, outcomes, "\n".join(lines))


def detail_message(name: str = "collective_order", variant=None, *,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The error DETAIL raises for a broken scenario, cleaned, one clause a line; "" if it saw nothing."""
    o = run_broken(name, variant, detail=True, timeout_s=timeout_s)
    return "" if o.kind != "error" else re.sub(r" (?=but Rank|Collectives differ)", "\n", o.message)


@dataclasses.dataclass(repr=False)
class FixedRun:
    """:func:`run_fixed`'s result: ``passed`` (its truth value) and the report (its ``repr``)."""
    scenario: str
    passed: bool
    report: str
    results: dict
    __repr__ = Diagnosis.__repr__
    __bool__ = lambda self: self.passed   # noqa: E731


def run_fixed(name: str, variant=None, *, world_size: int = WORLD_SIZE, timeout_s: float = 60.0,
              backend: str = "auto") -> FixedRun:
    """Run a fixed version (every variant, or ``variant``) and check every rank's result."""
    spec = _scenario(name)
    check_int("world_size", world_size, 2, 4, what="the lab's global batch and loaders fit those")
    check_timeout(timeout_s)
    chosen = resolve_backend(world_size, backend)
    lines, passed, results = [f"== {spec.name}, fixed: {spec.fix} =="], True, {}
    ran_on = where(world_size, chosen, backend_first=True)
    for v in _variants(spec, variant):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            values = launch(spec.fixed, world_size, *(() if v is None else (v,)), backend=chosen,
                            timeout_s=timeout_s, quiet=True)
        wrong = _wrong_values(spec, list(values), v)
        passed &= not wrong
        results[v] = list(values)
        lines.append(f"{spec.name}{f' ({v})' if v else ''}, {ran_on}: completed; "
                     + ("every rank right" if not wrong else f"{len(wrong)} rank(s) wrong"))
        same = all(_show(x) == _show(values[0]) for x in values)
        lines.append("  every rank returned " + _show(values[0]) if same else
                     "  " + "; ".join(f"rank {r}: {_show(x)}" for r, x in enumerate(values)))
        lines += [f"  {w}" for w in wrong]
    return FixedRun(name, passed, "\n".join(lines), results)


def check_hang_fix(name: str, fn: Callable):
    """Exercise: ``fn()`` (the default variant) runs on 2 and 3 gloo CPU ranks, 20 s timeout, each
    rank's value compared with the fixed version's; a Verdict (a hang is reported, never raised)."""
    spec = _scenario(name)
    variant = (spec.variants or (None,))[0]
    graded = functools.partial(graded_rank, fn) if callable(fn) else fn
    return grade_on_ranks(graded, lambda r, n: spec.expected(r, n, variant), world_sizes=(2, 3),
                          name=f"your fix of {name}", atol=spec.atol, timeout_s=20)


def graded_rank(fn: Callable):
    """Without the crash handler a forked rank may inherit (pytest's prints the parent's stack)."""
    faulthandler.disable()
    return fn()


# ---- PyTorch's Flight Recorder, on gloo ----------------------------------------------------------------
#: Turns the Flight Recorder on in every rank (read when the process group is created): a ring buffer of
#: the last N collectives, with op, sizes, sequence number and the Python stack at the call. NCCL's
#: watchdog writes it at its timeout with TORCH_NCCL_DUMP_ON_TIMEOUT=1 (to TORCH_FR_DUMP_TEMP_FILE + rank);
#: gloo records it too (torch 2.10-2.13) but has no watchdog, so :func:`_recorded` plays that part.
FR_ENV = {"TORCH_FR_BUFFER_SIZE": "64"}
_STALL_S = 1.0      # a collective not completed for this long: dump (NCCL's watchdog: its timeout)


def _recorded(fn: Callable, folder: str):
    """Run ``fn`` with a watchdog thread that writes this rank's Flight Recorder trace to
    ``folder/rank_<r>`` whenever the last collective it enqueued has not completed for ``_STALL_S``
    (again after each later stall, atomically: the file holds the latest state when the rank is killed)."""
    rank = dist.get_rank()
    path = os.path.join(folder, f"rank_{rank}")

    def watch():
        seen, since, written = None, time.monotonic(), None
        while True:
            time.sleep(0.05)
            status = next(iter(compat.flight_recorder_trace().get("pg_status", {}).values()), {})
            pending = (status.get("last_enqueued_collective", -1), status.get("last_completed_collective", -1))
            if pending != seen:
                seen, since = pending, time.monotonic()
            elif pending[0] > pending[1] and pending != written and time.monotonic() - since >= _STALL_S:
                with open(path + ".tmp", "wb") as f:
                    pickle.dump(compat.flight_recorder_trace(), f)
                os.replace(path + ".tmp", path)
                written = pending
    threading.Thread(target=watch, daemon=True).start()
    return fn()


def flight_recorder_dumps(name: str = "skipped_collective", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[dict]:
    """Run bug ``name`` (its first variant) on 2 gloo ranks with the Flight Recorder on; each rank's trace
    as it dumped it when a collective stalled: ``{"entries": [...], "pg_status": {...}, ...}``."""
    spec = _scenario(name)
    if spec.variants:
        raise ValueError(f"flight_recorder runs the bugs without variants: {[n for n, s in SCENARIOS.items() if not s.variants]}")
    check_timeout(timeout_s)
    with tempfile.TemporaryDirectory() as folder:
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                launch(_recorded, WORLD_SIZE, spec.broken, folder, backend="gloo", timeout_s=timeout_s,
                       quiet=True, env=FR_ENV)
        except (LaunchTimeout, LaunchError):
            pass
        dumps = []
        for rank in range(WORLD_SIZE):
            path = os.path.join(folder, f"rank_{rank}")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {rank} wrote no Flight Recorder trace: no collective stalled "
                                   f"within timeout_s={timeout_s:g}")
            with open(path, "rb") as f:
                dumps.append(pickle.load(f))
    return dumps


def _ops(dump: dict) -> dict:
    """{sequence number: (op, input sizes)} of one rank's default-group collectives."""
    return {e["collective_seq_id"]: (e["profiling_name"].split(":", 1)[-1], str(e["input_sizes"]))
            for e in dump["entries"] if not e.get("is_p2p")}


def first_mismatch(dumps: list[dict]) -> tuple[int, dict] | None:
    """What ``torchfrtrace`` looks for: the first sequence number at which the ranks' collectives differ
    (op or sizes, or missing), as ``(seq, {rank: (op, sizes) or None})``; None if they all agree."""
    ops = [_ops(d) for d in dumps]
    for seq in sorted(set().union(*ops)):
        calls = {rank: o.get(seq) for rank, o in enumerate(ops)}
        if len(set(calls.values())) > 1:
            return seq, calls
    return None


def flight_recorder(name: str = "skipped_collective", *, last: int = 3, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Each rank's ``last`` collectives from the Flight Recorder, and the first one on which they disagree."""
    check_int("last", last, 1)
    dumps = flight_recorder_dumps(name, timeout_s=timeout_s)
    lines = [f"{name}, {where(WORLD_SIZE, 'gloo', backend_first=True)}, Flight Recorder on "
             f"(TORCH_FR_BUFFER_SIZE={FR_ENV['TORCH_FR_BUFFER_SIZE']}), each rank's trace written once a "
             f"collective had waited {_STALL_S:g} s:"]
    for rank, d in enumerate(dumps):
        done = next(iter(d.get("pg_status", {}).values()), {}).get("last_completed_collective", -1)
        ops = sorted(_ops(d).items())
        # Only the last one can still be waiting: each earlier one was a blocking call the rank got past
        # (the recorder marks completion asynchronously, so its status of those varies from run to run).
        shown = ops[-last:]
        calls = ", ".join(f"#{seq} {op} {sizes}{' (not completed)' if seq == shown[-1][0] and seq > done else ''}"
                          for seq, (op, sizes) in shown)
        lines.append(f"  rank {rank}: {'..., ' if len(ops) > last else ''}{calls}")
    found = first_mismatch(dumps)
    if found is None:
        lines.append("  => every rank issued the same collectives")
    else:
        seq, calls = found
        lines.append(f"  => the ranks disagree at collective #{seq}: " + ", ".join(
            f"rank {r} {c[0] if c else 'never called it'}" for r, c in calls.items()))
    return "\n".join(lines)
