"""The grand comparison: every registered strategy trained on the same model, data and ranks.

Taught in ``notebooks/07_fsdp.ipynb`` (section "The grand comparison"). :func:`compare`
runs :func:`course_utils.harness.experiments.run` for each strategy in
:data:`course_utils.harness.strategies.STRATEGIES` ("single" on one process, the others on
``world_size`` ranks) and collects, per strategy:

* whether its per-step losses equal "single"'s (relative tolerance ``rel``, fp32, other
  summation orders; the table prints the bound, not the raw difference, which differs in
  its last digits from machine to machine), and the largest absolute difference;
* the model-state bytes per rank (params, grads, optimizer; the largest over the ranks,
  right after ``optimizer.step()``), as measured by the strategy's ``state_bytes``;
* the **peak** gradient bytes per rank, where the strategy tracks them: the course's
  ZeRO-1/2 (measured by :mod:`course_utils.harness.probes`: full ``.grad``
  tensors alive + messages in flight + shard gradients, at any moment of a step, reported
  by ``experiments.run`` as ``extra["peak_grad_bytes"]``). After the step ZeRO-2 holds
  1/N of the gradients, but with one bucket it held every full gradient and the bucket's
  message at once before sending: its peak is above ZeRO-1's (notebook 05). The other
  strategies do not track a peak (see :data:`PEAK_NOTE` for what their count means);
* the bytes one rank sends per step, per collective (all-reduce, reduce-scatter,
  all-gather, broadcast; ring convention of :class:`~course_utils.runtime.ledger.CommLedger`; the
  largest over the ranks) and the calls per step (``"torch-zero1"``,
  ``ZeroRedundancyOptimizer``, broadcasts every parameter from its owner after the step);
* the median step time (varies from run to run: the notebook prints it in a cell
  nbval does not compare).

Everything the table of :meth:`Comparison.table` prints is exact (bytes, calls, ratios of
bytes) or a bound (the losses), so it is the same text on every machine.
"""
from __future__ import annotations

import dataclasses
from numbers import Real

from ..checks import check_int
from ..harness import experiments
from ..harness.strategies import STRATEGIES
from ..harness.strategies import get as get_strategy
from ..runtime.fmt import plural

__all__ = ["Row", "Comparison", "compare", "PEAK_NOTE"]

_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")

#: What the table's gradient columns count, printed under it.
PEAK_NOTE = "\n".join((
    "grads B, state/single: held right after optimizer.step().",
    "peak grads B, peak/single: the most gradient bytes a rank held at any moment of a step (full .grad",
    "  + messages in flight + shards), tracked by the course's ZeRO-1/2 only. '-': not tracked.",
    "  single, ddp, torch-ddp, torch-zero1 hold the full .grad from backward to the step (the flat buckets",
    "  of ddp and torch DDP, one more gradient-sized copy, are not counted); zero3 and the FSDP2 ones hold",
    "  a unit's full gradient only inside that unit's backward (not counted).",
))


@dataclasses.dataclass(frozen=True)
class Row:
    """One strategy's line of the comparison (bytes per rank; comm per step)."""

    strategy: str
    world_size: int
    losses: tuple
    max_abs_loss_diff: float
    losses_equal: bool
    params: int
    grads: int
    optimizer: int
    comm_per_step: dict
    calls_per_step: dict
    step_time_s: float
    peak_grads: int | None = None    # most gradient bytes held during a step; None: not tracked

    @property
    def state(self) -> int:
        """Model-state bytes right after ``optimizer.step()``."""
        return self.params + self.grads + self.optimizer

    @property
    def peak_state(self) -> int | None:
        """params + peak gradient bytes + optimizer; None where the peak is not tracked."""
        return None if self.peak_grads is None else self.params + self.peak_grads + self.optimizer

    @property
    def comm_total(self) -> float:
        return float(sum(self.comm_per_step.values()))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The rows of :func:`compare` and how to show them."""

    rows: tuple
    world_size: int
    steps: int
    where: str
    rel: float = 1e-6

    def row(self, strategy: str) -> Row:
        for r in self.rows:
            if r.strategy == strategy:
                return r
        raise KeyError(f"no row for {strategy!r}; rows: {[r.strategy for r in self.rows]}")

    def table(self) -> str:
        """The deterministic part, as text: losses, state bytes (after the step, and the
        gradient peak where tracked), comm bytes and calls; :data:`PEAK_NOTE` under it."""
        base = self.row("single") if any(r.strategy == "single" for r in self.rows) else None
        from ..runtime.fmt import sci

        same = f"rel≤{sci(self.rel)}"
        head = (f"{'strategy':<17} {'ranks':>5} {'= single':>8} {same:>10} "
                f"{'params B':>9} {'grads B':>9} {'optim B':>9} {'state/single':>12} "
                f"{'peak grads B':>12} {'peak/single':>11} "
                f"{'sent B/step':>11} {'AR':>3} {'RS':>3} {'AG':>3} {'BC':>3}")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            ratio = f"{r.state / base.state:.3f}" if base else "-"
            peak = "-" if r.peak_grads is None else f"{r.peak_grads:,}"
            peak_ratio = f"{r.peak_state / base.state:.3f}" if base and r.peak_grads is not None else "-"
            c = r.calls_per_step
            lines.append(
                f"{r.strategy:<17} {r.world_size:>5} {'yes' if r.losses_equal else 'NO':>8} "
                f"{'✓' if r.losses_equal else '✗':>10} {r.params:>9,} {r.grads:>9,} {r.optimizer:>9,} "
                f"{ratio:>12} {peak:>12} {peak_ratio:>11} {r.comm_total:>11,.0f} {c['all_reduce']:>3g} "
                f"{c['reduce_scatter']:>3g} {c['all_gather']:>3g} {c['broadcast']:>3g}")
        lines.append(PEAK_NOTE)
        return "\n".join(lines)

    def times(self) -> str:
        """Median step time per strategy, slowest rank (varies between runs and machines)."""
        return "\n".join(f"{r.strategy:<17} {1e3 * r.step_time_s:8.1f} ms" for r in self.rows)

    def plot(self):
        """Three panels: state bytes per rank after the step (stacked; dashed outline: the
        state at the gradient peak, where tracked), bytes sent per step (stacked by
        collective), median step time. Returns the matplotlib Figure."""
        from matplotlib.figure import Figure

        names = [r.strategy for r in self.rows]
        y = list(range(len(names)))[::-1]
        fig = Figure(figsize=(11, 0.45 * len(names) + 1.6))
        axes = fig.subplots(1, 3, sharey=True)
        left = [0.0] * len(names)
        for part, color in (("params", "#4C72B0"), ("grads", "#DD8452"), ("optimizer", "#55A868")):
            vals = [getattr(r, part) / 1e3 for r in self.rows]
            axes[0].barh(y, vals, left=left, color=color, label=part)
            left = [a + b for a, b in zip(left, vals)]
        peaks = [(yy, r.peak_state / 1e3) for yy, r in zip(y, self.rows) if r.peak_state is not None]
        if peaks:                            # where the gradient peak is tracked: its outline
            axes[0].barh([p[0] for p in peaks], [p[1] for p in peaks], fill=False, edgecolor="black",
                         linestyle="--", linewidth=1, label="peak in the step")
        axes[0].set_xlabel("model-state KB per rank (max over ranks)")
        left = [0.0] * len(names)
        for op, color in zip(_OPS, ("#8172B3", "#C44E52", "#64B5CD", "#CCB974")):
            vals = [float(r.comm_per_step[op]) / 1e3 for r in self.rows]
            axes[1].barh(y, vals, left=left, color=color, label=op.replace("_", "-"))
            left = [a + b for a, b in zip(left, vals)]
        axes[1].set_xlabel("KB sent per rank per step")
        axes[2].barh(y, [1e3 * r.step_time_s for r in self.rows], color="#937860")
        axes[2].set_xlabel("median step time, ms (this machine)")
        axes[0].set_yticks(y, names)
        for ax in axes[:2]:
            ax.legend(fontsize=8, frameon=False, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0))
        fig.suptitle(f"every strategy, course GPT, {self.where}, {self.steps} steps")
        fig.tight_layout()
        return fig


def compare(world_size: int = 4, *, steps: int = 3, strategies=None, seed: int = 0,
            rel: float = 1e-6, quiet: bool = True) -> Comparison:
    """Train every strategy (default: all of :data:`~course_utils.harness.strategies.STRATEGIES`,
    "single" first) for ``steps`` steps and return a :class:`Comparison`.

    ``world_size`` ranks for the distributed strategies (gloo on CPU, or NCCL when every
    rank gets a GPU: the launcher decides); "single" always runs in this process on the
    whole global batch and is the reference for ``losses_equal``.
    """
    check_int("world_size", world_size, 2)
    check_int("steps", steps, 1)
    if not isinstance(rel, Real) or rel <= 0:
        raise ValueError(f"rel must be a positive tolerance such as 1e-6, got {rel!r}")
    if strategies is None:           # in the order of the notebooks
        order = list(STRATEGIES)
        names = sorted(order, key=lambda n: (STRATEGIES[n].notebook, order.index(n)))
    else:
        names = list(strategies)
    for name in names:
        get_strategy(name)                   # TypeError/ValueError for an unknown name
    if "single" in names:
        names.remove("single")
    names.insert(0, "single")
    reference = None
    rows = []
    where = ""
    for name in names:
        spec = get_strategy(name)
        n = world_size if spec.distributed else 1
        results = experiments.run(name, n, steps=steps, seed=seed, quiet=True)
        if reference is None:
            reference = results[0].losses
        if spec.distributed and not where:
            from ..runtime import launch

            where = launch.where(results)
        r0 = results[0]
        diff = experiments.max_abs_diff(r0.losses, reference)
        equal = all(abs(a - b) <= rel * abs(b) for a, b in zip(r0.losses, reference))
        state = {k: max(r.state_bytes[k] for r in results) for k in ("params", "grads", "optimizer")}
        comm = {op: max(r.comm_bytes.get(op, 0) for r in results) / steps for op in _OPS}
        calls = {op: r0.comm_calls.get(op, 0) / steps for op in _OPS}
        peaks = [r.extra["peak_grad_bytes"] for r in results if "peak_grad_bytes" in r.extra]
        rows.append(Row(name, n, tuple(r0.losses), diff, equal, state["params"], state["grads"],
                        state["optimizer"], comm, calls, max(r.step_time_s for r in results),
                        max(peaks) if peaks else None))
        if not quiet:
            print(f"{name}: done on {plural(n, 'rank')}")
    return Comparison(tuple(rows), world_size, steps, where or "one process", rel)
