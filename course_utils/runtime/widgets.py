"""Displaying an ipywidgets form on both widget stacks learners open: Colab's
(ipywidgets 7.7, IPython 7.34, ipykernel 6.17) and JupyterLab 4's (ipywidgets 8).

A course widget (a quiz, the calculator, the ring stepper) is an object that owns an
ipywidgets box and shows, next to the live form, a static form that any frontend can
draw without a kernel: text, and where useful a PNG or sanitisable HTML. That static form
is what an untrusted notebook, GitHub, nbval and the offline book show.

ipywidgets 8 gives a widget ``_repr_mimebundle_``; ipywidgets 7 has none and displays
through ``_ipython_display_``, which would drop the static form. :func:`bundle` builds
the same mime bundle on both: the widget's view reference plus the static form.
"""
from __future__ import annotations

__all__ = ["VIEW_MIME", "SUPPORTED_IPYWIDGETS", "bundle", "ipywidgets_major"]

VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: The ipywidgets versions the course's widgets are written for (pyproject.toml says the same).
SUPPORTED_IPYWIDGETS = ">=7.7,<9"


def ipywidgets_major() -> int:
    """The installed ipywidgets' major version (7 or 8)."""
    import ipywidgets

    return int(ipywidgets.__version__.split(".")[0])


def bundle(box, text: str, static: dict | None = None) -> dict:
    """The mime bundle that shows ``box`` live and ``text`` (plus ``static``: mime type →
    data, e.g. ``{"image/png": b64}``) wherever widgets cannot render.

    ``box`` is an ipywidgets widget, or None where ipywidgets is missing (then only the
    static form is returned).
    """
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
