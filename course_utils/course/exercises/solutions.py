"""Solutions on demand: :func:`hint` prints the step of a build where learners get stuck, in
words and shapes, not its code; :func:`solution` prints the course's answer to an exercise, a file of
``course_utils/course/solutions/`` (``NN.k.py``; a build's skeleton filled in: ``ddp.py``, ``zero1.py``, ...);
:func:`yours` is the class the cells after a build run: the learner's once it passed its check
in this kernel, else the reference (one line says which)."""
import importlib
import inspect
from pathlib import Path

from ...checks import check_choice
from ...impl.ddp import DataParallel
from ...impl.zero import Zero1, Zero2
from ...impl.zero3 import FlatUnit
from ...labs.grading import PASSED

__all__ = ["BUILDS", "HINTS", "hint", "solution", "yours", "versus"]

#: the answers, one file each: ``solutions/02.1.py`` for exercise 02.1, ``solutions/zero1.py``
#: for the ZeRO-1 build; package data (``course_utils/course/solutions/``), so that an
#: installed wheel has them too
SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"

#: build exercise -> (the learner's class name, the course's reference the cells after it fall back to)
BUILDS = {"ddp": ("MyDDP", DataParallel), "zero1": ("MyZero1", Zero1), "zero2": ("MyZero2", Zero2),
          "zero3": ("MyFlatUnit", FlatUnit)}


#: build exercise -> the hint: where learners get stuck, said as a trace or a shape, not as code
HINTS = {
    "ddp": """MyDDP, the in-order launch (TODO 3), traced with buckets [[p3, p2], [p1, p0]]:
  hook(p3): first hook of this backward -> queue _finish once (self.queued); ready = {p3};
            bucket 0 = [p3, p2] is not all in ready -> launch nothing
  hook(p2): ready = {p3, p2}; bucket self.next = 0 is all in -> _launch() (next becomes 1);
            bucket 1 is not complete -> stop (a `while`: when gradients arrive out of order,
            one hook can complete several buckets)
  hook(p1), hook(p0): the same; p0 completes bucket 1 -> _launch()
  _finish (TODO 4): launch what is left (a frozen or unused parameter never fires a hook);
            for each (bucket, flat, work) in self.pending: wait, divide by the world size, and
            split flat by the parameters' numel back into their .grad (view_as);
            then reset next, ready, pending and queued for the next backward.""",
    "zero1": """MyZero1: one flat, padded buffer per param group; the parameters are views of it.
  __init__: flat = flatten_and_pad(the group's params, N); point each p.data at its slice of flat
            (view_as); lo, hi = shard_bounds(padded numel, N, rank); the inner optimizer gets one
            Parameter, flat[lo:hi], whose .grad you create (zeros) so that step can fill it.
  step: flatten the .grads the same way (zeros for a None), reduce_scatter_tensor into the shard's
        .grad (a SUM: divide by N), copy the group's hyperparameters into its inner group (a
        scheduler changes yours), inner.step(), then all_gather_into_tensor(flat, flat[lo:hi]):
        in place, the input is this rank's own slice of the output, no copy needed; the views
        now read every rank's update.""",
    "zero2": """MyZero2: ZeRO-1's layout, but each bucket is reduce-scattered during backward.
  _launch(bucket) (TODO 1): message = the bucket's .grads flattened and padded (zeros for a None);
            set the full .grads to None (that is the memory ZeRO-2 saves); start
            reduce_scatter_tensor(message[lo:hi], message, async_op=True): the output is this
            rank's piece of the message itself, so nothing else is allocated.
  _finish (TODO 2): launch what is left; for every bucket wait, then ADD message[lo:hi] / N to the
            shard's .grad (added, so micro-batches accumulate; step() zeroes it); drop the message.""",
    "zero3": """MyFlatUnit, the piece that trips people up (TODO 2): backward needs the weights after forward
freed them. forward: gather(); out = self.module(*args); free(); then out.register_hook(fn) and
return out. Autograd calls fn(grad) when out's gradient arrives, just before this unit's own
backward: fn gathers again and returns grad unchanged. Because the parameters are views of the
same self.full, refilling it refills what autograd saved in forward (section 4's cell showed it).
TODO 3: count the _grad_ready calls; at len(self.params), reduce_scatter() once, free again.""",
}


def hint(name: str) -> None:
    """Print the hint for build ``name`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"zero3"``): the step
    where learners get stuck, as a trace or in words. ``solution(name)`` prints the whole answer."""
    check_choice("build", name, HINTS, kind="build exercise", kinds="build exercises")
    print(HINTS[name])


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
    measurement, in one line: right within ``tol`` (relative; a step time: 0.2)."""
    if prediction is None:             # the measurement stays hidden until there is a prediction
        print(f"{what}: predict first (set {name} above, then run this cell again)")
    else:
        off = abs(prediction - measured) / measured if measured else float(prediction != 0)
        verdict = ("right" if tol <= 0.01 else f"right, within {tol:.0%}") if off <= tol else f"off by {off:.0%}"
        print(f"{what}: you predicted {prediction:,}, measured {measured:,}: {verdict}")
