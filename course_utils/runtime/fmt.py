"""Printing measured numbers so that a notebook shows the same text on every machine.

fp32 results differ in their last digits between machines (vector unit, threads, BLAS
change the order of sums: ``4.476453`` here, ``4.476452`` there). So notebooks print ints
exactly; a measured float at :data:`SIG` digits, thousands of times coarser than that noise
(~2e-7 relative; at 4 digits three course values printed differently across machines); a
near-zero difference as the bound it meets (``≤ 1e-6 ✓``); tensor equality as a boolean.
The exact checks live in the tests. :func:`fmt_bytes` and :func:`table` live in
``theory/text.py`` so that ``theory`` can use them too.
"""
from __future__ import annotations

import math
import operator

from ..theory.text import fmt_bytes, table

__all__ = ["fmt_bytes", "table", "SIG", "LOSS_RTOL", "GRAD_ATOL", "num", "nums", "sci", "bound", "above", "near", "ratio",
           "losses_match", "max_abs_diff", "max_rel_diff", "show", "plural"]

#: Significant digits of a measured float (a loss, a norm) in a notebook's output.
SIG = 3

#: Largest relative difference between two fp32 runs of the same training that differ
#: only in how sums are split (ranks, buckets, shards): the course's "same losses".
LOSS_RTOL = 1e-6

#: Largest absolute difference between two fp32 gradients of the course GPT that differ
#: only in how sums are split (accumulation, ranks): measured up to ~5e-8.
GRAD_ATOL = 1e-6


def _check_real(name: str, value) -> float:
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        return float(value)            # also a 0-d tensor, a numpy scalar
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from None


def num(x, sig: int = SIG) -> str:
    """``num(4.4764528) == "4.48"``; a rounded value keeps trailing zeros (``"30.0"``), an exact one none (``"1.5"``)."""
    x = _check_real("x", x)
    if isinstance(sig, bool) or not isinstance(sig, int) or sig < 1:
        raise ValueError(f"sig must be an int >= 1, got {sig!r}")
    short = f"{x:.{sig}g}"
    if not math.isfinite(x) or float(short) == x:
        return short
    text = f"{x:#.{sig}g}"
    return text[:-1] if text.endswith(".") else text


def nums(xs, sig: int = SIG) -> str:
    """A list of floats at ``sig`` significant digits: ``"[4.63, 4.56, 4.48]"``."""
    return "[" + ", ".join(num(x, sig) for x in xs) + "]"


def sci(x) -> str:
    """A limit in short scientific notation: ``sci(1e-6) == "1e-6"``, ``sci(0.5) == "0.5"``."""
    x = _check_real("x", x)
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:g}"
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def bound(value, limit) -> str:
    """``"≤ 1e-6 ✓"`` when ``value <= limit`` (the same text on every machine), else the value and a cross."""
    value, limit = _check_real("value", value), _check_real("limit", limit)
    return f"≤ {sci(limit)} ✓" if value <= limit else f"= {value:.2g} > {sci(limit)} ✗"


def above(value, limit=0.0) -> str:
    """``"> 0 ✓"`` when ``value > limit`` (e.g. bf16 does change the losses), else a cross."""
    value, limit = _check_real("value", value), _check_real("limit", limit)
    return f"> {sci(limit)} ✓" if value > limit else f"= {value:.2g} ≤ {sci(limit)} ✗"


def near(value, target, tol) -> str:
    """``"0.5 ± 1e-5 ✓"`` when ``|value - target| <= tol``, else the value and a cross."""
    value, target, tol = _check_real("value", value), _check_real("target", target), _check_real("tol", tol)
    ok = abs(value - target) <= tol
    return f"{sci(target)} ± {sci(tol)} ✓" if ok else f"= {num(value, 7)}, not {sci(target)} ± {sci(tol)} ✗"


def max_abs_diff(losses, reference) -> float:
    """``max |a - b|`` over the pairs of ``losses`` and ``reference``, step by step."""
    return max(abs(a - b) for a, b in zip(losses, reference))


def max_rel_diff(losses, reference) -> float:
    """``max |a - b| / |b|`` over the pairs, step by step (0 where both are 0)."""
    return max(abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf)
               for a, b in zip(losses, reference))


#: What :func:`ratio` prints without a measurement (no socket counters on this OS, or NCCL).
NOT_MEASURED = "n/a (not measured here)"


def ratio(numerator, denominator, digits: int = 2) -> str:
    """``"1.50"``, or :data:`NOT_MEASURED` when either is None or the denominator is 0 (never fails)."""
    return NOT_MEASURED if numerator is None or not denominator else f"{numerator / denominator:.{digits}f}"


def losses_match(losses, reference, rtol: float = LOSS_RTOL) -> str:
    """``"≤ 1e-6 ✓"``: :func:`max_rel_diff` of ``losses`` to ``reference`` as the bound it meets."""
    losses, reference = list(losses), list(reference)
    if len(losses) != len(reference) or not losses:
        raise ValueError(f"need two equally long, non-empty loss lists, got "
                         f"{len(losses)} and {len(reference)}")
    return bound(max_rel_diff(losses, reference), rtol)


def plural(n, noun: str, nouns: str | None = None) -> str:
    """``"1 rank"``, ``"4 ranks"``, ``"2 processes"``; ``nouns``: an irregular plural. Every count the course prints."""
    try:
        if isinstance(n, bool):
            raise TypeError
        n = operator.index(n)              # an int, a numpy or 0-d tensor int; not a float
    except TypeError:
        raise TypeError(f"n must be a count (an int), got {type(n).__name__}") from None
    if not isinstance(noun, str) or not noun.strip():
        raise ValueError(f"noun must be a non-empty str, got {noun!r}")
    if nouns is None:
        nouns = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{n} {noun if n == 1 else nouns}"


def show(value) -> str:
    """A value a rank returned, for a grader: ``tensor([0.0485, 0.398], shape=(2,))``, floats at :data:`SIG` digits."""
    import torch

    def one(x, whole) -> str:
        return num(x) if isinstance(x, float) and not x.is_integer() else whole(x)

    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and value.dim() <= 1:
            return f"tensor({one(value.reshape(-1)[0].item(), lambda x: f'{x:g}')})"
        items = ", ".join(one(x, repr) for x in value.reshape(-1).tolist())
        return f"tensor([{items}], shape={tuple(value.shape)})"
    if isinstance(value, float):
        return one(value, lambda x: f"{x:g}")
    return repr(value)
