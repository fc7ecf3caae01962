"""Notebook hygiene: skeleton, executed in order, no errors (nbval compares outputs)."""
import json

import pytest

from course_utils.course.badges import notebook_paths
from course_utils.course.paths import APPENDICES

NOTEBOOKS = notebook_paths()
SKELETON = ["You will learn", "Prerequisites", "Runs in", "## Summary", "## Quiz", "Exercise",
            "## Further reading"]


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_skeleton(path):
    nb = _load(path)
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for heading in SKELETON:
        assert heading in markdown, f"{path.name}: missing '{heading}'"
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert '"google.colab" in sys.modules' in "".join(first_code["source"])
    if path.name not in APPENDICES:               # an optional appendix has no quiz
        assert "quiz.show(" in "".join("".join(c["source"]) for c in nb["cells"])
    assert "check_" in "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_with_the_kernelspec_jupyterlab_writes(path):
    """ipykernel's own kernel.json names itself "Python 3 (ipykernel)": a notebook saved with anything
    else opens marked as modified in JupyterLab, and saving it leaves a git diff."""
    from jupyter_client.kernelspec import KernelSpecManager
    written = KernelSpecManager().get_kernel_spec("python3")
    assert _load(path)["metadata"]["kernelspec"] == {"display_name": written.display_name,
                                                     "language": written.language, "name": "python3"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_fully_executed_in_order_without_errors(path):
    cells = [c for c in _load(path)["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in cells]
    assert None not in counts, f"{path.name}: code cells never executed"
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not run top to bottom in one kernel"
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name}: saved with errors"
    with_output = sum(1 for c in cells if c["outputs"])
    assert with_output >= 0.8 * len(cells), f"{path.name}: most code cells should show something"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ignored_outputs_are_rare(path):
    cells = [c for c in _load(path)["cells"] if c["cell_type"] == "code"]
    ignored = [c for c in cells if "nbval-ignore-output" in c["metadata"].get("tags", [])
               or "nbval-skip" in c["metadata"].get("tags", [])]
    assert len(ignored) <= max(3, len(cells) // 8), f"{path.name}: too many cells escape nbval"


def test_portability_kernel_really_runs_on_four_threads(tmp_path):
    """`make test-portable`'s second setting: torch caps OMP_NUM_THREADS at the core count,
    so an IPython startup file sets the kernel's threads; check that it does."""
    import os
    import shutil
    import subprocess
    import sys

    from course_utils.course.badges import ROOT

    ipython_dir = tmp_path / "ipython"            # a copy: IPython writes its state there
    shutil.copytree(ROOT / "tests" / "ipython_threads", ipython_dir)
    env = dict(os.environ, IPYTHONDIR=str(ipython_dir), COURSE_TEST_THREADS="4")
    out = subprocess.run([sys.executable, "-m", "IPython", "--quick", "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "4"
