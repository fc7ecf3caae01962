"""Every small exercise's answer in ``course_utils/course/solutions/`` passes its check, and ``solution("NN.k")``
prints it: the notebooks show a pointer, not the answer. (The builds' answers, ``ddp.py`` ...
``zero3.py``, are graded in tests/test_solutions.py and tests/test_build_zero3.py.)"""
import pytest
from toys import answer

from course_utils.course.exercises import solution
from course_utils.course.exercises.solutions import SOLUTIONS

FILES = sorted(p for p in SOLUTIONS.glob("*.py") if "." in p.stem)     # the builds: by name


def test_every_core_exercise_has_its_answer():
    assert sorted(p.stem for p in SOLUTIONS.glob("*.py") if p not in FILES) == ["ddp", "mixed", "prefetch", "zero1", "zero2", "zero3"]
    names = [p.stem for p in FILES]
    assert names == ["00.1", "01.1", "01.2", "02.1", "03.1",
                     "07.1", "08.1", "11.4"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_answer_passes_its_check(path, capsys):
    namespace, check = answer(path.stem)
    assert any(name.startswith("check") for name in check.co_names), "ends with its check call"
    verdict = eval(check, namespace)
    assert verdict, capsys.readouterr().out
    assert ": PASSED" in str(verdict)


def test_solution_prints_the_file(capsys):
    solution("02.1")
    out = capsys.readouterr().out
    assert out == (SOLUTIONS / "02.1.py").read_text(encoding="utf-8")


def test_solution_shows_a_package_function_in_full(capsys):
    solution("01.2")
    out = capsys.readouterr().out
    assert "def ring_all_reduce(tensor" in out and "# source:" not in out
    assert "check_ring_all_reduce(ring.ring_all_reduce)" in out


def test_the_notebooks_point_to_the_answers():
    import json

    from course_utils.course.badges import ROOT
    text = "".join((ROOT / "notebooks").joinpath(p).read_text(encoding="utf-8")    # the capstone: appendix 11
                   for p in sorted(n.name for n in (ROOT / "notebooks").glob("[01][0-9]_*.ipynb")))
    for path in SOLUTIONS.glob("*.py"):
        assert f'solution(\\"{path.stem}\\")' in text, f"no notebook points to solution({path.stem!r})"
    for p in (ROOT / "notebooks").glob("0[0-8]_*.ipynb"):
        cells = json.loads(p.read_text(encoding="utf-8"))["cells"]
        assert not any("".join(c["source"]).startswith("# Solution") for c in cells), \
            f"{p.name} prints an answer under its exercise: move it to course_utils/course/solutions/"


def test_every_stuck_pointer_has_solution_imported_before_it():
    """A learner who types the "Stuck?" line's ``solution(...)`` gets the answer, not a NameError:
    a code cell above it imports ``solution``."""
    import json

    from course_utils.course.badges import notebook_paths

    for path in notebook_paths():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        imported = False
        for cell in cells:
            text = "".join(cell["source"])
            if cell["cell_type"] == "code" and "import" in text and "solution" in text.split("import", 1)[1]:
                imported = True
            if cell["cell_type"] == "markdown" and "`solution(" in text:
                assert imported, f"{path.name}: a cell says {text[:60]!r} before any cell imports solution"


def test_every_build_has_a_hint_that_is_not_its_answer(capsys):
    """``hint(build)`` says where learners get stuck without handing over the code: no line of the
    answer's TODO bodies appears in it; each build's notebook points to it after importing it."""
    import json

    from course_utils.course.badges import ROOT
    from course_utils.course.exercises import BUILDS, hint
    from course_utils.course.exercises.solutions import HINTS

    from course_utils.course.exercises.solutions import _HINTS_GIVEN
    assert sorted(HINTS) == sorted(BUILDS)
    _HINTS_GIVEN.clear()
    for name in BUILDS:
        answer = (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8").splitlines()
        code = [l.strip() for l in answer if len(l.strip()) > 25 and not l.strip().startswith(("#", "def ", "class "))]
        assert len(HINTS[name]) == 3, name                # where to start, what each piece is, how
        for level, text in enumerate(HINTS[name]):
            hint(name)
            out = capsys.readouterr().out
            assert out.startswith(text) and len(text.splitlines()) >= (3 if level == 0 else 5)
            assert not [l for l in code if l in text], (name, level)
            assert "where to start" in text.splitlines()[0] if level == 0 else "where to start" not in text
            assert ({0: 'again says what each piece is', 1: 'again says how'}.get(level, f'solution("{name}") prints')
                    in out), (name, level, out[-80:])
        hint(name)                                         # past the last: the last again
        assert capsys.readouterr().out.startswith(HINTS[name][-1])
    with pytest.raises(ValueError, match="known build exercises: ddp"):
        hint("02.1")
    for p in [*(ROOT / "notebooks").glob("0[2-6]_*.ipynb"), ROOT / "notebooks" / "14_appendix_optional_builds.ipynb"]:
        cells = [("".join(c["source"]), c["cell_type"]) for c in json.loads(p.read_text(encoding="utf-8"))["cells"]]
        points = [i for i, (t, kind) in enumerate(cells) if kind == "markdown" and "`hint(" in t]
        imports = [i for i, (t, kind) in enumerate(cells) if kind == "code" and ", hint, solution" in t]
        if p.name.startswith("03"):
            assert not points
            continue
        assert len(points) == (2 if p.name.startswith("14") else 1) and imports and imports[0] < points[0], p.name
