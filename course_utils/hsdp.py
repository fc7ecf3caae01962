"""Hybrid sharding (HSDP): FSDP inside a group of ranks, plain data parallelism across groups.

Taught in ``notebooks/08_beyond_one_box.ipynb``. Importing this module registers the
strategy ``"torch-hsdp"`` in :data:`course_utils.experiments.STRATEGIES`:
``fully_shard(mesh=...)`` per block and then on the root, as ``"torch-fsdp"``
(:mod:`course_utils.fsdp`), but on a **2-D device mesh** of shape ``(replicas, shards)``
with dimension names ``("replicate", "shard")``:

* every parameter is sharded over the ``shards`` ranks of its row of the mesh (the
  *shard group*, meant to be the GPUs of one node, joined by fast links); the rows
  are ``replicas`` identical copies of the sharded model (one per node);
* forward and backward all-gather each unit's parameters inside the shard group and
  reduce-scatter its gradients there (FSDP2's messages: every parameter's dim 0
  padded to a multiple of ``shards``, :func:`course_utils.fsdp.padded_numel`);
* each reduce-scattered gradient shard (``1/shards`` of the unit) is then all-reduced
  across the ``replicas`` ranks that hold the same shard (the *replicate group*, one
  rank per node: the only traffic that crosses the slow inter-node links).

Ranks are laid out row-major, as ``init_device_mesh`` does: with 4 ranks and 2 shards the
shard groups are {0, 1} and {2, 3}, the replicate groups {0, 2} and {1, 3}.
:data:`DEFAULT_SHARDS` = 2 pretends each "node" has 2 ranks: ``run("torch-hsdp", 4)`` is
2 replicas x 2 shards. Other shapes through :func:`wrap_torch_hsdp` (``shards=``); on
2 ranks, ``shards=2`` is one replica of 2 shards (FSDP; FSDP2 still issues its
replicate all-reduces, on a 1-rank group: 0 bytes) and ``shards=1`` is 2 replicas of an
unsharded model (DDP-like: one all-reduce per unit, no all-gather, no reduce-scatter).

**What HSDP sends per step** (one rank, ring convention of :class:`~course_utils.comm.CommLedger`,
checked exactly in ``tests/test_hsdp.py``), for ``s`` shards, ``r`` replicas and the
FSDP2 unit messages ``M_u`` of :func:`course_utils.fsdp.message_numels` (padded for ``s``):

    all_gather     = (s-1)/s · 4·(M_root + g·Σ M_block)        g = 2 (reshard after forward)
    reduce_scatter = (s-1)/s · 4·(M_root + Σ M_block)           inside the shard group
    all_reduce     = 2(r-1)/r · 4·(M_root + Σ M_block)/s        across the replicate group

(:func:`hsdp_comm_bytes_per_step`). For the course GPT on 2 x 2: 504,000, 258,800 and
258,800 bytes per step. State bytes per rank are FSDP's on ``s`` ranks
(:func:`course_utils.fsdp.expected_state_bytes` with ``world_size=s``).

**Why bother** (:func:`hsdp_vs_fsdp_time`, :func:`crossover_table`): full sharding over
all N = g·n GPUs of n nodes runs its 3 ring passes (2 all-gathers, 1 reduce-scatter) of
the whole model across the slow inter-node links; HSDP runs them inside each node and
sends only an all-reduce of ``Ψ/g`` across nodes. The price is memory: model states
sharded g ways instead of N ways.

:func:`fsdp1_hybrid_without_mesh` measures a trap of the older FSDP1 API on CPU:
``ShardingStrategy.HYBRID_SHARD`` without a mesh or process groups infers "one node =
``device_count()`` devices", which is 1 on CPU, switches to ``NO_SHARD`` on a 1-rank
group with only a warning, and never all-reduces across ranks: the ranks diverge.
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from numbers import Integral, Real

from . import experiments, fsdp
from .collectives import predict_time
from .memory import model_states

__all__ = ["DEFAULT_SHARDS", "MESH_DIM_NAMES", "mesh_shape", "mesh_groups", "make_mesh",
           "wrap_torch_hsdp", "hsdp_calls_per_step", "hsdp_comm_bytes_per_step",
           "hsdp_expected_state_bytes", "measure_hsdp", "HybridCost", "hsdp_vs_fsdp_time",
           "crossover_inter_bw", "crossover_table", "DEFAULT_INTER_BWS", "fsdp1_hybrid_without_mesh"]

#: Ranks per shard group of ``run("torch-hsdp", N)``: the course's pretend "GPUs per node".
DEFAULT_SHARDS = 2
#: The names of the two mesh dimensions, outer (across nodes) first.
MESH_DIM_NAMES = ("replicate", "shard")


# ------------------------------------------------------------------ the mesh

def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def mesh_shape(world_size: int, shards: int = DEFAULT_SHARDS) -> tuple[int, int]:
    """``(replicas, shards)`` of the HSDP mesh for ``world_size`` ranks."""
    _check_int("world_size", world_size, 1)
    _check_int("shards", shards, 1)
    if world_size % shards:
        fits = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(f"HSDP needs world_size divisible by shards: {world_size} ranks cannot form "
                         f"groups of {shards}; use shards in {fits} (or a world size that "
                         f"{shards} divides)")
    return world_size // shards, shards


def mesh_groups(world_size: int, shards: int = DEFAULT_SHARDS) -> dict:
    """The ranks of every shard group (mesh rows) and replicate group (mesh columns),
    row-major as ``init_device_mesh`` lays them out."""
    replicas, shards = mesh_shape(world_size, shards)
    rows = [list(range(i * shards, (i + 1) * shards)) for i in range(replicas)]
    return {"shard": rows, "replicate": [[row[j] for row in rows] for j in range(shards)]}


def make_mesh(shards: int = DEFAULT_SHARDS, device_type: str | None = None):
    """The 2-D ``DeviceMesh`` (replicas, shards) over all ranks, dims ``("replicate", "shard")``.

    A collective call (it creates the process groups): call it on every rank, inside
    :func:`course_utils.launch.launch`. ``device_type`` defaults to this rank's device
    (``"cuda"`` under NCCL, else ``"cpu"``).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .launch import rank_device

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("make_mesh needs torch.distributed initialised: call it inside "
                           "course_utils.launch.launch(...) or %%ranks")
    shape = mesh_shape(dist.get_world_size(), shards)
    return init_device_mesh(device_type or rank_device().type, shape, mesh_dim_names=MESH_DIM_NAMES)


# ------------------------------------------------------------------ the strategy

def wrap_torch_hsdp(model, make_optimizer, *, shards: int = DEFAULT_SHARDS,
                    reshard_after_forward: bool = True, group=None, unit_types=None, **options):
    """The ``"torch-hsdp"`` strategy: ``fully_shard`` per block and on the root over the 2-D
    mesh of :func:`make_mesh` (``world_size/shards`` replicas x ``shards`` shards).

    Every rank starts from rank 0's parameters; the root stays gathered between forward
    and backward, as in ``"torch-fsdp"``. ``group`` must be None (the mesh spans all
    ranks); ``bucket_bytes``/``overlap`` are ignored.
    """
    import torch.distributed as dist

    if group is not None:
        raise ValueError("torch-hsdp builds its own 2-D mesh over all ranks; call it without group=")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch-hsdp needs torch.distributed initialised: run it inside "
                           "course_utils.launch.launch(...) or %%ranks")
    device_type = next(model.parameters()).device.type
    mesh = make_mesh(shards, device_type)
    return fsdp._wrap(model, make_optimizer, reshard_after_forward=reshard_after_forward,
                      mesh=mesh, unit_types=unit_types)


# ------------------------------------------------------------------ predicted traffic and state

def hsdp_calls_per_step(num_units: int, *, shards: int, reshard_after_forward: bool = True) -> dict:
    """Collective calls per step for ``num_units`` units plus the root (torch 2.13, measured).

    The all-gathers and reduce-scatters of :func:`course_utils.fsdp.calls_per_step`, none
    when ``shards == 1``; one all-reduce per unit always, even with one replica (FSDP2
    then all-reduces over a 1-rank group: a call that sends nothing).
    """
    _check_int("num_units", num_units, 0)
    _check_int("shards", shards, 1)
    out = fsdp.calls_per_step(num_units, reshard_after_forward=reshard_after_forward)
    if shards == 1:
        out["reduce_scatter"] = out["all_gather"] = 0
    out["all_reduce"] = num_units + 1
    return out


def hsdp_comm_bytes_per_step(model, world_size: int, shards: int = DEFAULT_SHARDS, *,
                             reshard_after_forward: bool = True, bytes_per_elem: int = 4,
                             unit_types=None) -> dict:
    """Bytes one rank sends per step (exact :class:`fractions.Fraction` values), for an
    unwrapped ``model``: FSDP2's all-gathers and reduce-scatters inside the shard group
    (:func:`course_utils.fsdp.comm_bytes_per_step` with ``world_size=shards``) and the
    all-reduce of each unit's ``1/shards`` gradient shard across the replicate group."""
    replicas, shards = mesh_shape(world_size, shards)
    out = fsdp.comm_bytes_per_step(model, shards, reshard_after_forward=reshard_after_forward,
                                   bytes_per_elem=bytes_per_elem, unit_types=unit_types)
    shard_numel = Fraction(sum(fsdp.message_numels(model, shards, unit_types)), shards)
    out["all_reduce"] = Fraction(2 * (replicas - 1), replicas) * bytes_per_elem * shard_numel
    return out


def hsdp_expected_state_bytes(model, world_size: int, rank: int, shards: int = DEFAULT_SHARDS) -> dict:
    """What :func:`course_utils.fsdp.fsdp_state_bytes` reports on ``rank`` after an AdamW
    step: FSDP's local shards for ``shards`` ranks, at this rank's place in its shard group."""
    mesh_shape(world_size, shards)
    _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    return fsdp.expected_state_bytes(model, shards, rank % shards)


# ------------------------------------------------------------------ measured

def _measure_rank(shards: int, steps: int, seed: int) -> dict:
    """One rank: train the course GPT with HSDP, record every collective with its group size."""
    import torch.distributed as dist

    from .comm import CommLedger
    from .launch import rank_device
    from .model import SyntheticData, build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    model, optimizer = wrap_torch_hsdp(build_model(seed=seed, device=device), experiments.make_adamw,
                                       shards=shards)
    data = SyntheticData(global_batch=experiments.GLOBAL_BATCH, seed=seed)
    state = {}

    def measure_last(step):
        if step == steps - 1:
            state.update(fsdp.fsdp_state_bytes(model, optimizer))

    with CommLedger() as ledger:
        losses, _ = experiments.train_steps(model, optimizer, data, range(steps), rank=rank,
                                            world=world, device=device, ledger=ledger,
                                            after_step=measure_last)
    by_group: dict = {}
    for rec in ledger.records:
        key = (rec.op, rec.world_size, rec.rank)
        row = by_group.setdefault(key, {"calls": 0, "message_bytes": 0})
        row["calls"] += 1
        row["message_bytes"] += rec.message_bytes
    return {"rank": rank, "losses": losses, "totals": ledger.totals(), "counts": ledger.counts(),
            "by_group": by_group, "state_bytes": {k: int(v) for k, v in state.items()}}


def measure_hsdp(world_size: int = 4, shards: int = DEFAULT_SHARDS, *, steps: int = 1, seed: int = 0,
                 timeout_s: float = 120.0) -> list[dict]:
    """Train the course GPT with HSDP on ``world_size`` ranks; per rank: ``losses``,
    ``totals``/``counts`` (CommLedger), ``by_group`` and ``state_bytes``.

    ``by_group`` is ``{(op, group size, rank in the group): {"calls", "message_bytes"}}``:
    which group each collective ran on. Global rank g sits at place ``g % shards`` of its
    shard group and ``g // shards`` of its replicate group, so the key tells the groups
    apart even when both have the same size (2 x 2).
    """
    from .launch import launch
    from .model import build_model

    mesh_shape(world_size, shards)
    _check_int("steps", steps, 1)
    _check_int("seed", seed, 0)
    if experiments.GLOBAL_BATCH % world_size:
        raise ValueError(f"the global batch of {experiments.GLOBAL_BATCH} rows cannot be split "
                         f"over {world_size} ranks; use 2, 3, 4 or 6 ranks")
    import torch.distributed.fsdp  # noqa: F401  (imported once here, inherited by forked ranks)

    build_model(seed=seed, device="meta")
    return list(launch(_measure_rank, world_size, shards, steps, seed, quiet=True, timeout_s=timeout_s))


# ------------------------------------------------------------------ the cost model

@dataclasses.dataclass(frozen=True)
class HybridCost:
    """Predicted communication per step: full sharding over all N GPUs vs HSDP.

    Seconds by the alpha-beta model (:func:`course_utils.collectives.predict_time`);
    bytes are what one GPU sends per step over the slow inter-node links and over the
    fast intra-node ones; ``states_*`` are model-state bytes per GPU (mixed precision,
    :func:`course_utils.memory.model_states`, ZeRO-3 over N vs over g GPUs).
    """

    num_params: float
    gpus_per_node: int
    nodes: int
    intra_bw: float
    inter_bw: float
    fsdp_s: float
    hsdp_s: float
    fsdp_inter_bytes: float
    hsdp_inter_bytes: float
    hsdp_intra_bytes: float
    states_fsdp: float
    states_hsdp: float

    @property
    def speedup(self) -> float:
        """How many times faster HSDP's communication is (> 1: HSDP wins)."""
        return self.fsdp_s / self.hsdp_s if self.hsdp_s else math.inf

    @property
    def faster(self) -> str:
        return "HSDP" if self.hsdp_s < self.fsdp_s else "full sharding" if self.fsdp_s < self.hsdp_s else "tie"


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def _cost_terms(num_params, gpus_per_node, nodes, intra_bw, alpha_intra_s, alpha_inter_s,
                bytes_per_elem):
    _check_positive("num_params", num_params)
    _check_int("gpus_per_node", gpus_per_node, 1)
    _check_int("nodes", nodes, 1)
    _check_positive("intra_bw", intra_bw)
    _check_positive("alpha_intra_s", alpha_intra_s)
    _check_positive("alpha_inter_s", alpha_inter_s)
    _check_int("bytes_per_elem", bytes_per_elem, 1)
    return num_params * bytes_per_elem, gpus_per_node, nodes, gpus_per_node * nodes


def hsdp_vs_fsdp_time(num_params, gpus_per_node: int, nodes: int, intra_bw: float, inter_bw: float, *,
                      alpha_intra_s: float = 5e-6, alpha_inter_s: float = 10e-6,
                      bytes_per_elem: int = 2) -> HybridCost:
    """Communication seconds per step of full sharding (FSDP/ZeRO-3 over all N = g·n GPUs)
    and of HSDP (shard inside each node of g GPUs, replicate across the n nodes).

    Model (ring collectives, alpha-beta of notebook 01, M = Ψ·bytes_per_elem, one
    message per pass, bf16 by default):

    * full sharding: 2 all-gathers + 1 reduce-scatter of M over N ranks. A ring that
      spans nodes runs at the speed of its slowest hop, so at ``inter_bw`` with
      latency ``alpha_inter_s`` (on one node: ``intra_bw``, ``alpha_intra_s``);
    * HSDP: the same 3 passes over the g GPUs of a node (``intra_bw``) plus one
      all-reduce of M/g over the n nodes (``inter_bw``).

    Bandwidths are bytes/s one GPU sends in a ring (nccl-tests' "bus bandwidth"):
    measure them on your cluster. Where NCCL spreads a cross-node ring over one NIC per
    GPU, that figure already includes it.
    """
    m, g, n, world = _cost_terms(num_params, gpus_per_node, nodes, intra_bw, alpha_intra_s,
                                 alpha_inter_s, bytes_per_elem)
    _check_positive("inter_bw", inter_bw)
    wide = (intra_bw, alpha_intra_s) if n == 1 else (inter_bw, alpha_inter_s)
    fsdp_s = (2 * predict_time("all_gather", m, world, wide[1], wide[0])
              + predict_time("reduce_scatter", m, world, wide[1], wide[0]))
    hsdp_s = (2 * predict_time("all_gather", m, g, alpha_intra_s, intra_bw)
              + predict_time("reduce_scatter", m, g, alpha_intra_s, intra_bw)
              + predict_time("all_reduce", m / g, n, alpha_inter_s, inter_bw))
    fsdp_inter = 3 * (world - 1) / world * m if n > 1 else 0.0
    return HybridCost(
        num_params=num_params, gpus_per_node=g, nodes=n, intra_bw=intra_bw, inter_bw=inter_bw,
        fsdp_s=fsdp_s, hsdp_s=hsdp_s, fsdp_inter_bytes=fsdp_inter,
        hsdp_inter_bytes=2 * (n - 1) / n * m / g, hsdp_intra_bytes=3 * (g - 1) / g * m,
        states_fsdp=model_states(num_params, world_size=world, stage=3).total,
        states_hsdp=model_states(num_params, world_size=g, stage=3).total)


def crossover_inter_bw(num_params, gpus_per_node: int, nodes: int, intra_bw: float, *,
                       alpha_intra_s: float = 5e-6, alpha_inter_s: float = 10e-6,
                       bytes_per_elem: int = 2) -> float:
    """The inter-node bandwidth at which full sharding's communication takes as long as
    HSDP's (below it HSDP is faster); ``math.inf`` when HSDP is faster at any bandwidth.

    Both times are ``a + X/inter_bw`` (:func:`hsdp_vs_fsdp_time`): full sharding has
    ``X_f = 3(N-1)/N·M`` and latency ``3(N-1)·alpha_inter``; HSDP has ``X_h = 2(n-1)/n·M/g``
    and a constant intra-node part ``c``. They meet at ``(X_f - X_h) / (c - a_f)``.
    """
    m, g, n, world = _cost_terms(num_params, gpus_per_node, nodes, intra_bw, alpha_intra_s,
                                 alpha_inter_s, bytes_per_elem)
    if n == 1:
        raise ValueError("with nodes=1 both strategies stay inside the node: there is no "
                         "inter-node link to compare; use nodes >= 2")
    x_f = 3 * (world - 1) / world * m
    x_h = 2 * (n - 1) / n * m / g
    a_f = 3 * (world - 1) * alpha_inter_s
    c_h = (3 * (g - 1) / g * m / intra_bw + 3 * (g - 1) * alpha_intra_s
           + 2 * (n - 1) * alpha_inter_s)
    return (x_f - x_h) / (c_h - a_f) if c_h > a_f else math.inf


#: Inter-node bandwidths (bytes/s per GPU) of :func:`crossover_table`: 50 Gb/s Ethernet
#: up to about twice an H100's NVLink.
DEFAULT_INTER_BWS = (6.25e9, 12.5e9, 25e9, 50e9, 100e9, 200e9, 400e9, 800e9)


def crossover_table(num_params=7e9, gpus_per_node: int = 8, nodes: int = 4, intra_bw: float = 450e9,
                    inter_bws=DEFAULT_INTER_BWS, **model) -> str:
    """A text table of :func:`hsdp_vs_fsdp_time` over inter-node bandwidths, with the
    crossover (:func:`crossover_inter_bw`) and the memory each strategy needs per GPU.

    Defaults: a 7B model in bf16 on 4 nodes of 8 GPUs with 450 GB/s NVLink per GPU
    (an H100's, one direction); the inter-node figures go from 50 Gb/s Ethernet to
    beyond NVLink, to find where full sharding catches up.
    """
    if not inter_bws:
        raise ValueError("inter_bws must list at least one bandwidth (bytes/s)")
    rows = [("inter-node GB/s", "full shard s", "HSDP s", "HSDP speedup", "faster")]
    cost = None
    for bw in inter_bws:
        cost = hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, bw, **model)
        rows.append((f"{bw / 1e9:g}", f"{cost.fsdp_s:.4f}", f"{cost.hsdp_s:.4f}",
                     f"{cost.speedup:.2f}x", cost.faster))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if 0 < j < 4 else c.ljust(w) for j, (c, w) in
                       enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    cross = crossover_inter_bw(num_params, gpus_per_node, nodes, intra_bw, **model)
    world = gpus_per_node * nodes
    lines += [
        "",
        f"{num_params / 1e9:g}B parameters, {nodes} nodes x {gpus_per_node} GPUs, "
        f"NVLink {intra_bw / 1e9:g} GB/s per GPU",
        "full sharding beats HSDP only above " + (
            "no bandwidth at all" if math.isinf(cross) else f"{cross / 1e9:.0f} GB/s between nodes"),
        f"bytes over the inter-node links per GPU per step: full sharding "
        f"{cost.fsdp_inter_bytes / 1e9:.2f} GB, HSDP {cost.hsdp_inter_bytes / 1e9:.3f} GB",
        f"model states per GPU (mixed precision): full sharding over {world} GPUs "
        f"{cost.states_fsdp / 1e9:.2f} GB, HSDP over {gpus_per_node} GPUs {cost.states_hsdp / 1e9:.2f} GB",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ FSDP1's HYBRID_SHARD trap

def _fsdp1_hybrid_rank() -> dict:
    import warnings

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from .comm import CommLedger

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                       auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
                       device_id=torch.device("cpu"))
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    x = torch.full((2, 4), float(rank + 1))           # each rank its own data
    with CommLedger() as ledger:
        wrapped(x).sum().backward()
        opt.step()
    with FSDP.summon_full_params(wrapped):
        weight = model[0].weight.detach().reshape(-1).tolist()
    groups = sorted({r.world_size for r in ledger.records})
    return {"weight": weight, "shard_group_size": wrapped.process_group.size(),
            "all_reduce_group_sizes": groups, "counts": ledger.counts(),
            "warnings": sorted({str(w.message).split(" since ")[0] for w in caught
                                if "HYBRID_SHARD" in str(w.message)})}


def fsdp1_hybrid_without_mesh(world_size: int = 2) -> dict:
    """FSDP1 ``HYBRID_SHARD`` with an auto-wrap policy but no mesh, on gloo CPU ranks that
    each see different data, one SGD step: ``{"where", "shard_group_size",
    "all_reduce_group_sizes", "diverged", "warnings"}``. Measured (torch 2.13): the shard
    group has 1 rank, every all-reduce runs on a 1-rank group, the ranks' weights differ.
    (Manual wrapping without a mesh raises a ValueError instead.)"""
    from .launch import launch, where

    _check_int("world_size", world_size, 2)
    out = launch(_fsdp1_hybrid_rank, world_size, backend="gloo", quiet=True, timeout_s=60)
    return {"where": where(out, backend_first=True),
            "shard_group_size": out[0]["shard_group_size"],
            "all_reduce_group_sizes": out[0]["all_reduce_group_sizes"],
            "diverged": any(o["weight"] != out[0]["weight"] for o in out[1:]),
            "warnings": out[0]["warnings"]}


if "torch-hsdp" not in experiments.STRATEGIES:
    experiments.register_strategy(
        "torch-hsdp", wrap_torch_hsdp, notebook="08_beyond_one_box",
        # looked up when called: importing course_utils.fsdp first imports experiments,
        # which imports this module while fsdp is still half-initialised
        state_bytes=lambda model, optimizer: fsdp.fsdp_state_bytes(model, optimizer),
        description=f"torch FSDP2 on a 2-D mesh (replicas x {DEFAULT_SHARDS} shards): fully_shard "
                    "inside each shard group, all-reduce across replicas (HSDP)")
