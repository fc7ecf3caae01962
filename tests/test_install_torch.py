"""`make`'s first install (scripts/install_torch.py): which torch a learner's machine gets.

The decision is tested from the facts it is made of (system, GPU, index reachable), so no
test downloads anything or needs a GPU; the script itself runs with --dry-run.
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from course_utils.course.badges import ROOT

SCRIPT = ROOT / "scripts" / "install_torch.py"
_spec = importlib.util.spec_from_file_location("install_torch", SCRIPT)
it = importlib.util.module_from_spec(_spec)
sys.modules["install_torch"] = it          # its dataclass looks its module up there
_spec.loader.exec_module(it)


class Probe:
    """A fake `reachable`: records the URLs asked."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def __call__(self, url):
        self.asked.append(url)
        return self.answer


def test_linux_without_a_gpu_and_the_cpu_index_answering_gets_the_cpu_build():
    probe = Probe(True)
    c = it.choose(system="Linux", has_gpu=False, reachable=probe)
    assert c.index == it.CPU_INDEX == "https://download.pytorch.org/whl/cpu"
    assert c.pip_args() == ["install", "torch==2.13.0", "--index-url", it.CPU_INDEX]
    assert probe.asked == [it.CPU_INDEX]
    assert "CPU build" in c.reason


def test_no_gpu_and_no_cpu_index_falls_back_to_pips_default():
    c = it.choose(system="Linux", has_gpu=False, reachable=Probe(False))
    assert c.index is None and c.pip_args() == ["install", "torch==2.13.0"]
    assert "cannot be reached" in c.reason


def test_a_gpu_gets_the_default_cuda_build_without_asking_the_cpu_index():
    probe = Probe(True)
    c = it.choose(system="Linux", has_gpu=True, reachable=probe)
    assert c.index is None and probe.asked == [] and "NVIDIA GPU" in c.reason


@pytest.mark.parametrize("system", ["Darwin", "Windows"])
def test_macos_and_windows_get_pypis_wheel_which_is_a_cpu_build_there(system):
    probe = Probe(True)
    c = it.choose(system=system, has_gpu=False, reachable=probe)
    assert c.index is None and probe.asked == []


def test_torch_index_and_spec_choose_otherwise():
    no = Probe(True)
    assert it.choose(system="Linux", has_gpu=False, reachable=no, index="default").index is None
    assert it.choose(system="Linux", has_gpu=True, reachable=no, index="cpu").index == it.CPU_INDEX
    url = "https://download.pytorch.org/whl/cu126"
    assert it.choose(system="Linux", has_gpu=False, reachable=no, index=url).index == url
    assert no.asked == []                       # an explicit choice never probes
    c = it.choose(system="Linux", has_gpu=True, reachable=no, spec="torch==2.11.0")
    assert c.pip_args() == ["install", "torch==2.11.0"]


@pytest.mark.parametrize("kw, message", [
    ({"index": "pypi"}, "TORCH_INDEX must be auto, default, cpu or an index URL"),
    ({"spec": "numpy"}, "TORCH_SPEC must name torch"),
])
def test_bad_settings_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        it.choose(system="Linux", has_gpu=False, reachable=Probe(True), **kw)


def test_an_unreachable_index_is_answered_false_quickly():
    # a port nothing listens on, on loopback: refused at once, no network needed
    assert it.index_reachable("http://127.0.0.1:9/whl/cpu", timeout_s=2.0) is False
    assert it.index_reachable("not a url") is False


def test_an_installed_torch_is_kept():
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"torch \S+ is already installed: kept\n", out.stdout), out.stdout


def test_without_torch_the_dry_run_prints_the_pip_command(tmp_path):
    """A Python with no torch (this one, told to ignore site-packages) gets a pip command;
    TORCH_INDEX=cpu so no probe runs."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    fake.chmod(0o755)
    env = dict(os.environ, TORCH_INDEX="cpu", TORCH_SPEC="torch==2.13.0")
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--python", str(fake)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert f"-m pip install torch==2.13.0 --index-url {it.CPU_INDEX}" in out.stdout, out.stdout


def test_make_installs_torch_through_the_script_and_the_learner_without_test_tools():
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert "scripts/install_torch.py" in stamp and '".[test]"' not in stamp
    lab = re.search(r"^lab: (.*)$", makefile, re.MULTILINE).group(1).split()
    assert lab == ["install"]
    assert re.search(r"^test: install-test$", makefile, re.MULTILINE)
    assert "--allow-root" in makefile
