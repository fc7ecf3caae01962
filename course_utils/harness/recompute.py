"""torch's op-level selective activation checkpointing with torchtitan's policy (appendix 09 §7
writes it out): the ``context_fn`` whose kept bytes ``theory.memory.op_selective_terms`` counts,
used by tests/test_activations.py on CPU and by ``make gpu-check`` on a GPU."""
from __future__ import annotations

from collections import Counter

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..checks import check_int
from ..runtime.compat import functional_reduce_scatter_op

__all__ = ["save_list", "sac_context"]


def save_list() -> set:
    """torchtitan's ``_save_list`` (9dec370, torchtitan/parallelisms/parallelize_llama.py l. 214-223)
    plus the CPU's flash kernel, which a CPU runs in its place."""
    aten = torch.ops.aten
    return {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            functional_reduce_scatter_op(), aten.abs.default, aten.max.default}


def sac_context(every: int = 2):
    """torchtitan's ``_custom_policy`` (l. 250-270 there) with every ``every``-th ``aten.mm`` saved
    (torchtitan: 2; 1 saves them all): the pair of contexts for ``checkpoint(..., context_fn=)``."""
    check_int("every", every, minimum=1)
    mm, keep, count = torch.ops.aten.mm.default, save_list(), Counter()

    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        count[mode] += op == mm
        save = op in keep and not (op == mm and (count[mode] - 1) % every)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)
