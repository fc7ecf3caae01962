"""The grading engine of every exercise: run the learner's function, compare, report.

:func:`grade_on_ranks` launches the learner's function on N ranks (several world sizes,
so a hard-coded answer fails), compares each rank's return value with the expected one
and prints one line per world size: ``2 gloo ranks on CPU: right: ...``, or ``... not
yet: rank R: got [first values ...], expected [...] (k of N ranks differ)``, the first
rank that differs with the part of its value where the difference starts. It returns a
:class:`Verdict`, truthy only when every rank of every world size is right; it never
raises on a wrong answer. :func:`grade_cases` does the same for plain functions, case
by case.

Graders always run gloo ranks on the CPU (:data:`GRADER_BACKEND`), also on a machine with
GPUs: the exercises are CPU-sized toys, and a learner's tensor made without a device
(``torch.tensor([1.0])``, ``torch.empty(n)``) must be graded, not rejected by NCCL, which
only takes tensors on the rank's GPU. The lines each grader prints say so.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..runtime.fmt import num as _num
from ..runtime.fmt import plural
from ..runtime.fmt import show as _show
from ..runtime.launch import LaunchError, LaunchTimeout, launch

__all__ = ["GRADER_BACKEND", "Verdict", "compare", "compare_brief", "brief", "launch_or_report", "on_world_sizes",
           "refuse_non_function", "report_problems", "report_ranks", "judge_on_ranks",
           "grade_on_ranks", "grade_cases", "first_problem", "refuse_non_class", "grade_build"]


def compare(got, expected, *, atol: float = 1e-6) -> str:
    """'' when ``got`` matches ``expected`` (numbers or tensors, within atol), else why not."""
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"got {_show(got)}, expected a tensor {_show(expected)}"
        if got.shape != expected.shape:
            return f"got shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        if not torch.allclose(got.double(), expected.double(), atol=atol, rtol=0):
            return f"got {_show(got)}, expected {_show(expected)}"
        return ""
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"got {_show(got)}, expected {_show(expected)}"
        return "" if abs(got - expected) <= atol else f"got {_show(got)}, expected {_show(expected)}"
    return "" if got == expected else f"got {_show(got)}, expected {_show(expected)}"


#: How many values of a tensor a grader's line shows.
BRIEF_VALUES = 5


def _value(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else _num(x)


def _window(flat, start: int) -> str:
    """``[v0, v1, ...]``: :data:`BRIEF_VALUES` values of ``flat`` from ``start``, '…' where cut."""
    stop = min(flat.numel(), start + BRIEF_VALUES)
    items = [_value(x) for x in flat[start:stop].tolist()]
    return "[" + ", ".join(["…"] * (start > 0) + items + ["…"] * (stop < flat.numel())) + "]"


def brief(value) -> str:
    """A value for a one-line report: a tensor as its first :data:`BRIEF_VALUES` values
    (``tensor([100, 101, 102, 103, 104, …])``, a 2-D one with its shape), anything else
    as :func:`course_utils.runtime.fmt.show` writes it."""
    import torch

    if isinstance(value, torch.Tensor) and value.numel() > 1:
        shape = f", shape={tuple(value.shape)}" if value.dim() > 1 else ""
        return f"tensor({_window(value.detach().reshape(-1).double().cpu(), 0)}{shape})"
    return _show(value)


def compare_brief(got, expected, *, atol: float) -> str:
    """:func:`compare`, in a few values: for two tensors of one shape, the values from
    just before the first element that differs, and its index."""
    import torch

    why = compare(got, expected, atol=atol)
    if not why or not isinstance(expected, torch.Tensor):
        return why
    if not isinstance(got, torch.Tensor):
        return f"got {brief(got)}, expected {brief(expected)}"
    if got.shape != expected.shape or got.numel() == 1:
        return why
    g, e = got.detach().reshape(-1).double().cpu(), expected.reshape(-1).double().cpu()
    first = int((~torch.isclose(g, e, atol=atol, rtol=0)).nonzero()[0])
    start = max(0, min(first - 1, g.numel() - BRIEF_VALUES))
    where = f"; first difference at index {first}" if first else ""
    return f"got {_window(g, start)}, expected {_window(e, start)}{where}"


class Verdict:
    """What a ``check_*`` returns: truthy when passed; shows as one line in a notebook."""

    def __init__(self, name: str, passed: bool):
        self.name, self.passed = name, bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"{self.name}: {'PASSED' if self.passed else 'not yet, see the lines above'}"


#: The backend of every grader's ranks, whatever GPUs are visible (see the module docstring).
GRADER_BACKEND = "gloo"


def launch_or_report(fn: Callable, world_size: int, *args, timeout_s: float, quiet: bool = False):
    """``launch(fn, world_size, *args)`` on gloo CPU ranks; on a failed or hung rank, print
    one friendly line and return None (a learner's bug is reported, never raised).
    ``quiet``: no launch line (the caller's report says where the ranks ran)."""
    try:
        return launch(fn, world_size, *args, backend=GRADER_BACKEND, timeout_s=timeout_s, quiet=quiet)
    except LaunchTimeout as exc:
        print(f"{plural(world_size, 'rank')}: rank {exc.rank} and maybe others never finished within "
              f"{timeout_s:g} s. Do all ranks call the same collectives in the same order?")
    except LaunchError as exc:
        if exc.exc_type is None:     # killed by a signal (e.g. gloo aborted it): no Python error
            print(f"{plural(world_size, 'rank')}: {str(exc).splitlines()[0]}")
        else:
            print(f"{plural(world_size, 'rank')}: rank {exc.rank} raised {exc.exc_type}: "
                  f"{str(exc).splitlines()[0].split(': ', 1)[-1]}")
    return None


class on_world_sizes:
    """``for n, values in (runs := on_world_sizes(rank_fn, (2, 3, 4), *args, timeout_s=30)):``
    launches ``rank_fn(*args)`` on each world size in turn (:func:`launch_or_report`) and
    yields the world sizes whose ranks all returned; ``runs.completed`` is False when one
    of them failed or hung (that was printed)."""

    def __init__(self, rank_fn: Callable, world_sizes: Sequence[int], *args, timeout_s: float,
                 quiet: bool = False):
        self.rank_fn, self.world_sizes, self.args, self.timeout_s = rank_fn, world_sizes, args, timeout_s
        self.quiet = quiet
        self.completed = True

    def __iter__(self):
        for n in self.world_sizes:
            values = launch_or_report(self.rank_fn, n, *self.args, timeout_s=self.timeout_s,
                                      quiet=self.quiet)
            if values is None:
                self.completed = False
                continue
            yield n, values


def refuse_non_function(fn, name: str, signature: str = "") -> Verdict | None:
    """A failed :class:`Verdict` (and one line saying why) when ``fn`` is not callable,
    else None: the first thing every ``check_*`` does. ``signature``, e.g.
    ``"(model) -> model"``, says what the function takes."""
    if callable(fn):
        return None
    print(f"{name} should be a function{' ' + signature if signature else ''}, got {type(fn).__name__}: "
          "define it with def, then check it.")
    return Verdict(name, False)


def report_problems(label: str, problems: list, right: str) -> bool:
    """Print one line: ``label: not yet: <problem>; <problem>`` or ``label: right:
    <right>`` when there is none; True when there is none."""
    print(f"{label}: not yet: {'; '.join(problems)}" if problems else f"{label}: right: {right}")
    return not problems


def report_ranks(label: str, findings) -> bool:
    """Print one line for a world size from ``findings`` (per rank, ``(why, detail)``:
    ``why`` is '' when the rank is right): ``label: right: every rank <detail>`` (the
    detail when every rank has the same, else rank 0's), or ``label: not yet: rank R:
    <why> (k of n ranks differ)`` for the first rank R that differs. True when every
    rank is right."""
    findings = list(findings)
    wrong = [(rank, why) for rank, (why, _) in enumerate(findings) if why]
    if wrong:
        rank, why = wrong[0]
        print(f"{label}: not yet: rank {rank}: {why} ({len(wrong)} of {len(findings)} ranks differ)")
        return False
    details = [detail for _, detail in findings]
    if details and all(d == details[0] for d in details):
        print(f"{label}: right" + (f": every rank {details[0]}" if details[0] else " on every rank"))
    else:
        print(f"{label}: right on every rank" + (f" (rank 0 {details[0]})" if details and details[0] else ""))
    return True


def judge_on_ranks(rank_fn: Callable, judge: Callable[[object, int, int], tuple], *,
                   world_sizes: Sequence[int], name: str, args: tuple = (),
                   timeout_s: float = 30) -> Verdict:
    """Run ``rank_fn(*args)`` on each world size (gloo CPU ranks, no launch line) and print
    one line per world size (:func:`report_ranks`, labelled ``N gloo ranks on CPU``) from
    ``judge(value, rank, world_size) -> (why, detail)``; a failed or hung launch is one line
    too (:func:`launch_or_report`). Returns a :class:`Verdict`."""
    from ..runtime.launch import where

    all_right = True
    for n in world_sizes:
        values = launch_or_report(rank_fn, n, *args, timeout_s=timeout_s, quiet=True)
        if values is None:
            all_right = False
            continue
        all_right &= report_ranks(where(n, GRADER_BACKEND, backend_first=True),
                                  [judge(value, rank, n) for rank, value in enumerate(values)])
    return Verdict(name, all_right)


def grade_on_ranks(fn: Callable, expected: Callable[[int, int], object], *,
                   world_sizes: Sequence[int] = (2, 4), name: str = "your function",
                   args: tuple = (), atol: float = 1e-6, timeout_s: float = 30) -> Verdict:
    """Run ``fn(*args)`` on each world size; compare rank r's value with ``expected(r, n)``.

    Prints one line per world size: ``N gloo ranks on CPU: right: every rank returned
    ...`` or ``... not yet: rank R: got ..., expected ... (k of N ranks differ)``, tensors
    in a few values (:func:`brief`). Returns a :class:`Verdict` (truthy when everything
    matches).
    """
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused

    def judge(value, rank, n):
        return compare_brief(value, expected(rank, n), atol=atol), f"returned {brief(value)}"

    return judge_on_ranks(fn, judge, world_sizes=world_sizes, name=name, args=args, timeout_s=timeout_s)


#: How many wrong cases :func:`grade_cases` shows (the rest are counted in one line).
SHOWN_WRONG_CASES = 2


def grade_cases(fn: Callable, cases: Sequence[dict], expected: Callable[..., object], *,
                name: str = "your function", rel: float = 1e-9) -> Verdict:
    """Call ``fn(**case)`` for each case; compare with ``expected(**case)``.

    For exercises that are plain functions (no ranks), e.g. memory arithmetic. When every
    case is right, one line per case shows what was checked; otherwise the first
    :data:`SHOWN_WRONG_CASES` wrong cases (what was got and what was expected), a line
    counting the other wrong ones, and ``k of n cases right``: at most 4 lines.
    """
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused
    right, wrong = [], []
    for case in cases:
        args = ", ".join(f"{k}={v!r}" for k, v in case.items())
        want = expected(**case)
        try:
            got = fn(**case)
        except Exception as exc:  # noqa: BLE001 - report, never raise, on a learner's bug
            wrong.append(f"  {name}({args}): raised {type(exc).__name__}: {exc}")
            continue
        tol = rel * abs(want) if isinstance(want, (int, float)) and not isinstance(want, bool) else 0
        why = compare(got, want, atol=tol)
        (wrong if why else right).append(f"  {name}({args}): " + (f"differs: {why}" if why else
                                                                   f"right ({_show(got)})"))
    for line in (wrong[:SHOWN_WRONG_CASES] if wrong else right):
        print(line)
    if len(wrong) > SHOWN_WRONG_CASES:
        print(f"  ... and {len(wrong) - SHOWN_WRONG_CASES} more case(s) differ")
    print(f"{len(right)} of {len(cases)} cases right")
    return Verdict(name, not wrong)


# --------------------------------------------------------------- the build exercises' driver

def first_problem(values) -> tuple | None:
    """``(rank, problem)`` to show from every rank's findings (per rank, a list of
    ``(problem or '', what was seen)``): a problem found right after construction, or a
    constructor that raised, before anything else (those cause the rest); None when none."""
    problems = [(r, p) for r, per in enumerate(values) for p, _ in per if p]
    causes = [(r, p) for r, p in problems if p.startswith("after construction") or " raised " in p]
    return (causes or problems or [None])[0]


def refuse_non_class(cls, name: str, example: str) -> Verdict | None:
    """A failed :class:`Verdict` (and one line) when ``cls`` is not a class, else None."""
    if isinstance(cls, type):
        return None
    print(f"check_{name} takes your class (e.g. check_{name}({example})), got {type(cls).__name__}")
    return Verdict(name, False)


def grade_build(name: str, example: str, cls, rank_fn: Callable, *args, right: Callable) -> Verdict:
    """The driver of every "build it" exercise (DDP, ZeRO-1/2/3): refuse a non-class, then
    run ``rank_fn(cls, *args)`` on 2, 3 and 4 gloo ranks (30 s each) and print one line
    per world size: ``N gloo ranks on CPU: not yet: rank R: <the first problem>``
    (:func:`first_problem`) or ``N gloo ranks on CPU: right: <right(values)>``."""
    if (refused := refuse_non_class(cls, name, example)) is not None:
        return refused
    from .model import warm_up

    from ..runtime.launch import where

    warm_up()
    all_right = True
    for n, values in (runs := on_world_sizes(rank_fn, (2, 3, 4), cls, *args, timeout_s=30, quiet=True)):
        label = where(n, GRADER_BACKEND, backend_first=True)
        first = first_problem(values)
        if first:
            print(f"{label}: not yet: rank {first[0]}: {first[1]}")
            all_right = False
            continue
        print(f"{label}: right: {right(values)}")
    return Verdict(name, all_right and runs.completed)
