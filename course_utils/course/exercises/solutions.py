"""Solutions on demand: :func:`solution` prints the course's answer to a small exercise
(``solutions/NN.k.py``) or the reference of a build's shape; :func:`yours` is the class the
cells after a build run: the learner's once it passed its check in this kernel, else the
reference (one line says which)."""
import importlib
import inspect
from pathlib import Path

from ...checks import check_choice
from ...harness.grading import PASSED
from ...impl.common import BucketHooks, make_buckets
from ...impl.ddp import DataParallel
from ...impl.zero import Zero1, Zero2
from ...impl.zero3 import FlatUnit

__all__ = ["BUILDS", "solution", "yours", "versus"]

#: the small exercises' answers, one file each: ``solutions/02.1.py`` for exercise 02.1
SOLUTIONS = Path(__file__).resolve().parents[3] / "solutions"

#: exercise -> (the learner's class name, the reference, what solution() prints)
BUILDS = {
    "ddp": ("MyDDP", DataParallel, (make_buckets, DataParallel.__init__, BucketHooks._on_grad,
                                    DataParallel._launch, DataParallel._finish)),
    "zero1": ("MyZero1", Zero1, (Zero1.__init__, Zero1._make_bucket, Zero1._grad_buffers,
                                 Zero1.reduce_gradients, Zero1._reduce, Zero1.step)),
    "zero2": ("MyZero2", Zero2, (Zero2.__init__, Zero2._grad_buffers, Zero2._launch, Zero2._wait,
                                 Zero2._finish, Zero2.reduce_gradients)),
    "zero3": ("MyFlatUnit", FlatUnit, (FlatUnit.gather, FlatUnit.free, FlatUnit.forward,
                                       FlatUnit._grad_ready, FlatUnit.reduce_scatter)),
}


def solution(name: str) -> None:
    """Print the course's answer to exercise ``name``: a small one (``"02.1"``) from its file in
    ``solutions/``, ready to paste and run; a build (``"ddp"``, ``"zero1"``, ``"zero2"``,
    ``"zero3"``) as the reference's methods, from the package's own source."""
    small = sorted(p.stem for p in SOLUTIONS.glob("*.py"))
    check_choice("exercise", name, [*small, *BUILDS], kind="exercise", kinds="exercises")
    if name in small:
        for line in (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8").splitlines():
            if line.startswith("# source: "):       # the answer is a function of the package
                module, _, attr = line[len("# source: "):].rpartition(".")
                line = inspect.getsource(getattr(importlib.import_module(module), attr))
            print(line)
        return
    learner, ref, methods = BUILDS[name]
    print(f"# {ref.__module__}.{ref.__name__}: {learner}'s shape; check_{name}({ref.__name__}) passes\n")
    for method in methods:
        print(inspect.getsource(method))


def yours(name: str, cls):
    """``cls`` if it passed ``check_<name>`` in this kernel, else the course's reference."""
    check_choice("exercise", name, BUILDS, kind="build exercise", kinds="build exercises")
    learner, ref, _ = BUILDS[name]
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
