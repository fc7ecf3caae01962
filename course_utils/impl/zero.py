"""ZeRO-1 and ZeRO-2, one import: :class:`Zero1` (:mod:`course_utils.impl.zero1`, notebook 04),
:class:`Zero2` (:mod:`course_utils.impl.zero2`, notebook 05's build), their options as mixins, and
:func:`zero_optimizer`, which puts a stage and its options together.
"""
from __future__ import annotations

import functools

from ..checks import check_int
from .common import DEFAULT_BUCKET_BYTES
from .zero1 import AllReduceGradients, BF16Master, MixedZero1, Zero1, ZeroBucket
from .zero2 import SendAfterBackward, Zero2

__all__ = ["Zero1", "Zero2", "ZeroBucket", "zero_optimizer", "AllReduceGradients",
           "SendAfterBackward", "BF16Master", "MixedZero1", "VARIANTS", "DEFAULT_BUCKET_BYTES"]

#: How ZeRO-1 reduces the gradients: a reduce-scatter, or an all-reduce then keep a slice.
VARIANTS = ("reduce_scatter", "allreduce")


@functools.cache
def _with(base: type, *mixins: type) -> type:
    return type("".join(m.__name__ for m in mixins) + base.__name__, (*mixins, base), {}) if mixins else base


def zero_optimizer(params, optimizer_class, *, stage: int = 1, bucket_bytes=DEFAULT_BUCKET_BYTES,
                  variant: str = "reduce_scatter", mixed: bool = False, overlap: bool = True, group=None,
                  observers: tuple = (), **defaults):
    """:class:`Zero1` (``stage=1``) or :class:`Zero2`, with the options' mixins (``observers``:
    more mixins in front, e.g. one that measures from outside)."""
    check_int("stage", stage, 1, 2, what="ZeRO-3 is course_utils.impl.zero3")
    if variant not in VARIANTS or (variant == "allreduce" and stage != 1):
        raise ValueError(f"variant must be one of {VARIANTS} ('allreduce': ZeRO-1 only), got {variant!r}")
    mixins = [m for m, on in ((AllReduceGradients, variant == "allreduce"), (BF16Master, mixed),
                              (SendAfterBackward, stage == 2 and not overlap)) if on]
    cls = _with(Zero1 if stage == 1 else Zero2, *observers, *mixins)
    return cls(params, optimizer_class, bucket_bytes, group=group, **defaults)
