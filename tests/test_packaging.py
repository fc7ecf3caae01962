"""Packaging: pyproject vs environment.yml, the two make commands, CI entry point."""
import os
import re

try:
    import tomllib
except ModuleNotFoundError:            # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from course_utils.course.badges import ROOT

CONDA_TO_PIP = {"pytorch": "torch"}


def _pip_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["test"]
    return {Requirement(r).name.lower(): str(Requirement(r).specifier) for r in reqs}


def _conda_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):  # the pip: section installs the package itself
            assert dep == {"pip": ["-e ."]}
            continue
        name, spec = re.match(r"^([A-Za-z0-9_.-]+)(.*)$", dep).groups()
        if name in ("python", "pip"):
            continue
        out[CONDA_TO_PIP.get(name, name).lower()] = str(SpecifierSet(spec))  # pip's order: '<9,>=7.7'
    return out, env


def test_environment_yml_lists_the_same_packages_as_pyproject():
    conda, env = _conda_requirements()
    assert conda == _pip_requirements()
    assert "python=3.11" in env["dependencies"]


def test_torch_is_a_range_in_the_package_and_pinned_in_make():
    from course_utils.runtime.compat import MIN_TORCH
    assert _pip_requirements()["torch"] == ">=" + ".".join(map(str, MIN_TORCH))
    makefile = (ROOT / "Makefile").read_text()
    # the learner's torch comes from scripts/install_torch.py (tests/test_install_torch.py)
    assert 'DEFAULT_SPEC = "torch==2.13.0"' in (ROOT / "scripts" / "install_torch.py").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line]
    assert all("torch" not in line or "torch==$(COMPAT_TORCH)" in line or "COLAB" in line
               for line in installs)


def test_the_compat_target_installs_the_oldest_supported_torch():
    from course_utils.runtime.compat import MIN_TORCH
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^COMPAT_TORCH \?= (\d+)\.(\d+)\.\d+$", makefile, re.MULTILINE)
    assert pinned and (int(pinned[1]), int(pinned[2])) == MIN_TORCH


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for cmd in ("make lab", "make test", "make test-nb", "make figures", "make badges",
                "make gpu-check", "torchrun"):
        assert cmd in readme, cmd


def test_the_wheel_ships_the_solutions(tmp_path):
    """``solution(...)`` works from an installed wheel, not only from this checkout: the answers
    are package data (course_utils/course/solutions/), read from wherever the package is."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import importlib.util

    import setuptools
    from course_utils.course.exercises.solutions import SOLUTIONS

    if tuple(int(v) for v in setuptools.__version__.split(".")[:2]) < (70, 1) and not importlib.util.find_spec("wheel"):
        pytest.skip(f"setuptools {setuptools.__version__} builds a wheel only with the `wheel` package, "
                    "not installed in this venv (setuptools >= 70.1 needs none)")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "course_utils", src / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("course_utils/course/solutions/")}
    assert shipped == {f"course_utils/course/solutions/{p.name}" for p in SOLUTIONS.glob("*.py")}
    from course_utils.course.exercises.hints import TEXTS
    hints = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("course_utils/course/hints/")}
    assert hints == {f"course_utils/course/hints/{p.name}" for p in TEXTS.glob("*.txt")} and len(hints) == 6
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(tmp_path / "site"), str(wheel)], check=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run([sys.executable, "-c", "import course_utils; print(course_utils.__file__); "
                          "from course_utils.course.exercises import solution; solution('ddp')"],
                         capture_output=True, text=True, check=True, cwd=tmp_path, env=env).stdout
    where, printed = out.split("\n", 1)
    assert where.startswith(str(tmp_path / "site"))
    assert printed == (SOLUTIONS / "ddp.py").read_text(encoding="utf-8")
    out = subprocess.run([sys.executable, "-c", "from course_utils.course.exercises import hint; hint('zero3')"],
                         capture_output=True, text=True, check=True, cwd=tmp_path, env=env).stdout
    assert out.startswith("MyFlatUnit, where to start:")
