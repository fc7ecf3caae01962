"""The torchrun commands the README documents actually run."""
import os
import subprocess
import sys

from course_utils.badges import ROOT


def test_hello_ranks_under_torchrun():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "scripts" / "hello_ranks.py")],
        capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("all-reduced 3, expected 3") == 2, out.stdout
    assert "rank 0 of 2" in out.stdout and "rank 1 of 2" in out.stdout
