"""Every difference between the torch versions the course supports, in one place.

- The oldest torch it runs on (:data:`MIN_TORCH`; importing ``course_utils`` on an older
  one raises one sentence naming the torch to install).
- FSDP2's own data parallelism, ``replicate``, private and with a different signature
  across versions (:func:`fsdp2_replicate`).
- One spelling of the flat-buffer collectives, used by every piece of course code that
  gathers or reduce-scatters one flat tensor (the collectives of notebook 01, the ZeRO
  and FSDP code of notebooks 04-07). torch 2.13 renamed them and deprecated the old
  names (a ``FutureWarning`` on every call)::

    torch >= 2.13                          torch 2.10 - 2.12
    dist.all_gather_single(out, inp)       dist.all_gather_into_tensor(out, inp)
    dist.reduce_scatter_single(out, inp)   dist.reduce_scatter_tensor(out, inp)

Course code calls :func:`all_gather_into_tensor` and :func:`reduce_scatter_tensor`
from here: they call the new name when torch has it
(no warning) and the old one otherwise. The functions are looked up on
``torch.distributed`` at call time, so a :class:`~course_utils.comm.CommLedger`
that is recording sees the call.

Shapes: ``output`` of ``all_gather_into_tensor`` holds ``world_size`` times the
elements of ``input`` (concatenated along dim 0); ``input`` of
``reduce_scatter_tensor`` holds ``world_size`` times the elements of ``output``. With
gloo, pad flat buffers to a multiple of the world size: uneven sizes fail.
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist

__all__ = ["all_gather_into_tensor", "reduce_scatter_tensor", "HAS_SINGLE_NAMES",
           "ALL_GATHER_NAME", "REDUCE_SCATTER_NAME", "fsdp2_replicate",
           "MIN_TORCH", "require_supported_torch"]

#: The oldest torch the course runs on (README, "Where it runs"). Measured on CPU/gloo:
#: 2.10 passes every test and notebook; on 2.9 FSDP2's ``replicate`` and sharded
#: gradient clipping differ, and on 2.7 FSDP2 reduces with ``ReduceOp.AVG``, which gloo
#: lacks, so its gradients come out N times too large, silently.
MIN_TORCH = (2, 10)


def require_supported_torch(version: str | None = None) -> None:
    """Raise ``ImportError`` naming the torch to install when ``version`` (default: this
    torch's) is older than :data:`MIN_TORCH`; a version string it cannot read passes."""
    version = torch.__version__ if version is None else version
    if not isinstance(version, str):
        raise TypeError(f"version must be a string like '2.10.0', got {type(version).__name__}")
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and (int(found[1]), int(found[2])) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"ZeRO to FSDP needs torch >= {need}, and this is torch {version}: "
            f"run `pip install 'torch>={need}'` and restart the kernel.")


#: True when this torch has ``all_gather_single`` / ``reduce_scatter_single`` (2.13+).
HAS_SINGLE_NAMES = hasattr(dist, "all_gather_single") and hasattr(dist, "reduce_scatter_single")
#: The names of the two flat-tensor collectives on this torch (what a traceback shows).
ALL_GATHER_NAME = "all_gather_single" if HAS_SINGLE_NAMES else "all_gather_into_tensor"
REDUCE_SCATTER_NAME = "reduce_scatter_single" if HAS_SINGLE_NAMES else "reduce_scatter_tensor"


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


def fsdp2_replicate(modules, group=None) -> bool:
    """Apply FSDP2's own data parallelism (``replicate``) to each of ``modules``, in order,
    over ``group`` (default: all ranks); False, changing nothing, where this torch has none.

    ``replicate`` lives in the private
    ``torch.distributed._composable.replicate_with_fsdp`` (torch >= 2.9). Its mesh is 1-D
    and named ``("replicate",)``, as torch 2.13 names the mesh it builds itself; torch 2.10
    refuses an unnamed one.
    """
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError:
        return False
    from torch.distributed.device_mesh import DeviceMesh

    modules = list(modules)
    device_type = next(modules[-1].parameters()).device.type    # cpu on gloo ranks
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device_type,
                                 mesh_dim_names=("replicate",))
    for module in modules:
        replicate(module, mesh=mesh)
    return True
