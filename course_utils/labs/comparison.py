"""The grand comparison (notebook 07): every registered strategy trained on the same model, data and ranks:
losses vs "single"'s (within ``rel``, printed as the bound: the last digits vary by machine), state bytes
per rank after ``optimizer.step()``, the **peak** gradient bytes where tracked (:data:`PEAK_NOTE`), bytes
sent and calls per step per collective, the median step time (varies: printed where nbval does not compare).
"""
from __future__ import annotations

import dataclasses

from ..checks import check_int, check_number
from ..harness import experiments
from ..harness.strategies import STRATEGIES
from ..harness.strategies import get as get_strategy
from ..runtime import launch
from ..runtime.fmt import max_abs_diff, plural, sci

__all__ = ["Row", "Comparison", "compare", "PEAK_NOTE"]

_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")

#: What the table's gradient columns count, printed under it.
PEAK_NOTE = """grads B, state/single: held right after optimizer.step().
peak grads B, peak/single: the most gradient bytes a rank held at any moment of a step (full .grad
  + messages in flight + shards), tracked by the course's ZeRO-1/2 only. '-': not tracked.
  single, ddp, torch-ddp, torch-zero1 hold the full .grad from backward to the step (the flat buckets
  of ddp and torch DDP, one more gradient-sized copy, are not counted); zero3 and the FSDP2 ones hold
  a unit's full gradient only inside that unit's backward (not counted)."""


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
        return self.params + self.grads + self.optimizer

    @property
    def peak_state(self) -> int | None:
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
        """The deterministic part, as text, :data:`PEAK_NOTE` under it."""
        base = self.row("single") if any(r.strategy == "single" for r in self.rows) else None
        same = f"rel≤{sci(self.rel)}"
        head = (f"{'strategy':<17} {'ranks':>5} {'= single':>8} {same:>10} {'params B':>9} {'grads B':>9} "
                f"{'optim B':>9} {'state/single':>12} {'peak grads B':>12} {'peak/single':>11} "
                f"{'sent B/step':>11} {'AR':>3} {'RS':>3} {'AG':>3} {'BC':>3}")
        lines = [head, "-" * len(head)]
        for r in self.rows:
            ratio = f"{r.state / base.state:.3f}" if base else "-"
            peak = "-" if r.peak_grads is None else f"{r.peak_grads:,}"
            peak_ratio = f"{r.peak_state / base.state:.3f}" if base and r.peak_grads is not None else "-"
            lines.append(
                f"{r.strategy:<17} {r.world_size:>5} {'yes' if r.losses_equal else 'NO':>8} "
                f"{'✓' if r.losses_equal else '✗':>10} {r.params:>9,} {r.grads:>9,} {r.optimizer:>9,} "
                f"{ratio:>12} {peak:>12} {peak_ratio:>11} {r.comm_total:>11,.0f} "
                + " ".join(f"{r.calls_per_step[op]:>3g}" for op in _OPS))
        return "\n".join(lines + [PEAK_NOTE])

    def times(self) -> str:
        """Median step time per strategy, slowest rank (varies between runs and machines)."""
        return "\n".join(f"{r.strategy:<17} {1e3 * r.step_time_s:8.1f} ms" for r in self.rows)

    def plot(self):
        """State bytes (stacked; dashed: at the gradient peak), bytes sent (by collective), step time."""
        from matplotlib.figure import Figure
        names = [r.strategy for r in self.rows]
        y = list(range(len(names)))[::-1]
        fig = Figure(figsize=(11, 0.45 * len(names) + 1.6))
        axes = fig.subplots(1, 3, sharey=True)
        state = [(part, color, [getattr(r, part) / 1e3 for r in self.rows])
                 for part, color in (("params", "#4C72B0"), ("grads", "#DD8452"), ("optimizer", "#55A868"))]
        comm = [(op.replace("_", "-"), color, [float(r.comm_per_step[op]) / 1e3 for r in self.rows])
                for op, color in zip(_OPS, ("#8172B3", "#C44E52", "#64B5CD", "#CCB974"))]
        for ax, stack in ((axes[0], state), (axes[1], comm)):
            left = [0.0] * len(names)
            for label, color, vals in stack:
                ax.barh(y, vals, left=left, color=color, label=label)
                left = [a + b for a, b in zip(left, vals)]
        peaks = [(yy, r.peak_state / 1e3) for yy, r in zip(y, self.rows) if r.peak_state is not None]
        if peaks:                            # where the gradient peak is tracked: its outline
            axes[0].barh([p[0] for p in peaks], [p[1] for p in peaks], fill=False, edgecolor="black",
                         linestyle="--", linewidth=1, label="peak in the step")
        axes[2].barh(y, [1e3 * r.step_time_s for r in self.rows], color="#937860")
        for ax, label in zip(axes, ("model-state KB per rank (max over ranks)", "KB sent per rank per step",
                                    "median step time, ms (this machine)")):
            ax.set_xlabel(label)
        axes[0].set_yticks(y, names)
        for ax in axes[:2]:
            ax.legend(fontsize=8, frameon=False, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0))
        fig.suptitle(f"every strategy, course GPT, {self.where}, {self.steps} steps")
        fig.tight_layout()
        return fig


def compare(world_size: int = 4, *, steps: int = 3, strategies=None, seed: int = 0,
            rel: float = 1e-6, quiet: bool = True) -> Comparison:
    """Train every strategy (default: all registered, in the notebooks' order) for ``steps`` steps,
    the distributed ones on ``world_size`` ranks; "single" (one process) first, the reference."""
    check_int("world_size", world_size, 2)
    check_int("steps", steps, 1)
    check_number("rel", rel, above=0, example="1e-6")
    names = list(strategies) if strategies is not None else sorted(STRATEGIES, key=lambda n: STRATEGIES[n].notebook)
    for name in names:
        get_strategy(name)                   # TypeError/ValueError for an unknown name
    reference, rows, where = None, [], ""
    for name in ["single"] + [n for n in names if n != "single"]:
        spec = get_strategy(name)
        n = world_size if spec.distributed else 1
        results = experiments.run(name, n, steps=steps, seed=seed, quiet=True)
        r0 = results[0]
        reference = r0.losses if reference is None else reference
        if spec.distributed and not where:
            where = launch.where(results)
        equal = all(abs(a - b) <= rel * abs(b) for a, b in zip(r0.losses, reference))
        comm = {op: max(r.comm_bytes.get(op, 0) for r in results) / steps for op in _OPS}
        calls = {op: r0.comm_calls.get(op, 0) / steps for op in _OPS}
        peaks = [r.extra["peak_grad_bytes"] for r in results if "peak_grad_bytes" in r.extra]
        rows.append(Row(name, n, tuple(r0.losses), max_abs_diff(r0.losses, reference), equal,
                        *(max(r.state_bytes[k] for r in results) for k in ("params", "grads", "optimizer")),
                        comm, calls, max(r.step_time_s for r in results), max(peaks) if peaks else None))
        if not quiet:
            print(f"{name}: done on {plural(n, 'rank')}")
    return Comparison(tuple(rows), world_size, steps, where or "one process", rel)
