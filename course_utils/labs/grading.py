"""The grading engine of every exercise: run the learner's function on several world sizes
(a hard-coded answer fails), print one line per world size, return a :class:`Verdict`, never
raise on a wrong answer. Always gloo on the CPU (:data:`GRADER_BACKEND`), even with GPUs: a
learner's tensor made without a device must be graded, not rejected by NCCL.
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Sequence

from ..runtime.fmt import num as _num
from ..runtime.fmt import plural
from ..runtime.fmt import show as _show
from ..runtime.launch import LaunchError, LaunchTimeout, launch

__all__ = ["GRADER_BACKEND", "Verdict", "compare", "compare_brief", "brief", "launch_or_report", "on_world_sizes",
           "refuse_non_function", "report_problems", "error_hint", "GLOO_ABORT", "GLOO_CRASH", "graded_on_rank", "report_ranks", "judge_on_ranks",
           "grade_on_ranks", "grade_cases", "first_problem", "carried_over", "PASSED", "grade_build"]


def compare(got, expected, *, atol: float = 1e-6) -> str:
    """'' when ``got`` matches ``expected`` (numbers or tensors, within atol), else why not."""
    import torch
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"got {_show(got)}, expected a tensor {_show(expected)}"
        if got.shape != expected.shape:
            return f"got shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        same = torch.allclose(got.double(), expected.double(), atol=atol, rtol=0)
    elif isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        same = not isinstance(got, bool) and isinstance(got, (int, float)) and abs(got - expected) <= atol
    else:
        same = got == expected
    return "" if same else f"got {_show(got)}, expected {_show(expected)}"


#: How many values of a tensor a grader's line shows.
BRIEF_VALUES = 5


def _window(flat, start: int) -> str:
    stop = min(flat.numel(), start + BRIEF_VALUES)
    items = [f"{x:.0f}" if float(x).is_integer() else _num(x) for x in flat[start:stop].tolist()]
    return "[" + ", ".join(["…"] * (start > 0) + items + ["…"] * (stop < flat.numel())) + "]"


def brief(value) -> str:
    """A value in one line: a tensor as its first :data:`BRIEF_VALUES` values (and shape)."""
    import torch
    if isinstance(value, torch.Tensor) and value.numel() > 1:
        shape = f", shape={tuple(value.shape)}" if value.dim() > 1 else ""
        return f"tensor({_window(value.detach().reshape(-1).double().cpu(), 0)}{shape})"
    return _show(value)


def compare_brief(got, expected, *, atol: float) -> str:
    """:func:`compare`, in a few values from just before the first element that differs."""
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


#: What a rank killed by signal 6 (SIGABRT) usually means in a grader's gloo ranks.
GLOO_ABORT = ("gloo aborted it (signal 6): this usually means the ranks called collectives whose sizes or "
              "order differ (e.g. a bucket order that differs between ranks)")
#: A grader's rank runs only Python and collectives: a segmentation fault there is gloo reading a
#: message of another size than it expected, as after an abort.
GLOO_CRASH = ("it crashed inside gloo (signal 11, a segmentation fault): this usually means the ranks called "
              "collectives whose sizes or order differ (e.g. a bucket order that differs between ranks)")

#: What gloo's own errors of a mismatched collective usually mean (a peer sent another size, or
#: closed its connection when it aborted on one): said whichever rank reports first.
_MISMATCH = ("gloo saw the ranks disagree: this usually means the ranks called collectives whose sizes or "
             "order differ (e.g. a bucket order that differs between ranks)")

#: A hint for an error that names no mistake of its own: (words in the message, hint).
_HINTS = (("process group has not been initialized",
           "the process group was destroyed while the grader still ran: leave it to the launcher "
           "(a __del__ or cleanup that calls dist.destroy_process_group()?)"),
          ("a gradient arrived twice in one backward",
           "with every parameter used once per backward: the hooks' state (self.ready, self.queued) was "
           "not reset at the end of _finish, for the next backward"),
          ("op.preamble.length", _MISMATCH),
          ("Connection closed by peer", _MISMATCH),
          ("Connection reset by peer", _MISMATCH),
          ("'NoneType' object has no attribute 'wait'",
           "a Work that is None: a collective called without async_op=True waits at once and returns None, "
           "or a Work already waited for and cleared is waited for again"))


def error_hint(message: str) -> str:
    """`` (<hint>)`` for an error message that :data:`_HINTS` explains, else ''."""
    return next((f" ({hint})" for words, hint in _HINTS if words in message), "")


def _hang_lines(exc: LaunchTimeout) -> list[str]:
    """One line per hung rank: the collective it waits in, or that it still runs (an endless
    loop), and the learner's frame it is in; then one line of advice."""
    from .frames import collective_of, describe, frames_of, in_torch, learner_frame
    lines, looping, waiting, returned = [], [], {}, []
    for rank, stack in sorted(exc.stacks.items()):
        frames = frames_of(stack, innermost_first=True)
        if rank in exc.results or (frames and all(in_torch(f.file) for f in frames)):   # the launcher's barrier
            returned.append(rank)
            lines.append(f"  rank {rank}: had returned; waited for the others at the end")
            continue
        if not frames:
            continue
        mine, collective = learner_frame(frames), collective_of(frames)
        at = f" at {describe(mine)}" if mine else ""
        if collective and rank not in exc.moving:
            waiting[rank] = collective = "a Work's wait()" if collective == "wait" else collective
            lines.append(f"  rank {rank}: waiting in {collective}" + (f", called{at}" if mine else
                                                                   " (the grader's own, after your code)"))
        elif rank in exc.moving or (mine is frames[0] and not exc.cpu_measured):
            looping.append(rank)
            lines.append(f"  rank {rank}: still running" + (f" your code{at}" if mine else
                                                             f" in {frames[0].func}"))
        else:
            lines.append(f"  rank {rank}: stopped" + (at or f" in {frames[0].func}") +
                         ", not using the CPU (sleeping, or waiting for something?)")
    ranks = lambda rs: ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))  # noqa: E731
    if looping:
        lines.append(f"  {ranks(looping[:1])} never stopped running your code: an endless loop?"
                     + (" (the others wait for it in a collective)" if waiting else ""))
    elif waiting and returned:
        lines.append(f"  {ranks(list(waiting))} {'waits' if len(waiting) == 1 else 'wait'} in a collective that "
                     f"{ranks(returned)} never called (it returned): every rank must call the same collectives")
    elif len(set(waiting.values())) > 1:
        lines.append("  The ranks wait in different collectives: every rank must call the same collectives in "
                     "the same order (does a condition, a count or a loop differ between ranks?)")
    elif waiting and set(waiting.values()) == {"broadcast"}:
        lines.append("  Every rank waits in broadcast: a broadcast needs the same src on every rank (rank src "
                     "sends, the others receive)")
    elif waiting:
        lines.append("  The ranks wait for one another: do all ranks call the same collectives, in the same "
                     "order, the same number of times?")
    return lines


def launch_or_report(fn: Callable, world_size: int, *args, timeout_s: float, quiet: bool = False,
                     finished: Callable[[dict], str] | None = None):
    """``launch`` on gloo CPU ranks; a failed or hung rank: a few lines printed (the exception
    or the collective it waits in, and where in the learner's code), None returned.
    ``finished(values by rank)``: for a hang, what the ranks that did return found ('' if nothing)."""
    from .frames import describe, frames_of, learner_frame
    label = plural(world_size, "rank")
    try:
        return launch(fn, world_size, *args, backend=GRADER_BACKEND, timeout_s=timeout_s, quiet=quiet)
    except LaunchTimeout as exc:
        found = finished(exc.results) if finished is not None and exc.results else ""
        print(f"{label}: never finished within {timeout_s:g} s (stopped)"
              + (f"; meanwhile {found}" if found else "") + ":")
        lines = _hang_lines(exc)
        print("\n".join(lines) if lines else
              "  Do all ranks call the same collectives in the same order?")
    except LaunchError as exc:
        if exc.exc_type is None:     # killed by a signal (e.g. gloo aborted it): no Python error
            if exc.signal in (6, 11):
                print(f"{label}: rank {exc.rank} was killed: {GLOO_ABORT if exc.signal == 6 else GLOO_CRASH}")
            else:
                print(f"{label}: {str(exc).splitlines()[0]}")
        else:
            message = str(exc).splitlines()[0].split(": ", 1)[-1]
            mine = learner_frame(frames_of(exc.rank_traceback, innermost_first=False))
            print(f"{label}: rank {exc.rank} raised {exc.exc_type}: {message}{error_hint(message)}"
                  + (f"\n  at {describe(mine)}" if mine else ""))
    return None


class on_world_sizes:
    """Yields ``(n, values)`` for each world size whose ranks all returned
    (:func:`launch_or_report`); ``completed`` is False when one failed or hung, and the
    world sizes after it are not tried (one timeout, not one per world size)."""

    def __init__(self, rank_fn: Callable, world_sizes: Sequence[int], *args, timeout_s: float,
                 quiet: bool = False, finished: Callable[[dict], str] | None = None):
        self.rank_fn, self.world_sizes, self.args, self.timeout_s = rank_fn, world_sizes, args, timeout_s
        self.quiet, self.finished = quiet, finished
        self.completed = True

    def __iter__(self):
        for i, n in enumerate(self.world_sizes):
            values = launch_or_report(self.rank_fn, n, *self.args, timeout_s=self.timeout_s,
                                      quiet=self.quiet, finished=self.finished)
            if values is None:
                self.completed = False
                rest = list(self.world_sizes[i + 1:])
                if rest:
                    print(f"  (not tried on {' and '.join(map(str, rest))} ranks after that)")
                return
            yield n, values


@contextlib.contextmanager
def dist_replaced(replacements: dict):
    """While entered, ``torch.distributed.<name>`` is ``replacements[name]``; on exit (an exception
    included) each original is back. How a grader forbids, spies on or delays a learner's collectives."""
    import torch.distributed as dist
    saved = {name: getattr(dist, name) for name in replacements}
    try:
        for name, replacement in replacements.items():
            setattr(dist, name, replacement)
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def dist_wrapped(names: Sequence[str], wrap: Callable):
    """``dist_replaced`` with each of ``names`` (those this torch has) as ``wrap(the original)``."""
    import torch.distributed as dist
    return dist_replaced({name: wrap(getattr(dist, name)) for name in names if hasattr(dist, name)})


def refuse_non_function(fn, name: str, signature: str = "") -> Verdict | None:
    """A failed :class:`Verdict` (and one line why) when ``fn`` is not callable, else None."""
    if callable(fn):
        return None
    print(f"{name} should be a function{' ' + signature if signature else ''}, got {type(fn).__name__}: "
          "define it with def, then check it.")
    return Verdict(name, False)


def report_problems(label: str, problems: list, right: str) -> bool:
    """Print ``label: not yet: <problems>`` or ``label: right: <right>``; True when right."""
    print(f"{label}: not yet: {'; '.join(problems)}" if problems else f"{label}: right: {right}")
    return not problems


def report_ranks(label: str, findings) -> bool:
    """Print one line from per-rank ``(why, detail)`` (``why`` '' when right): ``label:
    right: every rank <detail>`` or ``label: not yet: rank R: <why> (k of n ranks differ)``."""
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
    """Run ``rank_fn(*args)`` on each world size; one :func:`report_ranks` line each from
    ``judge(value, rank, world_size) -> (why, detail)``."""
    from ..runtime.launch import where
    runs = on_world_sizes(rank_fn, world_sizes, *args, timeout_s=timeout_s, quiet=True)
    rights = [report_ranks(where(n, GRADER_BACKEND, backend_first=True),
                           [judge(value, rank, n) for rank, value in enumerate(values)]) for n, values in runs]
    return Verdict(name, all(rights) and runs.completed)


def grade_on_ranks(fn: Callable, expected: Callable[[int, int], object], *,
                   world_sizes: Sequence[int] = (2, 4), name: str = "your function",
                   args: tuple = (), atol: float = 1e-6, timeout_s: float = 30) -> Verdict:
    """Run ``fn(*args)`` on each world size; compare rank r's value with ``expected(r, n)``."""
    if (refused := refuse_non_function(fn, name)) is not None:
        return refused

    def judge(value, rank, n):
        return compare_brief(value, expected(rank, n), atol=atol), f"returned {brief(value)}"

    return judge_on_ranks(fn, judge, world_sizes=world_sizes, name=name, args=args, timeout_s=timeout_s)


#: How many wrong cases :func:`grade_cases` shows (the rest are counted in one line).
SHOWN_WRONG_CASES = 2


def grade_cases(fn: Callable, cases: Sequence[dict], expected: Callable[..., object], *,
                name: str = "your function", rel: float = 1e-9) -> Verdict:
    """Call ``fn(**case)`` for each case; compare with ``expected(**case)``. Prints every
    right case, or the first :data:`SHOWN_WRONG_CASES` wrong ones; then ``k of n cases right``."""
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


def carried_over(problem: str, step: int, why: str = "state not reset? gradients not zeroed?") -> str:
    """``problem``, found at ``step`` (from 0) after the earlier steps matched one process, said
    so: something carried over. Left as it is when about that step by design (``"step …"``: an
    LR changed after step 1) or an exception."""
    if not problem or not step or problem.startswith("step ") or " raised " in problem:
        return problem
    return (f"step 1 matched one process; step {step + 1} did not: {problem}: something from an "
            f"earlier step carried over ({why})")


def first_problem(values) -> tuple | None:
    """``(rank, problem)`` to show from per-rank lists of ``(problem or '', seen)``: a
    constructor's problem first (it causes the rest), a rank's parameters or losses that differ
    from one process's last (a consequence: another rank may say why); None when none."""
    problems = [(r, p) for r, per in enumerate(values) for p, _ in per if p]
    causes = [(r, p) for r, p in problems if p.startswith("after construction") or " raised " in p]
    consequences = [(r, p) for r, p in problems if _CONSEQUENCE.search(p)]
    return (causes or [rp for rp in problems if rp not in consequences] or problems or [None])[0]


#: A problem that another rank's may explain: parameters or losses off after a step.
_CONSEQUENCE = re.compile(r"^(after step \d+, \S+ differs from one process|the losses differ from one process)")


#: The class that last passed each build exercise in this kernel (``"zero1"`` -> your MyZero1).
PASSED: dict = {}


#: Words of a rank's error that a peer caused (it hung or died): not the learner's mistake.
_CONSEQUENCES = ("Timed out waiting", "Connection closed by peer", "Connection reset", "Broken pipe")


def _returned(values: dict) -> str:
    """For a hang: what the ranks that returned found (their :func:`first_problem`), or ''."""
    per_rank = [values.get(r, []) for r in range(max(values) + 1)]
    try:          # a rank's collective that timed out while a peer hung: a consequence, not shown
        first = first_problem([[(p, seen) for p, seen in per if not any(w in p for w in _CONSEQUENCES)]
                               for per in per_rank])
    except (TypeError, ValueError):      # not a build's [(problem, seen)]
        return ""
    return f"rank {first[0]} returned: {first[1]}" if first else ""


#: What :func:`graded_on_rank` says when the process group is gone once the learner's objects are.
GROUP_GONE = ("once the grader dropped your objects, the process group was gone: something (a __del__?) "
              "called dist.destroy_process_group(); leave the process group to the launcher")


def graded_on_rank(rank_fn: Callable, cls, *args) -> list:
    """``rank_fn(cls, *args)``, then the learner's objects collected (``gc``): a class whose
    ``__del__`` destroys the process group is found here, not by chance in a later exercise."""
    import gc

    import torch.distributed as dist
    values = list(rank_fn(cls, *args))
    gc.collect()
    if not dist.is_initialized():
        values.append((GROUP_GONE, {}))
    return values


def grade_build(name: str, example: str, cls, rank_fn: Callable, *args, right: Callable,
                timeout_s: float = 30, world_sizes: Sequence[int] = (2, 3, 4)) -> Verdict:
    """The driver of every "build it" exercise: ``rank_fn(cls, *args)`` on 2, 3 and 4 gloo
    ranks, one line each: the :func:`first_problem` or ``right: <right(values)>``; a class that
    passes (on every world size) is noted in :data:`PASSED`. A world size that raised or hung
    (``timeout_s``) is the last tried; ``world_sizes``: fewer, for tests."""
    if not isinstance(cls, type):
        check = f"check_{name.split(',')[0]}"
        print(f"{check} takes your class (e.g. {check}({example})), got {type(cls).__name__}")
        return Verdict(name, False)
    from ..runtime.launch import where
    from ..harness.model import warm_up
    warm_up()
    rights = []
    runs = on_world_sizes(graded_on_rank, tuple(world_sizes), rank_fn, cls, *args, timeout_s=timeout_s, quiet=True,
                          finished=_returned)
    for n, values in runs:
        first = first_problem(values)   # right(values) only when there is none
        rights.append(report_problems(where(n, GRADER_BACKEND, backend_first=True),
                                      [f"rank {first[0]}: {first[1]}"] if first else [], first or right(values)))
    PASSED.pop(name, None)
    if all(rights) and runs.completed and set(world_sizes) >= {2, 3, 4}:
        PASSED[name] = cls
    return Verdict(name, name in PASSED)
