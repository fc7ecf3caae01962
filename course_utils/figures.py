"""The figures in ``vis/``, each drawn by code here; ``make figures`` redraws them all.

Taught in ``notebooks/00_orientation.ipynb`` (the course map). A figure is two
functions: ``data()`` returns the numbers it draws (plain JSON-able values, computed by
``course_utils``), ``draw(data)`` returns a matplotlib figure. The SVG written to
``vis/`` carries the SHA-256 of that data in its metadata, so
``tests/test_figures.py`` can tell when a committed figure no longer matches the
code, without comparing pixels (which change with matplotlib versions).

Add a figure: write ``_<name>_data`` and ``_<name>_draw``, register them in
``FIGURES``, run ``make figures``, commit the SVG.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Callable

from .memory import GB, STAGE_NAMES, model_states

__all__ = ["FIGURES", "VIS_DIR", "data", "data_hash", "draw", "save", "make_all",
           "stale", "show", "path"]

VIS_DIR = Path(__file__).resolve().parent.parent / "vis"
_HASH_RE = re.compile(r"data-sha256=([0-9a-f]{64})")


# ------------------------------------------------------------------- zero_stages

def _zero_stages_data() -> dict:
    """Per-GPU model states for 7B params on 4 GPUs, mixed-precision Adam (seed 001)."""
    num_params, gpus, recipe = 7_000_000_000, 4, "mixed"
    stages = []
    for stage in (0, 1, 2, 3):
        ms = model_states(num_params, world_size=gpus, stage=stage, recipe=recipe)
        stages.append({"name": STAGE_NAMES[stage], "stage": stage,
                       "params_GB": ms.params / GB, "grads_GB": ms.grads / GB,
                       "optimizer_GB": ms.optimizer / GB, "total_GB": ms.total / GB})
    return {"num_params": num_params, "gpus": gpus, "recipe": recipe, "stages": stages,
            "sharded": {"DDP": [], "ZeRO-1": ["optimizer"], "ZeRO-2": ["optimizer", "grads"],
                        "ZeRO-3": ["optimizer", "grads", "params"]}}


def _zero_stages_draw(d: dict):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}
    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    names = [s["name"] for s in d["stages"]][::-1]
    stages = d["stages"][::-1]
    for y, s in enumerate(stages):
        left = 0.0
        for part in ("params", "grads", "optimizer"):
            width = s[f"{part}_GB"]
            sharded = part in d["sharded"][s["name"]]
            ax.barh(y, width, left=left, color=colors[part], edgecolor="black", linewidth=0.6,
                    hatch="//" if sharded else None, alpha=0.9)
            if width >= 6:
                ax.text(left + width / 2, y, f"{width:g}", ha="center", va="center",
                        color="white", fontsize=8, fontweight="bold")
            left += width
        ax.text(left + 1.5, y, f"{s['total_GB']:g} GB", va="center", fontsize=9)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlim(0, max(s["total_GB"] for s in stages) * 1.18)
    ax.set_xlabel("GB per GPU (1 GB = 10^9 bytes)")
    ax.set_title(f"Model states per GPU: {d['num_params'] / 1e9:g}B parameters, "
                 f"{d['gpus']} GPUs, mixed-precision Adam (2 + 2 + 12 bytes/param)", fontsize=9)
    handles = [Patch(facecolor=c, edgecolor="black", label=p) for p, c in colors.items()]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="sharded 1/N"))
    ax.legend(handles=handles, loc="lower right", fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ ddp_redundancy

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

    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}
    fig, ax = plt.subplots(figsize=(8.0, 3.4))
    for g in range(d["gpus"]):
        bottom = 0.0
        for part, value in d["parts_GB"].items():
            ax.bar(g, value, bottom=bottom, color=colors[part], edgecolor="black", linewidth=0.6,
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
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def _ring_data() -> dict:
    from .ring import ring_figure_data

    return ring_figure_data(4)


def _ring_draw(d: dict):
    from .ring import ring_figure_draw

    return ring_figure_draw(d)


FIGURES: dict[str, tuple[Callable[[], dict], Callable[[dict], object]]] = {
    "zero_stages": (_zero_stages_data, _zero_stages_draw),
    "ddp_redundancy": (_ddp_redundancy_data, _ddp_redundancy_draw),
    "ring_all_reduce": (_ring_data, _ring_draw),   # notebook 01: the ring all-reduce, step by step
}


# ------------------------------------------------------------------- machinery

def _check(name: str) -> None:
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; known figures: {sorted(FIGURES)}")


def path(name: str, vis_dir: Path | str | None = None) -> Path:
    """Where figure ``name`` lives (``vis/<name>.svg``)."""
    _check(name)
    return Path(vis_dir or VIS_DIR) / f"{name}.svg"


def data(name: str) -> dict:
    """The numbers figure ``name`` draws."""
    _check(name)
    return FIGURES[name][0]()


def data_hash(name: str) -> str:
    """SHA-256 of the figure's data (canonical JSON)."""
    blob = json.dumps(data(name), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def draw(name: str):
    """A matplotlib figure of ``name``, drawn now from code."""
    _check(name)
    data_fn, draw_fn = FIGURES[name]
    return draw_fn(data_fn())


def save(name: str, vis_dir: Path | str | None = None) -> Path:
    """Draw ``name`` and write it as a deterministic SVG tagged with its data hash."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    target = path(name, vis_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.hashsalt": "zero-to-fsdp", "svg.fonttype": "none"}):
        fig = draw(name)
        fig.savefig(target, format="svg", metadata={
            "Date": None, "Creator": None,
            "Title": name, "Description": f"data-sha256={data_hash(name)}"})
    plt.close(fig)
    return target


def make_all(vis_dir: Path | str | None = None) -> list[Path]:
    """Redraw every registered figure (``make figures``)."""
    return [save(name, vis_dir) for name in FIGURES]


def stale(vis_dir: Path | str | None = None) -> dict[str, str]:
    """Figures whose committed SVG is missing or drawn from other data: name -> why."""
    problems = {}
    for name in FIGURES:
        p = path(name, vis_dir)
        if not p.exists():
            problems[name] = f"{p} is missing: run `make figures`"
            continue
        m = _HASH_RE.search(p.read_text(encoding="utf-8"))
        if not m:
            problems[name] = f"{p} carries no data hash: run `make figures`"
        elif m.group(1) != data_hash(name):
            problems[name] = f"{p} was drawn from other data than the code gives now: run `make figures`"
    return problems


def show(name: str):
    """Display figure ``name`` in a notebook (the committed SVG; drawn live if absent)."""
    from IPython.display import SVG, display

    p = path(name)
    if p.exists():
        display(SVG(filename=str(p)))
    else:  # e.g. a non-editable install without the repo's vis/ folder
        display(draw(name))


if __name__ == "__main__":  # python -m course_utils.figures  (what `make figures` runs)
    for written in make_all():
        print(f"wrote {written}")
