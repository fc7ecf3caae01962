"""HSDP measured (notebook 08): which group each collective runs on, and FSDP1's ``HYBRID_SHARD`` trap.

FSDP1's ``HYBRID_SHARD`` without a mesh or process groups infers "one node = ``device_count()``
devices", 1 on CPU, switches to ``NO_SHARD`` on a 1-rank group with only a warning and never
all-reduces across ranks: the ranks diverge (:func:`fsdp1_hybrid_without_mesh` measures it).
"""
from __future__ import annotations

from ..checks import check_int
from ..harness import experiments
from ..harness.model import rows_per_rank
from ..harness.strategies import wrap_torch_hsdp
from ..theory.sharding import DEFAULT_SHARDS, mesh_shape

__all__ = ["measure_hsdp", "fsdp1_hybrid_without_mesh"]


def _measure_rank(shards: int, steps: int, seed: int) -> dict:
    import torch.distributed as dist
    from ..harness.model import SyntheticData, build_model
    from ..runtime.launch import rank_device
    from ..runtime.ledger import CommLedger
    device = rank_device()
    model, optimizer = wrap_torch_hsdp(build_model(seed=seed, device=device), experiments.make_adamw, shards=shards)
    data = SyntheticData(global_batch=experiments.GLOBAL_BATCH, seed=seed)
    losses = []
    with CommLedger() as ledger:
        for step, loss, _ in experiments.train(model, optimizer, data, steps, device=device, meters=(ledger,)):
            losses.append(loss)
            if step == steps - 1:
                state = experiments.state_bytes(model, optimizer)
    by_group: dict = {}
    for rec in ledger.records:
        row = by_group.setdefault((rec.op, rec.world_size, rec.rank), {"calls": 0, "message_bytes": 0})
        row["calls"] += 1
        row["message_bytes"] += rec.message_bytes
    return {"rank": dist.get_rank(), "losses": losses, "totals": ledger.totals(), "counts": ledger.counts(),
            "by_group": by_group, "state_bytes": state}


def measure_hsdp(world_size: int = 4, shards: int = DEFAULT_SHARDS, *, steps: int = 1, seed: int = 0,
                 timeout_s: float = 120.0) -> list[dict]:
    """Train the course GPT with HSDP; per rank ``losses``, ``totals``/``counts``, ``state_bytes``,
    ``by_group``: ``{(op, group size, rank in the group): {"calls", "message_bytes"}}`` (global rank g
    is at ``g % shards`` in its shard group, ``g // shards`` in its replicate group: 2 x 2 tells apart)."""
    from ..harness.model import warm_up
    from ..runtime.launch import launch
    mesh_shape(world_size, shards)
    check_int("steps", steps, 1)
    check_int("seed", seed, 0)
    rows_per_rank(experiments.GLOBAL_BATCH, world_size)
    warm_up(imports=("torch.distributed.fsdp",))
    return list(launch(_measure_rank, world_size, shards, steps, seed, quiet=True, timeout_s=timeout_s))


def _fsdp1_hybrid_rank() -> dict:
    import warnings
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from ..runtime.ledger import CommLedger
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                       auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"))
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    with CommLedger() as ledger:
        wrapped(torch.full((2, 4), float(dist.get_rank() + 1))).sum().backward()   # each rank its own data
        opt.step()
    with FSDP.summon_full_params(wrapped):
        weight = model[0].weight.detach().reshape(-1).tolist()
    return {"weight": weight, "shard_group_size": wrapped.process_group.size(),
            "all_reduce_group_sizes": sorted({r.world_size for r in ledger.records}),
            "warnings": sorted({str(w.message).split(" since ")[0] for w in caught if "HYBRID_SHARD" in str(w.message)})}


def fsdp1_hybrid_without_mesh(world_size: int = 2) -> dict:
    """FSDP1 ``HYBRID_SHARD`` with auto-wrapping but no mesh, one SGD step on gloo ranks with
    different data. Measured (torch 2.13): a 1-rank shard group, every all-reduce on a 1-rank
    group, diverged weights. (Manual wrapping without a mesh raises a ValueError instead.)"""
    from ..runtime.launch import launch, where
    check_int("world_size", world_size, 2)
    out = launch(_fsdp1_hybrid_rank, world_size, backend="gloo", quiet=True, timeout_s=60)
    return {"where": where(out, backend_first=True), "diverged": any(o["weight"] != out[0]["weight"] for o in out[1:]),
            **{k: out[0][k] for k in ("shard_group_size", "all_reduce_group_sizes", "warnings")}}
