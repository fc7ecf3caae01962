"""A helper that returns a matplotlib Figure shows it only as a cell's last expression (or inside
``display``): anywhere else the figure is built and dropped, and the learner reads prose about a plot
that never appeared. Every notebook cell that calls one must show it, and its committed outputs hold
the image."""
import ast
import inspect
import json
from pathlib import Path

import pytest

from course_utils.course import plots
from course_utils.labs import clock

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# every public plotting helper of the course that returns its Figure rather than calling plt.show()
RETURNS_A_FIGURE = {name for mod in (plots, clock) for name, fn in inspect.getmembers(mod, inspect.isfunction)
                    if name.startswith("plot_") and fn.__module__ == mod.__name__ and "return fig" in inspect.getsource(fn)}


def _python(source: str) -> str:
    """The cell without IPython magics, which ast cannot parse."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _called(node) -> str | None:
    f = node.func if isinstance(node, ast.Call) else None
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def test_the_helpers_are_found():
    assert {"plot_choices", "plot_steps", "plot_plan", "plot_crossover"} <= RETURNS_A_FIGURE


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_a_helper_returns_is_shown(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for cell in cells:
        source = "".join(cell["source"])
        try:
            body = ast.parse(_python(source)).body
        except SyntaxError:
            continue
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.Expr) and _called(stmt.value) in RETURNS_A_FIGURE:
                assert i == len(body) - 1, (f"{path.name}: `{ast.unparse(stmt)}` is not the cell's last expression, "
                                            "so its figure is never shown: wrap it in display(...)")
        shown = [s for s in body if isinstance(s, ast.Expr) and (_called(s.value) in RETURNS_A_FIGURE or (
            _called(s.value) == "display" and any(_called(a) in RETURNS_A_FIGURE for a in s.value.args)))]
        if shown and "%%ranks" not in source:
            images = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})]
            assert images, f"{path.name}: the cell calling {ast.unparse(shown[0])} has no figure in its committed outputs"
