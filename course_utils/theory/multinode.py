"""Full sharding vs HSDP across nodes (notebook 08): communication time, bytes per NIC and
memory per GPU from the alpha-beta model; the planner uses the same link model.

``n`` nodes of ``g`` GPUs, R = ``nics_per_node`` NICs of ``nic_bw`` each, NVLink ``intra_bw``
per GPU. A ring over all N = g·n ranks (one ring per NIC, each leaving a node once) in which
every rank sends S bytes puts S/R bytes through each NIC and S·(1 - floor(R/g)/R) over the
busiest GPU's NVLink, taking the larger of the two times (:func:`flat_ring_wire`). HSDP:
ZeRO-3 over g on NVLink, and g rings of n ranks all-reduce each M/g shard (:func:`cross_node_wire`).
FSDP2 issues that cross-node all-reduce on a stream of its own (``all_reduce_stream`` in torch
2.13's ``_fsdp_collectives.foreach_reduce``), beside backward's all-gathers and reduce-scatters
on NVLink: HSDP takes forward's all-gathers + max(backward's passes, the all-reduces), not their
sum (``overlap=False``: the sum, one phase after the other).
"""
from __future__ import annotations

import dataclasses
import math

from ..checks import check_int, check_positive
from .alpha_beta import predict_time, ring_steps
from .comm import collective_bytes
from .memory import model_states

__all__ = ["flat_ring_wire", "cross_node_wire", "HybridCost", "hsdp_vs_fsdp_time", "crossovers",
           "crossover_inter_bw"]


def _nics(nics_per_node, gpus_per_node: int) -> int:
    """R, the NICs of one node: ``nics_per_node``, or one per GPU when None."""
    if nics_per_node is None:
        return gpus_per_node
    check_int("nics_per_node", nics_per_node, 1, what="network cards in one node")
    return nics_per_node


def flat_ring_wire(sent_bytes: float, gpus_per_node: int, nodes: int, intra_bw: float, nic_bw: float,
                   nics_per_node: int | None = None) -> tuple[float, float, float]:
    """Bandwidth part of a ring over all GPUs: ``(seconds, bytes per NIC, busiest NVLink bytes)``."""
    r = _nics(nics_per_node, gpus_per_node)
    if nodes == 1:
        return sent_bytes / intra_bw, 0.0, float(sent_bytes)
    nic = sent_bytes / r
    nvlink = sent_bytes * (1 - (r // gpus_per_node) / r)
    return max(nic / nic_bw, nvlink / intra_bw), nic, nvlink


def cross_node_wire(sent_bytes: float, gpus_per_node: int, nodes: int, nic_bw: float,
                    nics_per_node: int | None = None) -> tuple[float, float]:
    """Bandwidth part of HSDP's cross-node rings, ``(seconds, bytes per NIC)``: g·sent/R per NIC."""
    r = _nics(nics_per_node, gpus_per_node)
    if nodes == 1:
        return 0.0, 0.0
    nic = gpus_per_node * sent_bytes / r
    return nic / nic_bw, nic


@dataclasses.dataclass(frozen=True)
class HybridCost:
    """Communication per step, full sharding over all N GPUs vs HSDP: seconds, their alpha part,
    bytes per NIC and on the busiest NVLink, model-state bytes per GPU (ZeRO-3 over N vs g)."""
    num_params: float
    gpus_per_node: int
    nodes: int
    nics_per_node: int
    intra_bw: float
    nic_bw: float
    fsdp_s: float
    hsdp_s: float
    hsdp_serial_s: float
    fsdp_latency_s: float
    hsdp_latency_s: float
    fsdp_nic_bytes: float
    hsdp_nic_bytes: float
    fsdp_nvlink_bytes: float
    hsdp_nvlink_bytes: float
    states_fsdp: float
    states_hsdp: float

    @property
    def fsdp_node_bytes(self) -> float:
        return self.fsdp_nic_bytes * self.nics_per_node

    @property
    def hsdp_node_bytes(self) -> float:
        return self.hsdp_nic_bytes * self.nics_per_node

    @property
    def speedup(self) -> float:
        """> 1: HSDP's communication is faster."""
        return self.fsdp_s / self.hsdp_s if self.hsdp_s else math.inf

    @property
    def faster(self) -> str:
        return "HSDP" if self.hsdp_s < self.fsdp_s else "full sharding" if self.fsdp_s < self.hsdp_s else "tie"


def hsdp_vs_fsdp_time(num_params, gpus_per_node: int, nodes: int, intra_bw: float, nic_bw: float, *,
                      nics_per_node: int | None = None, alpha_intra_s: float = 5e-6,
                      alpha_inter_s: float = 10e-6, bytes_per_elem: int = 2, overlap: bool = True) -> HybridCost:
    """Communication per step of full sharding (over all g·n GPUs) and of HSDP (shard in a node,
    replicate across nodes); bandwidths in bytes/s, ``nics_per_node`` None: one per GPU.
    ``overlap``: HSDP's cross-node all-reduce runs beside backward's passes on NVLink, as FSDP2
    runs it (False: after them; ``hsdp_serial_s`` is that time either way).

    >>> c = hsdp_vs_fsdp_time(7e9, 8, 4, 450e9, 50e9)        # 8 NICs of 400 Gb/s per node
    >>> round(c.fsdp_s, 3), round(c.hsdp_serial_s, 3), round(c.hsdp_s, 3)
    (0.103, 0.134, 0.082)
    """
    for name in ("gpus_per_node", "nodes", "bytes_per_elem"):
        check_int(name, locals()[name], 1)
    for name in ("num_params", "intra_bw", "nic_bw", "alpha_intra_s", "alpha_inter_s"):
        check_positive(name, locals()[name])
    r = _nics(nics_per_node, gpus_per_node)
    m, g, n = num_params * bytes_per_elem, gpus_per_node, nodes
    world = g * n
    sent = 2 * collective_bytes("all_gather", m, world) + collective_bytes("reduce_scatter", m, world)
    fsdp_lat = 3 * ring_steps("all_gather", world) * (alpha_inter_s if n > 1 else alpha_intra_s)
    fsdp_wire, fsdp_nic, fsdp_nvlink = flat_ring_wire(sent, g, n, intra_bw, nic_bw, r)
    gather = predict_time("all_gather", m, g, alpha_intra_s, intra_bw)          # one pass in a node
    backward = gather + predict_time("reduce_scatter", m, g, alpha_intra_s, intra_bw)
    hsdp_wire, hsdp_nic = cross_node_wire(collective_bytes("all_reduce", m / g, n), g, n, nic_bw, r)
    cross = ring_steps("all_reduce", n) * alpha_inter_s + hsdp_wire
    hsdp_lat = 3 * ring_steps("all_gather", g) * alpha_intra_s + ring_steps("all_reduce", n) * alpha_inter_s
    serial = gather + backward + cross
    return HybridCost(
        num_params=num_params, gpus_per_node=g, nodes=n, nics_per_node=r, intra_bw=intra_bw, nic_bw=nic_bw,
        fsdp_s=fsdp_lat + fsdp_wire, hsdp_s=gather + max(backward, cross) if overlap else serial,
        hsdp_serial_s=serial,
        fsdp_latency_s=fsdp_lat, hsdp_latency_s=hsdp_lat, fsdp_nic_bytes=fsdp_nic, hsdp_nic_bytes=hsdp_nic,
        fsdp_nvlink_bytes=fsdp_nvlink, hsdp_nvlink_bytes=3 * collective_bytes("all_gather", m, g),
        states_fsdp=model_states(num_params, world_size=world, stage=3).total,
        states_hsdp=model_states(num_params, world_size=g, stage=3).total)


def crossovers(num_params, gpus_per_node: int, nodes: int, intra_bw: float, *,
               nics_per_node: int | None = None, **model) -> tuple[float, ...]:
    """The per-NIC bandwidths (bytes/s) at which full sharding and HSDP take the same time,
    ascending, between 10 MB/s and 100 TB/s: HSDP is faster below the first, full sharding
    between the first and the second, and so on; ``()``: HSDP is faster at every bandwidth."""
    import numpy as np

    if nodes == 1:
        raise ValueError("with nodes=1 both strategies stay inside the node: there is no "
                         "network to compare; use nodes >= 2")

    def gap(bw: float) -> float:           # > 0: HSDP faster
        c = hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, bw, nics_per_node=nics_per_node,
                              **model)
        return c.fsdp_s - c.hsdp_s

    grid = np.geomspace(1e7, 1e14, 400)
    gaps = [gap(b) for b in grid]
    found = []
    for lo, hi, g_lo, g_hi in zip(grid, grid[1:], gaps, gaps[1:]):
        if (g_lo > 0) != (g_hi > 0):
            for _ in range(80):                # bisect in log space
                mid = math.sqrt(lo * hi)
                if (gap(mid) > 0) == (g_lo > 0):
                    lo = mid
                else:
                    hi = mid
            found.append(float(math.sqrt(lo * hi)))
    if gaps[0] <= 0:                          # full sharding already faster at the bottom
        found.insert(0, float(grid[0]))
    return tuple(found)


def crossover_inter_bw(num_params, gpus_per_node: int, nodes: int, intra_bw: float, *,
                       nics_per_node: int | None = None, **model) -> float:
    """The first of :func:`crossovers` (``math.inf``: HSDP is faster at every bandwidth)."""
    found = crossovers(num_params, gpus_per_node, nodes, intra_bw, nics_per_node=nics_per_node, **model)
    return found[0] if found else math.inf
