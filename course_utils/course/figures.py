"""The figures in ``vis/`` (the course map in notebook 00; each shown where it is taught).

A figure is ``_<name>_data()`` (JSON-able numbers from course_utils) and ``_<name>_draw(data)``, registered
in ``FIGURES``; ``make figures`` writes each as a byte-identical SVG and a PNG at :data:`DPI` (what ``show``
displays: untrusted notebooks and GitHub draw PNGs, not SVGs), both tagged with the data's SHA-256 so
``tests/test_figures.py`` finds stale ones without comparing pixels.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Callable

from ..checks import check_choice
from .badges import ROOT as REPO_ROOT
from ..theory.comm import OPS, collective_calls, comm_volume, paper_volume, sent_bytes
from ..theory.config import COURSE_CONFIG, preset
from ..theory.layout import padded_numel
from ..theory.memory import GB, STAGE_NAMES, model_states
from ..theory.timeline import predicted_timeline, unit_numels

__all__ = ["FIGURES", "VIS_DIR", "DPI", "FORMATS", "data", "data_hash", "draw", "save",
           "make_all", "stale", "show", "path", "png_bytes"]

VIS_DIR = REPO_ROOT / "vis"
_HASH_RE = re.compile(rb"data-sha256=([0-9a-f]{64})")
#: Resolution of the PNGs: sharp text on a high-density screen, displayed at CSS size.
DPI = 150
#: The files each figure is written as, in ``vis/<name>.<format>``.
FORMATS = ("svg", "png")
_CSS_DPI = 96   # CSS pixels per inch: an 8-inch figure shows 768 px wide, as its SVG does
_STATE_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}


def _finish(fig, *axes):
    for ax in axes:
        ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def _zero_stages_data() -> dict:
    """Per-GPU model states for 7B params on 4 GPUs, mixed-precision Adam."""
    num_params, gpus, recipe = 7_000_000_000, 4, "mixed"
    stages = [{"name": STAGE_NAMES[ms.stage], "stage": ms.stage, "params_GB": ms.params / GB,
               "grads_GB": ms.grads / GB, "optimizer_GB": ms.optimizer / GB, "total_GB": ms.total / GB}
              for ms in (model_states(num_params, world_size=gpus, stage=s, recipe=recipe) for s in (0, 1, 2, 3))]
    return {"num_params": num_params, "gpus": gpus, "recipe": recipe, "stages": stages,
            "sharded": {"DDP": [], "ZeRO-1": ["optimizer"], "ZeRO-2": ["optimizer", "grads"],
                        "ZeRO-3": ["optimizer", "grads", "params"]}}


def _zero_stages_draw(d: dict):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    stages = d["stages"][::-1]
    for y, s in enumerate(stages):
        left = 0.0
        for part in ("params", "grads", "optimizer"):
            width = s[f"{part}_GB"]
            sharded = part in d["sharded"][s["name"]]
            ax.barh(y, width, left=left, color=_STATE_COLORS[part], edgecolor="black", linewidth=0.6,
                    hatch="//" if sharded else None, alpha=0.9)
            if width >= 6:
                ax.text(left + width / 2, y, f"{width:g}", ha="center", va="center",
                        color="white", fontsize=8, fontweight="bold")
            left += width
        ax.text(left + 1.5, y, f"{s['total_GB']:g} GB", va="center", fontsize=9)
    ax.set_yticks(range(len(stages)), [s["name"] for s in stages])
    ax.set_xlim(0, max(s["total_GB"] for s in stages) * 1.18)
    ax.set_xlabel("GB per GPU (1 GB = 10^9 bytes)")
    ax.set_title(f"Model states per GPU: {d['num_params'] / 1e9:g}B parameters, "
                 f"{d['gpus']} GPUs, mixed-precision Adam (2 + 2 + 12 bytes/param)", fontsize=9)
    handles = [Patch(facecolor=c, edgecolor="black", label=p) for p, c in _STATE_COLORS.items()]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="sharded 1/N"))
    ax.legend(handles=handles, loc="lower right", fontsize=8, frameon=False)
    return _finish(fig, ax)


def _ddp_redundancy_data() -> dict:
    """DDP on 4 GPUs, 7B params, mixed-precision Adam: every GPU holds the same 112 GB."""
    num_params, gpus = 7_000_000_000, 4
    ms = model_states(num_params, world_size=gpus, stage=0, recipe="mixed")
    z3 = model_states(num_params, world_size=gpus, stage=3, recipe="mixed")
    return {"num_params": num_params, "gpus": gpus,
            "parts_GB": {"params": ms.params / GB, "grads": ms.grads / GB, "optimizer": ms.optimizer / GB},
            "per_gpu_GB": ms.total / GB, "cluster_GB": gpus * ms.total / GB,
            "unique_GB": ms.total / GB, "zero3_per_gpu_GB": z3.total / GB}


def _ddp_redundancy_draw(d: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8.0, 3.4))
    for g in range(d["gpus"]):
        bottom = 0.0
        for part, value in d["parts_GB"].items():
            ax.bar(g, value, bottom=bottom, color=_STATE_COLORS[part], edgecolor="black", linewidth=0.6,
                   alpha=1.0 if g == 0 else 0.45, label=part if g == 0 else None)
            ax.text(g, bottom + value / 2, f"{value:g}", ha="center", va="center", fontsize=8, color="white")
            bottom += value
        ax.text(g, bottom + 2, "unique" if g == 0 else "copy", ha="center", fontsize=8)
    ax.axhline(d["zero3_per_gpu_GB"], color="black", linestyle=":", linewidth=1)
    ax.text(d["gpus"] - 0.5, d["zero3_per_gpu_GB"] + 2, f"ZeRO-3: {d['zero3_per_gpu_GB']:g} GB per GPU",
            ha="right", fontsize=8)
    ax.set_xticks(range(d["gpus"]), [f"GPU {g}" for g in range(d["gpus"])])
    ax.set_ylabel("GB per GPU")
    ax.set_title(f"DDP keeps {d['gpus']} identical copies: {d['cluster_GB']:g} GB in the cluster, "
                 f"{d['unique_GB']:g} GB of it unique ({d['num_params'] / 1e9:g}B params)", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _finish(fig, ax)


def _ring_data() -> dict:
    from ..impl.ring import ring_all_reduce_steps
    return {"world_size": 4, "steps": ring_all_reduce_steps(4)}


def _ring_draw(d: dict):
    from .ring_view import draw_ring_sequence
    return draw_ring_sequence(d["steps"])


_COLLECTIVES = (  # (demo name in labs.collectives_lab, title, what it does, bytes a rank sends)
    ("broadcast", "broadcast", "rank 0's tensor is copied to every rank", "M, 0 on the ring's last rank"),
    ("all_reduce", "all-reduce", "every rank gets the element-wise sum", "2(N-1)/N·M"),
    ("reduce_scatter", "reduce-scatter", "the sum, cut in N pieces: rank r keeps piece r", "(N-1)/N·M"),
    ("all_gather", "all-gather", "every rank gets every rank's piece, in rank order", "(N-1)/N·M"),
)
_RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52")
_SUM_COLOR = "#F6D55C"


def _collectives_data(world_size: int = 4) -> dict:
    """Before/after of the four collectives (notebook 01's demos) and the ring-model bytes sent."""
    from ..labs.collectives_lab import ROOT, expected
    rows = []
    for name, title, what, _ in _COLLECTIVES:
        ranks = [expected(name, r, world_size) for r in range(world_size)]
        before = [[float(x) for x in e["before"].tolist()] for e in ranks]
        after = [[float(x) for x in e["after"].tolist()] for e in ranks]
        chunk = len(before[0])
        if name == "broadcast":
            sources = [[ROOT] * len(a) for a in after]
        elif name == "all_gather":
            sources = [[i // chunk for i in range(len(a))] for a in after]
        else:
            sources = [["sum"] * len(a) for a in after]
        element = 4  # float32; M: the gathered output for all-gather, else the input
        message = element * (len(after[0]) if name == "all_gather" else len(before[0]))
        own = element * len(before[0])
        sent = [sent_bytes(name, message, world_size, r, ROOT, own) for r in range(world_size)]
        rows.append({"name": name, "title": title, "what": what, "before": before, "after": after,
                     "after_sources": sources, "message_bytes": message, "sent_bytes": sent})
    return {"world_size": world_size, "root": ROOT, "element_bytes": 4, "collectives": rows}


def _collectives_draw(d: dict):
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle
    n = d["world_size"]
    cell, row_h, gap = 0.5, 0.45, 0.9
    width = max(len(v) for c in d["collectives"] for v in c["before"] + c["after"]) * cell
    x_before, x_after = 0.6, 0.6 + width + 1.6
    x_text = x_after + width + 0.4
    block = n * row_h
    fig, ax = plt.subplots(figsize=(10.0, 8.0))
    formulas = {name: formula for name, _, _, formula in _COLLECTIVES}

    def cells(x0, y_top, values, sources):
        for r, (vals, srcs) in enumerate(zip(values, sources)):
            y = y_top - (r + 1) * row_h
            ax.text(x0 - 0.12, y + row_h / 2, f"r{r}", ha="right", va="center", fontsize=8)
            for i, (v, src) in enumerate(zip(vals, srcs)):
                face = _SUM_COLOR if src == "sum" else _RANK_COLORS[src % len(_RANK_COLORS)]
                alpha = 1.0 if src == "sum" else 0.35
                ax.add_patch(Rectangle((x0 + i * cell, y + 0.04), cell - 0.04, row_h - 0.08,
                                       facecolor=face, alpha=alpha, edgecolor="black", linewidth=0.5))
                ax.text(x0 + i * cell + (cell - 0.04) / 2, y + row_h / 2, f"{v:g}", ha="center",
                        va="center", fontsize=7.5)

    y = 0.0
    for c in d["collectives"]:
        ax.text(0.0, y, c["title"], fontsize=11, fontweight="bold", va="bottom")
        ax.text(0.0 + 0.22 * len(c["title"]) + 0.3, y + 0.02, c["what"], fontsize=9, va="bottom",
                color="#333333")
        top = y - 0.15
        cells(x_before, top, c["before"], [[r] * len(v) for r, v in enumerate(c["before"])])
        cells(x_after, top, c["after"], c["after_sources"])
        mid = top - block / 2
        ax.add_patch(FancyArrowPatch((x_before + width + 0.25, mid), (x_after - 0.55, mid),
                                     arrowstyle="-|>", mutation_scale=14, color="black", linewidth=1.2))
        sent = c["sent_bytes"]
        sent_text = f"{sent[0]:g}" if len(set(sent)) == 1 else ", ".join(f"{s:g}" for s in sent)
        ax.text(x_text, top - 0.35, f"M = {c['message_bytes']} B", fontsize=8.5, va="center")
        ax.text(x_text, top - 0.85, f"sent per rank: {sent_text} B", fontsize=8.5, va="center")
        ax.text(x_text, top - 1.35, f"= {formulas[c['name']]}", fontsize=8.5, va="center",
                color="#333333")
        y = top - block - gap
    ax.text(x_before, 0.55, "before", fontsize=10, fontstyle="italic")
    ax.text(x_after, 0.55, "after", fontsize=10, fontstyle="italic")
    ax.text(x_text, 0.55, "ring model, float32", fontsize=10, fontstyle="italic")
    ax.set_xlim(-0.2, x_text + 3.6)
    ax.set_ylim(y + gap - 0.2, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"The four collectives of ZeRO and FSDP on {n} ranks: rank r starts from 10·r + i; "
                 "colour = the rank a value comes from, yellow = a sum over all ranks", fontsize=9)
    return _finish(fig)


def _memory_vs_gpus_data() -> dict:
    """Model states per GPU for 7B params, mixed-precision Adam, N = 1 ... 64 GPUs."""
    num_params, recipe = 7_000_000_000, "mixed"
    gpus = [2 ** k for k in range(7)]
    stages = []
    for stage in (0, 1, 2, 3):
        one = model_states(num_params, world_size=1, stage=stage, recipe=recipe)   # floor: the unsharded parts
        stages.append({"name": STAGE_NAMES[stage], "stage": stage, "total_GB": [
            model_states(num_params, world_size=n, stage=stage, recipe=recipe).total / GB for n in gpus],
            "floor_GB": {0: one.total, 1: one.params + one.grads, 2: one.params, 3: 0}[stage] / GB})
    return {"num_params": num_params, "recipe": recipe, "gpus": gpus, "stages": stages}


def _memory_vs_gpus_draw(d: dict):
    import matplotlib.pyplot as plt
    colors = ("#333333", "#4C72B0", "#DD8452", "#55A868")
    fig, ax = plt.subplots(figsize=(8.0, 4.2))
    gpus = d["gpus"]
    for s, color in zip(d["stages"], colors):
        ax.plot(gpus, s["total_GB"], "o-", color=color, label=s["name"], linewidth=1.6, markersize=4)
        for n, v in zip(gpus, s["total_GB"]):
            if n in (gpus[2], gpus[-1]):
                ax.annotate(f"{v:.3g}", (n, v), textcoords="offset points",
                            xytext=(-12, -12) if s["stage"] == 3 and n != gpus[-1] else (0, 6),
                            ha="center", fontsize=7.5, color=color)
        if 0 < s["floor_GB"] < s["total_GB"][0]:
            ax.axhline(s["floor_GB"], color=color, linestyle=":", linewidth=1)
            ax.text(gpus[0], s["floor_GB"] + 1.5, f"{s['name']} never below {s['floor_GB']:g} GB "
                    "(the parts it keeps whole)", fontsize=7.5, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [str(n) for n in gpus])
    ax.set_xlabel("GPUs N (data-parallel ranks)")
    ax.set_ylabel("GB per GPU (1 GB = 10^9 bytes)")
    ax.set_ylim(0, max(d["stages"][0]["total_GB"]) * 1.15)
    ax.set_title(f"Model states per GPU vs N: {d['num_params'] / 1e9:g}B parameters, "
                 "mixed-precision Adam (2 + 2 + 12 bytes/param)\nZeRO-3 alone falls as 1/N", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="center right")
    return _finish(fig, ax)


def _zero3_timeline_data(world_size: int = 2) -> dict:
    """The ZeRO-3 timeline of the course GPT on ``world_size`` ranks, without and with prefetch."""
    numels = unit_numels(COURSE_CONFIG)
    padded = [padded_numel(m, world_size) for m in numels]
    return {"world_size": world_size, "num_params": COURSE_CONFIG.num_params(),
            "unit_numels": numels, "padded_numels": padded,
            "full_model_bytes": 4 * COURSE_CONFIG.num_params(),
            "shard_bytes": 4 * sum(padded) // world_size,
            "timelines": {str(p).lower(): predicted_timeline(world_size, prefetch=p)
                          for p in (False, True)}}


def _zero3_timeline_draw(d: dict):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.0), sharey=True)
    for ax, (key, tl) in zip(axes, d["timelines"].items()):
        kb = [e["alive_bytes"] / 1e3 for e in tl]
        x = range(len(tl))
        ax.step(x, kb, where="post", color="#4C72B0", linewidth=1.6, label="full parameters gathered")
        first_bwd = next(i for i, e in enumerate(tl) if e["phase"] == "backward")
        ax.axvspan(first_bwd - 0.5, len(tl) - 0.5, color="#DD8452", alpha=0.12, label="backward")
        ax.axhline(d["full_model_bytes"] / 1e3, color="#333333", linestyle=":", linewidth=1,
                   label=f"the whole model, as DDP keeps it: {d['full_model_bytes'] / 1e3:g} KB")
        ax.axhline(d["shard_bytes"] / 1e3, color="#55A868", linestyle="--", linewidth=1,
                   label=f"this rank's shard of the parameters: {d['shard_bytes'] / 1e3:g} KB")
        peak = max(tl, key=lambda e: e["alive_bytes"])
        ax.annotate(f"peak {peak['alive_bytes'] / 1e3:g} KB\n({peak['alive_units']} units)",
                    (tl.index(peak), peak["alive_bytes"] / 1e3), textcoords="offset points",
                    xytext=(8, 14), fontsize=7.5, arrowprops={"arrowstyle": "-", "linewidth": 0.6})
        ax.set_xticks(list(x), [f"{e['event']} {e['unit'].replace('blocks.', 'b')}" for e in tl],
                      rotation=90, fontsize=7)
        ax.set_xlim(-0.5, len(tl) - 0.5)
        ax.set_title(f"prefetch={key.capitalize()}", fontsize=9)
    axes[0].set_ylabel("KB of full fp32 parameters alive")
    axes[0].set_ylim(0, d["full_model_bytes"] / 1e3 * 1.15)
    axes[0].legend(fontsize=7.5, frameon=False, loc="center", bbox_to_anchor=(0.5, 0.68))
    fig.suptitle(f"ZeRO-3 (course_utils.impl.zero3) on the course GPT, {d['world_size']} ranks: one training "
                 "step, gather by gather (root = embeddings + final norm, b0..b3 = blocks)", fontsize=9)
    return _finish(fig, *axes)


def _comm_table_data(preset_name: str = "llama-2-7b", world_size: int = 4,
                     bytes_per_elem: int = 2) -> dict:
    """Bytes one rank sends per step, and the calls, for DDP, ZeRO-1/2/3 and FSDP2 on a real model."""
    from ..harness.model import build_model
    from ..theory.sharding import calls_per_step, comm_bytes_per_step, fsdp_units
    p = preset(preset_name)
    psi = p.num_params
    model = build_model(p.config, device="meta")
    layers = len(fsdp_units(model))
    rows = []
    for stage in (0, 1, 2, 3):
        vol = comm_volume(psi, world_size=world_size, stage=stage, bytes_per_elem=bytes_per_elem)
        calls = collective_calls(stage, num_layers=layers + 1)
        rows.append({"name": STAGE_NAMES[stage] + (" (all units twice)" if stage == 3 else ""),
                     "bytes": {op: vol[op] for op in OPS}, "total": vol["total"], "calls": calls,
                     "calls_per": "bucket" if stage < 3 else "step",
                     "paper_elements": paper_volume(psi, stage=stage)})

    fsdp_bytes = {op: int(v) if v.denominator == 1 else float(v) for op, v in comm_bytes_per_step(
        model, world_size, bytes_per_elem=bytes_per_elem).items()}
    rows.append({"name": "FSDP2 (root kept gathered)", "bytes": fsdp_bytes,
                 "total": sum(fsdp_bytes.values()), "calls": calls_per_step(layers),
                 "calls_per": "step", "paper_elements": None})
    ddp = rows[0]["total"]
    for r in rows:
        r["x_ddp"] = r["total"] / ddp
    return {"preset": preset_name, "num_params": psi, "layers": layers, "world_size": world_size,
            "bytes_per_elem": bytes_per_elem, "rows": rows}


def _comm_table_draw(d: dict):
    import matplotlib.pyplot as plt
    colors = {"all_reduce": "#4C72B0", "reduce_scatter": "#DD8452", "all_gather": "#55A868"}
    fig, (ax, tab) = plt.subplots(2, 1, figsize=(9.0, 6.0), gridspec_kw={"height_ratios": [1.25, 1]})
    rows = d["rows"][::-1]
    for y, r in enumerate(rows):
        left = 0.0
        for op, color in colors.items():
            v = r["bytes"][op] / GB
            ax.barh(y, v, left=left, color=color, edgecolor="black", linewidth=0.6,
                    label=op.replace("_", "-") if y == 0 else None)
            left += v
        ax.text(left + 0.3, y, f"{r['total'] / GB:.2f} GB = {r['x_ddp']:.3f}× DDP", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=8)
    ax.set_xlim(0, max(r["total"] for r in rows) / GB * 1.6)
    ax.set_xlabel("GB one rank sends per step (ring algorithms, 1 GB = 10^9 bytes)", fontsize=8)
    ax.legend(fontsize=8, frameon=False, loc="upper right")
    ax.set_title(f"Communication per step: {d['preset']} (Ψ = {d['num_params']:,}, {d['layers']} blocks), "
                 f"{d['world_size']} ranks, {8 * d['bytes_per_elem']}-bit messages", fontsize=9)

    def calls(r, op):
        c = r["calls"][op]
        return "-" if c == 0 else (f"{c} per bucket" if r["calls_per"] == "bucket" else str(c))

    cells = [[r["name"], calls(r, "all_reduce"), calls(r, "reduce_scatter"), calls(r, "all_gather"),
              "-" if r["paper_elements"] is None else f"{r['paper_elements'] / d['num_params']:g}Ψ"]
             for r in d["rows"]]
    tab.axis("off")
    table = tab.table(cellText=cells, colLabels=["calls per step", "all-reduce", "reduce-scatter",
                                                 "all-gather", "ZeRO paper"],
                      loc="center", cellLoc="center", colWidths=[0.3, 0.16, 0.16, 0.16, 0.12])
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.35)
    tab.set_title(f"L = {d['layers']} blocks + the root. ZeRO-3 as in the paper gathers every unit in forward "
                  "and again in backward: 2L+2.\nFSDP2 keeps the root gathered between forward and backward: "
                  "2L+1.\nThe paper counts elements and drops (N-1)/N: 2Ψ vs 3Ψ.", fontsize=8)
    return _finish(fig, ax)


FIGURES: dict[str, tuple[Callable[[], dict], Callable[[dict], object]]] = {
    "zero_stages": (_zero_stages_data, _zero_stages_draw),
    "ddp_redundancy": (_ddp_redundancy_data, _ddp_redundancy_draw),
    "ring_all_reduce": (_ring_data, _ring_draw),   # notebook 01: the ring all-reduce, step by step
    "collectives": (_collectives_data, _collectives_draw),            # notebook 01
    "memory_vs_gpus": (_memory_vs_gpus_data, _memory_vs_gpus_draw),   # notebook 03
    "zero3_timeline": (_zero3_timeline_data, _zero3_timeline_draw),   # notebook 06
    "comm_table": (_comm_table_data, _comm_table_draw),               # notebook 06
}


def path(name: str, vis_dir: Path | str | None = None, fmt: str = "svg") -> Path:
    """Where figure ``name`` lives: ``vis/<name>.svg`` (``fmt="png"``: ``vis/<name>.png``)."""
    check_choice("name", name, FIGURES, kind="figure", kinds="figures")
    check_choice("fmt", fmt, FORMATS, kind="format", kinds="formats")
    return Path(vis_dir or VIS_DIR) / f"{name}.{fmt}"


def data(name: str) -> dict:
    check_choice("name", name, FIGURES, kind="figure", kinds="figures")
    return FIGURES[name][0]()


def data_hash(name: str) -> str:
    """SHA-256 of the figure's data as canonical JSON."""
    blob = json.dumps(data(name), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def draw(name: str):
    return FIGURES[name][1](data(name))


def _metadata(name: str, fmt: str) -> dict:
    """Metadata that makes the file deterministic (no date, no version) and tags its data."""
    tag = {"Title": name, "Description": f"data-sha256={data_hash(name)}"}
    return {**tag, "Software": None} if fmt == "png" else {**tag, "Date": None, "Creator": None}


def png_bytes(fig, name: str) -> bytes:
    """``fig`` (figure ``name``) as deterministic PNG bytes at :data:`DPI`."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata=_metadata(name, "png"))
    return buf.getvalue()


def save(name: str, vis_dir: Path | str | None = None) -> list[Path]:
    """Draw ``name`` once and write its deterministic SVG and PNG; returns their paths."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    targets = [path(name, vis_dir, fmt) for fmt in FORMATS]
    targets[0].parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.hashsalt": "zero-to-fsdp", "svg.fonttype": "none"}):
        fig = draw(name)
        fig.savefig(targets[0], format="svg", metadata=_metadata(name, "svg"))
        targets[1].write_bytes(png_bytes(fig, name))
    plt.close(fig)
    return targets


def make_all(vis_dir: Path | str | None = None) -> list[Path]:
    """Redraw every registered figure (``make figures``): every file written."""
    return [p for name in FIGURES for p in save(name, vis_dir)]


def stale(vis_dir: Path | str | None = None) -> dict[str, str]:
    """Figures whose committed SVG or PNG is missing or drawn from other data: name -> why."""
    problems = {}
    for name in FIGURES:
        for p in (path(name, vis_dir, fmt) for fmt in FORMATS):
            m = _HASH_RE.search(p.read_bytes()) if p.exists() else None
            why = ("is missing" if not p.exists() else "carries no data hash" if not m else
                   "was drawn from other data than the code gives now"
                   if m.group(1).decode() != data_hash(name) else "")
            if why:
                problems[name] = f"{p} {why}: run `make figures`"
                break
    return problems


def show(name: str):
    """Display the committed PNG of ``name`` (drawn live if absent) as wide as its SVG."""
    import base64

    from IPython.display import display
    p = path(name, fmt="png")
    if p.exists():
        png = p.read_bytes()
    else:  # e.g. a non-editable install without the repo's vis/ folder
        import matplotlib.pyplot as plt

        fig = draw(name)
        png = png_bytes(fig, name)
        plt.close(fig)
    width = round(int.from_bytes(png[16:20], "big") * _CSS_DPI / DPI)   # the IHDR width
    display({"image/png": base64.b64encode(png).decode("ascii"), "text/plain": f"figure: {name}"},
            raw=True, metadata={"image/png": {"width": width}})


if __name__ == "__main__":  # python -m course_utils.course.figures  (what `make figures` runs)
    for written in make_all():
        print(f"wrote {written}")
