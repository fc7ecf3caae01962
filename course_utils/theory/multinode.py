"""Full sharding vs HSDP across nodes: communication time, bytes over the inter-node
links and memory per GPU, from the alpha-beta model.

Taught in ``notebooks/08_beyond_one_box.ipynb`` (the strategy itself is
:mod:`course_utils.impl.hsdp`).
"""
from __future__ import annotations

import dataclasses
import math

from ..checks import check_int, check_positive
from .alpha_beta import predict_time
from .memory import model_states

__all__ = ["HybridCost", "hsdp_vs_fsdp_time", "crossover_inter_bw", "crossover_table",
           "DEFAULT_INTER_BWS"]


@dataclasses.dataclass(frozen=True)
class HybridCost:
    """Predicted communication per step: full sharding over all N GPUs vs HSDP.

    Seconds by the alpha-beta model (:func:`course_utils.theory.alpha_beta.predict_time`);
    bytes are what one GPU sends per step over the slow inter-node links and over the
    fast intra-node ones; ``states_*`` are model-state bytes per GPU (mixed precision,
    :func:`course_utils.theory.memory.model_states`, ZeRO-3 over N vs over g GPUs).
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


def _cost_terms(num_params, gpus_per_node, nodes, intra_bw, alpha_intra_s, alpha_inter_s,
                bytes_per_elem):
    check_positive("num_params", num_params)
    check_int("gpus_per_node", gpus_per_node, 1)
    check_int("nodes", nodes, 1)
    check_positive("intra_bw", intra_bw)
    check_positive("alpha_intra_s", alpha_intra_s)
    check_positive("alpha_inter_s", alpha_inter_s)
    check_int("bytes_per_elem", bytes_per_elem, 1)
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
    check_positive("inter_bw", inter_bw)
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
