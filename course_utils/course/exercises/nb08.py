"""The capstone of ``notebooks/08_beyond_one_box.ipynb``: choose a strategy for three clusters."""
from __future__ import annotations

import dataclasses
from typing import Callable

from ...harness.grading import Verdict
from ...theory.memory import GB
from ...theory.planner import NEAR_TIE, Choice, Plan, as_choice, plan, recommend

__all__ = ["Scenario", "reference_choice", "check_capstone", "CAPSTONE_SCENARIOS"]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A capstone scenario: a model, a cluster and a workload (:func:`plan`'s arguments;
    ``inter_bw_gbps`` is per NIC, ``nics_per_node`` None: one NIC per GPU)."""

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

    def plan_kwargs(self) -> dict:
        """The keyword arguments of :func:`plan` for this scenario (with ``model``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("name", "story")}

    def plan(self) -> Plan:
        kw = self.plan_kwargs()
        return plan(kw.pop("model"), **kw)


CAPSTONE_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("7B on one DGX", "Llama-2-7B, one node of 8 x 80 GB GPUs on NVLink (450 GB/s), "
             "seq 4096, 64 sequences per step", "llama-2-7b", 80.0, 8, 1, 450.0, 50.0, 4096, 64, 1024.0),
    Scenario("70B on 4 nodes, one NIC per node", "Llama-2-70B, 4 nodes x 8 x 80 GB, NVLink inside a "
             "node but a single 200 Gb/s network card (25 GB/s) per node between nodes, seq 4096, "
             "1024 sequences (4M tokens) per step",
             "llama-2-70b", 80.0, 8, 4, 450.0, 25.0, 4096, 1024, 2048.0, nics_per_node=1),
    Scenario("13B on one 24 GB GPU", "Llama-2-13B on a single 24 GB GPU with 256 GB of host memory, "
             "seq 4096, 8 sequences per step", "llama-2-13b", 24.0, 1, 1, 450.0, 50.0, 4096, 8, 256.0),
)


def reference_choice(scenario: Scenario) -> Choice:
    """The planner's answer for a scenario (what :func:`check_capstone` compares with)."""
    if not isinstance(scenario, Scenario):
        raise TypeError("reference_choice() takes one of CAPSTONE_SCENARIOS")
    rec = recommend(scenario.plan())
    if rec.choice is None:
        raise ValueError(f"nothing fits in scenario {scenario.name!r}: {rec.reason}")
    return rec.choice


def check_capstone(fn: Callable, *, near_tie: float = NEAR_TIE):
    """Capstone exercise of notebook 08: ``fn(scenario) -> choice`` for each of
    :data:`CAPSTONE_SCENARIOS`.

    A choice is a :class:`Choice`, a dict ``{"strategy", "offload", "recompute"}`` or a
    tuple ``(strategy, offload, recompute)``. It is right when the planner says it fits
    and its step time is within ``near_tie`` (5%) of the fastest option that fits.
    Prints, per scenario, what is right and what differs; returns a
    :class:`course_utils.course.exercises.Verdict`.
    """
    name = "capstone"
    if not callable(fn):
        print(f"{name}: pass your function choose(scenario), got {type(fn).__name__}")
        return Verdict(name, False)
    right = 0
    for sc in CAPSTONE_SCENARIOS:
        rows = sc.plan()
        rec = recommend(rows, near_tie=near_tie)
        try:
            choice = as_choice(fn(sc))
        except Exception as exc:  # noqa: BLE001 - a learner's bug is reported, never raised
            print(f"  {sc.name}: your function raised {type(exc).__name__}: {exc}")
            continue
        try:
            got = rows.row(choice)
        except ValueError as exc:
            print(f"  {sc.name}: {exc}")
            continue
        best = rec.row
        if not got.fits:
            print(f"  {sc.name}: differs: {choice.label()} does not fit ({got.why}); "
                  f"the planner recommends {best.choice.label()}")
        elif got.step_s > best.step_s * (1 + near_tie):
            print(f"  {sc.name}: differs: {choice.label()} fits but takes {got.step_s:.2f} s per step, "
                  f"{got.step_s / best.step_s - 1:+.0%} vs {best.choice.label()} at {best.step_s:.2f} s "
                  f"(compute {got.compute_s:.2f} / comm {got.comm_s:.2f} / offload {got.offload_s:.2f} "
                  f"vs {best.compute_s:.2f} / {best.comm_s:.2f} / {best.offload_s:.2f})")
        else:
            right += 1
            extra = "" if got is best else f" (within {near_tie:.0%} of {best.choice.label()})"
            print(f"  {sc.name}: right: {choice.label()} fits ({got.total / GB:.1f} GB per GPU) and "
                  f"takes {got.step_s:.2f} s per step{extra}")
    n = len(CAPSTONE_SCENARIOS)
    print(f"{right} of {n} scenarios right")
    return Verdict(name, right == n)
