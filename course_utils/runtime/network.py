"""A modelled network: the clock of a slow link on any laptop (notebooks 02, 06-08).

On a 2-core CPU gloo's transfers take the cores that compute needs, so nothing really
overlaps and a step's time says little about a cluster. Inside :class:`ModelledNetwork`
every collective still runs for real (its results are real), but it *completes* no earlier
than a link of latency α and bandwidth β would deliver it, in the α-β ring model of
:mod:`course_utils.theory.alpha_beta`:

- each rank has a link (two with ``node_size``: within a node, across nodes); transfers
  queue on it in issue order, so concurrent collectives share it;
- the real transfers run on one thread of the process, in issue order (so every rank runs
  them in the same order), each once its link takes it;
- a blocking collective returns at its modelled arrival; an ``async_op=True`` one returns at
  once and its ``wait()`` blocks until the arrival; a future (``get_future()``, torch DDP's
  comm hook) completes then; FSDP2's side streams are modelled too (:class:`_CpuStreams`);
- compute is not slowed: it is measured on this CPU.

So a step's clock is compute (measured) + the communication it did not hide (modelled).
Point-to-point calls run unmodelled. :func:`predict_step` is the same model applied to a
step run on a free link: the prediction to compare the clock with.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import threading
import time
from typing import Mapping

import torch.distributed as dist

from ..checks import check_int, check_number
from ..theory.comm import OPS, collective_bytes, gloo_bytes
from . import ledger as _ledger
from .compat import cpu_default_stream

__all__ = ["Link", "Network", "Transfer", "ModelledNetwork", "modelled_network", "current_network",
           "as_network", "parse_network", "predict_step", "FREE"]

_P2P = ("send", "recv", "isend", "irecv")


def _rate(x: float) -> str:
    return "free" if math.isinf(x) else f"{x / 1e6:g} MB/s"


def steps_and_bytes(op: str, message_bytes: int, world_size: int, wire: str = "ring") -> tuple[int, float]:
    """(latency steps, bytes one rank sends) of one call: the ring's for ring ops (``wire="gloo"``:
    gloo's bytes), one step per peer and the whole message for the others; (0, 0) on one rank."""
    if world_size <= 1:
        return 0, 0.0
    if op in OPS:
        sent = (gloo_bytes(op, message_bytes, world_size) if wire == "gloo"
                else collective_bytes(op, message_bytes, world_size))
        return (2 if op == "all_reduce" else 1) * (world_size - 1), sent
    return world_size - 1, message_bytes


@dataclasses.dataclass(frozen=True)
class Link:
    """One rank's link: ``bandwidth`` bytes/s it sends (``math.inf``: free), ``latency`` s per ring step."""
    bandwidth: float
    latency: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth == math.inf):
            check_number("bandwidth", self.bandwidth, above=0, example="50e6 (bytes per second)")
        check_number("latency", self.latency, minimum=0, example="20e-6 (seconds)")

    def seconds(self, op: str, message_bytes: int, world_size: int, wire: str = "ring") -> float:
        """The α-β time of one call: ring ops ``α·steps + ring bytes / β`` (``wire="gloo"``:
        the bytes gloo sends, :func:`~course_utils.theory.comm.gloo_bytes`); the others one
        latency per peer and the whole message through the link."""
        steps, sent = steps_and_bytes(op, message_bytes, world_size, wire)
        return self.latency * steps + sent / self.bandwidth

    def describe(self) -> str:
        return f"{_rate(self.bandwidth)}, α {self.latency * 1e6:g} µs"


@dataclasses.dataclass(frozen=True)
class Network:
    """A link per rank; with ``node_size``, a collective whose ranks span nodes of
    ``node_size`` ranks uses the ``inter`` link instead (HSDP's two link classes).
    ``wire``: ``"ring"`` (the bytes of NCCL's ring) or ``"gloo"`` (what gloo sends: its
    reduce-scatter is a whole all-reduce), to compare with gloo on a real slow link."""
    intra: Link
    inter: Link | None = None
    node_size: int | None = None
    wire: str = "ring"

    def __post_init__(self):
        if self.wire not in ("ring", "gloo"):
            raise ValueError(f"wire must be 'ring' or 'gloo', got {self.wire!r}")
        if (self.inter is None) != (self.node_size is None):
            raise ValueError("give both inter (the link across nodes) and node_size (ranks per node), "
                             "or neither")
        if self.node_size is not None:
            check_int("node_size", self.node_size, 1, what="ranks per node")

    def link_for(self, ranks) -> tuple[str, Link]:
        if self.node_size is None or len({r // self.node_size for r in ranks}) <= 1:
            return ("intra" if self.node_size else "link"), self.intra
        return "inter", self.inter

    def seconds(self, ranks, op: str, message_bytes: int, world_size: int) -> tuple[str, float]:
        """(which link, seconds) of one call among ``ranks``. A call spanning nodes with k of its
        ranks in each runs as NCCL runs it with a NIC per GPU (notebook 08's multi-node model): k
        rings, each leaving a node once, so each rank's inter-node link carries 1/k of the bytes
        and its intra-node link the rest, both at once; latency is the inter-node link's."""
        kind, link = self.link_for(ranks)
        nodes = len({r // self.node_size for r in ranks}) if self.node_size else 1
        k = len(ranks) // nodes
        if kind != "inter" or k <= 1:
            return kind, link.seconds(op, message_bytes, world_size, self.wire)
        steps, sent = steps_and_bytes(op, message_bytes, world_size, self.wire)
        return kind, link.latency * steps + max(sent / k / link.bandwidth, sent * (1 - 1 / k) / self.intra.bandwidth)

    def describe(self) -> str:
        where = f"network modelled at {self.intra.describe()}"
        if self.node_size:
            where += f" within a node of {self.node_size} ranks and {self.inter.describe()} across nodes"
        if self.wire == "gloo":
            where += " (the bytes gloo sends)"
        return where + "; compute measured on this CPU"


FREE = Network(Link(math.inf, 0.0))


def as_network(spec) -> Network | None:
    """``None``, a :class:`Network`, a :class:`Link` or a dict ``{"bandwidth": bytes/s,
    "latency": s}`` (+ ``"inter_bandwidth"``, ``"inter_latency"``, ``"node_size"``)."""
    if spec is None or isinstance(spec, Network):
        return spec
    if isinstance(spec, Link):
        return Network(spec)
    if not isinstance(spec, Mapping):
        raise TypeError(f"network must be a dict like {{'bandwidth': 50e6, 'latency': 20e-6}} "
                        f"(bytes/s, seconds), got {type(spec).__name__}")
    known = {"bandwidth", "latency", "inter_bandwidth", "inter_latency", "node_size", "wire"}
    if unknown := sorted(set(spec) - known):
        raise ValueError(f"network has no key {', '.join(unknown)}; its keys: {', '.join(sorted(known))}")
    if "bandwidth" not in spec:
        raise ValueError("network needs 'bandwidth' (bytes per second one rank sends), e.g. 50e6")
    intra = Link(spec["bandwidth"], spec.get("latency", 0.0))
    inter = None
    if "inter_bandwidth" in spec:
        inter = Link(spec["inter_bandwidth"], spec.get("inter_latency", spec.get("latency", 0.0)))
    return Network(intra, inter, spec.get("node_size"), spec.get("wire", "ring"))


@dataclasses.dataclass
class Transfer:
    """One collective on a rank's modelled link; times from ``time.perf_counter()``."""
    op: str
    function: str
    message_bytes: int
    world_size: int
    link: str
    seconds: float             # the α-β time of this call alone (model)
    async_op: bool
    ranks: tuple               # the group's global ranks
    issued: float              # the call was made (measured)
    start: float               # the link took it: max(issued, previous arrival) (model)
    arrival: float             # start + seconds (model)
    waited: float | None = None    # wait() called (or issued, for a blocking call) (measured)
    done: float | None = None      # the caller got the result back (measured)
    executed: bool = False         # the real transfer ran
    future: bool = False           # completed through a future (torch DDP's comm hook)
    stream: bool = False           # issued on a side stream (FSDP2's): compute waits on an event
    ran: tuple | None = None       # (from, to): the real transfer on the network's thread (measured)

    def shifted(self, t0: float) -> "Transfer":
        """A copy with every time measured from ``t0`` (e.g. its step's start)."""
        move = {k: getattr(self, k) - t0 for k in ("issued", "start", "arrival", "waited", "done")
                if getattr(self, k) is not None}
        if self.ran is not None:
            move["ran"] = (self.ran[0] - t0, self.ran[1] - t0)
        return dataclasses.replace(self, **move)

    @property
    def blocked(self) -> float:
        """Seconds the caller stood waiting for this transfer (measured)."""
        if self.done is None or self.waited is None:
            return 0.0
        return max(0.0, self.done - self.waited)


class ModelledWork(dist.Work):
    """The handle an async collective returns under a :class:`ModelledNetwork`."""

    def __init__(self, net: "ModelledNetwork", job: "_Job"):
        super().__init__()
        self._net, self._job, self._future = net, job, None

    def wait(self, timeout=None) -> bool:
        if self._job.tr.waited is None:
            self._job.tr.waited = time.perf_counter()
        self._net._finish(self._job)
        return True

    def is_completed(self) -> bool:
        return self._job.done.is_set() and time.perf_counter() >= self._job.tr.arrival

    def is_success(self) -> bool:
        return self._job.exc is None

    def result(self):
        self.wait()
        return self._job.out

    def get_future(self):
        if self._future is None:
            self._future = self._net._future(self._job)
        return self._future

    def synchronize(self) -> None:
        self.wait()


class _Job:
    """A collective issued, to run for real on the network's thread, in issue order."""
    __slots__ = ("tr", "call", "due", "done", "out", "exc")

    def __init__(self, tr: Transfer, call):
        self.tr, self.call = tr, call
        self.due = tr.start if tr.async_op else tr.issued     # blocking calls run at once
        self.done, self.out, self.exc = threading.Event(), None, None

    def run(self) -> None:
        began = time.perf_counter()
        try:
            out = self.call.run()
            if self.tr.async_op:                 # c10d Work: its result, as its future holds it
                out.wait()
                try:
                    out = out.get_future().value()
                except (AttributeError, RuntimeError, NotImplementedError):
                    out = None
            elif self.call.family == "funcol" and hasattr(out, "wait"):
                out = out.wait()
            self.out = out
        except BaseException as exc:  # noqa: BLE001 - re-raised to the caller that waits
            self.exc = exc
        finally:
            self.tr.ran = (began, time.perf_counter())
            self.tr.executed = True
            self.done.set()


class ModelledNetwork:
    """While active in a process, every collective it issues is timed by ``network``'s links
    (see the module). ``transfers``: what went on this rank's links, in issue order. ::

        with ModelledNetwork({"bandwidth": 50e6, "latency": 20e-6}) as net:
            loss.backward(); optimizer.step()
        net.transfers[0].arrival - net.transfers[0].issued

    The real transfers run on one thread of this process, in issue order, from the moment
    the modelled link takes each one (a blocking one at once), beside compute as NCCL's
    kernels run beside a GPU's; the caller then waits for the modelled arrival too.
    """

    def __init__(self, network):
        self.network = as_network(network)
        if self.network is None:
            raise ValueError("network must not be None")
        self.transfers: list[Transfer] = []
        self._issued: list[_Job] = []
        self._free: dict[str, float] = {}
        self._jobs: collections.deque = collections.deque()
        self._timers: list = []            # (arrival, seq, job, future) to complete
        self._cv = threading.Condition()
        self._thread = None
        self._closed = False

    # -- context
    def __enter__(self) -> "ModelledNetwork":
        if _CURRENT:
            raise RuntimeError("a modelled network is already active in this process; leave it first")
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True, name="modelled-network")
        self._thread.start()
        _CURRENT.append(self)
        _ledger.push_transport(self)
        self._streams = _CpuStreams(self)
        self._streams.install()
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self.synchronize()
        finally:
            self._streams.uninstall()
            _ledger.pop_transport(self)
            _CURRENT.remove(self)
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            self._thread.join(timeout=5)
        return False

    def describe(self) -> str:
        return self.network.describe()

    # -- the transport
    def __call__(self, call: "_ledger.Call"):
        if call.name in _P2P:
            return call.run()
        op, message, world, _rank, _sent, is_async = call.describe()
        ranks = tuple(self._ranks(call))
        kind, cost = self.network.seconds(ranks, op, message, max(world, 1))
        side = self._streams.side_stream() if not (is_async and call.family == "c10d") else None
        with self._cv:
            now = time.perf_counter()
            start = max(now, self._free.get(kind, now), getattr(side, _READY, 0.0))
            tr = Transfer(op=op, function=call.name, message_bytes=int(message), world_size=int(world),
                          link=kind, seconds=cost, async_op=bool(is_async and call.family == "c10d"),
                          ranks=ranks, issued=now, start=start, arrival=start + cost)
            self._free[kind] = tr.arrival
            if side is not None:             # FSDP2's streams: compute waits on an event later
                tr.stream = True
                setattr(side, _READY, tr.arrival)
            job = _Job(tr, call)
            self.transfers.append(tr)
            self._issued.append(job)
            self._jobs.append(job)
            self._cv.notify_all()
        if tr.async_op:
            return ModelledWork(self, job)
        if tr.stream:                        # the real result now; the modelled one at the event
            job.done.wait()
            if job.exc is not None:
                raise job.exc
            return job.out
        tr.waited = now
        return self._finish(job)

    def _finish(self, job: _Job):
        """The caller's side: the real transfer has run, and the modelled one has arrived."""
        with _waiting(job.tr.op):
            job.done.wait()
            if job.exc is not None:
                raise job.exc
            self._sleep_until(job.tr.arrival)
        if job.tr.done is None:
            job.tr.done = time.perf_counter()
        return job.out

    @staticmethod
    def _ranks(call) -> list:
        """The global ranks of the call's group (all ranks if it cannot tell)."""
        if call.name == "_broadcast_coalesced":          # DDP's start-up broadcast: (group, ...)
            return dist.get_process_group_ranks(call.args[0])
        try:
            group = call.signature.bind(*call.args, **call.kwargs).arguments.get("group")
            if call.family == "funcol":
                group = _ledger.funcol_group(group)
            if isinstance(group, list):
                return group
            if group is not None:
                return dist.get_process_group_ranks(group)
        except (TypeError, AttributeError, RuntimeError, ValueError):
            pass
        return list(range(dist.get_world_size()))

    def _future(self, job: _Job):
        import torch

        fut = torch.futures.Future()
        job.tr.future = True
        with self._cv:
            heapq.heappush(self._timers, (job.tr.arrival, id(job), job, fut))
            self._cv.notify_all()
        return fut

    def _serve(self) -> None:
        """The network's thread: run each job when due, complete each future at its arrival."""
        _ledger._TLS.depth = 1             # a collective called inside a real one is not re-queued
        while True:
            with self._cv:
                while True:
                    now = time.perf_counter()
                    due = min((j.due for j in self._jobs), default=math.inf)
                    ring = self._timers[0][0] if self._timers else math.inf
                    if due <= now or ring <= now:
                        break
                    if self._closed and not self._jobs and not self._timers:
                        return
                    wake = min(due, ring)
                    self._cv.wait(None if math.isinf(wake) else wake - now)
                if due <= now:
                    job, fut = self._jobs.popleft(), None
                else:
                    _, _, job, fut = heapq.heappop(self._timers)
            if fut is None:
                job.run()
                with self._cv:
                    self._cv.notify_all()
            elif job.exc is not None:
                fut.set_exception(job.exc)
            else:
                if job.tr.done is None:          # when the future's waiter (torch DDP) got it
                    job.tr.done = time.perf_counter()
                fut.set_result(job.out)

    def synchronize(self) -> None:
        """Wait until every transfer issued so far has run and arrived, and every future is
        complete (as ``torch.cuda.synchronize()`` waits for the GPU)."""
        with self._cv:
            jobs, self._issued = self._issued, []
        for job in jobs:
            job.done.wait()
            if job.exc is not None:
                raise job.exc
        self.block_until(max((j.tr.arrival for j in jobs), default=0.0))
        with self._cv:
            while self._timers:
                self._cv.wait(0.001)

    def block_until(self, t: float) -> None:
        """Compute waits until ``t`` for what side streams carry (an event, a synchronize):
        the side-stream transfers that have arrived by then were waited for here."""
        now = time.perf_counter()
        if t > now:
            with _waiting("a stream"):
                self._sleep_until(t)
        done = time.perf_counter()
        with self._cv:
            for tr in self.transfers[-256:]:
                if tr.stream and tr.waited is None and tr.arrival <= t:
                    tr.waited, tr.done = now, done

    @staticmethod
    def _sleep_until(t: float) -> None:
        while (left := t - time.perf_counter()) > 0:
            time.sleep(left)

    # -- reading the clock
    def between(self, t0: float, t1: float) -> list[Transfer]:
        """The transfers issued in ``[t0, t1)`` (one step's, given its start and end)."""
        return [t for t in self.transfers if t0 <= t.issued < t1]


_UNITS = {"gb/s": 1e9, "mb/s": 1e6, "kb/s": 1e3, "b/s": 1.0, "gbit": 1e9 / 8, "mbit": 1e6 / 8,
          "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_network(text: str) -> Network:
    """``"6MB/s"``, ``"6MB/s,50us"`` or ``"400mbit,20us"`` (bandwidth per rank, latency per ring step)."""
    import re

    parts = [p.strip() for p in str(text).split(",")]
    values = []
    for part, kinds in zip(parts, (("gb/s", "mb/s", "kb/s", "b/s", "gbit", "mbit"), ("s", "ms", "us", "µs", "ns"))):
        m = re.fullmatch(r"([0-9.]+(?:e-?[0-9]+)?)\s*([a-zµ/]+)", part.lower())
        if not m or m.group(2) not in kinds:
            break
        values.append(float(m.group(1)) * _UNITS[m.group(2)])
    if len(values) != len(parts) or not 1 <= len(parts) <= 2:
        raise ValueError(f"a network is written like 6MB/s or 6MB/s,50us (bandwidth per rank in GB/s, "
                         f"MB/s, kB/s or mbit; latency per ring step in s, ms, us or ns), got {text!r}")
    return as_network({"bandwidth": values[0], "latency": values[1] if len(values) > 1 else 0.0})


def _waiting(what: str):
    """A span a profiler trace shows on the waiting thread (torch.profiler sees only its own)."""
    from torch.autograd.profiler import record_function

    return record_function(f"modelled network: waiting for {what}")


_CURRENT: list = []
_READY = "_course_modelled_ready"       # a side stream's attribute: when its last transfer arrives


class _ModelledEvent:
    """What a CPU stream's ``record_event()`` returns under a network: the time it completes."""

    def __init__(self, net: "ModelledNetwork", t: float = 0.0):
        self._net, self.t = net, t

    def query(self) -> bool:
        return time.perf_counter() >= self.t

    def synchronize(self) -> None:
        self._net.block_until(self.t)

    def wait(self, stream=None) -> None:
        import torch

        (stream or torch.cpu.current_stream()).wait_event(self)


class _CpuStreams:
    """GPU streams, modelled on the CPU, while a network is active. torch's CPU ``Stream`` and
    ``Event`` do nothing (torch/cpu/__init__.py), so FSDP2's collectives, issued on its
    all-gather, reduce-scatter and all-reduce streams, would block compute as plain calls. Here
    a blocking collective issued on a side stream returns once its real result is in; the
    stream is busy until its modelled arrival; an event recorded on it completes then; the
    default stream (the CPU thread: compute) blocks only when it waits for that event, as a
    GPU's compute stream does. What a CPU cannot model: a GPU's host runs ahead of its kernels,
    so forward's all-gathers, issued one layer ahead, overlap there and not here."""

    def __init__(self, net: "ModelledNetwork"):
        self.net, self.saved = net, []

    def side_stream(self):
        import torch

        cpu = getattr(torch, "cpu", None)
        current = cpu.current_stream() if cpu is not None and hasattr(cpu, "current_stream") else None
        return current if current is not None and current is not cpu_default_stream() else None

    def _ready(self, stream) -> float:
        if stream is None or stream is cpu_default_stream():
            return time.perf_counter()
        return getattr(stream, _READY, 0.0)

    def install(self) -> None:
        import torch

        cpu = getattr(torch, "cpu", None)
        default = cpu_default_stream()
        if cpu is None or default is None or not all(hasattr(cpu, n) for n in ("Stream", "Event")):
            return
        net, ready = self.net, self._ready

        def record_event(stream, event=None):
            ev = event if isinstance(event, _ModelledEvent) else _ModelledEvent(net)
            ev.t = ready(stream)
            return ev

        def wait_until(stream, t: float) -> None:
            if stream is default:
                net.block_until(t)
            else:
                setattr(stream, _READY, max(getattr(stream, _READY, 0.0), t))

        def wait_event(stream, event) -> None:
            if isinstance(event, _ModelledEvent):
                wait_until(stream, event.t)

        def wait_stream(stream, other) -> None:
            wait_until(stream, ready(other))

        def event_record(event, stream=None):
            event._net, event.t = net, ready(stream or cpu.current_stream())

        def event_wait(event, stream=None):
            wait_until(stream or cpu.current_stream(), getattr(event, "t", 0.0))

        def event_synchronize(event):
            net.block_until(getattr(event, "t", 0.0))

        def event_query(event):
            return time.perf_counter() >= getattr(event, "t", 0.0)

        for cls, name, fn in ((cpu.Stream, "record_event", record_event), (cpu.Stream, "wait_event", wait_event),
                              (cpu.Stream, "wait_stream", wait_stream), (cpu.Event, "record", event_record),
                              (cpu.Event, "wait", event_wait), (cpu.Event, "synchronize", event_synchronize),
                              (cpu.Event, "query", event_query)):
            self.saved.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, fn)

    def uninstall(self) -> None:
        while self.saved:
            cls, name, original = self.saved.pop()
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)


def predict_step(step_s: float, transfers, network) -> float:
    """The step time ``network`` would give a step that took ``step_s`` on a free link,
    from that step's ``transfers`` (times from the step's start): the same compute, and at
    each wait, blocked until the modelled arrival (transfers queue on their link in issue
    order). A transfer completed through a future is waited for when the step issued its
    last transfer (torch DDP waits for every bucket as backward ends)."""
    network = as_network(network)
    transfers = sorted(transfers, key=lambda t: t.issued)
    last_issue = max((t.issued for t in transfers), default=0.0)
    events = []
    for i, tr in enumerate(transfers):
        events.append((tr.issued, 0, i))
        waited = tr.waited if tr.waited is not None else (last_issue if tr.future else None)
        if waited is not None:
            events.append((max(waited, tr.issued), 1, i))
    shift, free, arrival = 0.0, {}, {}
    for t, kind, i in sorted(events):
        tr, now = transfers[i], t + shift
        if kind == 0:
            name, cost = network.seconds(tr.ranks, tr.op, tr.message_bytes, tr.world_size)
            start = max(now, free.get(name, now))
            arrival[i] = free[name] = start + cost
        else:
            on_free_link = tr.blocked if tr.waited is not None else 0.0
            shift += max(on_free_link, arrival[i] - now) - on_free_link
    return step_s + shift


def current_network() -> ModelledNetwork | None:
    """The modelled network active in this process, or None."""
    return _CURRENT[-1] if _CURRENT else None


def modelled_network(bandwidth: float, latency: float = 0.0, **more) -> ModelledNetwork:
    """``with modelled_network(50e6, 20e-6):`` around any code on the ranks (a ``%%ranks`` cell,
    your own training loop): its collectives are timed by that link (bytes/s, seconds)."""
    return ModelledNetwork({"bandwidth": bandwidth, "latency": latency, **more})
