"""The theory models' figures: each takes what a function of ``theory/`` returns (or its
inputs) and draws it as a matplotlib ``Figure``. ``theory/`` itself draws nothing.

:func:`plot_alpha_beta` (notebook 01), :func:`plot_plan` (11, the planner widget),
:func:`plot_choices` (08, four clusters' recommendations),
:func:`plot_estimators` (09) and :func:`plot_crossover` (11).
"""
from __future__ import annotations

import math
from typing import Sequence

from ..checks import check_positive
from ..theory.alpha_beta import AlphaBetaFit
from ..theory.comm import collective_bytes
from ..theory.estimators import Row
from ..theory.memory import GB
from ..theory.multinode import crossovers, hsdp_vs_fsdp_time
from ..theory.planner import Choice, Plan, as_choice, recommend
from ..theory.text import fmt_bytes

__all__ = ["plot_alpha_beta", "plot_plan", "plot_choices", "plot_estimators", "plot_crossover"]


# ------------------------------------------------------------------ alpha-beta (notebook 01)

def _bytes_label(m: float) -> str:
    return fmt_bytes(m, "auto", 3, sig=True, largest="MiB")


def plot_alpha_beta(sizes: Sequence, times: Sequence, fit: AlphaBetaFit):
    """Log-log plot: measured times, the fitted model, its latency floor and bandwidth line."""
    import numpy as np
    from matplotlib.figure import Figure
    if not isinstance(fit, AlphaBetaFit):
        raise TypeError(f"fit must be what fit_alpha_beta returns, got {type(fit).__name__}")
    if len(sizes) != len(times) or not len(sizes):
        raise ValueError("sizes and times must be non-empty and of the same length")
    fig = Figure(figsize=(7.0, 4.2))
    ax = fig.subplots()
    grid = np.geomspace(min(sizes) / 2, max(sizes) * 2, 200)
    ax.loglog(sizes, [t * 1e3 for t in times], "o", color="#4C72B0", label="measured (best of repeats, slowest rank)")
    ax.loglog(grid, [fit.predict(m) * 1e3 for m in grid], "-", color="#C44E52",
              label=f"fit: {fit.steps}·alpha + bytes sent / bandwidth")
    if fit.alpha_s > 0:
        ax.axhline(fit.alpha_s * fit.steps * 1e3, color="gray", linestyle=":", linewidth=1,
                   label=f"latency: {fit.steps} × {fit.alpha_s * 1e6:.0f} us")
    if math.isfinite(fit.bandwidth):
        ax.loglog(grid, [collective_bytes(fit.op, m, fit.world_size) / fit.bandwidth * 1e3 for m in grid],
                  "--", color="gray", linewidth=1, label=f"bandwidth: {fit.bandwidth / 1e9:.2f} GB/s")
        ax.set_ylim(min(times) * 1e3 / 3, max(times) * 1e3 * 3)
    if fit.alpha_s > 0 and math.isfinite(fit.bandwidth):
        x = fit.crossover_bytes()
        ax.axvline(x, color="black", linestyle=":", linewidth=0.8)
        ax.text(x, ax.get_ylim()[1], f" crossover {_bytes_label(x)}", va="top", fontsize=8)
    ticks = [m for m in (2 ** k for k in range(0, 41, 2)) if grid[0] <= m <= grid[-1]]
    ax.set_xticks(ticks, [_bytes_label(m) for m in ticks], fontsize=8)
    ax.minorticks_off()
    ax.set(xlabel="message size M", ylabel="time (ms)")
    ax.set_title(f"{fit.op} on {fit.world_size} ranks: t = alpha·steps + bytes sent / bandwidth", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ the planner (notebook 08)

_PART_COLORS = {"states": "#4C72B0", "activations": "#C44E52", "buffers": "#8C8C8C",
                "compute": "#55A868", "comm": "#DD8452", "offload": "#8172B2"}


def _stacked_bars(ax_mem, ax_t, y: float, r, **bar) -> float:
    """One option's two bars at height ``y``: memory per GPU (states, activations, buffers with
    torch's bf16 parameter copies: the row's total) and its step (compute, exposed communication,
    offload). Returns the exposed communication's seconds."""
    exposed = r.step_s - r.compute_s - r.offload_s
    for ax, parts in ((ax_mem, (("states", r.states / GB), ("activations", r.activations / GB),
                                ("buffers", (r.buffers + r.copies) / GB))),
                      (ax_t, (("compute", r.compute_s), ("comm", exposed), ("offload", r.offload_s)))):
        left = 0.0
        for part, value in parts:
            ax.barh(y, value, left=left, color=_PART_COLORS[part], **bar)
            left += value
    return exposed


def plot_plan(rows: Plan, *, highlight: Choice | None = None):
    """A :func:`~course_utils.theory.planner.plan`: memory per GPU and seconds per step, one bar per option; the recommended one outlined."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not isinstance(rows, Plan):
        raise TypeError("plot_plan() takes the Plan returned by planner.plan(...)")
    a = rows.assumptions
    rec = recommend(rows).choice if highlight is None else as_choice(highlight)
    fig = Figure(figsize=(10.0, 0.28 * len(rows) + 1.6))
    ax_mem, ax_t = fig.subplots(1, 2, sharey=True)
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows):
        edge = dict(edgecolor="black", linewidth=1.5) if r.choice == rec else dict(linewidth=0)
        _stacked_bars(ax_mem, ax_t, y, r, alpha=1.0 if r.fits else 0.35, **edge)
    ax_mem.axvline(a.gpu_mem_gb, color="black", linestyle="--", linewidth=1)
    ax_mem.set_yticks(ys, [r.short() + ("" if r.fits else " (no fit)") for r in rows], fontsize=7)
    ax_mem.set_xlim(0, max(a.gpu_mem_gb * 1.6, 1.0))     # a bar that does not fit may run off the edge
    for ax, parts, xlabel in ((ax_mem, ("states", "activations", "buffers"), "GB per GPU"),
                              (ax_t, ("compute", "comm", "offload"), "seconds per optimizer step")):
        ax.set_xlabel(xlabel)
        handles = [Patch(color=_PART_COLORS[p], label="exposed comm" if p == "comm" else p) for p in parts]
        ax.legend(handles=handles, fontsize=7, frameon=False, ncol=3, loc="lower center",
                  bbox_to_anchor=(0.5, 1.0))
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"{a.model} on {a.nodes} x {a.gpus_per_node} GPUs of {a.gpu_mem_gb:g} GB, seq {a.seq_len}"
                 + (f": recommended {rec.label(a.framework, amp=a.amp)}" if rec else ": nothing fits"), fontsize=9)
    fig.tight_layout()
    return fig


def plot_choices(plans: Sequence[Plan]):
    """Each plan's recommended option, one row per cluster (notebook 08 §2.2): its memory per GPU
    against the GPU's (dashed), and its step split into compute, exposed communication and offload."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    plans = list(plans)
    if not plans or not all(isinstance(p, Plan) for p in plans):
        raise TypeError("plot_choices() takes a list of the Plans returned by planner.plan(...)")
    fig = Figure(figsize=(11.0, 0.75 * len(plans) + 1.5))
    ax_mem, ax_t = fig.subplots(1, 2, sharey=True)
    ys = list(range(len(plans)))[::-1]
    labels, widest = [], {"mem": 1.0, "t": 1e-9}
    for y, p in zip(ys, plans):
        a, r = p.assumptions, recommend(p).row
        labels.append(f"{a.model}, {a.nodes} x {a.gpus_per_node} GPUs of {a.gpu_mem_gb:g} GB,\n"
                      f"{a.inter_bw_gbps:g} GB/s NICs: " + (r.label() if r else "nothing fits"))
        ax_mem.plot([a.gpu_mem_gb] * 2, [y - 0.4, y + 0.4], color="black", linestyle="--", linewidth=1)
        widest["mem"] = max(widest["mem"], a.gpu_mem_gb)
        if r is None:
            continue
        exposed = _stacked_bars(ax_mem, ax_t, y, r, height=0.6)
        ax_mem.text(max(r.total / GB, a.gpu_mem_gb), y, f" {r.total / GB:.0f} GB", va="center", fontsize=8)
        ax_t.text(r.step_s, y, f" {r.step_s:.1f} s = {r.compute_s:.1f} + {exposed:.1f} + {r.offload_s:.1f}",
                  va="center", fontsize=8)
        widest["t"] = max(widest["t"], r.step_s)
    ax_mem.set_yticks(ys, labels, fontsize=8)
    ax_mem.set_xlim(0, widest["mem"] * 1.25)
    ax_t.set_xlim(0, widest["t"] * 1.7)
    ax_mem.set_xlabel("GB per GPU (dashed: its memory)", fontsize=9)
    ax_t.set_xlabel("seconds per step: compute + exposed comm + offload", fontsize=9)
    for ax in (ax_mem, ax_t):
        ax.spines[["top", "right"]].set_visible(False)
    parts = ("states", "activations", "buffers", "compute", "comm", "offload")
    fig.legend(handles=[Patch(color=_PART_COLORS[p], label="exposed comm" if p == "comm" else p) for p in parts],
               fontsize=8, frameon=False, ncol=6, loc="lower center")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


# ------------------------------------------------------------------ memory estimators (notebook 09)

_FAMILY_COLORS = (("ZeRO paper", "#4C72B0"), ("fp32 grads", "#64B5CD"), ("DeepSpeed", "#DD8452"),
                  ("accelerate", "#55A868"))


def _family(name: str) -> tuple[str, str]:
    return next(((f, c) for f, c in _FAMILY_COLORS if name.startswith(f)), ("other", "#8C8C8C"))


def plot_estimators(rows, *, title: str = ""):
    """:func:`~course_utils.theory.estimators.compare` rows as a bar chart of GPU GB (host memory is per node: left out)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = list(rows)
    if not rows or not all(isinstance(r, Row) for r in rows):
        raise TypeError("plot_estimators() takes the list of Row returned by estimators.compare(...)")
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {title!r}")
    ys = list(range(len(rows)))[::-1]
    fig = Figure(figsize=(8.0, 0.3 * len(rows) + 1.4))
    ax = fig.subplots()
    values = [r.gpu_bytes / GB for r in rows]
    ax.barh(ys, values, color=[_family(r.name)[1] for r in rows])
    for y, v in zip(ys, values):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
    ax.set_yticks(ys, [r.name for r in rows], fontsize=7)
    ax.set_xlim(0, max(values) * 1.15)
    ax.set_xlabel("model states per GPU, GB (1 GB = 1e9 bytes; DeepSpeed and accelerate print GiB)")
    seen = dict.fromkeys(_family(r.name) for r in rows)
    ax.legend(handles=[Patch(color=c, label=f) for f, c in seen], fontsize=7, frameon=False,
              loc="lower right")
    ax.spines[["top", "right"]].set_visible(False)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ full sharding vs HSDP (notebook 11)

def plot_crossover(num_params=7e9, gpus_per_node: int = 8, nodes: int = 4, intra_bw: float = 450e9, *,
                   nics_per_node=(8, 1), nic_bw_range=(3e9, 400e9), **model):
    """Log-log panels (one per ``nics_per_node``): both strategies' time against one NIC's bandwidth."""
    import numpy as np
    from matplotlib.figure import Figure

    counts = [nics_per_node] if isinstance(nics_per_node, int) else list(nics_per_node)
    if not counts:
        raise ValueError("nics_per_node must be an int or a non-empty sequence of ints")
    lo, hi = nic_bw_range
    check_positive("nic_bw_range[0]", lo)
    if not hi > lo:
        raise ValueError(f"nic_bw_range must be (low, high) with high > low, got {nic_bw_range!r}")
    grid = np.geomspace(lo, hi, 200)
    fig = Figure(figsize=(5.0 * len(counts), 4.0))
    axes = fig.subplots(1, len(counts), squeeze=False)[0]
    for ax, r in zip(axes, counts):
        costs = [hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, float(b), nics_per_node=r,
                                   **model) for b in grid]
        serial = [hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, float(b), nics_per_node=r,
                                    overlap=False, **model).hsdp_s for b in grid]
        found = crossovers(num_params, gpus_per_node, nodes, intra_bw, nics_per_node=r, **model)
        x = grid / 1e9
        ax.loglog(x, [c.fsdp_s for c in costs], "-", color="#C44E52", label=f"full sharding over {nodes * gpus_per_node} GPUs")
        ax.loglog(x, [c.hsdp_s for c in costs], "-", color="#4C72B0",
                  label=f"HSDP ({gpus_per_node} shards x {nodes} replicas), all-reduce overlapped (FSDP2)")
        ax.loglog(x, serial, ":", color="#4C72B0", linewidth=1, label="HSDP, its phases one after the other")
        if found:
            right = min(found[1], hi) if len(found) > 1 else hi
            ax.axvspan(max(found[0], lo) / 1e9, right / 1e9, color="#C44E52", alpha=0.08,
                       label="full sharding faster")
        for b in found:
            if lo <= b <= hi:
                ax.axvline(b / 1e9, color="black", linestyle=":", linewidth=0.8)
                ax.text(b / 1e9, ax.get_ylim()[1], f" {b / 1e9:.0f} GB/s", va="top", fontsize=8)
        ax.set_xlim(lo / 1e9, hi / 1e9)
        ticks = [t for t in (6.25, 12.5, 25, 50, 100, 200, 400) if lo / 1e9 <= t <= hi / 1e9]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("bandwidth of one NIC, GB/s (x 8 = Gb/s: 50 GB/s is a 400 Gb/s card)", fontsize=8)
        ax.set_ylabel("communication per step (s)")
        ax.set_title(f"{r} NIC(s) per node of {gpus_per_node} GPUs", fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"{num_params / 1e9:g}B params, {nodes} nodes x {gpus_per_node} GPUs, NVLink "
                 f"{intra_bw / 1e9:g} GB/s: 2 all-gathers + 1 reduce-scatter per step", fontsize=9)
    labelled = {label: handle for ax in axes for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(labelled.values(), labelled.keys(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))      # the legend below the panels, off the lines
    return fig
