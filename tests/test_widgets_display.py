"""Every interactive element the notebooks display, through IPython's display pipeline,
on whichever widget stack is installed: ipywidgets 8 (the main venv, JupyterLab 4) and
Colab's (ipywidgets 7.7, IPython 7.34, ipykernel 6.17: `make test-widgets`).

Each element must show a live widget view (the model id of a widget that exists) and its
static text, then answer a learner's clicks and inputs, in Python. With
COURSE_EXPECT_IPYWIDGETS=7 (set by `make test-widgets`) the installed major version must
be 7, and with COURSE_EXPECT_COLAB_PINS=1 the widget stack must be Colab's pins, so the
Colab run cannot silently test ipywidgets 8. tests/colab/colab-pins.txt is checked here.
"""
import json
import os
import re
import warnings
from importlib import metadata
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from course_utils.course import calculator, quiz
from course_utils.course.questions import MultiChoice, Numeric, SingleChoice
from course_utils.course.quizbank import QUIZZES
from course_utils.course import ring_view
from course_utils.impl import ring
from course_utils.course.widgets import LIVE_NOTE, SUPPORTED_IPYWIDGETS, VIEW_MIME, ipywidgets_major

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "colab" / "colab-pins.txt"
#: What `make test-widgets` takes from the pins file: the widget and kernel stack.
WIDGET_STACK = ("ipywidgets", "ipython", "ipykernel", "jupyter_client", "traitlets",
                "widgetsnbextension", "matplotlib", "numpy", "cloudpickle")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict:
    out = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"colab-pins.txt: {line!r} is not name==version"
            out[_norm(name)] = version
    return out


@pytest.fixture(scope="module")
def shell():
    return InteractiveShell.instance()


def _live(model_id: str):
    """The widget whose view a bundle references (None if no such widget exists)."""
    from ipywidgets.widgets import widget as wmod

    registry = getattr(wmod, "_instances", None)     # ipywidgets 8
    if registry is None:
        registry = wmod.Widget.widgets               # ipywidgets 7
    return registry.get(model_id)


def _shown(bundle: dict, text: str):
    """Check one displayed bundle: a live widget's view and the static text; return the widget."""
    assert VIEW_MIME in bundle, sorted(bundle)
    box = _live(bundle[VIEW_MIME]["model_id"])
    assert box is not None, "the view references no live widget"
    assert bundle["text/plain"] == text
    return box


def _displayed(shell, code: str) -> list[dict]:
    """Run ``code`` as a cell would: what it display()s, then its value as an execute_result."""
    with capture_output() as cap:
        result = shell.run_cell(code, store_history=False)
    result.raise_error()
    bundles = [dict(o.data) for o in cap.outputs]
    if result.result is not None:
        bundles.append(shell.display_formatter.format(result.result)[0])
    return bundles


# ----------------------------------------------------------------- the installed stack

def test_the_installed_widget_stack_is_a_supported_one_and_the_expected_one():
    """Always: the installed ipywidgets is in the supported range. Under make test-widgets
    and test-colab (COURSE_EXPECT_IPYWIDGETS=7, COURSE_EXPECT_COLAB_PINS=1) also: it is the
    major asked for, and the whole widget stack is Colab's pins, so neither venv can
    silently test another stack."""
    assert Version(metadata.version("ipywidgets")) in SpecifierSet(SUPPORTED_IPYWIDGETS)
    want = os.environ.get("COURSE_EXPECT_IPYWIDGETS")
    if want:
        assert ipywidgets_major() == int(want), metadata.version("ipywidgets")
    if os.environ.get("COURSE_EXPECT_COLAB_PINS"):
        pins = _pins()
        wrong = {n: (metadata.version(n), pins[_norm(n)]) for n in WIDGET_STACK
                 if metadata.version(n) != pins[_norm(n)]}
        assert not wrong, f"installed vs Colab's pin: {wrong}"


def test_colab_pins_file_names_its_source_and_pins_the_widget_stack():
    text = PINS.read_text()
    assert re.search(r"github\.com/googlecolab/backend-info/blob/[0-9a-f]{40}/pip-freeze\.txt", text)
    assert re.search(r"^# python_version == 3\.\d+", text, re.MULTILINE)
    pins = _pins()
    for name in WIDGET_STACK + ("torch", "notebook", "nbformat", "jupyter_core", "pyzmq", "tornado", "pytest"):
        assert _norm(name) in pins, name
    from course_utils.runtime.compat import MIN_TORCH

    assert Version(pins["ipywidgets"]) in SpecifierSet(SUPPORTED_IPYWIDGETS)
    assert Version(pins["torch"]).release[:2] >= MIN_TORCH


def test_the_widget_venv_takes_this_stack_and_the_main_venvs_torch():
    makefile = (ROOT / "Makefile").read_text()
    stack = re.search(r"^WIDGETS_STACK := ((?:.*\\\n)*.*)$", makefile, re.MULTILINE)
    assert stack and set(stack[1].replace("\\", " ").split()) == set(WIDGET_STACK)
    spec = re.search(r"^WIDGETS_TORCH \?= (\S+)$", makefile, re.MULTILINE)
    script = (ROOT / "scripts" / "install_torch.py").read_text()
    assert spec and f'DEFAULT_SPEC = "{spec[1]}"' in script


def test_declared_ipywidgets_range_is_the_supported_one():
    pyproject = (ROOT / "pyproject.toml").read_text()
    env = (ROOT / "environment.yml").read_text()
    assert f'"ipywidgets{SUPPORTED_IPYWIDGETS}"' in pyproject
    assert re.search(rf"^\s*- ipywidgets{re.escape(SUPPORTED_IPYWIDGETS)}\s*$", env, re.MULTILINE)


def test_widgets_are_built_without_warnings_so_no_argument_is_silently_ignored():
    """traitlets drops a keyword a widget does not have (an ipywidgets-8-only one on 7) with
    only a DeprecationWarning: building every course widget must warn about nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for key in sorted(QUIZZES):
            quiz.get(key).widget()
        calculator.Calculator()
        calculator.planner_widget(model="llama-2-13b", gpu_memory="40 GB", gpus_per_node=8, nodes=2)
        ring_view.ring_step_widget(4)
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if re.search(r"ipywidgets|traitlets|course_utils", f"{w.filename} {w.message}")]
    assert not ours


# ------------------------------------------------ every widget cell of the notebooks

def _widget_cells():
    """(notebook, cell index, source) of every code cell saved with a widget view."""
    out = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for i, cell in enumerate(cells):
            if any(VIEW_MIME in o.get("data", {}) for o in cell.get("outputs", [])):
                out.append((path.name[:2], i, "".join(cell["source"])))
    return out


WIDGET_CELLS = _widget_cells()


def _static_text(source: str) -> str:
    """The static text a widget cell must show (nbval compares it with the saved output)."""
    call = source.strip().splitlines()[-1]
    if m := re.fullmatch(r'quiz\.show\("(\d\d)"\)', call):
        return quiz.get(m[1]).text()
    note = LIVE_NOTE + "\n"          # a picture's static form says that running the cell gives live controls
    if call == "calculator.show()":
        return note + calculator.table(calculator.Setting())
    if call == "ring_view.ring_step_widget(4)":
        return note + ring.describe_ring(ring.ring_all_reduce_steps(4))
    if m := re.fullmatch(r"calculator\.planner_widget\((.*)\)", call):
        return note + eval(f"calculator.PlannerSetting({m[1]})").text()      # the cell's own arguments
    raise AssertionError(f"a widget cell this module does not know: {source!r}")


def test_every_quiz_and_widget_of_the_notebooks_is_a_widget_cell():
    calls = [src.strip().splitlines()[-1] for _, _, src in WIDGET_CELLS]
    assert sorted(c for c in calls if c.startswith("quiz.show")) == [f'quiz.show("{k}")' for k in sorted(QUIZZES)]
    assert {"calculator.show()", "ring_view.ring_step_widget(4)"} <= set(calls)
    assert any(c.startswith("calculator.planner_widget(") for c in calls)


@pytest.mark.parametrize("nb, index, source", WIDGET_CELLS, ids=[f"{c[0]}-cell{c[1]}" for c in WIDGET_CELLS])
def test_notebook_widget_cell_displays_a_live_view_and_its_text(shell, nb, index, source):
    shell.run_cell("from course_utils.course import calculator, quiz, ring_view",
                   store_history=False).raise_error()
    bundles = _displayed(shell, source)
    assert len(bundles) == 1, bundles
    _shown(bundles[0], _static_text(source))


# ----------------------------------------------------------- a learner's interactions

def _click(row, value):
    """Answer one quiz row (label, field, HBox([Check]), feedback) and return the feedback."""
    field, button, feedback = row.children[1], row.children[2].children[0], row.children[3]
    if hasattr(field, "children"):                       # MultiChoice: one Checkbox per option
        for box, letter in zip(field.children, "abcdefghijklmnopqrstuvwxyz"):
            box.value = letter in value
    else:
        field.value = value
    button.click()
    return feedback.value


@pytest.mark.parametrize("key", sorted(QUIZZES))
def test_quiz_form_answers_wrong_right_and_malformed_input(shell, key):
    with capture_output() as cap:
        quiz.show(key)
    assert len(cap.outputs) == 1
    q = quiz.get(key)
    box = _shown(dict(cap.outputs[0].data), q.text())
    score, rows = box.children[1], box.children[2:]
    assert len(rows) == len(q)
    for row, question in zip(rows, q.questions):
        if isinstance(question, Numeric):
            assert "Try again" in _click(row, "banana")
            wrong, right = str(question.answer * 2 + 10), repr(question.answer)
        elif isinstance(question, SingleChoice):
            right = next(iter(question.answer))
            wrong = next(c for c in question.letters if c not in question.answer)
        else:
            assert isinstance(question, MultiChoice)
            right = "".join(sorted(question.answer))
            wrong = next(c for c in question.letters if c not in question.answer)
        assert "Not quite" in _click(row, wrong)
        assert "Correct" in _click(row, right)
    assert f"Score: {len(q)} / {len(q)} correct ({len(q)} answered)" in score.value


def test_calculator_redraws_when_a_control_changes(shell):
    with capture_output() as cap:
        calculator.show()
    box = _shown(dict(cap.outputs[0].data), f"{LIVE_NOTE}\n{calculator.table(calculator.Setting())}")
    (columns, out) = box.children
    controls = {c.description: c for col in columns.children for c in col.children}
    before = out.outputs[1]["text"]
    controls["GPUs"].value = 64
    after = out.outputs[1]["text"]
    assert after != before and "64 GPUs" in after and out.outputs[0]["data"]["image/png"]
    controls["custom (billions)"].value = -3
    controls["model"].value = calculator.CUSTOM
    assert "Change the inputs" in out.outputs[0]["text"]


def test_planner_widget_replans_when_a_control_changes(shell):
    bundles = _displayed(shell, 'calculator.planner_widget(model="llama-2-13b", gpu_memory="40 GB", '
                                'gpus_per_node=8, nodes=2)')
    setting = calculator.PlannerSetting(model="llama-2-13b", gpu_memory="40 GB", gpus_per_node=8, nodes=2)
    box = _shown(bundles[0], f"{LIVE_NOTE}\n{setting.text()}")
    (columns, out) = box.children
    controls = {c.description: c for col in columns.children for c in col.children}
    controls["nodes"].value = 4
    assert out.outputs[1]["text"] == calculator.PlannerSetting(
        model="llama-2-13b", gpu_memory="40 GB", gpus_per_node=8, nodes=4).text() + "\n"
    controls["global batch"].value = 100                 # not a multiple of 32 GPUs
    assert "Change the inputs" in out.outputs[0]["text"]


def test_ring_slider_steps_through_the_all_reduce(shell):
    bundles = _displayed(shell, "ring_view.ring_step_widget(4)")
    steps = ring.ring_all_reduce_steps(4)
    box = _shown(bundles[0], f"{LIVE_NOTE}\n{ring.describe_ring(steps)}")
    slider, out = box.children
    assert out.outputs[1]["text"] == ring.describe_step(steps[0]) + "\n"
    slider.value = slider.max
    assert out.outputs[1]["text"] == ring.describe_step(steps[-1]) + "\n"
    assert out.outputs[0]["data"]["text/plain"] == f"<ring step {len(steps)}>"
