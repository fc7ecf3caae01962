"""Argument checks shared by the whole package: bad input gets a ``TypeError`` or
``ValueError`` that names the argument and what to pass instead.

One place, so every function of the course words the same mistake the same way.
"""
from __future__ import annotations

import math
from numbers import Integral, Real

__all__ = ["is_int", "is_number", "check_int", "check_choice", "check_bool", "check_number", "check_positive",
           "check_timeout", "check_module", "require_process_group", "distributed"]


def is_int(value) -> bool:
    """An integer and not a bool (``True`` is an int to Python, never a count to the course)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number and not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None, *,
              what: str = "") -> None:
    """``value`` is an int (not a bool) within ``[minimum, maximum]``; ``what`` says what
    the number counts, in the message."""
    what = f" ({what})" if what else ""
    if not is_int(value):
        raise TypeError(f"{name} must be an int{what}, got {type(value).__name__}")
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"{name} must be between {minimum} and {maximum}{what}, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}{what}, got {value}")


def check_choice(name: str, value, choices, *, kind: str, kinds: str) -> None:
    """``value`` is one of the strings ``choices``; the messages name a ``kind`` of thing
    (e.g. ``"strategy"``, plural ``"strategies"``) and list the known ones."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str such as {next(iter(choices))!r}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; known {kinds}: {', '.join(choices)}")


def check_bool(name: str, value) -> None:
    """``value`` is True or False (not 0/1, not None)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_number(name: str, value, *, minimum=None, above=None, maximum=None, example: str = "") -> float:
    """``value`` is a finite real number (not a bool), ``>= minimum``, ``> above``,
    ``<= maximum`` where given; ``example`` is quoted in the message."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number{f' such as {example}' if example else ''}, "
                        f"got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    hint = f" (e.g. {example})" if example else ""
    if above is not None and not value > above:
        raise ValueError(f"{name} must be > {above}{hint}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}{hint}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return value


def check_positive(name: str, value) -> None:
    """``value`` is a finite real number > 0 (a ``ValueError`` whatever is wrong)."""
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def check_timeout(timeout_s) -> None:
    if not is_number(timeout_s) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")


def check_module(name: str, value, *, what: str = ""):
    """``value`` is a ``torch.nn.Module`` (``what``: which one, in the message); returns it."""
    from torch import nn

    if not isinstance(value, nn.Module):
        what = f" ({what})" if what else ""
        raise TypeError(f"{name} must be an nn.Module{what}, got {type(value).__name__}")
    return value


def distributed() -> bool:
    """Whether ``torch.distributed`` is initialised in this process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def require_process_group(what: str) -> None:
    """``RuntimeError`` unless ``torch.distributed`` is initialised: ``what`` runs on ranks."""
    if not distributed():
        raise RuntimeError(f"{what} needs torch.distributed initialised: run it inside "
                           "course_utils.launch.launch(fn, N) or a %%ranks cell")
