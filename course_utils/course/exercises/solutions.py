"""Solutions on demand: :func:`hint` prints, call after call, where to start a build and then how
(in words and traces, not its code); :func:`solution` prints the course's answer to an exercise, a file of
``course_utils/course/solutions/`` (``NN.k.py``; a build's answer: ``ddp.py``, ``zero1.py``, ...);
:func:`skeleton` prints a build's skeleton, made from its answer (the spec: signatures, docstrings and
the lines marked ``# given``; a test keeps each notebook's build cell equal to it);
:func:`yours` is the class the cells after a build run: the learner's once it passed its check
in this kernel, else the reference (one line says which)."""
import ast
import importlib
import inspect
import re
from pathlib import Path

from ...checks import check_choice
from ...impl.ddp import DataParallel
from ...impl.zero import MixedZero1, Zero1, Zero2
from ...impl.zero3 import FlatUnit, Zero3
from ...labs.grading import PASSED
from .hints import HINTS

__all__ = ["BUILDS", "HINTS", "answer", "course_answer", "hint", "solution", "skeleton", "yours", "versus"]

#: the answers, one file each: ``solutions/02.1.py`` for exercise 02.1, ``solutions/zero1.py``
#: for the ZeRO-1 build; package data (``course_utils/course/solutions/``), so that an
#: installed wheel has them too
SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"

#: build exercise -> (the learner's class name, the course's reference the cells after it fall back to)
BUILDS = {"ddp": ("MyDDP", DataParallel), "zero1": ("MyZero1", Zero1), "mixed": ("MyMixedZero1", MixedZero1),
          "zero2": ("MyZero2", Zero2), "zero3": ("MyFlatUnit", FlatUnit), "prefetch": ("MyPrefetchUnit", Zero3)}


#: how many times :func:`hint` was called for each build in this kernel
_HINTS_GIVEN: dict = {}


def hint(name: str) -> None:
    """Print the next hint for build ``name`` (``"ddp"``, ``"zero1"``, ``"mixed"``, ``"zero2"``, ``"zero3"``):
    where to start, then, called again, what each piece is, then how; after the last,
    ``solution(name)`` prints the code."""
    check_choice("build", name, HINTS, kind="build exercise", kinds="build exercises")
    k = _HINTS_GIVEN.get(name, 0)
    _HINTS_GIVEN[name] = k + 1
    levels = HINTS[name]
    shown = min(k, len(levels) - 1)
    print(levels[shown])
    more = (f'hint("{name}") again says {_NEXT_HINT[shown + 1]}.' if shown + 1 < len(levels)
            else f'solution("{name}") prints the code.')
    print(f"({shown + 1} of {len(levels)}; {more})")


#: what the next call of :func:`hint` says, by level
_NEXT_HINT = {1: "what each piece is", 2: "how, as a trace"}


def skeleton(name: str) -> str:
    """Build ``name``'s skeleton, made from its answer: the code outside the class, the class and
    method lines and their docstrings (the spec), and the lines marked ``# given`` (the mark
    dropped; ``# given: why`` keeps ``# why``); a method with neither docstring nor given line (a
    helper of the answer's) is left out. The notebook's build cell is this text (tested)."""
    check_choice("build", name, BUILDS, kind="build exercise", kinds="build exercises")
    text = (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8")
    lines = text.splitlines()
    keep = [True] * len(lines)
    keep[0] = not lines[0].startswith("# Exercise")          # the answer's header line
    methods = [node for cls in ast.parse(text).body if isinstance(cls, ast.ClassDef)
               for node in cls.body if isinstance(node, ast.FunctionDef)]
    for node in methods:
        first = min(d.lineno for d in node.decorator_list) if node.decorator_list else node.lineno
        doc = ast.get_docstring(node) is not None
        spec_end = node.body[0].end_lineno if doc else node.body[0].lineno - 1
        given = [i for i in range(spec_end, node.end_lineno) if _GIVEN.search(lines[i])]
        for i in range(spec_end, node.end_lineno):
            keep[i] = i in given
        if not doc and not given:
            for i in range(first - 1, node.end_lineno):
                keep[i] = False
            if first - 2 >= 0 and not lines[first - 2].strip():
                keep[first - 2] = False                         # its blank line before
    out = [_GIVEN.sub(lambda m: f"{m.group(1)}# {m.group(2)}" if m.group(2) else "", line)
           for line, k in zip(lines, keep) if k]
    return "\n".join(out).strip("\n") + "\n"


#: the mark of a skeleton's given line in an answer: ``# given`` or ``# given: comment``
_GIVEN = re.compile(r"(\s*)# given(?:: (.*))?$")


def solution(name: str) -> None:
    """Print the course's answer to exercise ``name`` (``"02.1"``; a build: ``"ddp"``, ``"zero1"``,
    ``"zero2"``, ``"zero3"``, its skeleton filled in) from its file in :data:`SOLUTIONS`, ready to
    paste and run: it ends with the exercise's check, which it passes."""
    small = sorted(p.stem for p in SOLUTIONS.glob("*.py") if p.stem not in BUILDS)
    check_choice("exercise", name, [*small, *BUILDS], kind="exercise", kinds="exercises")
    for line in (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("# source: "):       # the answer is a function of the package
            module, _, attr = line[len("# source: "):].rpartition(".")
            line = inspect.getsource(getattr(importlib.import_module(module), attr))
        print(line)


def answer(name: str, namespace: dict | None = None):
    """Exercise ``name``'s answer, the file :func:`solution` prints, with its definitions run and its
    check call not: ``(namespace, the check call compiled)``. ``namespace``: what the notebook defined
    before (06.2's answer subclasses the learner's ``MyFlatUnit``)."""
    path = SOLUTIONS / f"{name}.py"
    *body, last = ast.parse(path.read_text(encoding="utf-8")).body
    namespace = dict(namespace or {})
    exec(compile(ast.Module(body, []), str(path), "exec"), namespace)
    return namespace, compile(ast.Expression(last.value), str(path), "eval")


def course_answer(name: str):
    """The class the course's answer to build ``name`` defines (``course_answer("zero3")``: a
    ``MyFlatUnit``), for a later build that extends it when the learner's own is not at hand."""
    check_choice("build", name, BUILDS, kind="build exercise", kinds="build exercises")
    return answer(name)[0][BUILDS[name][0]]


def yours(name: str, cls):
    """``cls`` if it passed ``check_<name>`` in this kernel, else the course's reference."""
    check_choice("exercise", name, BUILDS, kind="build exercise", kinds="build exercises")
    learner, ref = BUILDS[name]
    if cls is not None and PASSED.get(name) is cls:
        print(f"running your {cls.__name__} (it passed check_{name})")
        return cls
    print(f"your {learner} has not passed check_{name} yet: running the course's {ref.__name__}")
    return ref


def versus(prediction, measured: int, what: str, name: str = "my_prediction", tol: float = 0.01) -> None:
    """Your prediction (None: not made yet; ``name``: the variable that holds it) next to the
    measurement, in one line: right within ``tol`` (relative; a step time: 0.2). Before a
    prediction the measurement stays hidden: in a notebook, behind a closed "reading, not
    running?" (for a reader of the saved notebook, on GitHub or in the book); elsewhere, not shown."""
    if prediction is None:
        prompt = f"{what}: predict first (set {name} above, then run this cell again)"
        _hidden_behind(prompt, f"{what}: measured {measured:,}")
    else:
        off = abs(prediction - measured) / measured if measured else float(prediction != 0)
        verdict = ("right" if tol <= 0.01 else f"right, within {tol:.0%}") if off <= tol else f"off by {off:.0%}"
        print(f"{what}: you predicted {prediction:,}, measured {measured:,}: {verdict}")


def once_predicted(text: str, *predictions, what: str = "the measurements") -> None:
    """``text`` (a table of measurements) printed once every prediction is made; before, kept
    behind the same closed reveal as :func:`versus`'s."""
    if all(p is not None for p in predictions):
        print(text)
    else:
        _hidden_behind(f"{what}: shown once you have predicted", text)


def _hidden_behind(prompt: str, reveal: str) -> None:
    """``prompt`` as text; in an IPython kernel, also as HTML with ``reveal`` behind a closed <details>."""
    try:
        from IPython import get_ipython
        kernel = get_ipython() is not None and hasattr(get_ipython(), "kernel")
    except ImportError:
        kernel = False
    if not kernel:
        print(prompt)
        return
    import html

    from IPython.display import display
    display({"text/plain": prompt,
             "text/html": f"<div><pre>{html.escape(prompt)}</pre><details><summary>reading, not running? "
                          f"the measurement</summary><pre>{html.escape(reveal)}</pre></details></div>"}, raw=True)