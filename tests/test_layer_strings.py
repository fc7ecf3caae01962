"""No lower layer names a higher one, even in a string (tests/test_architecture.py reads
imports; this reads the text: a list of module names, a docstring, a comment).

    checks  <-  theory  <-  runtime  <-  impl  <-  harness  <-  labs  <-  course

A dotted name of a layer is ``course_utils.harness...``, a relative ``.harness`` or
``..harness.x``, or ``harness.experiments`` (the layer then a name); the bare word, or one
ending a sentence ("of course."), is not. Checked here: ``checks.py`` and ``runtime/``.
"""
import re
from pathlib import Path

import pytest

import course_utils

PKG = Path(course_utils.__file__).parent
LAYERS = ["checks", "theory", "runtime", "impl", "harness", "labs", "course"]
CHECKED = {"checks": [PKG / "checks.py"], "runtime": sorted((PKG / "runtime").rglob("*.py"))}

# a dotted token: leading dots (relative), then names joined by dots; not inside a longer one
_DOTTED = re.compile(r"(?<![\w.])(\.*)([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def higher_names(text: str, layer: str) -> list[tuple[int, str]]:
    """(line, name) for each dotted name in ``text`` of a layer above ``layer``."""
    above = set(LAYERS[LAYERS.index(layer) + 1:])
    found = []
    for match in _DOTTED.finditer(text):
        dots, parts = match.group(1), match.group(2).split(".")
        if parts[0] == "course_utils":
            hit = len(parts) > 1 and parts[1] in above
        else:
            hit = parts[0] in above and (bool(dots) or len(parts) > 1)
        if hit:
            found.append((text.count("\n", 0, match.start()) + 1, match.group(0)))
    return found


#: Known, to be fixed where they are (then this mark fails: drop it).
KNOWN: dict = {}


@pytest.mark.parametrize("layer, path", [
    pytest.param(layer, path, id=str(path.relative_to(PKG)),
                 marks=[pytest.mark.xfail(reason=KNOWN[path], strict=True)] if path in KNOWN else [])
    for layer, paths in CHECKED.items() for path in paths])
def test_no_higher_layer_is_named(layer, path):
    assert path.exists()
    found = higher_names(path.read_text(encoding="utf-8"), layer)
    assert not found, f"{path.relative_to(PKG.parent)} names a layer above {layer}: {found}"


def test_the_runtime_files_are_all_checked():
    assert len(CHECKED["runtime"]) > 5 and PKG / "runtime" / "launch.py" in CHECKED["runtime"]


@pytest.mark.parametrize("planted, name", [
    ('"course_utils.harness.experiments"', "course_utils.harness.experiments"),
    ("'course_utils.impl'", "course_utils.impl"), ("from ..labs import hangs", "..labs"),
    ('"..harness.model"', "..harness.model"), ("see .course.exercises", ".course.exercises"),
    ("harness.experiments.run", "harness.experiments.run"), ("impl.zero3", "impl.zero3"),
    ("`course_utils.course`", "course_utils.course"), ("(labs.hangs)", "labs.hangs"),
])
def test_the_check_finds_a_planted_name(planted, name):
    text = f'"""A module."""\nX = 1\nY = {planted}  # planted\n'
    assert higher_names(text, "runtime") == [(3, name)]


@pytest.mark.parametrize("ordinary", [
    "the course. Then", "of course.", "a test harness.\nNext", "the labs, the impl and the course",
    "course_utils.runtime.launch", "course_utils.theory.comm", "..theory.text", "torch.distributed.fsdp",
    "self.course_name", "my_course.x", "harness_experiments", "x.harness.y", "course_utils.",
])
def test_the_check_passes_ordinary_text(ordinary):
    assert higher_names(f"# {ordinary}\ns = {ordinary!r}\n", "runtime") == []


def test_a_layer_below_is_named_freely_and_checks_sees_every_layer_above():
    assert higher_names("from ..theory.comm import OPS", "runtime") == []
    assert higher_names("from ..theory.comm import OPS", "checks") == [(1, "..theory.comm")]
    assert higher_names("course_utils.runtime.launch", "theory") == [(1, "course_utils.runtime.launch")]
