"""Displaying an ipywidgets form on Colab's ipywidgets 7.7 and JupyterLab 4's ipywidgets 8.

A course widget owns an ipywidgets box and shows, next to the live form, a static form
(text, maybe a PNG) for untrusted notebooks, GitHub, nbval and the offline book.
ipywidgets 7 has no ``_repr_mimebundle_`` (its ``_ipython_display_`` would drop the static
form): :func:`bundle` builds the same mime bundle on both.
"""
from __future__ import annotations

import base64
import io
import textwrap

__all__ = ["VIEW_MIME", "SUPPORTED_IPYWIDGETS", "LIVE_NOTE", "bundle", "ipywidgets_major", "png_b64", "static_png"]

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: The ipywidgets versions the course's widgets are written for (pyproject.toml says the same).
SUPPORTED_IPYWIDGETS = ">=7.7,<9"
#: the width of a character of 8-pt monospace, inches
CHAR_IN = 0.066
#: What a saved (static) form says under its picture, where the live controls cannot render.
LIVE_NOTE = "Saved picture of one setting: run this cell (JupyterLab or Colab) for live controls."


def ipywidgets_major() -> int:
    import ipywidgets
    return int(ipywidgets.__version__.split(".")[0])


def bundle(box, text: str, static: dict | None = None) -> dict:
    """``box`` live (None: no ipywidgets) and ``text`` plus ``static`` (mime -> data) where widgets cannot render."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out: dict = {}
    if box is not None:
        if hasattr(box, "_repr_mimebundle_"):          # ipywidgets >= 8
            got = box._repr_mimebundle_()
            out.update(got[0] if isinstance(got, tuple) else got)
        elif getattr(box, "_view_name", None) is not None:   # ipywidgets 7
            out[VIEW_MIME] = {"version_major": 2, "version_minor": 0,
                              "model_id": box._model_id}
            box._handle_displayed()                    # what 7's _ipython_display_ does after
    out.update(static or {})
    out["text/plain"] = text
    return out


def png_b64(fig) -> str:
    """A matplotlib figure as base64 PNG at 80 dpi, for a widget's static form."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return base64.b64encode(buf.getvalue()).decode()


def static_png(fig, text: str = "") -> str:
    """``fig`` with ``text`` (a table, monospace) and :data:`LIVE_NOTE` under it, as base64 PNG:
    the static form a saved notebook shows where the widget cannot render."""
    import matplotlib.pyplot as plt

    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    image = plt.imread(io.BytesIO(base64.b64decode(png_b64(fig))))
    plt.close(fig)
    height, width = image.shape[0] / 80, image.shape[1] / 80           # inches at 80 dpi
    fits = max(int(width / CHAR_IN), 100)      # a longer line (a sentence, not a table row) is wrapped
    lines = [part for t in [*text.splitlines(), "", LIVE_NOTE]
             for part in (textwrap.wrap(t, fits, subsequent_indent="    ") if len(t) > fits else [t])]
    line = 0.15
    width = max(width, CHAR_IN * max(len(t) for t in lines))
    out = plt.figure(figsize=(width, height + line * (len(lines) + 1)))
    top = height / (height + line * (len(lines) + 1))
    ax = out.add_axes((0, 1 - top, image.shape[1] / 80 / width, top))
    ax.imshow(image)
    ax.set_axis_off()
    for i, t in enumerate(lines):
        out.text(0.01, 1 - top - line * (i + 1) / out.get_figheight(), t, family="monospace", fontsize=8,
                 va="top", style="italic" if t == LIVE_NOTE else "normal")
    encoded = png_b64(out)
    plt.close(out)
    return encoded
