"""The memory calculator (notebook 03: which ZeRO stage fits?) and the planner's widget.
Where widgets cannot render (nbval, GitHub) they show a figure and a text table."""
from __future__ import annotations

import dataclasses

from ..checks import check_choice, check_int
from ..theory import planner
from ..theory.config import PRESETS
from ..theory.memory import GB, RECIPES, STAGE_NAMES, GpuMemory, per_gpu
from . import widgets
from .plots import plot_plan

__all__ = ["Setting", "GPU_MEMORY", "rows", "table", "plot", "Calculator", "show", "fitting_table",
           "PlannerSetting", "PlannerWidget", "planner_widget"]

GPU_MEMORY = {"40 GB": 40 * GB, "80 GB": 80 * GB, "141 GB": 141 * GB}
_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#C44E52"}
CUSTOM = "custom size"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One calculator setting. ``model``: a preset name, or CUSTOM with ``custom_billions``."""
    model: str = "llama-2-7b"
    custom_billions: float = 7.0
    gpus: int = 4
    stage: int = 3
    recipe: str = "mixed"
    offload_optimizer: bool = False
    offload_params: bool = False
    micro_batch: int = 1
    seq: int = 2048
    attention: str = "flash"
    recompute: str = "none"
    gpu_memory: str = "80 GB"
    trainable: float = 1.0       # the fraction that trains (LoRA: 0.01); frozen weights keep params only

    def __post_init__(self):
        if self.model != CUSTOM and self.model not in PRESETS:
            raise ValueError(f"model must be one of {sorted(PRESETS)} or {CUSTOM!r}, got {self.model!r}")
        check_choice("gpu_memory", self.gpu_memory, GPU_MEMORY, kind="gpu_memory", kinds="gpu_memory values")
        if self.model == CUSTOM and not (isinstance(self.custom_billions, (int, float))
                                         and self.custom_billions > 0):
            raise ValueError(f"the custom size must be a positive number of billions of parameters "
                             f"(e.g. 7 for 7B), got {self.custom_billions!r}")

    @property
    def has_architecture(self) -> bool:
        return self.model != CUSTOM and PRESETS[self.model].config is not None

    def model_arg(self):
        return PRESETS[self.model] if self.model != CUSTOM else self.custom_billions * 1e9

    def label(self) -> str:
        name = self.model if self.model != CUSTOM else f"{self.custom_billions:g}B custom"
        return f"{name}, {self.gpus} GPU{'s' if self.gpus > 1 else ''}, {self.recipe}"


def rows(s: Setting) -> list[tuple[int, GpuMemory]]:
    """Per-GPU memory for stages 0-3; offload only where the stage allows it (memory.placement)."""
    return [(stage, per_gpu(s.model_arg(), world_size=s.gpus, stage=stage, recipe=s.recipe,
                            micro_batch=s.micro_batch if s.has_architecture else None, seq=s.seq,
                            attention=s.attention, recompute=s.recompute, trainable=s.trainable,
                            offload_optimizer=(s.offload_optimizer or s.offload_params) and stage >= 1,
                            offload_params=s.offload_params and stage == 3))
            for stage in (0, 1, 2, 3)]


def table(setting: Setting) -> str:
    """The per-stage numbers as a fixed-width text table, in GB (1e9 bytes)."""
    cap = GPU_MEMORY[setting.gpu_memory]
    acts = "activations" if setting.has_architecture else "activations (n/a: no architecture)"
    head = (f"{setting.label()}; micro-batch {setting.micro_batch}, seq {setting.seq}, "
            f"{setting.attention} attention, recompute {setting.recompute}"
            + (f", trainable {setting.trainable:g}" if setting.trainable < 1 else ""))
    off = [n for n, on in (("optimizer", setting.offload_optimizer or setting.offload_params),
                           ("params", setting.offload_params)) if on]
    host = bool(off)   # the host's column only when needed: narrow beside a side panel
    lines = [head, f"offload: {', '.join(off) if off else 'none'}; GPU: {setting.gpu_memory}; "
                   f"GB per GPU (1 GB = 1e9 bytes); {acts}",
             f"{'stage':<8}{'params':>9}{'grads':>9}{'optim':>9}{'activ':>9}{'total':>9}"
             + (f"{'on host':>9}" if host else "") + "  fits?"]
    for stage, m in rows(setting):
        mark = "<-" if stage == setting.stage else ""
        lines.append(f"{STAGE_NAMES[stage]:<8}{m.params / GB:9.2f}{m.grads / GB:9.2f}"
                     f"{m.optimizer / GB:9.2f}{m.activations / GB:9.2f}{m.total / GB:9.2f}"
                     + (f"{m.cpu / GB:9.2f}" if host else "")
                     + f"  {'yes' if m.fits(cap) else 'no'} {mark}".rstrip())
    fitting = [STAGE_NAMES[st] for st, m in rows(setting) if m.fits(cap)]
    lines.append(f"fits in {setting.gpu_memory}: {', '.join(fitting) if fitting else 'no stage'}")
    return "\n".join(lines)


def plot(setting: Setting):
    """Stacked bars per stage against the GPU-memory line; the chosen stage is outlined."""
    from matplotlib.figure import Figure
    cap = GPU_MEMORY[setting.gpu_memory]
    data = rows(setting)
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    for i, (stage, m) in enumerate(data):
        bottom = 0.0
        for part in ("params", "grads", "optimizer", "activations"):
            value = getattr(m, part) / GB
            ax.bar(i, value, bottom=bottom, color=_COLORS[part], label=part if i == 0 else None,
                   edgecolor="black" if stage == setting.stage else "none",
                   linewidth=2 if stage == setting.stage else 0)
            bottom += value
        ax.text(i, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(cap / GB, color="black", linestyle="--", linewidth=1)
    ax.text(-0.45, cap / GB, f"{setting.gpu_memory} GPU", ha="left", va="bottom", fontsize=8)
    ax.set_xticks(range(4), [STAGE_NAMES[s] for s, _ in data])
    ax.set_ylabel("GB per GPU")
    ax.set_title(setting.label() + f", micro-batch {setting.micro_batch}, seq {setting.seq}", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


class _Form:
    """ipywidgets ``controls`` (two columns that wrap) over a frozen setting dataclass: a figure and a table out."""
    _label = "<figure>"

    def _start(self):
        import ipywidgets as w
        self.out = w.Output()
        for c in self.controls.values():
            c.observe(self._changed, names="value")
        items = list(self.controls.values())
        self.box = w.VBox([w.HBox([w.VBox(items[:6]), w.VBox(items[6:])],
                                  layout=w.Layout(flex_flow="row wrap")), self.out])
        self._render()

    def _dropdown(self, w, style):
        return lambda key, options, label: w.Dropdown(options=options, value=getattr(self.setting, key),
                                                      description=label, style=style)

    def _changed(self, _):
        if "custom_billions" in self.controls:      # the calculator: a size to type only for CUSTOM
            self.controls["custom_billions"].disabled = self.controls["model"].value != CUSTOM
        try:
            self.setting = type(self.setting)(**{k: c.value for k, c in self.controls.items()})
        except (ValueError, TypeError) as exc:
            self.out.outputs = (_stream(f"Change the inputs: {exc}\n"),)
            return
        self._render()

    def _render(self):
        # Set directly (never `with out: print`), so nothing leaks into the cell's saved output.
        self.out.outputs = (
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": widgets.png_b64(self._figure()), "text/plain": self._label}},
            _stream(self._text() + "\n"),
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return widgets.bundle(self.box, f"{widgets.LIVE_NOTE}\n{self._text()}",
                              {"image/png": widgets.static_png(self._figure(), self._text())})


class Calculator(_Form):
    """The calculator widget; display it in a notebook (or call :func:`show`)."""
    _label = "<calculator figure>"

    def __init__(self, setting: Setting | None = None):
        import ipywidgets as w
        self.setting = s = setting or Setting()
        style = {"description_width": "120px"}
        dd = self._dropdown(w, style)
        self.controls = {
            "model": dd("model", list(PRESETS) + [CUSTOM], "model"),
            # A plain FloatText: a bounded one would turn 0 or -3 into its minimum silently.
            "custom_billions": w.FloatText(value=s.custom_billions, step=0.5, disabled=s.model != CUSTOM,
                                           description="custom (billions)", style=style),
            "gpus": dd("gpus", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], "GPUs"),
            "stage": w.ToggleButtons(options=[(STAGE_NAMES[i], i) for i in range(4)], value=s.stage,
                                     description="stage", style={**style, "button_width": "80px"}),
            "recipe": dd("recipe", ["mixed", "mixed-fp32-grads", "fp32"], "recipe"),
            **{k: w.Checkbox(value=getattr(s, k), description=d, indent=False, layout=w.Layout(width="auto"))
               for k, d in (("offload_optimizer", "offload optimizer to CPU"),
                            ("offload_params", "offload params to CPU (ZeRO-3)"))},
            "micro_batch": w.IntSlider(value=s.micro_batch, min=1, max=64, description="micro-batch", style=style),
            "seq": dd("seq", [512, 1024, 2048, 4096, 8192, 16384], "sequence length"),
            "attention": dd("attention", ["standard", "flash"], "attention"),
            "recompute": dd("recompute", ["none", "selective", "torchtitan", "full"], "recomputation"),
            "trainable": dd("trainable", [1.0, 0.1, 0.01], "trainable fraction"),
            "gpu_memory": w.ToggleButtons(options=list(GPU_MEMORY), value=s.gpu_memory,
                                          description="GPU memory", style={**style, "button_width": "80px"}),
        }
        self._start()

    def _figure(self):
        return plot(self.setting)

    def _text(self) -> str:
        return table(self.setting)


def show(setting: Setting | None = None):
    """Display the calculator."""
    from IPython.display import display
    display(Calculator(setting))


_GPU_MEM = {"24 GB": 24.0, "40 GB": 40.0, "80 GB": 80.0, "141 GB": 141.0}


@dataclasses.dataclass(frozen=True)
class PlannerSetting:
    """The widget's inputs (a subset of :func:`plan`'s arguments)."""
    model: str = "llama-2-13b"
    gpu_memory: str = "80 GB"
    gpus_per_node: int = 8
    nodes: int = 2
    intra_bw_gbps: float = 450.0
    inter_bw_gbps: float = 50.0          # per network card (NIC)
    nics_per_node: int = 0               # 0: one NIC per GPU
    seq_len: int = 4096
    global_batch: int = 128
    recipe: str = "mixed"
    mfu: float = 0.4
    overlap: float = 0.0
    trainable: float = 1.0               # the fraction that trains (LoRA: ~0.01)

    def __post_init__(self):
        if self.model not in PRESETS or PRESETS[self.model].config is None:
            usable = sorted(k for k, p in PRESETS.items() if p.config is not None)
            raise ValueError(f"model must be one of {usable}, got {self.model!r}")
        check_choice("gpu_memory", self.gpu_memory, _GPU_MEM, kind="gpu_memory", kinds="gpu_memory values")
        world = self.gpus_per_node * self.nodes
        if self.global_batch % world:
            raise ValueError(f"global batch {self.global_batch} is not a multiple of the "
                             f"{world} GPUs: change the global batch or the GPUs")

    def plan(self) -> planner.Plan:
        return planner.plan(self.model, gpu_mem_gb=_GPU_MEM[self.gpu_memory], gpus_per_node=self.gpus_per_node,
                    nodes=self.nodes, intra_bw_gbps=self.intra_bw_gbps, inter_bw_gbps=self.inter_bw_gbps,
                    nics_per_node=self.nics_per_node or None,
                    seq_len=self.seq_len, global_batch=self.global_batch, recipe=self.recipe,
                    mfu=self.mfu, overlap=self.overlap, trainable=self.trainable)

    def text(self) -> str:
        rows = self.plan()
        return fitting_table(rows, assumptions=False) + "\nrecommendation: " + planner.recommend(rows).reason


def fitting_table(rows: planner.Plan, top: int = 5, *, assumptions: bool = True) -> str:
    """:func:`planner.table` of the ``top`` fastest options that fit (the smallest if none does);
    ``assumptions=False``: one line of the inputs the planner widget sets instead of every assumption."""
    if not isinstance(rows, planner.Plan):
        raise TypeError("fitting_table() takes the Plan returned by planner.plan(...)")
    check_int("top", top, 1)
    fitting = sorted((r for r in rows if r.fits), key=lambda r: r.step_s)
    shown = fitting[:top] or sorted(rows, key=lambda r: r.total)[:1]
    what = ((f"the {len(shown)} fastest" if len(fitting) > len(shown) else "all") + ", fastest first"
            if fitting else "the smallest option")
    text = planner.table(planner.Plan(shown, rows.assumptions)).split("\n")
    note = f"{len(fitting)} of {len(rows)} options fit; shown: {what} (the plot shows every option)"
    if not assumptions:
        a = rows.assumptions
        text = text[:text.index("assumptions:")] + [
            f"inputs: {a.nics_per_node} NIC(s) of {a.inter_bw_gbps:g} GB/s per node, {a.intra_bw_gbps:g} GB/s "
            f"inside a node, MFU {a.mfu:g}, overlap {a.overlap:.0%}"
            + (f", {a.global_batch} sequences per step" if a.global_batch is not None else "")
            + (f", trainable {a.trainable:g}" if a.trainable < 1 else "")
            + ("; HSDP rows left out: on one node HSDP is ZeRO-3" if a.nodes == 1 else "")
            + "; every assumption: plan(...).assumptions.lines(), printed in appendix 11"]
    return "\n".join(text[:1] + [note] + text[1:])


class PlannerWidget(_Form):
    """The planner as a form: sliders and dropdowns in, a table and a bar plot out."""
    _label = "<planner figure>"

    def __init__(self, setting: PlannerSetting | None = None):
        import ipywidgets as w
        if setting is not None and not isinstance(setting, PlannerSetting):
            raise TypeError("setting must be a PlannerSetting")
        self.setting = s = setting or PlannerSetting()
        style = {"description_width": "130px"}
        dd = self._dropdown(w, style)
        self.controls = {
            "model": dd("model", [k for k, p in PRESETS.items() if p.config is not None], "model"),
            "gpu_memory": w.ToggleButtons(options=list(_GPU_MEM), value=s.gpu_memory,
                                          description="GPU memory", style={**style, "button_width": "70px"}),
            "gpus_per_node": dd("gpus_per_node", [1, 2, 4, 8], "GPUs per node"),
            "nodes": w.IntSlider(value=s.nodes, min=1, max=64, description="nodes", style=style),
            "intra_bw_gbps": w.FloatSlider(value=s.intra_bw_gbps, min=10, max=900, step=10,
                                           description="intra-node GB/s", style=style),
            "inter_bw_gbps": w.FloatSlider(value=s.inter_bw_gbps, min=1, max=100, step=1,
                                           description="GB/s per NIC", style=style),
            "nics_per_node": dd("nics_per_node", [("one per GPU", 0)] + [(str(k), k) for k in (1, 2, 4, 8, 16)],
                                "NICs per node"),
            "seq_len": dd("seq_len", [512, 1024, 2048, 4096, 8192], "sequence length"),
            "global_batch": w.IntText(value=s.global_batch, description="global batch", style=style),
            "recipe": dd("recipe", list(RECIPES), "recipe"),
            "mfu": w.FloatSlider(value=s.mfu, min=0.1, max=0.8, step=0.05, description="MFU", style=style),
            "overlap": w.FloatSlider(value=s.overlap, min=0.0, max=1.0, step=0.1,
                                     description="comm overlap", style=style),
            "trainable": dd("trainable", [1.0, 0.1, 0.01], "trainable fraction"),
        }
        self._start()

    def _figure(self):
        return plot_plan(self.setting.plan())

    def _text(self) -> str:
        return self.setting.text()


def planner_widget(setting: PlannerSetting | None = None, **fields) -> PlannerWidget:
    """The planner widget; ``planner_widget(model="llama-2-70b", nodes=4)`` starts there."""
    if setting is not None and fields:
        raise TypeError("pass either a PlannerSetting or field values, not both")
    return PlannerWidget(setting or PlannerSetting(**fields))
