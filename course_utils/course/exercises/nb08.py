"""The capstone of ``notebooks/11_appendix_at_scale.ipynb`` (exercise 11.4): ``choose(scenario) -> (choice, gb)``; and 08's hang fix."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
from typing import Callable

from ...labs.grading import Verdict, brief, compare_brief, judge_on_ranks, refuse_non_function
from ...labs.hangs import SCENARIOS, graded_rank
from ...runtime.fmt import plural
from ...theory.config import preset
from ...theory.memory import GB
from ...theory.planner import NEAR_TIE, Choice, Plan, as_choice, plan, recommend

__all__ = ["check_skipped_collective", "Scenario", "reference_plan", "reference_choice", "reference_gb", "check_capstone",
           "CAPSTONE_SCENARIOS", "MEMORY_TOLERANCE"]


def _printing(fn: Callable):
    """On a rank: ``fn()``'s value, as the hang exercises run it, and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        value = graded_rank(fn)
    return value, out.getvalue().strip()


def check_skipped_collective(fn: Callable) -> Verdict:
    """Exercise 08.1: ``fn()`` on 2 and 3 gloo CPU ranks (20 s timeout) returns the mean loss on
    every rank, and only rank 0 prints (a fix that prints on every rank fails)."""
    name = "your fix of skipped_collective"
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    spec = SCENARIOS["skipped_collective"]

    def judge(value, rank, n):
        got, printed = value
        why = compare_brief(got, spec.expected(rank, n), atol=spec.atol)
        if not why and rank == 0 and not printed:
            why = "printed nothing: rank 0 prints the mean"
        if not why and rank > 0 and printed:
            why = f"printed {printed!r}: only rank 0 prints"
        return why, f"returned {brief(got)}"

    return judge_on_ranks(functools.partial(_printing, fn), judge, world_sizes=(2, 3), name=name,
                          timeout_s=20)


#: How close the learner's GB per GPU must be to the planner's (relative).
MEMORY_TOLERANCE = 0.01

_SHARDED_PARAMS = ("ZeRO-3", "HSDP")       # these gather parameters: bigger buffers


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A model, a cluster and a workload, as numbers. ``inter_bw_gbps`` is per network card
    (NIC), ``nics_per_node`` None: one NIC per GPU; ``host_mem_gb`` per node."""
    name: str
    story: str
    model: str
    gpu_mem_gb: float
    gpus_per_node: int
    nodes: int
    intra_bw_gbps: float
    inter_bw_gbps: float
    seq_len: int
    global_batch: int
    host_mem_gb: float
    nics_per_node: int | None = None

    @property
    def params(self) -> int:
        return preset(self.model).num_params

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def other_gb(self, strategy: str, recompute: bool) -> float:
        """GB per GPU besides the model states at micro-batch 1 (activations + buffers)."""
        choice = as_choice((strategy, "none", recompute))   # a clear error for a bad name
        return _other_gb(self)[(strategy in _SHARDED_PARAMS, choice.recompute == "full")]

    def numbers(self) -> str:
        nics = "one per GPU" if self.nics_per_node is None else str(self.nics_per_node)
        o = _other_gb(self)
        return (f"Ψ = {self.params:,}, N = {plural(self.gpus, 'GPU')} ({plural(self.nodes, 'node')} "
                f"x {self.gpus_per_node}) of {self.gpu_mem_gb:g} GB, NICs per node: {nics}; other GB at micro-batch 1: "
                f"DDP/ZeRO-1/ZeRO-2 {o[(False, False)]:.2f} (recompute {o[(False, True)]:.2f}), "
                f"ZeRO-3/HSDP {o[(True, False)]:.2f} (recompute {o[(True, True)]:.2f})")


@functools.lru_cache(maxsize=None)
def reference_plan(scenario: Scenario, micro_batch: int | None = None) -> Plan:
    """The grader's planner on a scenario (None: the largest micro-batch that fits)."""
    if not isinstance(scenario, Scenario):
        raise TypeError("reference_plan() takes one of CAPSTONE_SCENARIOS")
    kw = {f.name: getattr(scenario, f.name) for f in dataclasses.fields(scenario)
          if f.name not in ("name", "story", "model")}
    return plan(scenario.model, **kw, micro_batch=micro_batch, recipe="mixed",    # the course's ZeRO-3:
                persistence_threshold=0, max_reuse_distance=0)                   # every tensor sharded


@functools.lru_cache(maxsize=None)
def _other_gb(scenario: Scenario) -> dict:
    rows = reference_plan(scenario, 1)          # activations + buffers, per (gathers params, recompute)
    return {(sharded, rc): round((r.total - r.states) / GB, 2) for sharded in (False, True)
            for rc in (False, True) for r in [rows.row(("ZeRO-3" if sharded else "ZeRO-1", "none", rc))]}


def reference_gb(scenario: Scenario, choice) -> float:
    """The planner's GB per GPU for ``choice`` at micro-batch 1 (states + activations + buffers)."""
    return reference_plan(scenario, 1).row(as_choice(choice)).total / GB


def reference_choice(scenario: Scenario) -> Choice:
    """The planner's answer for a scenario (what :func:`check_capstone` compares with)."""
    if not isinstance(scenario, Scenario):
        raise TypeError("reference_choice() takes one of CAPSTONE_SCENARIOS")
    rec = recommend(reference_plan(scenario))
    if rec.choice is None:
        raise ValueError(f"nothing fits in scenario {scenario.name!r}: {rec.reason}")
    return rec.choice


CAPSTONE_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("7B on one DGX", "Llama-2-7B, one node of 8 x 80 GB GPUs on NVLink (450 GB/s), "
             "seq 4096, 64 sequences per step", "llama-2-7b", 80.0, 8, 1, 450.0, 50.0, 4096, 64, 1024.0),
    Scenario("70B on 4 nodes, one NIC per node", "Llama-2-70B, 4 nodes x 8 x 80 GB, NVLink inside a "
             "node but a single 200 Gb/s network card (25 GB/s) per node between nodes, seq 4096, "
             "1024 sequences (4M tokens) per step",
             "llama-2-70b", 80.0, 8, 4, 450.0, 25.0, 4096, 1024, 2048.0, nics_per_node=1),
    Scenario("13B on 2 nodes, one NIC per node", "Llama-2-13B, 2 nodes x 8 x 80 GB, one 25 GB/s NIC per "
             "node, seq 4096, 256 sequences per step",
             "llama-2-13b", 80.0, 8, 2, 450.0, 25.0, 4096, 256, 2048.0, nics_per_node=1),
    Scenario("7B on 2 nodes, one NIC per node", "Llama-2-7B, 2 nodes x 8 x 80 GB, one 25 GB/s NIC per "
             "node, seq 4096, 512 sequences per step",
             "llama-2-7b", 80.0, 8, 2, 450.0, 25.0, 4096, 512, 2048.0, nics_per_node=1),
    Scenario("70B on 2 nodes, a NIC per GPU", "Llama-2-70B, 2 nodes x 8 x 40 GB, one 50 GB/s NIC per GPU, "
             "seq 4096, 256 sequences per step",
             "llama-2-70b", 40.0, 8, 2, 450.0, 50.0, 4096, 256, 2048.0),
    Scenario("13B on one 24 GB GPU", "Llama-2-13B on a single 24 GB GPU with 256 GB of host memory, "
             "seq 4096, 8 sequences per step", "llama-2-13b", 24.0, 1, 1, 450.0, 50.0, 4096, 8, 256.0),
)


def _answer(value) -> tuple[Choice, float]:
    if isinstance(value, dict) and set(value) == {"choice", "gb_per_gpu"}:
        value = (value["choice"], value["gb_per_gpu"])
    if not (isinstance(value, tuple) and len(value) == 2):
        raise TypeError("return a pair (choice, gb_per_gpu), e.g. (planner.Choice('ZeRO-2'), 54.1); "
                        f"got {type(value).__name__}")
    choice, gb = value
    if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb):
        raise TypeError(f"gb_per_gpu must be a number of GB (1e9 bytes), got {gb!r}")
    return as_choice(choice), float(gb)


def _memory_verdict(scenario: Scenario, choice: Choice, gb: float) -> tuple[bool, str]:
    row = reference_plan(scenario, 1).row(choice)
    ref, states = row.total / GB, row.states / GB
    if abs(gb - ref) <= MEMORY_TOLERANCE * ref:
        return True, f"memory right ({gb:.1f} GB per GPU at micro-batch 1)"
    return False, (f"memory differs: yours {gb:.1f} GB, the planner's {ref:.1f} (model states "
                   f"{states:.1f} of it)")


def _choice_verdict(scenario: Scenario, choice: Choice, near_tie: float) -> tuple[bool, str]:
    rows = reference_plan(scenario)
    got, best = rows.row(choice), recommend(rows, near_tie=near_tie).row
    if not got.fits:
        return False, f"{choice.label()} does not fit ({got.why})"
    if got.step_s > best.step_s * (1 + near_tie):
        return False, (f"{choice.label()} fits but takes {got.step_s:.1f} s per step, "
                       f"{got.step_s / best.step_s - 1:+.0%} vs the fastest option that fits "
                       f"(compute / comm / offload {got.compute_s:.1f} / {got.comm_s:.1f} / "
                       f"{got.offload_s:.1f} vs {best.compute_s:.1f} / {best.comm_s:.1f} / {best.offload_s:.1f})")
    tie = "" if got is best else f", within {near_tie:.0%} of the fastest that fits"
    return True, f"{choice.label()} fits, {got.step_s:.2f} s per step{tie}"


def check_capstone(fn: Callable, *, near_tie: float = NEAR_TIE):
    """Memory right within 1 % of the planner's; choice right when it fits and its step time is
    within ``near_tie`` of the fastest option that fits."""
    name = "capstone"
    if not callable(fn):
        print(f"{name}: pass your function choose(scenario), got {type(fn).__name__}")
        return Verdict(name, False)
    right = 0
    for sc in CAPSTONE_SCENARIOS:
        try:
            if (value := fn(sc)) is None:
                print(f"  {sc.name}: no answer yet (None)")
                continue
            choice, gb = _answer(value)
            reference_plan(sc).row(choice)                  # an option of this cluster?
        except Exception as exc:  # noqa: BLE001 - a learner's bug is reported, never raised
            print(f"  {sc.name}: {type(exc).__name__}: {exc}")
            continue
        mem_ok, mem = _memory_verdict(sc, choice, gb)
        pick_ok, pick = _choice_verdict(sc, choice, near_tie)
        right += mem_ok and pick_ok
        print(f"  {sc.name}: {mem}; choice {'right' if pick_ok else 'differs'}: {pick}")
    n = len(CAPSTONE_SCENARIOS)
    print(f"{right} of {n} scenarios right")
    return Verdict(name, right == n)
