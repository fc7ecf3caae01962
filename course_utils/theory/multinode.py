"""Full sharding vs HSDP across nodes: communication time, bytes through the network
cards (NICs) and memory per GPU, from the alpha-beta model with the links of a real node.

Taught in ``notebooks/08_beyond_one_box.ipynb`` (the strategy itself is
:mod:`course_utils.impl.hsdp`); :mod:`course_utils.theory.planner` uses the same
link model for its multi-node rows.

The cluster
-----------
``n`` nodes of ``g`` GPUs (``N = g·n`` ranks). Inside a node each GPU sends at
``intra_bw`` bytes/s over NVLink; each node has ``nics_per_node`` = R network cards of
``nic_bw`` bytes/s each (a DGX H100: R = g = 8 NICs of 400 Gb/s = 50 GB/s).

A ring collective across nodes (NCCL's rings)
---------------------------------------------
Every rank of a ring sends ``S`` bytes on its outgoing hop (all-gather and
reduce-scatter of an M-byte message: ``S = (N-1)/N·M``; all-reduce ``2(N-1)/N·M``).
NCCL splits the message over one ring (channel) per NIC, R rings of M/R bytes each.
Each ring is ordered node by node: it visits the g GPUs of a node over NVLink and leaves
the node **once**, through one NIC, to the next node. So

* a node sends, per collective, R rings × one crossing hop × S/R bytes = ``S`` bytes
  through its NICs, **S/R bytes per NIC** (the ring of a NIC crosses once per node);
* over NVLink, the busiest GPU (the one that drives the fewest crossings,
  ``floor(R/g)`` of the R rings) sends ``S·(1 - floor(R/g)/R)``: ``S·(g-1)/g`` with one
  NIC per GPU, all of ``S`` when there are fewer NICs than GPUs;
* the hops run at the same time (the ring is pipelined), so the bandwidth part takes
  ``max(S/(R·nic_bw), NVLink bytes / intra_bw)``. The ring's bus bandwidth across nodes
  is ``R·nic_bw``: it grows with the NICs of a node, not with the GPUs of the ring;
* latency: the ring takes ``ring_steps`` steps (N-1 per all-gather/reduce-scatter,
  2(N-1) per all-reduce), each as slow as its slowest hop: ``alpha_inter`` per step
  when the ring spans nodes, ``alpha_intra`` on one node.

(:func:`flat_ring_wire`.) Only one hop in g of a ring crosses nodes; charging all of a
GPU's ring traffic to the network, as if each GPU's ring had one slow link of its own,
overstates full sharding's time by about g×.

Full sharding vs HSDP (per step, one message per pass, bf16 by default)
-----------------------------------------------------------------------
* **full sharding** (ZeRO-3 over N): 2 all-gathers + 1 reduce-scatter of M over the
  N ranks: ``3(N-1)·alpha_inter + max(3(N-1)/N·M / (R·nic_bw), NVLink part)``.
  Bytes through each NIC: ``3(N-1)/N·M / R``.
* **HSDP** (ZeRO-3 over the g GPUs of a node, replicated over the n nodes): the same 3
  passes over g GPUs on NVLink, ``3(g-1)·alpha_intra + 3(g-1)/g·M / intra_bw``, then
  one all-reduce of each rank's M/g gradient shard across nodes. Those are g rings (one
  per local rank) of n ranks, every hop crossing nodes: a node sends
  ``g·2(n-1)/n·M/g = 2(n-1)/n·M`` through its R NICs (:func:`cross_node_wire`):
  ``2(n-1)·alpha_inter + 2(n-1)/n·M / (R·nic_bw)``.

With 4 × 8 GPUs, 8 NICs per node, 7B parameters in bf16 (M = 14 GB), 450 GB/s NVLink,
alpha 5 us inside / 10 us across nodes: per NIC per step full sharding sends 5.09 GB,
HSDP 2.625 GB; at 25 GB/s per NIC full sharding takes 0.204 s, HSDP 0.187 s; at 50 GB/s
0.103 s against 0.134 s. HSDP's real advantages are fewer bytes through the network
(about half), a shorter ring (latency 3(g-1)·alpha_intra + 2(n-1)·alpha_inter instead of
3(N-1)·alpha_inter, which multiplies with every per-layer collective) and smaller
groups; it pays with g-way instead of N-way sharded model states, and with an NVLink part
that cannot overlap its network part.
"""
from __future__ import annotations

import dataclasses
import math

from ..checks import check_int, check_positive
from .alpha_beta import predict_time, ring_steps
from .comm import collective_bytes
from .memory import model_states
from .text import table

__all__ = ["flat_ring_wire", "cross_node_wire", "HybridCost", "hsdp_vs_fsdp_time", "crossovers",
           "crossover_inter_bw", "crossover_summary", "crossover_table", "plot_crossover",
           "DEFAULT_NIC_BWS"]


def _nics(nics_per_node, gpus_per_node: int) -> int:
    """R, the NICs of one node: ``nics_per_node``, or one per GPU when None."""
    if nics_per_node is None:
        return gpus_per_node
    check_int("nics_per_node", nics_per_node, 1, what="network cards in one node")
    return nics_per_node


def flat_ring_wire(sent_bytes: float, gpus_per_node: int, nodes: int, intra_bw: float, nic_bw: float,
                   nics_per_node: int | None = None) -> tuple[float, float, float]:
    """The bandwidth part of ring collectives over all ``gpus_per_node × nodes`` GPUs in
    which every rank sends ``sent_bytes``: ``(seconds, bytes per NIC, NVLink bytes of the
    busiest GPU)``, as derived in the module docstring (all on NVLink on one node)."""
    r = _nics(nics_per_node, gpus_per_node)
    if nodes == 1:
        return sent_bytes / intra_bw, 0.0, float(sent_bytes)
    nic = sent_bytes / r
    nvlink = sent_bytes * (1 - (r // gpus_per_node) / r)
    return max(nic / nic_bw, nvlink / intra_bw), nic, nvlink


def cross_node_wire(sent_bytes: float, gpus_per_node: int, nodes: int, nic_bw: float,
                    nics_per_node: int | None = None) -> tuple[float, float]:
    """The bandwidth part of HSDP's replicate collectives, ``(seconds, bytes per NIC)``:
    ``gpus_per_node`` rings of ``nodes`` ranks share a node's R NICs, each rank sending
    ``sent_bytes`` (so ``g·sent_bytes / R`` per NIC). Nothing on one node."""
    r = _nics(nics_per_node, gpus_per_node)
    if nodes == 1:
        return 0.0, 0.0
    nic = gpus_per_node * sent_bytes / r
    return nic / nic_bw, nic


@dataclasses.dataclass(frozen=True)
class HybridCost:
    """Predicted communication per step: full sharding over all N GPUs vs HSDP.

    Seconds by the model of this module (see its docstring); ``*_latency_s`` is the
    alpha part of each; ``*_nic_bytes`` what one NIC sends across nodes per step;
    ``*_nvlink_bytes`` what the busiest GPU sends over NVLink; ``states_*`` model-state
    bytes per GPU (mixed precision, :func:`course_utils.theory.memory.model_states`,
    ZeRO-3 over N vs over g GPUs).
    """
    num_params: float
    gpus_per_node: int
    nodes: int
    nics_per_node: int
    intra_bw: float
    nic_bw: float
    fsdp_s: float
    hsdp_s: float
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
        """Bytes one node sends across nodes per step with full sharding (all its NICs)."""
        return self.fsdp_nic_bytes * self.nics_per_node

    @property
    def hsdp_node_bytes(self) -> float:
        """Bytes one node sends across nodes per step with HSDP (all its NICs)."""
        return self.hsdp_nic_bytes * self.nics_per_node

    @property
    def speedup(self) -> float:
        """How many times faster HSDP's communication is (> 1: HSDP wins)."""
        return self.fsdp_s / self.hsdp_s if self.hsdp_s else math.inf

    @property
    def faster(self) -> str:
        return "HSDP" if self.hsdp_s < self.fsdp_s else "full sharding" if self.fsdp_s < self.hsdp_s else "tie"


def _checked(num_params, gpus_per_node, nodes, intra_bw, nic_bw, nics_per_node, alpha_intra_s,
             alpha_inter_s, bytes_per_elem):
    check_positive("num_params", num_params)
    check_int("gpus_per_node", gpus_per_node, 1)
    check_int("nodes", nodes, 1)
    check_positive("intra_bw", intra_bw)
    check_positive("nic_bw", nic_bw)
    r = _nics(nics_per_node, gpus_per_node)
    check_positive("alpha_intra_s", alpha_intra_s)
    check_positive("alpha_inter_s", alpha_inter_s)
    check_int("bytes_per_elem", bytes_per_elem, 1)
    return r


def hsdp_vs_fsdp_time(num_params, gpus_per_node: int, nodes: int, intra_bw: float, nic_bw: float, *,
                      nics_per_node: int | None = None, alpha_intra_s: float = 5e-6,
                      alpha_inter_s: float = 10e-6, bytes_per_elem: int = 2) -> HybridCost:
    """Communication seconds per step of full sharding (FSDP/ZeRO-3 over all N = g·n GPUs)
    and of HSDP (shard inside each node of g GPUs, replicate across the n nodes).

    ``intra_bw``: NVLink bytes/s per GPU; ``nic_bw``: bytes/s of one NIC;
    ``nics_per_node``: NICs per node (None: one per GPU, as on a DGX H100). The model,
    with its derivation, is in this module's docstring.

    >>> c = hsdp_vs_fsdp_time(7e9, 8, 4, 450e9, 25e9)        # 8 NICs of 200 Gb/s per node
    >>> round(c.fsdp_s, 3), round(c.hsdp_s, 3), round(c.fsdp_nic_bytes / 1e9, 2), c.hsdp_nic_bytes / 1e9
    (0.204, 0.187, 5.09, 2.625)
    """
    r = _checked(num_params, gpus_per_node, nodes, intra_bw, nic_bw, nics_per_node, alpha_intra_s,
                 alpha_inter_s, bytes_per_elem)
    m, g, n = num_params * bytes_per_elem, gpus_per_node, nodes
    world = g * n
    sent = 2 * collective_bytes("all_gather", m, world) + collective_bytes("reduce_scatter", m, world)
    fsdp_lat = 3 * ring_steps("all_gather", world) * (alpha_inter_s if n > 1 else alpha_intra_s)
    fsdp_wire, fsdp_nic, fsdp_nvlink = flat_ring_wire(sent, g, n, intra_bw, nic_bw, r)
    hsdp_intra = (2 * predict_time("all_gather", m, g, alpha_intra_s, intra_bw)
                  + predict_time("reduce_scatter", m, g, alpha_intra_s, intra_bw))
    hsdp_wire, hsdp_nic = cross_node_wire(collective_bytes("all_reduce", m / g, n), g, n, nic_bw, r)
    hsdp_lat = 3 * ring_steps("all_gather", g) * alpha_intra_s + ring_steps("all_reduce", n) * alpha_inter_s
    return HybridCost(
        num_params=num_params, gpus_per_node=g, nodes=n, nics_per_node=r, intra_bw=intra_bw, nic_bw=nic_bw,
        fsdp_s=fsdp_lat + fsdp_wire, hsdp_s=hsdp_intra + ring_steps("all_reduce", n) * alpha_inter_s + hsdp_wire,
        fsdp_latency_s=fsdp_lat, hsdp_latency_s=hsdp_lat, fsdp_nic_bytes=fsdp_nic, hsdp_nic_bytes=hsdp_nic,
        fsdp_nvlink_bytes=fsdp_nvlink, hsdp_nvlink_bytes=3 * collective_bytes("all_gather", m, g),
        states_fsdp=model_states(num_params, world_size=world, stage=3).total,
        states_hsdp=model_states(num_params, world_size=g, stage=3).total)


def crossovers(num_params, gpus_per_node: int, nodes: int, intra_bw: float, *,
               nics_per_node: int | None = None, **model) -> tuple[float, ...]:
    """The per-NIC bandwidths at which full sharding and HSDP take the same time, ascending.

    HSDP is faster below the first; full sharding between the first and the second (or
    above the first when there is no second); ``()`` when HSDP is faster at every
    bandwidth. Why at most two: HSDP takes ``c + X_h/B`` (B the per-NIC bandwidth, c its
    NVLink part and latencies) and full sharding ``a + max(X_f/B, v)`` (v its NVLink
    part, a its latency), with ``X_f > X_h``. While the network bounds full sharding
    (``B <= X_f/v``) the difference ``(X_f - X_h)/B + a - c`` falls with B: they meet at
    ``(X_f - X_h)/(c - a)``. Once NVLink bounds it, the difference ``v + a - c - X_h/B``
    grows with B: when ``v + a > c`` (fewer NICs than GPUs, or a short message whose
    latency dominates) HSDP wins again above ``X_h/(v + a - c)``.
    """
    if nodes == 1:
        raise ValueError("with nodes=1 both strategies stay inside the node: there is no "
                         "network to compare; use nodes >= 2")
    c = hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, 1e9, nics_per_node=nics_per_node,
                          **model)
    x_f, x_h = c.fsdp_nic_bytes, c.hsdp_nic_bytes
    v, a = c.fsdp_nvlink_bytes / intra_bw, c.fsdp_latency_s
    fixed_h = c.hsdp_s - x_h / c.nic_bw
    network_bound_up_to = x_f / v if v > 0 else math.inf
    if fixed_h <= a or (x_f - x_h) / (fixed_h - a) > network_bound_up_to:
        return ()
    first = (x_f - x_h) / (fixed_h - a)
    k = v + a - fixed_h
    return (first, x_h / k) if k > 0 else (first,)


def crossover_inter_bw(num_params, gpus_per_node: int, nodes: int, intra_bw: float, *,
                       nics_per_node: int | None = None, **model) -> float:
    """The per-NIC bandwidth above which full sharding's communication is faster than
    HSDP's (below it HSDP is faster); ``math.inf`` when HSDP is faster at every
    bandwidth. Full sharding may lose again at a second, higher bandwidth:
    :func:`crossovers` gives both."""
    found = crossovers(num_params, gpus_per_node, nodes, intra_bw, nics_per_node=nics_per_node, **model)
    return found[0] if found else math.inf


#: Per-NIC bandwidths (bytes/s) of :func:`crossover_table`: 25 Gb/s Ethernet up to
#: 1.6 Tb/s; 100/200/400/800 Gb/s (12.5/25/50/100 GB/s) are today's InfiniBand and RoCE cards.
DEFAULT_NIC_BWS = (3.125e9, 6.25e9, 12.5e9, 25e9, 50e9, 100e9, 200e9)


def _gbs(bw: float) -> str:
    return f"{bw / 1e9:.1f} GB/s"


def _where_full_wins(found: tuple) -> str:
    if not found:
        return "HSDP is faster at every bandwidth"
    if len(found) == 1:
        return f"full sharding is faster above {_gbs(found[0])} per NIC, HSDP below"
    return (f"full sharding is faster between {_gbs(found[0])} and {_gbs(found[1])} per NIC "
            "(its ring is NVLink-bound above that), HSDP outside")


def crossover_summary(num_params=7e9, gpus_per_node: int = 8, nodes: int = 4, intra_bw: float = 450e9,
                      nic_bw: float = 25e9, *, nics_per_node: int | None = None, **model) -> str:
    """A few lines: where the two strategies cross, both times at ``nic_bw``, the bytes
    through each NIC and each node, the latency and the model states per GPU."""
    c = hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, nic_bw, nics_per_node=nics_per_node,
                          **model)
    found = crossovers(num_params, gpus_per_node, nodes, intra_bw, nics_per_node=nics_per_node, **model)
    world = gpus_per_node * nodes
    return "\n".join([
        f"{num_params / 1e9:g}B parameters, {nodes} nodes x {gpus_per_node} GPUs, NVLink "
        f"{intra_bw / 1e9:g} GB/s per GPU, {c.nics_per_node} NIC(s) per node",
        _where_full_wins(found),
        f"at {nic_bw / 1e9:g} GB/s per NIC: full sharding {c.fsdp_s:.3f} s, HSDP {c.hsdp_s:.3f} s per step "
        f"({c.faster} faster, {max(c.speedup, 1 / c.speedup):.2f}x)",
        f"bytes across nodes per step: per NIC full sharding {c.fsdp_nic_bytes / 1e9:.2f} GB, HSDP "
        f"{c.hsdp_nic_bytes / 1e9:.3f} GB; per node {c.fsdp_node_bytes / 1e9:.2f} GB vs "
        f"{c.hsdp_node_bytes / 1e9:.2f} GB",
        f"latency per step (one message per pass): full sharding {c.fsdp_latency_s * 1e3:.3f} ms, "
        f"HSDP {c.hsdp_latency_s * 1e3:.3f} ms",
        f"model states per GPU (mixed precision): full sharding over {world} GPUs "
        f"{c.states_fsdp / 1e9:.2f} GB, HSDP over {gpus_per_node} GPUs {c.states_hsdp / 1e9:.2f} GB",
    ])


def crossover_table(num_params=7e9, gpus_per_node: int = 8, nodes: int = 4, intra_bw: float = 450e9,
                    nic_bws=DEFAULT_NIC_BWS, *, nics_per_node: int | None = None, **model) -> str:
    """A text table of :func:`hsdp_vs_fsdp_time` over per-NIC bandwidths, then
    :func:`crossover_summary` (at 25 GB/s per NIC).

    Defaults: a 7B model in bf16 on 4 nodes of 8 GPUs with 450 GB/s NVLink per GPU
    (an H100's, one direction) and one NIC per GPU.
    """
    if not nic_bws:
        raise ValueError("nic_bws must list at least one bandwidth (bytes/s per NIC)")
    rows = [("GB/s per NIC", "full shard s", "HSDP s", "HSDP speedup", "faster")]
    for bw in nic_bws:
        cost = hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, bw,
                                 nics_per_node=nics_per_node, **model)
        rows.append((f"{bw / 1e9:g}", f"{cost.fsdp_s:.4f}", f"{cost.hsdp_s:.4f}",
                     f"{cost.speedup:.2f}x", cost.faster))
    summary = crossover_summary(num_params, gpus_per_node, nodes, intra_bw, nics_per_node=nics_per_node, **model)
    return table(rows[0], rows[1:], left=(0, 4), notes=["", summary])


def plot_crossover(num_params=7e9, gpus_per_node: int = 8, nodes: int = 4, intra_bw: float = 450e9, *,
                   nics_per_node=(8, 1), nic_bw_range=(3e9, 400e9), **model):
    """One log-log panel per entry of ``nics_per_node``: communication seconds per step of
    full sharding and HSDP against the bandwidth of one NIC, with the crossover(s) marked,
    the range where full sharding is faster shaded."""
    import numpy as np
    from matplotlib.figure import Figure

    counts = [nics_per_node] if isinstance(nics_per_node, int) else list(nics_per_node)
    if not counts:
        raise ValueError("nics_per_node must be an int or a non-empty sequence of ints")
    lo, hi = nic_bw_range
    check_positive("nic_bw_range[0]", lo)
    if not hi > lo:
        raise ValueError(f"nic_bw_range must be (low, high) with high > low, got {nic_bw_range!r}")
    grid = np.geomspace(lo, hi, 200)
    fig = Figure(figsize=(5.0 * len(counts), 4.0))
    axes = fig.subplots(1, len(counts), squeeze=False)[0]
    for ax, r in zip(axes, counts):
        costs = [hsdp_vs_fsdp_time(num_params, gpus_per_node, nodes, intra_bw, float(b), nics_per_node=r,
                                   **model) for b in grid]
        found = crossovers(num_params, gpus_per_node, nodes, intra_bw, nics_per_node=r, **model)
        x = grid / 1e9
        ax.loglog(x, [c.fsdp_s for c in costs], "-", color="#C44E52", label=f"full sharding over {nodes * gpus_per_node} GPUs")
        ax.loglog(x, [c.hsdp_s for c in costs], "-", color="#4C72B0",
                  label=f"HSDP ({gpus_per_node} shards x {nodes} replicas)")
        if found:
            right = min(found[1], hi) if len(found) > 1 else hi
            ax.axvspan(max(found[0], lo) / 1e9, right / 1e9, color="#C44E52", alpha=0.08,
                       label="full sharding faster")
        for b in found:
            if lo <= b <= hi:
                ax.axvline(b / 1e9, color="black", linestyle=":", linewidth=0.8)
                ax.text(b / 1e9, ax.get_ylim()[1], f" {b / 1e9:.0f} GB/s", va="top", fontsize=8)
        ax.set_xlim(lo / 1e9, hi / 1e9)
        ticks = [t for t in (6.25, 12.5, 25, 50, 100, 200, 400) if lo / 1e9 <= t <= hi / 1e9]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("bandwidth of one NIC, GB/s (x 8 = Gb/s: 50 GB/s is a 400 Gb/s card)", fontsize=8)
        ax.set_ylabel("communication per step (s)")
        ax.set_title(f"{r} NIC(s) per node of {gpus_per_node} GPUs", fontsize=9)
        ax.legend(fontsize=7, frameon=False, loc="lower left")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.suptitle(f"{num_params / 1e9:g}B params, {nodes} nodes x {gpus_per_node} GPUs, NVLink "
                 f"{intra_bw / 1e9:g} GB/s: 2 all-gathers + 1 reduce-scatter per step", fontsize=9)
    fig.tight_layout()
    return fig
