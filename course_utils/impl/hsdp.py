"""Hybrid sharding (HSDP): FSDP inside a group of ranks, plain data parallelism across groups.

Taught in ``notebooks/08_beyond_one_box.ipynb``; the strategy ``"torch-hsdp"``: ``"torch-fsdp"``
(:mod:`course_utils.impl.fsdp`) on a **2-D device mesh** ``(replicas, shards)``, dims
``("replicate", "shard")``. Each parameter is sharded over the ``shards`` ranks of its mesh
row (the *shard group*: one node's GPUs, fast links), which all-gather parameters and
reduce-scatter gradients; each gradient shard is then all-reduced across the ``replicas``
ranks holding the same shard (the *replicate group*, one rank per node: the only traffic on
the slow inter-node links). ``run("torch-hsdp", 4)`` is 2 replicas x 2 shards
(:data:`DEFAULT_SHARDS`: pretend nodes of 2 ranks); on 2 ranks ``shards=2`` is FSDP (FSDP2
still all-reduces, over 1-rank groups: 0 bytes), ``shards=1`` DDP-like (one all-reduce per unit).
Predictions: :mod:`course_utils.theory.sharding`; time across nodes:
:mod:`course_utils.theory.multinode`; measurements: :mod:`course_utils.labs.hsdp_lab`.
"""
from __future__ import annotations

from ..checks import require_process_group
from ..theory.sharding import DEFAULT_SHARDS
from .fsdp import make_mesh, wrap_fsdp2

__all__ = ["wrap_torch_hsdp"]


def wrap_torch_hsdp(model, make_optimizer, *, shards: int = DEFAULT_SHARDS,
                    reshard_after_forward: bool = True, group=None, unit_types=None):
    """The ``"torch-hsdp"`` strategy: ``"torch-fsdp"`` on the 2-D mesh of :func:`make_mesh`
    (``world_size/shards`` replicas x ``shards`` shards) over all ranks, hence no ``group``."""
    if group is not None:
        raise ValueError("torch-hsdp builds its own 2-D mesh over all ranks; call it without group=")
    require_process_group("torch-hsdp")
    mesh = make_mesh(next(model.parameters()).device.type, shards=shards)
    return wrap_fsdp2(model, make_optimizer, reshard_after_forward=reshard_after_forward,
                      mesh=mesh, unit_types=unit_types)
