"""Auto-graders for the exercises: run the learner's function on real ranks, compare.

Taught in ``notebooks/00_orientation.ipynb``. :func:`grade_on_ranks` is the engine
every ``check_*`` helper uses: it launches the learner's function on N ranks (several
world sizes, so a hard-coded answer fails), compares each rank's return value with the
expected one and prints, per rank, what is right and what differs. It returns True
only when every rank of every world size is right; it never raises on a wrong answer.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .launch import LaunchError, LaunchTimeout, launch

__all__ = ["Verdict", "grade_on_ranks", "compare", "check_rank_sum", "check_gather_squares"]


def _show(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and value.dim() <= 1:
            return f"tensor({value.reshape(-1)[0].item():g})" if value.dim() else f"tensor({value.item():g})"
        return f"tensor({[round(x, 6) for x in value.reshape(-1).tolist()]}, shape={tuple(value.shape)})"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


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


class Verdict:
    """What a ``check_*`` returns: truthy when passed; shows as one line in a notebook."""

    def __init__(self, name: str, passed: bool):
        self.name, self.passed = name, bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"{self.name}: {'PASSED' if self.passed else 'not yet, see the lines above'}"


def grade_on_ranks(fn: Callable, expected: Callable[[int, int], object], *,
                   world_sizes: Sequence[int] = (2, 4), name: str = "your function",
                   args: tuple = (), atol: float = 1e-6, timeout_s: float = 30) -> Verdict:
    """Run ``fn(*args)`` on each world size; compare rank r's value with ``expected(r, n)``.

    Prints one line per rank and per world size; returns a :class:`Verdict`
    (truthy when everything matches).
    """
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}: define it with def, then check it.")
        return Verdict(name, False)
    all_right = True
    for n in world_sizes:
        try:
            values = launch(fn, n, *args, timeout_s=timeout_s)
        except LaunchTimeout as exc:
            print(f"{n} ranks: ranks {exc.rank} and maybe others never finished within {timeout_s:g} s."
                  " Do all ranks call the same collectives in the same order?")
            all_right = False
            continue
        except LaunchError as exc:
            print(f"{n} ranks: rank {exc.rank} raised {exc.exc_type}: "
                  f"{str(exc).splitlines()[0].split(': ', 1)[-1]}")
            all_right = False
            continue
        wrong = 0
        for rank, value in enumerate(values):
            why = compare(value, expected(rank, n), atol=atol)
            if why:
                wrong += 1
                print(f"  rank {rank}: differs: {why}")
            else:
                print(f"  rank {rank}: right ({_show(value)})")
        all_right &= wrong == 0
        print(f"{n} ranks: {'all right' if not wrong else f'{wrong} of {n} ranks differ'}")
    return Verdict(name, all_right)


# ------------------------------------------------------------------ notebook 00

def check_rank_sum(fn: Callable) -> Verdict:
    """Exercise 00.1: every rank returns the sum over ranks of (rank + 1)."""
    return grade_on_ranks(fn, lambda r, n: float(n * (n + 1) // 2),
                          world_sizes=(2, 4), name="rank_sum")


def check_gather_squares(fn: Callable) -> Verdict:
    """Exercise 00.2: every rank returns the tensor [(r + 1)**2 for r in ranks]."""
    import torch

    return grade_on_ranks(
        fn, lambda r, n: torch.tensor([float((i + 1) ** 2) for i in range(n)]),
        world_sizes=(3, 4), name="gather_squares")
