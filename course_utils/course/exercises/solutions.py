"""Solutions on demand: :func:`solution` prints the course's answer to an exercise, a file of
``solutions/`` (``NN.k.py``; a build's skeleton filled in: ``ddp.py``, ``zero1.py``, ...);
:func:`yours` is the class the cells after a build run: the learner's once it passed its check
in this kernel, else the reference (one line says which)."""
import importlib
import inspect
from pathlib import Path

from ...checks import check_choice
from ...harness.grading import PASSED
from ...impl.ddp import DataParallel
from ...impl.zero import Zero1, Zero2
from ...impl.zero3 import FlatUnit

__all__ = ["BUILDS", "solution", "yours", "versus"]

#: the answers, one file each: ``solutions/02.1.py`` for exercise 02.1, ``solutions/zero1.py``
#: for the ZeRO-1 build
SOLUTIONS = Path(__file__).resolve().parents[3] / "solutions"

#: build exercise -> (the learner's class name, the course's reference the cells after it fall back to)
BUILDS = {"ddp": ("MyDDP", DataParallel), "zero1": ("MyZero1", Zero1), "zero2": ("MyZero2", Zero2),
          "zero3": ("MyFlatUnit", FlatUnit)}


def solution(name: str) -> None:
    """Print the course's answer to exercise ``name`` (``"02.1"``; a build: ``"ddp"``, ``"zero1"``,
    ``"zero2"``, ``"zero3"``, its skeleton filled in) from its file in ``solutions/``, ready to
    paste and run: it ends with the exercise's check, which it passes."""
    small = sorted(p.stem for p in SOLUTIONS.glob("*.py") if p.stem not in BUILDS)
    check_choice("exercise", name, [*small, *BUILDS], kind="exercise", kinds="exercises")
    for line in (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("# source: "):       # the answer is a function of the package
            module, _, attr = line[len("# source: "):].rpartition(".")
            line = inspect.getsource(getattr(importlib.import_module(module), attr))
        print(line)


def yours(name: str, cls):
    """``cls`` if it passed ``check_<name>`` in this kernel, else the course's reference."""
    check_choice("exercise", name, BUILDS, kind="build exercise", kinds="build exercises")
    learner, ref = BUILDS[name]
    if cls is not None and PASSED.get(name) is cls:
        print(f"running your {cls.__name__} (it passed check_{name})")
        return cls
    print(f"your {learner} has not passed check_{name} yet: running the course's {ref.__name__}")
    return ref


def versus(prediction, measured: int, what: str) -> None:
    """Your prediction (None: not made yet) next to the measurement, in one line."""
    if prediction is None:             # the measurement stays hidden until there is a prediction
        print(f"{what}: predict first (set my_prediction above, then run this cell again)")
    else:
        off = abs(prediction - measured) / measured if measured else float(prediction != 0)
        verdict = "right" if off <= 0.01 else f"off by {off:.0%}"
        print(f"{what}: you predicted {prediction:,}, measured {measured:,}: {verdict}")
