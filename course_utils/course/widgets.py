"""Displaying an ipywidgets form on Colab's ipywidgets 7.7 and JupyterLab 4's ipywidgets 8.

A course widget owns an ipywidgets box and shows, next to the live form, a static form
(text, maybe a PNG) for untrusted notebooks, GitHub, nbval and the offline book.
ipywidgets 7 has no ``_repr_mimebundle_`` (its ``_ipython_display_`` would drop the static
form): :func:`bundle` builds the same mime bundle on both.
"""
from __future__ import annotations

import base64
import io

__all__ = ["VIEW_MIME", "SUPPORTED_IPYWIDGETS", "bundle", "ipywidgets_major", "png_b64"]

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: The ipywidgets versions the course's widgets are written for (pyproject.toml says the same).
SUPPORTED_IPYWIDGETS = ">=7.7,<9"


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
