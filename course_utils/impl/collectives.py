"""All-reduce built from the two collectives ZeRO and FSDP are made of.

Taught in ``notebooks/01_collectives.ipynb``; the demos of every collective on live ranks
are :mod:`course_utils.labs.collectives_lab`.
"""
from __future__ import annotations

__all__ = ["all_reduce_via_rs_ag"]


def all_reduce_via_rs_ag(tensor):
    """The all-reduce (sum) of ``tensor``, built from a reduce-scatter and an all-gather.

    Pad with zeros to a multiple of the world size (zeros do not change a sum),
    reduce-scatter so each rank owns the sum of one chunk, all-gather the chunks, strip the
    padding. Returns a new tensor of the same shape. Call it on every rank.
    """
    import torch
    import torch.distributed as dist

    from ..runtime.compat import all_gather_into_tensor, reduce_scatter_tensor
    from ..theory.layout import padded_numel

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    n = dist.get_world_size()
    numel = tensor.numel()
    padded = torch.zeros(padded_numel(numel, n), dtype=tensor.dtype, device=tensor.device)  # n equal chunks
    chunk = padded.numel() // n
    padded[:numel] = tensor.reshape(-1)
    mine = torch.empty(chunk, dtype=tensor.dtype, device=tensor.device)
    reduce_scatter_tensor(mine, padded)           # mine = sum over ranks of my chunk
    gathered = torch.empty_like(padded)
    all_gather_into_tensor(gathered, mine)        # every chunk, on every rank
    return gathered[:numel].reshape(tensor.shape)
