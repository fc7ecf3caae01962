"""GPU detection before ranks are launched never initialises CUDA in the parent.

``torch.cuda.is_available()`` asks the CUDA runtime, which initialises the CUDA driver in
the calling process; a rank forked after that cannot use the GPU. The course counts GPUs
with ``course_utils.runtime.launch.gpu_count()`` (``torch.cuda.device_count()``: NVML first). These
tests hold on a CPU-only machine too: ``is_available`` and CUDA's initialisation are
replaced by functions that raise, so any detection path that reached them fails.
"""
import ast
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import course_utils.runtime.launch as L
from course_utils.runtime import env
from course_utils.course.badges import ROOT

_FORBID_CUDA = """
import torch

def forbidden(*args, **kwargs):
    raise AssertionError("GPU detection called torch.cuda.is_available() or initialised CUDA")

torch.cuda.is_available = forbidden
torch.cuda.init = forbidden
torch.cuda._lazy_init = forbidden
"""


def _run(body: str) -> subprocess.CompletedProcess:
    code = _FORBID_CUDA + body
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("gpus", [None, 0, 2], ids=["this machine", "no GPU", "two GPUs"])
def test_detection_leaves_cuda_uninitialised(gpus):
    """Every function that runs in the parent before ranks are launched, in a fresh
    interpreter: CUDA is still uninitialised afterwards, and the launcher would fork."""
    patch = "" if gpus is None else f"torch.cuda.device_count = lambda: {gpus}"
    out = _run(patch + textwrap.dedent("""
        from course_utils.runtime import env
        from course_utils.runtime import launch
        from course_utils.harness import precision
        from course_utils.harness import train_cli  # importing must not touch CUDA
        n = launch.gpu_count()
        launch.resolve_backend(1)
        launch.resolve_backend(2, "gloo")
        names = env.gpu_names()
        env.detect()
        env.plan((1, 2, 4))
        env.table((1, 2))
        assert len(names) == n, (names, n)
        print("gpus", n, "initialised", torch.cuda.is_initialized(),
              "start", launch.choose_start_method())
    """))
    assert out.returncode == 0, out.stderr[-3000:]
    expected = torch.cuda.device_count() if gpus is None else gpus
    assert out.stdout.split() == ["gpus", str(expected), "initialised", "False", "start", "fork"]


def test_resolve_backend_counts_gpus_without_is_available(monkeypatch):
    def forbidden():
        raise AssertionError("resolve_backend called torch.cuda.is_available()")

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", forbidden)
    assert L.gpu_count() == 2
    assert L.resolve_backend(2) == "nccl"
    assert L.resolve_backend(2, "nccl") == "nccl"
    assert L.resolve_backend(3) == "gloo"
    with pytest.raises(ValueError, match="one GPU per rank: 3 ranks but 2 GPU"):
        L.resolve_backend(3, "nccl")
    assert env.plan((1, 2, 4)) == [(1, "nccl"), (2, "nccl"), (4, "gloo")]
    assert len(env.gpu_names()) == 2
    assert not torch.cuda.is_initialized()


def _is_available_calls(path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "is_available" and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "cuda"]


def test_no_code_of_the_course_calls_cuda_is_available():
    """One detection, launch.gpu_count(): no module, script or notebook cell asks
    torch.cuda.is_available()."""
    files = sorted((ROOT / "course_utils").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    assert files
    found = {str(p.relative_to(ROOT)): lines for p in files if (lines := _is_available_calls(p))}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):    # the learner's cells too
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        found.update({f"{nb.name} cell {i}": "is_available" for i, c in enumerate(cells)
                      if c["cell_type"] == "code" and "cuda.is_available(" in "".join(c["source"])})
    assert found == {}, f"use course_utils.runtime.launch.gpu_count() instead, at {found}"
