"""Every script in benchmarks/ runs once, as small as it goes, so none can rot. Their
timings are printed, never asserted (the machine's load decides them)."""
import os
import re
import subprocess
import sys

import pytest

from course_utils.course.badges import ROOT

SMALL = {
    "launch_overhead.py": ["--ranks", "2", "--repeat", "1"],
    "ddp_step_time.py": ["--ranks", "2", "--steps", "2", "--repeat", "1", "--models", "course"],
    "zero3_step_time.py": ["--ranks", "2", "--steps", "2", "--repeat", "1", "--models", "course"],
    "clock_peers.py": ["--steps", "2", "--repeat", "1"],
}


def test_every_benchmark_is_listed_here():
    assert sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")) == sorted(SMALL)


@pytest.mark.parametrize("script", sorted(SMALL))
def test_the_benchmark_runs(script):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("COURSE_START_METHOD", None)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *SMALL[script]],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    if script == "launch_overhead.py":          # every start method, first launch and median
        for method in ("fork", "forkserver", "spawn"):
            assert re.search(rf"^ *{method}: first \d+\.\d+ s; then median \d+\.\d+ s", out.stdout, re.M), out.stdout
        assert "forkserver / fork, median after the first:" in out.stdout
    if script == "ddp_step_time.py":            # the ratio against torch, with its goal
        assert re.search(r"ratio \d+\.\d+x \((within|OVER) 1\.2x\)", out.stdout), out.stdout
    if script == "clock_peers.py":              # both pairs, their ratios and hidden shares, with goals
        for pair in ("DDP: course DDP / torch DDP", "ZeRO-3: course Zero3 / torch FSDP2"):
            assert re.search(rf"{pair} on the clock: \d+\.\d+x \((within|OVER) 1\.15x\)", out.stdout), out.stdout
        assert len(re.findall(r"hidden: measured \d\.\d+, predicted \d\.\d+ \((within|OVER) 0\.15\)",
                              out.stdout)) == 4, out.stdout
    if script == "zero3_step_time.py":
        assert re.search(r"zero3 prefetch / torch-fsdp: \d+\.\d+x \((within|OVER) 1\.3x\)", out.stdout), out.stdout
