"""A published gpt2-xl benchmark (Megatron-LM, H100 80 GB, runs R1 ... R12) laid out: its runs
(notebooks 02, 05, 09) and the planner checked against it (09). The figures live in
``theory.gpt2xl.GPT2XL_BENCHMARK`` and ``theory.scaling.GPT2XL_RUNS``."""
from __future__ import annotations

import dataclasses
import re

from ..theory.gpt2xl import GPT2XL_BENCHMARK, BenchmarkRow, benchmark_comparison
from ..theory.scaling import GPT2XL_RUNS

__all__ = ["Run", "RUNS", "runs", "runs_table", "tolerance_band", "plot_check", "mib_to_gb"]

_B, _S = GPT2XL_BENCHMARK, GPT2XL_RUNS


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: its setup and what it reported (text as reported, '-' if not)."""

    name: str
    gpus: int
    micro_batch: int
    accumulation: int
    distributed_optimizer: bool
    step_time: str
    memory: str
    what: str

    @property
    def global_batch(self) -> int:
        return self.gpus * self.micro_batch * self.accumulation


def mib_to_gb(mib: float) -> float:
    """``mib`` MiB (2**20 bytes: what Megatron and nvidia-smi print as "MB") in GB (1e9 bytes)."""
    if isinstance(mib, bool) or not isinstance(mib, (int, float)):
        raise TypeError(f"mib must be a number of MiB, got {mib!r}")
    if mib < 0:
        raise ValueError(f"mib must be >= 0, got {mib!r}")
    return mib * 2**20 / 1e9


_per_gpu_12 = _B["dp8_max_global_batch"] // 8
_per_gpu_12z = _B["dp8_max_global_batch_distopt"] // 8

#: The runs the course uses, in the benchmark's order (R8-R11 scale the distributed
#: optimizer from 2 to 8 GPUs; the course uses their end point, R12).
RUNS: tuple[Run, ...] = (
    Run("R1", 1, 1, 1, False, "-", f"{_B['r1_used_mib']:,} MiB", "baseline: one sequence, one GPU"),
    Run("R2", _S["dp"], 1, 1, False,
        f"R1 + {_S['overhead_batch1_ms']} ms (+{_S['overhead_batch1_share']:.0%})", "about R1's",
        "R1 data-parallel on 4 GPUs"),
    Run("R3", 1, _B["max_batch_one_gpu"], 1, False, f"{_B['r3_step_ms']} ms", "-",
        "the largest micro-batch that fits one GPU"),
    Run("R4", 1, _B["max_batch_one_gpu"], _S["accum_k"], False, f"{_B['r4_step_ms']} ms", "-",
        "R3 with 4 micro-batches accumulated"),
    Run("R5", _S["dp"], _B["max_batch_one_gpu"], 1, False, f"{_B['r5_step_ms']} ms",
        f"{_B['dp4_batch15_gb']} GB", "R3 data-parallel on 4 GPUs"),
    Run("R6", _S["dp"], _B["max_batch_one_gpu"], 1, True, "-", f"{_B['dp4_batch15_distopt_gb']} GB",
        "R5 + distributed optimizer"),
    Run("R7", 1, _B["max_batch_one_gpu"] + 1, 1, True, "-", "out of memory",
        "one GPU: no other rank to shard with"),
    Run("R12", 8, _per_gpu_12, 1, False, "-", "largest that fits", "8 GPUs, plain data parallel"),
    Run("R12+", 8, _per_gpu_12z, 1, True, "-", "largest that fits", "8 GPUs + distributed optimizer"),
)
_BY_NAME = {r.name: r for r in RUNS}


def runs(names=None) -> list[Run]:
    """The :class:`Run` of each name (default: all), in the order given."""
    if names is None:
        return list(RUNS)
    names = names.split() if isinstance(names, str) else list(names)
    for n in names:
        if n not in _BY_NAME:
            raise ValueError(f"no run {n!r}; the runs are {', '.join(_BY_NAME)}")
    if not names:
        raise ValueError("name at least one run, e.g. runs('R1 R2')")
    return [_BY_NAME[n] for n in names]


def runs_table(names=None) -> str:
    """The runs and their setup as a text table (the distributed-optimizer column only if one uses it)."""
    rows = runs(names)
    dist = any(r.distributed_optimizer for r in rows)
    head = (f"{'run':<6}{'GPUs':>4}  {'micro x accum':>13}{'global':>8}  " + (f"{'dist. opt.':<11}" if dist else "")
            + f"{'step time':<19}{'memory per GPU':<19}what changes")
    out = [head, "-" * (len(head) + 22)] + [
        f"{r.name:<6}{r.gpus:>4}  {f'{r.micro_batch} x {r.accumulation}':>13}{r.global_batch:>8}  "
        + (f"{'yes' if r.distributed_optimizer else 'no':<11}" if dist else "")
        + f"{r.step_time:<19}{r.memory:<19}{r.what}" for r in rows]
    out.append("gpt2-xl, sequences of 1024 tokens, Megatron-LM, H100 80 GB, bf16 weights + fp32 gradients "
               "and Adam (18 B/param).")
    return "\n".join(out)


_TOLERANCES = [
    (re.compile(r"same (\d+) decimals"), lambda rep, m: (rep - 0.5 * 10 ** -int(m), rep + 0.5 * 10 ** -int(m))),
    (re.compile(r"within (\d+(?:\.\d+)?)%"), lambda rep, m: (rep * (1 - float(m) / 100), rep * (1 + float(m) / 100))),
    (re.compile(r"\+-(\d+)"), lambda rep, m: (rep - int(m), rep + int(m))),
    (re.compile(r"must be < (\d+)"), lambda rep, m: (0.0, float(m))),
]


def tolerance_band(row: BenchmarkRow) -> tuple[float, float]:
    """The range of predicted values a row's tolerance accepts, in the row's unit."""
    if not isinstance(row, BenchmarkRow):
        raise TypeError(f"tolerance_band() takes a gpt2xl.BenchmarkRow, got {type(row).__name__}")
    for pattern, band in _TOLERANCES:
        m = pattern.search(row.tolerance)
        if m:
            return band(row.reported, m.group(1))
    raise ValueError(f"tolerance {row.tolerance!r} of {row.quantity!r} is none of: same N decimals, "
                     "within X%, +-N, must be < N")


def _short(v: float) -> str:
    return f"{v:,.2f}".rstrip("0").rstrip(".") if abs(v) >= 1000 else f"{v:.4g}"


def plot_check(rows=None):
    """Every figure as predicted / reported (1 = exact), its tolerance band shaded; green if inside."""
    from matplotlib.figure import Figure

    rows = benchmark_comparison() if rows is None else list(rows)
    if not rows or not all(isinstance(r, BenchmarkRow) for r in rows):
        raise TypeError("plot_check() takes the list of BenchmarkRow of gpt2xl.benchmark_comparison()")
    fig = Figure(figsize=(8.6, 0.34 * len(rows) + 1.5))
    ax = fig.subplots()
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows):
        lo, hi = tolerance_band(r)
        ax.barh(y, (hi - lo) / r.reported, left=lo / r.reported, height=0.8, color="#dddddd", zorder=1)
        ratio = r.predicted / r.reported
        ax.plot([1, ratio], [y, y], color="#999999", lw=1, zorder=2)
        ax.plot(ratio, y, "o", color="#55A868" if r.within else "#C44E52", zorder=3)
        ax.text(1.62, y, f"{_short(r.reported)} vs {_short(r.predicted)} {r.unit}", va="center", fontsize=7)
    ax.text(1.62, len(rows) - 0.4, "reported vs predicted", fontsize=7, fontweight="bold")
    ax.axvline(1, color="black", lw=0.8)
    ax.set_yticks(ys, [r.quantity for r in rows], fontsize=7)
    ax.set_xlim(0, 1.6)
    ax.set_xlabel("predicted / reported (grey: the range the row's tolerance accepts)", fontsize=8)
    ax.set_title("gpt2-xl on H100: the planner against every reported figure", fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
