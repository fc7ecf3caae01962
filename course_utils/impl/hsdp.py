"""Hybrid sharding (HSDP): FSDP inside a group of ranks, plain data parallelism across groups.

Taught in ``notebooks/08_beyond_one_box.ipynb``; the strategy ``"torch-hsdp"`` of
:mod:`course_utils.harness.strategies`: ``fully_shard`` per block and then on the root, as
``"torch-fsdp"`` (:mod:`course_utils.impl.fsdp`), but on a **2-D device mesh** of shape
``(replicas, shards)`` with dimension names ``("replicate", "shard")``:

* every parameter is sharded over the ``shards`` ranks of its row of the mesh (the
  *shard group*, meant to be the GPUs of one node, joined by fast links); the rows
  are ``replicas`` identical copies of the sharded model (one per node);
* forward and backward all-gather each unit's parameters inside the shard group and
  reduce-scatter its gradients there;
* each reduce-scattered gradient shard (``1/shards`` of the unit) is then all-reduced
  across the ``replicas`` ranks that hold the same shard (the *replicate group*, one
  rank per node: the only traffic that crosses the slow inter-node links).

``run("torch-hsdp", 4)`` is 2 replicas x 2 shards (:data:`DEFAULT_SHARDS` pretends each
"node" has 2 ranks). On 2 ranks, ``shards=2`` is one replica of 2 shards (FSDP; FSDP2
still issues its replicate all-reduces, on a 1-rank group: 0 bytes) and ``shards=1`` is 2
replicas of an unsharded model (DDP-like: one all-reduce per unit, nothing else).
Predictions: :mod:`course_utils.theory.sharding`; time across nodes:
:mod:`course_utils.theory.multinode`; measurements: :mod:`course_utils.labs.hsdp_lab`.
"""
from __future__ import annotations

from ..checks import require_process_group
# Re-exports: labs.hsdp_lab.
from ..theory.sharding import DEFAULT_SHARDS, mesh_shape  # noqa: F401
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
