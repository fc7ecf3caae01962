"""What a reader sees of every committed notebook before running it: a notebook opened
untrusted (JupyterLab, Jupyter Notebook), GitHub's viewer and the offline book draw a PNG
and text, but not a saved SVG output, and an object's repr tells a reader nothing.

So no saved output may show an object repr (``<IPython.core.display.SVG object>``,
``<... object at 0x...>``), a matplotlib ``<Figure size ...>`` without its image, or an
``image/svg+xml`` output without an ``image/png`` beside it (``figures.show`` displays the
committed PNG for that reason). These check the committed outputs: after changing what a
cell displays, re-execute the notebook (``make outputs NB=..``).
"""
import json
import re

import pytest

from course_utils.course.badges import notebook_paths

NOTEBOOKS = notebook_paths()
_OBJECT_REPR = re.compile(r"<[A-Za-z_][\w.]* object(?: at 0x[0-9a-fA-F]+)?>")
_FIGURE_REPR = re.compile(r"<Figure size [0-9.]+x[0-9.]+ with \d+ Axes>")
_WIDGET_REPR = re.compile(r"^(?:VBox|HBox|Box|Output|Tab|Accordion|GridBox)\(")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def problems(nb: dict) -> list[str]:
    """What a reader of the saved notebook would see wrongly: one line per bad output."""
    found = []
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(code, 1):
        first_line = (_text(cell["source"]).strip().splitlines() or [""])[0]
        where = f"code cell {number} ({first_line[:50]})"
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                if _OBJECT_REPR.search(_text(out["text"])):
                    found.append(f"{where}: prints an object repr")
                continue
            data = out.get("data", {})
            plain = _text(data.get("text/plain", ""))
            drawn = {"image/png", "image/jpeg", "text/html"} & set(data)
            if "image/svg+xml" in data and "image/png" not in data:
                found.append(f"{where}: an SVG output without a PNG (untrusted notebooks and GitHub do not draw it)")
            if _OBJECT_REPR.search(plain):
                found.append(f"{where}: text form is an object repr {_OBJECT_REPR.search(plain).group(0)}")
            if _FIGURE_REPR.search(plain) and "image/png" not in data:
                found.append(f"{where}: a matplotlib figure saved as its repr only")
            if _WIDGET_REPR.match(plain) and not drawn:
                found.append(f"{where}: a widget saved without a text form")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_outputs_are_readable_without_a_kernel(path):
    found = problems(json.loads(path.read_text(encoding="utf-8")))
    assert not found, f"{path.name}: re-execute it (make outputs NB={path.name[:2]}):\n" + "\n".join(found)


def _nb(*outputs):
    return {"cells": [{"cell_type": "code", "source": "x", "outputs": list(outputs)}]}


def _display(data):
    return {"output_type": "display_data", "data": data, "metadata": {}}


@pytest.mark.parametrize("output, bad", [
    (_display({"image/svg+xml": "<svg/>", "text/plain": "<IPython.core.display.SVG object>"}), 2),
    (_display({"image/svg+xml": "<svg/>", "image/png": "iVBO", "text/plain": "figure: zero_stages"}), 0),
    (_display({"image/png": "iVBO", "text/plain": "figure: zero_stages"}), 0),
    (_display({"image/png": "iVBO", "text/plain": "<Figure size 640x480 with 1 Axes>"}), 0),
    (_display({"text/plain": "<Figure size 640x480 with 1 Axes>"}), 1),
    (_display({"text/plain": "<__main__.Thing object at 0x7f3a2c>"}), 1),
    ({"output_type": "stream", "name": "stdout", "text": ["<foo.Bar object at 0xdeadbeef>\n"]}, 1),
    ({"output_type": "stream", "name": "stdout", "text": ["step 1: loss 4.48\n"]}, 0),
    (_display({"application/vnd.jupyter.widget-view+json": {}, "text/plain": "VBox(children=(HTML(value=''),))"}), 1),
    (_display({"application/vnd.jupyter.widget-view+json": {}, "text/plain": "Quiz: 00 (6 questions)"}), 0),
])
def test_problems_finds_what_a_reader_cannot_read(output, bad):
    assert len(problems(_nb(output))) == bad
