"""Where a step's time goes (notebooks 02, 06, 07, 08): the same training step first on a free
link, then under a modelled network (:mod:`course_utils.runtime.network`). The free steps give
the compute (measured) and when each collective was issued and waited for; the α-β model
applied to them is the *prediction*; the steps under the network are the *clock*.

:func:`time_step` runs one strategy (the course's classes, the learner's, torch DDP and FSDP2
alike: they issue the same collectives); :func:`plot_steps` draws one step of each, compute
and wire side by side, the hidden and the exposed part of the communication.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics

from ..checks import check_int
from ..harness.experiments import StepClock, make_adamw, train, wrap
from ..harness.model import SyntheticData, build_model, rows_per_rank, warm_up
from ..harness.strategies import get as get_strategy
from ..runtime.launch import launch, rank_device
from ..runtime.network import FREE, ModelledNetwork, as_network, predict_step
from ..theory.config import COURSE_CONFIG

__all__ = ["NETWORK", "GLOBAL_BATCH", "StepTime", "time_step", "plot_steps", "describe", "union_s",
           "blocked_spans", "shaped_network", "shaped_link_unavailable", "time_on_shaped_link",
           "profile_step", "trace_lanes", "plot_trace", "matched_network"]

#: The link of the course's clock demos: 6 MB/s per rank, 50 µs per ring step. The course GPT's
#: 517,400 B of fp32 gradients then take 86 ms to all-reduce on 2 ranks, about as long as the
#: backward of :data:`GLOBAL_BATCH` rows on one core: what overlap can hide is there to hide.
NETWORK = {"bandwidth": 6e6, "latency": 50e-6}
#: Rows per step in the clock demos: enough compute that real gloo's own few milliseconds
#: per call (on the loopback, sharing two cores) stay small beside the modelled link.
GLOBAL_BATCH = 384
TIMEOUT_S = 300
#: The link's bars in :func:`plot_steps`, one colour per collective.
LINK_COLORS = {"all_reduce": "#4C72B0", "all_gather": "#55A868", "reduce_scatter": "#8172B2",
               "broadcast": "#937860"}


@dataclasses.dataclass
class StepTime:
    """One strategy's step on rank 0: ``free_s`` on a free link (compute and the loopback,
    measured), ``predicted_s`` (the model applied to the free steps), ``measured_s`` under
    ``network`` (the clock; on a real shaped link, measured); medians over the steps."""
    label: str
    strategy: str
    world_size: int
    network: str
    free_s: float | None
    predicted_s: float | None
    measured_s: float
    free: list            # StepClock per free step (rank 0)
    clocked: list         # StepClock per step under the network (rank 0)

    @property
    def median_clock(self) -> StepClock:
        """The clocked step whose time is the median."""
        times = [c.step_s for c in self.clocked]
        return self.clocked[times.index(statistics.median_low(times))]

    @property
    def error(self) -> float | None:
        """measured / predicted - 1."""
        return None if self.predicted_s is None else self.measured_s / self.predicted_s - 1

    def wire_s(self, op: str | None = None) -> float:
        """Seconds the median clocked step's link was busy (model), with ``op``'s transfers only."""
        c = self.median_clock
        return union_s([(t.start, t.arrival) for t in c.transfers if op in (None, t.op)], 0.0, c.step_s)

    def exposed_s(self, op: str | None = None) -> float:
        """Seconds a clocked step stood waiting for the network (measured), for ``op`` only: the
        median over the steps, which one step slowed by the machine's load does not move."""
        return statistics.median(union_s(blocked_spans(c, op), 0.0, c.step_s) for c in self.clocked)


def blocked_spans(clock: StepClock, op: str | None = None) -> list:
    """(from, to) of each wait for a transfer in ``clock``. A future's waiter (torch DDP's C++
    reducer) is taken to wait from when the step issued its last transfer, as it does when
    backward ends, until the future completed."""
    last_issue = max((t.issued for t in clock.transfers), default=0.0)
    spans = []
    for t in clock.transfers:
        if op not in (None, t.op):
            continue
        waited = t.waited if t.waited is not None else (last_issue if t.future else None)
        if waited is not None and t.done is not None and t.done > waited:
            spans.append((waited, t.done))
    return spans


def union_s(spans, lo: float, hi: float) -> float:
    """Length of the union of ``spans`` (start, end), clipped to ``[lo, hi]``."""
    total, reach = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _clocks(spans, net, description: str) -> list:
    out = []
    for t0, tb, t1 in spans[1:]:                   # the first step warms up
        transfers = [t.shifted(t0) for t in net.between(t0, t1)] if net is not None else []
        out.append(StepClock(description, t1 - t0, transfers, tb - t0))
    return out


def _timed(strategy: str, steps: int, network, free: bool, global_batch: int, seed: int,
           options: dict) -> dict:
    device = rank_device()
    model, optimizer = wrap(strategy, build_model(COURSE_CONFIG, seed=seed, device=device), make_adamw,
                            **options)
    data = SyntheticData(COURSE_CONFIG, global_batch=global_batch, seed=seed)
    out, first = {}, 0
    for name, net in (("free", FREE if free else False), ("clocked", network)):
        if net is False:
            continue
        spans = []
        with (ModelledNetwork(net) if net is not None else contextlib.nullcontext()) as modelled:
            for _ in train(model, optimizer, data, range(first, first + steps + 1), device=device,
                           spans=spans):
                pass
        first += steps + 1
        out[name] = _clocks(spans, modelled, modelled.describe() if modelled else "the real link")
    return out


def time_step(strategy: str, world_size: int = 2, *, network=NETWORK, steps: int = 6,
              global_batch: int = GLOBAL_BATCH, seed: int = 0, label: str | None = None,
              free: bool = True, quiet: bool = True, timeout_s: float = TIMEOUT_S,
              **options) -> StepTime:
    """``steps`` steps of ``strategy`` (after one warm-up step) on a free link, then as many
    under ``network`` (None: as the ranks run, e.g. on a real shaped link); ``options`` reach
    ``wrap`` (``impl=MyDDP``, ``bucket_bytes``, ``overlap``, ``prefetch``...)."""
    spec = get_strategy(strategy)
    if not spec.distributed:
        raise ValueError(f"strategy {strategy!r} is one process: it sends nothing to time")
    check_int("world_size", world_size, 2, what="ranks; one rank sends nothing")
    check_int("steps", steps, 1)
    check_int("global_batch", global_batch, 1)
    rows_per_rank(global_batch, world_size)
    network = as_network(network)
    warm_up(COURSE_CONFIG)
    results = launch(_timed, world_size, strategy, steps, network, free, global_batch, seed, options,
                     quiet=quiet, timeout_s=timeout_s)
    r0 = results[0]
    free_clocks = r0.get("free", [])
    predicted = None
    if free_clocks and network is not None:
        predicted = statistics.median(predict_step(c.step_s, c.transfers, network) for c in free_clocks)
    return StepTime(label=label or strategy, strategy=strategy, world_size=world_size,
                    network=network.describe() if network is not None else "the real link",
                    free_s=statistics.median(c.step_s for c in free_clocks) if free_clocks else None,
                    predicted_s=predicted, measured_s=statistics.median(c.step_s for c in r0["clocked"]),
                    free=free_clocks, clocked=r0["clocked"])


def describe(times: dict, *, predicted: bool = True, waited: bool = False, free: bool = True) -> str:
    """One line per labelled :class:`StepTime`: free (unless ``free=False``), predicted (unless
    ``predicted=False``), measured (ms), and with ``waited=True`` the time the clocked step stood
    waiting for the network (:meth:`StepTime.exposed_s`), which, unlike the difference of two
    separately timed steps, is measured inside one run and never negative."""
    head = f"{'predicted':>11}" if predicted else ""
    rows = [f"{'':<34}" + (f"{'no delay':>10}" if free else "") + f"{head}{'step':>9}"
            + (f"{'waited':>9}" if waited else "") + "   (ms per step, rank 0)"]
    for label, t in times.items():
        pred = "" if not predicted else (f"{t.predicted_s * 1e3:>11.0f}" if t.predicted_s is not None else f"{'':>11}")
        free_ms = "" if not free else (f"{t.free_s * 1e3:>10.0f}" if t.free_s is not None else f"{'':>10}")
        wait = f"{t.exposed_s() * 1e3:>9.0f}" if waited else ""
        rows.append(f"{label:<34}{free_ms}{pred}{t.measured_s * 1e3:>9.0f}{wait}")
    return "\n".join(rows)


def plot_steps(times: dict, *, title: str | None = None, predicted: bool = False):
    """One lane pair per labelled :class:`StepTime` (its median step under the network, rank 0):
    compute (measured: everything the rank does but wait, gloo's own CPU work on its transfers
    included), waiting for the network (exposed), and the link busy (modelled), per collective.
    ``predicted=True`` adds a tick where the α-β model puts the step's end (from the no-delay run,
    a separate run: it can differ by as much as a step varies from run to run)."""
    from matplotlib.figure import Figure

    if not isinstance(times, dict) or not times or not all(isinstance(t, StepTime) for t in times.values()):
        raise TypeError("times must be a non-empty dict of label -> StepTime (what time_step returns)")
    fig = Figure(figsize=(9.0, 1.4 + 0.75 * len(times)))
    ax = fig.subplots()
    labels = list(times)
    drawn: set = set()
    for row, label in enumerate(labels):
        t = times[label]
        c = t.median_clock
        y = row * 1.0
        blocked = sorted(blocked_spans(c))
        ax.broken_barh([(0, c.step_s * 1e3)], (y - 0.38, 0.36), color="#DD8452", alpha=0.85,
                       label="computing (measured)" if row == 0 else None)
        ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in blocked], (y - 0.38, 0.36), color="#C44E52",
                       label="waiting for the network: exposed" if row == 0 else None)
        for op, color in LINK_COLORS.items():
            bars = [(tr.start * 1e3, tr.seconds * 1e3) for tr in c.transfers if tr.seconds > 0 and tr.op == op]
            ax.broken_barh(bars, (y + 0.02, 0.36), color=color, edgecolor="white", linewidth=0.4,
                           label=f"link busy: {op.replace('_', '-')} (modelled)"
                           if op not in drawn and bars else None)
            drawn.update([op] if bars else [])
        cross = [(tr.start * 1e3, tr.seconds * 1e3) for tr in c.transfers if tr.seconds > 0 and tr.link == "inter"]
        if cross:
            ax.broken_barh(cross, (y + 0.02, 0.36), facecolor="none", edgecolor="black", linewidth=0.4,
                           hatch="////", label="across nodes" if "inter" not in drawn else None)
            drawn.add("inter")
        if c.backward_at is not None:
            ax.plot([c.backward_at * 1e3] * 2, [y - 0.42, y - 0.02], color="#333333", linewidth=1, linestyle=":",
                    label="backward starts" if row == 0 else None)
        if predicted and t.predicted_s is not None:
            ax.plot([t.predicted_s * 1e3] * 2, [y - 0.42, y + 0.42], color="black", linewidth=1.2,
                    label="predicted step end" if row == 0 else None)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    import textwrap

    ax.set_xlabel("ms from the start of a step (rank 0)", fontsize=8)
    where = textwrap.fill(next(iter(times.values())).network, 150)
    ax.set_title((title or "one training step: compute, and the communication it hides or waits for")
                 + "\n" + where, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.55 / fig.get_figheight(), 1, 1))
    return fig


# -- a real slow link: the loopback of a private network namespace, rate-limited by tc (Linux, root)
#: The shaped loopback's rate: 96 Mbit/s = 12 MB/s, which the 2 ranks share (every byte of the
#: ring crosses the one loopback): 6 MB/s per rank, the modelled :data:`NETWORK`.
SHAPED_RATE_MBIT = 96


def shaped_network(rate_mbit: float = SHAPED_RATE_MBIT, world_size: int = 2) -> dict:
    """The modelled network of the shaped loopback: its rate shared by ``world_size`` ranks,
    gloo's bytes (its reduce-scatter is a whole all-reduce), the loopback's latency."""
    return {"bandwidth": rate_mbit * 1e6 / 8 / world_size, "latency": 50e-6, "wire": "gloo"}


def shaped_link_unavailable() -> str | None:
    """Why the shaped loopback cannot be made here (None: it can)."""
    import os
    import shutil
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        return "a private network namespace needs Linux"
    if os.geteuid() != 0:
        return "unshare -n and tc need root"
    missing = [t for t in ("unshare", "ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (iproute2 and util-linux)"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", _SHAPE.format(rate=SHAPED_RATE_MBIT)],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"could not shape a private loopback: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return None


# The burst must exceed the loopback's MTU; small, so that what the idle link saved up during
# compute (32 KB) barely shortens a step.
_SHAPE = ("ip link set lo up && ip link set lo mtu 9000 && "
          "tc qdisc add dev lo root tbf rate {rate}mbit burst 32kb latency 400ms")


def time_on_shaped_link(strategy: str, world_size: int = 2, *, rate_mbit: float = SHAPED_RATE_MBIT,
                        steps: int = 6, global_batch: int = GLOBAL_BATCH, timeout_s: float = TIMEOUT_S,
                        **options) -> float:
    """Median step (s, rank 0) of ``strategy`` over a real loopback shaped to ``rate_mbit``, in a
    private network namespace (:func:`shaped_link_unavailable` says where it cannot run)."""
    import json
    import subprocess
    import sys

    if why := shaped_link_unavailable():
        raise RuntimeError(f"no shaped link here: {why}")
    spec = json.dumps({"strategy": strategy, "world_size": world_size, "steps": steps,
                       "global_batch": global_batch, "options": options})
    cmd = (_SHAPE.format(rate=rate_mbit) + f" && exec {sys.executable} -m course_utils.labs.clock")
    out = subprocess.run(["unshare", "-n", "sh", "-c", cmd], input=spec, capture_output=True, text=True,
                         timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"the run on the shaped link failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["measured_s"]


def _main() -> None:
    """Rank 0's median step of the strategy described by the JSON on stdin, as the ranks run
    (no modelled network): the shaped-link side of :func:`time_on_shaped_link`."""
    import json
    import sys

    spec = json.load(sys.stdin)
    t = time_step(spec["strategy"], spec["world_size"], network=None, free=False, steps=spec["steps"],
                  global_batch=spec["global_batch"], **spec["options"])
    print(json.dumps({"measured_s": t.measured_s}))



# -- a real profiler trace of one clocked step
def _profiled(strategy: str, network, global_batch: int, seed: int, options: dict, path: str | None) -> dict:
    import json
    import time

    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    device = rank_device()
    model, optimizer = wrap(strategy, build_model(COURSE_CONFIG, seed=seed, device=device), make_adamw,
                            **options)
    data = SyntheticData(COURSE_CONFIG, global_batch=global_batch, seed=seed)
    spans = []
    with ModelledNetwork(network) as net:
        for _ in train(model, optimizer, data, range(2), device=device):      # warm up
            pass
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("clock: sync"):
                t_sync = time.perf_counter()
            for _ in train(model, optimizer, data, range(2, 3), device=device, spans=spans):
                pass
    t0, _, t1 = spans[0]
    transfers = [t.shifted(t0) for t in net.between(t0, t1)]
    if dist.get_rank() != 0 or path is None:
        return {}
    prof.export_chrome_trace(path)
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    sync = next(e for e in events if e.get("name") == "clock: sync")
    offset_us = sync["ts"] - t_sync * 1e6            # profiler µs = perf_counter s x 1e6 + offset
    pid = sync["pid"]
    start_us = t0 * 1e6 + offset_us
    for tr in transfers:                             # the model, and the thread the profiler cannot see
        events.append({"ph": "X", "cat": "modelled network", "name": f"link busy: {tr.op}", "pid": pid,
                       "tid": "modelled link", "ts": start_us + tr.start * 1e6, "dur": tr.seconds * 1e6})
        if tr.ran is not None:
            events.append({"ph": "X", "cat": "modelled network", "name": f"gloo: {tr.op}", "pid": pid,
                           "tid": "network thread", "ts": start_us + tr.ran[0] * 1e6,
                           "dur": (tr.ran[1] - tr.ran[0]) * 1e6})
    for a, b in blocked_spans(StepClock("", t1 - t0, transfers)):
        events.append({"ph": "X", "cat": "modelled network", "name": "waiting for the network", "pid": pid,
                       "tid": "waiting (exposed)", "ts": start_us + a * 1e6, "dur": (b - a) * 1e6})
    events.append({"ph": "X", "cat": "clock", "name": "training step", "pid": pid, "tid": "step",
                   "ts": start_us, "dur": (t1 - t0) * 1e6})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return {"path": path, "step_ms": (t1 - t0) * 1e3}


@contextlib.contextmanager
def _quiet_stderr():
    """The process's C++ stderr to /dev/null (Kineto prints a line as each profiler starts and stops)."""
    import os
    import sys

    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def profile_step(strategy: str = "ddp", world_size: int = 2, *, path: str, network=NETWORK,
                 global_batch: int = GLOBAL_BATCH, seed: int = 0, quiet: bool = True,
                 timeout_s: float = TIMEOUT_S, **options) -> dict:
    """One step of ``strategy`` under ``network``, after two warm-up steps, profiled with
    ``torch.profiler`` (CPU) on every rank; rank 0's trace is written to ``path`` as Chrome /
    Perfetto JSON (open it in ui.perfetto.dev or chrome://tracing), with lanes added from the
    network's records: the step, the real gloo transfers on the network's thread (the profiler
    records only the thread it was started in), the modelled link's transfers and the waits
    for them. Returns ``{"path", "step_ms"}``."""
    get_strategy(strategy)
    check_int("world_size", world_size, 2, what="ranks; one rank sends nothing")
    rows_per_rank(global_batch, world_size)
    warm_up(COURSE_CONFIG)
    return launch(_profiled, world_size, strategy, as_network(network), global_batch, seed, options,
                  str(path), quiet=quiet, timeout_s=timeout_s)[0]


def trace_lanes(path) -> dict:
    """``{lane: [(name, start ms, duration ms)]}`` of a trace :func:`profile_step` wrote, from the
    step's start: the main thread's outermost operations (compute, the calls it makes, its
    waits), any other thread's, and the lanes added from the network's records."""
    import json

    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)
              if e.get("ph") == "X" and "dur" in e]
    step = next(e for e in events if e.get("tid") == "step")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    threads: dict = {}
    for e in events:
        if e.get("cat") in ("modelled network", "clock") or not lo <= e["ts"] < hi:
            continue
        threads.setdefault(e["tid"], []).append(e)
    main = max(threads, key=lambda t: sum(e["dur"] for e in threads[t])) if threads else None
    lanes: dict = {}
    for tid, evs in threads.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        outer, reach = [], lo
        for e in evs:                                # outermost events only
            if e["ts"] >= reach:
                outer.append(e)
                reach = e["ts"] + e["dur"]
        lane = "main thread: compute and the calls it makes" if tid == main else f"thread {tid}"
        lanes[lane] = [(e["name"], (e["ts"] - lo) / 1e3, e["dur"] / 1e3) for e in outer]
    added = {"network thread": "network thread: gloo's real transfers", "waiting (exposed)": "waiting (exposed)",
             "modelled link": "modelled link"}
    for tid, lane in added.items():
        lanes[lane] = [(e["name"], (e["ts"] - lo) / 1e3, e["dur"] / 1e3) for e in events if e.get("tid") == tid]
    return lanes


def plot_trace(path, *, title: str | None = None):
    """The trace :func:`profile_step` wrote, drawn as Perfetto draws it: a lane per thread."""
    from matplotlib.figure import Figure

    lanes = trace_lanes(path)
    fig = Figure(figsize=(9.0, 0.8 + 0.55 * len(lanes)))
    ax = fig.subplots()
    colors = {"waiting (exposed)": "#C44E52", "modelled link": "#4C72B0",
              "network thread: gloo's real transfers": "#8172B2"}
    for row, (lane, spans) in enumerate(lanes.items()):
        color = colors.get(lane, "#DD8452" if lane.startswith("main") else "#8172B2")
        ax.broken_barh([(s, max(d, 0.05)) for _, s, d in spans], (row - 0.35, 0.7), color=color,
                       edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(lanes)), list(lanes), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the step (rank 0; torch.profiler, CPU)", fontsize=8)
    ax.set_title(title or "one profiled step: each bar an operation as the trace records it", fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig



def matched_network(world_size: int = 2, *, global_batch: int = GLOBAL_BATCH, latency: float = 50e-6,
                    steps: int = 3, timeout_s: float = TIMEOUT_S) -> tuple[dict, float]:
    """``(network, backward seconds)``: the link on which the course GPT's gradient all-reduce
    takes as long as its backward does on this machine (measured: the course's DDP, one bucket,
    on a free link), so that what overlap can hide is there to hide on a slow CPU and a fast one
    alike; its bandwidth rounded to 2 significant digits."""
    import math

    from ..theory.comm import collective_bytes

    check_int("world_size", world_size, 2, what="ranks; one rank sends nothing")
    t = time_step("ddp", world_size, network=FREE, steps=steps, global_batch=global_batch,
                  timeout_s=timeout_s, bucket_bytes=2**40)       # one bucket: sent when backward ends
    backward = statistics.median(max(tr.issued for tr in c.transfers) - c.backward_at for c in t.free)
    sent = collective_bytes("all_reduce", 4 * COURSE_CONFIG.num_params(), world_size)
    return {"bandwidth": float(f"{sent / backward:.2g}"), "latency": latency}, backward


if __name__ == "__main__":
    _main()
