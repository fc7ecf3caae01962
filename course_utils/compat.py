"""One spelling of the flat-buffer collectives for every torch the course supports.

Used by every piece of course code that gathers or reduce-scatters one flat tensor
(the collectives of notebook 01, the ZeRO and FSDP code of notebooks 04-07). torch 2.13
renamed the two
collectives that work on one flat tensor and deprecated the old names (a
``FutureWarning`` on every call)::

    torch >= 2.13                          torch 2.6 - 2.12
    dist.all_gather_single(out, inp)       dist.all_gather_into_tensor(out, inp)
    dist.reduce_scatter_single(out, inp)   dist.reduce_scatter_tensor(out, inp)

The package supports ``torch >= 2.6``, so course code calls :func:`all_gather_into_tensor`
and :func:`reduce_scatter_tensor` from here: they call the new name when torch has it
(no warning) and the old one otherwise. The functions are looked up on
``torch.distributed`` at call time, so a :class:`~course_utils.comm.CommLedger`
that is recording sees the call.

Shapes: ``output`` of ``all_gather_into_tensor`` holds ``world_size`` times the
elements of ``input`` (concatenated along dim 0); ``input`` of
``reduce_scatter_tensor`` holds ``world_size`` times the elements of ``output``. With
gloo, pad flat buffers to a multiple of the world size: uneven sizes fail.
"""
from __future__ import annotations

import torch.distributed as dist

__all__ = ["all_gather_into_tensor", "reduce_scatter_tensor", "HAS_SINGLE_NAMES"]

#: True when this torch has ``all_gather_single`` / ``reduce_scatter_single`` (2.13+).
HAS_SINGLE_NAMES = hasattr(dist, "all_gather_single") and hasattr(dist, "reduce_scatter_single")


def all_gather_into_tensor(output, input, group=None, async_op=False):
    """Gather every rank's ``input`` into ``output`` (rank r's part at ``r*input.numel()``).

    ``torch.distributed.all_gather_single`` where it exists, else
    ``all_gather_into_tensor``. Returns a work handle when ``async_op=True``, else None.
    """
    if HAS_SINGLE_NAMES:
        return dist.all_gather_single(output, input, group=group, async_op=async_op)
    return dist.all_gather_into_tensor(output, input, group=group, async_op=async_op)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input`` (``world_size`` chunks) over the ranks; rank r gets chunk r in ``output``.

    ``torch.distributed.reduce_scatter_single`` where it exists, else
    ``reduce_scatter_tensor``. Returns a work handle when ``async_op=True``, else None.
    """
    if HAS_SINGLE_NAMES:
        return dist.reduce_scatter_single(output, input, op=op, group=group, async_op=async_op)
    return dist.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)
