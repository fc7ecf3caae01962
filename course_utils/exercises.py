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

__all__ = ["Verdict", "grade_on_ranks", "grade_cases", "compare", "check_rank_sum", "check_gather_squares",
           "check_bytes_per_gpu", "check_smallest_fitting_stage", "smallest_fitting_stage"]


def _show(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and value.dim() <= 1:
            return f"tensor({value.reshape(-1)[0].item():g})" if value.dim() else f"tensor({value.item():g})"
        return f"tensor({[round(x, 6) for x in value.reshape(-1).tolist()]}, shape={tuple(value.shape)})"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.6g}"
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


def grade_cases(fn: Callable, cases: Sequence[dict], expected: Callable[..., object], *,
                name: str = "your function", rel: float = 1e-9) -> Verdict:
    """Call ``fn(**case)`` for each case; compare with ``expected(**case)``; print per case.

    For exercises that are plain functions (no ranks), e.g. memory arithmetic.
    """
    if not callable(fn):
        print(f"{name} should be a function, got {type(fn).__name__}: define it with def, then check it.")
        return Verdict(name, False)
    wrong = 0
    for case in cases:
        args = ", ".join(f"{k}={v!r}" for k, v in case.items())
        want = expected(**case)
        try:
            got = fn(**case)
        except Exception as exc:  # noqa: BLE001 - report, never raise, on a learner's bug
            wrong += 1
            print(f"  {name}({args}): raised {type(exc).__name__}: {exc}")
            continue
        tol = rel * abs(want) if isinstance(want, (int, float)) and not isinstance(want, bool) else 0
        why = compare(got, want, atol=tol)
        if why:
            wrong += 1
            print(f"  {name}({args}): differs: {why}")
        else:
            print(f"  {name}({args}): right ({_show(got)})")
    print(f"{len(cases) - wrong} of {len(cases)} cases right")
    return Verdict(name, wrong == 0)


# ------------------------------------------------------------------ notebook 03

_BYTES_CASES = [
    dict(num_params=7e9, world_size=4, stage=0), dict(num_params=7e9, world_size=4, stage=1),
    dict(num_params=13e9, world_size=8, stage=2), dict(num_params=7.5e9, world_size=64, stage=3),
    dict(num_params=1.5e9, world_size=3, stage=3), dict(num_params=70e9, world_size=1, stage=2),
]


def check_bytes_per_gpu(fn: Callable) -> Verdict:
    """Exercise 03.1: ``fn(num_params, world_size, stage)`` -> model-state bytes per GPU
    for mixed-precision Adam (2 + 2 + 12 bytes per parameter)."""
    from .memory import model_states

    return grade_cases(fn, _BYTES_CASES,
                       lambda num_params, world_size, stage: model_states(
                           num_params, world_size=world_size, stage=stage).total,
                       name="bytes_per_gpu")


_FIT_CASES = [
    dict(model="llama-2-7b", gpus=4, gpu_gb=80, micro_batch=1, seq=2048),
    dict(model="llama-2-7b", gpus=8, gpu_gb=40, micro_batch=2, seq=2048),
    dict(model="llama-2-13b", gpus=8, gpu_gb=80, micro_batch=1, seq=4096),
    dict(model="llama-2-70b", gpus=8, gpu_gb=80, micro_batch=1, seq=4096),
    dict(model="llama-2-70b", gpus=64, gpu_gb=80, micro_batch=1, seq=1024),
    dict(model="gpt2-xl", gpus=1, gpu_gb=40, micro_batch=4, seq=1024),
]


def smallest_fitting_stage(model: str, gpus: int, gpu_gb: float, micro_batch: int, seq: int):
    """Reference for exercise 03.2: the lowest stage whose per-GPU total (mixed recipe,
    flash attention, no recomputation, no offload) fits in ``gpu_gb`` GB; None if none."""
    from .memory import GB, per_gpu

    for stage in (0, 1, 2, 3):
        m = per_gpu(model, world_size=gpus, stage=stage, micro_batch=micro_batch, seq=seq,
                    attention="flash")
        if m.total <= gpu_gb * GB:
            return stage
    return None


def check_smallest_fitting_stage(fn: Callable) -> Verdict:
    """Exercise 03.2: ``fn(model, gpus, gpu_gb, micro_batch, seq)`` -> 0-3 or None."""
    return grade_cases(fn, _FIT_CASES, smallest_fitting_stage, name="smallest_stage")
