"""The torchrun commands the README documents actually run, and the make targets of scripts/."""
import os
import re
import subprocess
import sys

from course_utils.course.badges import ROOT


def test_hello_ranks_under_torchrun():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "scripts" / "hello_ranks.py")],
        capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("all-reduced 3, expected 3") == 2, out.stdout
    assert "rank 0 of 2" in out.stdout and "rank 1 of 2" in out.stdout


def test_make_gpu_check_runs_the_script_with_the_gpus_visible():
    """`make gpu-check` is scripts/gpu_check.py with the venv's python, GPUs not hidden
    (its no-GPU run is tested in test_gpu_check.py)."""
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE).group(1).split()
    assert "gpu-check" in phony
    recipe = re.search(r"^gpu-check:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "no gpu-check target in the Makefile"
    assert recipe.group(1).strip() == "$(PY) scripts/gpu_check.py"
    assert "CUDA_VISIBLE_DEVICES" not in recipe.group(1)
