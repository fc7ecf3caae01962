"""CommLedger (notebook 01): record every collective this process issues, with the bytes the
ring *model* says it sends (:func:`course_utils.theory.comm.sent_bytes`); what really went on
the wire is :mod:`course_utils.runtime.wire` (on gloo they differ).
"""
from __future__ import annotations

import contextlib as _contextlib
import dataclasses as _dataclasses
import functools as _functools
import inspect as _inspect
import threading as _threading
import time as _time
from fractions import Fraction as _Fraction

from ..theory.comm import OPS, sent_bytes
from ..theory.text import fmt_bytes, table
from .compat import DDP_BUFFER_BROADCAST, functional_collectives, resolve_process_group

__all__ = ["CommLedger", "CommRecord", "LEDGER_OPS", "ddp_comm_hook"]

#: Normalised op names a :class:`CommLedger` records, in the order its tables show them.
LEDGER_OPS = OPS + ("broadcast", "reduce", "scatter", "gather", "all_to_all", "send", "recv",
                    "barrier")


@_dataclasses.dataclass(frozen=True)
class CommRecord:
    """One collective call seen by a :class:`CommLedger`; ``function``: e.g. ``"funcol.all_reduce"``."""
    op: str
    function: str
    message_bytes: int
    sent_bytes: int | float
    world_size: int
    rank: int
    seconds: float
    async_op: bool = False


# name -> (op, the argument holding the message, how to size it: "tensor", "list" (of tensors),
# "lists" (of lists), "times_n" (its bytes x the group size: a gather's input), None: 0)
_C10D = {name: (op, arg, how) for op, arg, how, names in (
    ("all_reduce", "tensor", "tensor", ("all_reduce",)),
    ("all_reduce", "tensors", "list", ("all_reduce_coalesced",)),
    ("reduce", "tensor", "tensor", ("reduce",)),
    ("broadcast", "tensor", "tensor", ("broadcast",)),
    ("all_gather", "tensor_list", "list", ("all_gather",)),                  # the gathered size
    ("all_gather", "output_tensor", "tensor", ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")),
    ("all_gather", "output_tensor_lists", "lists", ("all_gather_coalesced",)),
    ("reduce_scatter", "input_list", "list", ("reduce_scatter",)),           # the unreduced size
    ("reduce_scatter", "input", "tensor", ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")),
    ("scatter", "tensor", "tensor", ("scatter",)),                            # one rank's chunk
    ("gather", "tensor", "tensor", ("gather",)),                              # one rank's chunk
    ("all_to_all", "input_tensor_list", "list", ("all_to_all",)),
    ("all_to_all", "input", "tensor", ("all_to_all_single",)),
    ("send", "tensor", "tensor", ("send", "isend")),
    ("recv", "tensor", "tensor", ("recv", "irecv")),
    ("barrier", None, None, ("barrier", "monitored_barrier")),
) for name in names}
# torch.distributed._functional_collectives (DTensor's), each also as "<name>_autograd"; all async
_FUNCOL = {name + suffix: (op, "self", how) for suffix in ("", "_autograd") for name, op, how in (
    ("broadcast", "broadcast", "tensor"), ("all_reduce", "all_reduce", "tensor"),
    ("all_gather_single", "all_gather", "times_n"), ("all_gather_tensor", "all_gather", "times_n"),
    ("reduce_scatter_single", "reduce_scatter", "tensor"), ("reduce_scatter_tensor", "reduce_scatter", "tensor"),
    ("all_to_all_single", "all_to_all", "tensor"))}

_LOCK = _threading.RLock()
_ACTIVE: list = []          # ledgers recording now, in the order they were entered
_PATCHES: list = []         # (module, name, original, wrapper) while installed
_TLS = _threading.local()   # .depth: inside a recorded call; .label: who is calling
#: The transport every wrapped call goes through while one is set (a modelled network,
#: :mod:`course_utils.runtime.network`): ``transport(call)`` runs ``call.original``.
_TRANSPORT: list = []


def _sum_bytes(ts) -> int:
    return sum(t.nbytes for t in ts if t is not None)


def _group_rank(group, global_root, group_root) -> int:
    """The root's rank inside ``group`` from a global ``src``/``dst`` or a ``group_src``."""
    import torch.distributed as dist

    if group_root is not None or global_root is None:
        return group_root or 0
    return global_root if group is None or group is dist.group.WORLD else dist.get_group_rank(group, global_root)


def funcol_group(group):
    """A funcol group (ProcessGroup, name, DeviceMesh, (mesh, dim)) as a ProcessGroup; a list of ranks as is."""
    if isinstance(group, list) and group and all(isinstance(r, int) for r in group):
        return group
    if isinstance(group, tuple):                       # (DeviceMesh, dim)
        return group[0].get_group(group[1])
    if isinstance(group, str):                         # a group name
        return resolve_process_group(group)
    if hasattr(group, "get_group"):                    # a 1-D DeviceMesh
        return group.get_group()
    return group


def _funcol_group(group):
    """(world size, rank) of a funcol group: ProcessGroup, name, DeviceMesh, (mesh, dim) or ranks."""
    import torch.distributed as dist

    group = funcol_group(group)
    if isinstance(group, list):
        return len(group), group.index(dist.get_rank())
    return group.size(), group.rank()


def _exact_sent(rec: CommRecord) -> _Fraction:
    """sent_bytes as an exact fraction (ring ops: k·(N-1)/N·M without float rounding)."""
    if rec.op in OPS and rec.world_size > 1:
        k = 2 if rec.op == "all_reduce" else 1
        return _Fraction(k * (rec.world_size - 1) * rec.message_bytes, rec.world_size)
    return _Fraction(rec.sent_bytes)


def _from_fraction(x: _Fraction):
    return int(x) if x.denominator == 1 else float(x)


def _own_chunk(tensor, splits, world: int, rank: int) -> int:
    """Bytes of ``tensor`` (an all-to-all input) that stay on this rank."""
    if not splits:
        return tensor.nbytes // world
    row = tensor.nbytes // max(1, tensor.shape[0]) if tensor.dim() else tensor.nbytes
    return splits[rank] * row


def _size(value, how: str | None, world: int) -> int:
    if how is None or value is None:
        return 0
    return {"tensor": lambda v: v.nbytes, "times_n": lambda v: v.nbytes * world, "list": _sum_bytes,
            "lists": lambda v: sum(_sum_bytes(lst) for lst in v)}[how](value)


def _describe(family: str, name: str, signature, args, kwargs):
    """(op, message_bytes, world_size, rank, sent_bytes, async_op) of one call."""
    import torch.distributed as dist

    if name == "_broadcast_coalesced":       # C++: (process_group, tensors, buffer_size, src)
        pg, tensors = args[0], args[1]
        src = args[3] if len(args) > 3 else 0
        message, world, rank = _sum_bytes(tensors), pg.size(), pg.rank()
        return "broadcast", message, world, rank, sent_bytes("broadcast", message, world, rank,
                                                              src, 0), False
    op, arg_name, how = (_FUNCOL if family == "funcol" else _C10D)[name]
    a = signature.bind(*args, **kwargs).arguments
    group = a.get("group")
    if family == "funcol":
        (world, rank), is_async = _funcol_group(group), True
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        is_async = name in ("isend", "irecv") or bool(a.get("async_op", False))
    message = _size(a.get(arg_name), how, world)
    root = own = 0
    if op in ("broadcast", "scatter"):           # funcol's src is a rank within the group already
        root = (a.get("src") or 0) if family == "funcol" else _group_rank(group, a.get("src"), a.get("group_src"))
    elif op in ("reduce", "gather"):
        root = _group_rank(group, a.get("dst"), a.get("group_dst"))
    elif op == "all_to_all":
        own = (a[arg_name][rank].nbytes if how == "list"
               else _own_chunk(a[arg_name], a.get("input_split_sizes"), world, rank))
    return op, message, world, rank, sent_bytes(op, message, world, rank, root, own), is_async


def describe_call(family: str, name: str, signature, args, kwargs) -> tuple:
    """``_describe``, or 0 bytes and world size -1 with a warning: bookkeeping never breaks a call."""
    try:
        return _describe(family, name, signature, args, kwargs)
    except Exception as exc:  # noqa: BLE001 - bookkeeping must never break communication
        import warnings

        warnings.warn(f"CommLedger could not size a call of {name} ({exc!r}); recorded with "
                      "0 bytes and world_size -1", RuntimeWarning, stacklevel=4)
        op = (_FUNCOL if family == "funcol" else _C10D).get(name, ("broadcast",))[0]
        return op, 0, -1, -1, 0, False


@_dataclasses.dataclass
class Call:
    """One intercepted collective call, handed to a transport: ``run()`` makes the real call."""
    family: str
    name: str
    signature: object
    original: object
    args: tuple
    kwargs: dict

    def run(self):
        return self.original(*self.args, **self.kwargs)

    def describe(self) -> tuple:
        return describe_call(self.family, self.name, self.signature, self.args, self.kwargs)


def _record(family: str, name: str, signature, args, kwargs, seconds: float) -> None:
    op, message, world, rank, sent, is_async = describe_call(family, name, signature, args, kwargs)
    function = ("funcol." + name) if family == "funcol" else name
    if label := getattr(_TLS, "label", None):
        function += f" ({label})"
    rec = CommRecord(op=op, function=function, message_bytes=int(message), sent_bytes=sent,
                     world_size=int(world), rank=int(rank), seconds=seconds, async_op=is_async)
    with _LOCK:
        for ledger in _ACTIVE:
            if not ledger._paused:
                ledger.records.append(rec)


def _make_wrapper(family: str, name: str, original):
    try:
        signature = _inspect.signature(original)
    except (TypeError, ValueError):      # a C++ builtin (_broadcast_coalesced)
        signature = None

    @_functools.wraps(original)
    def recorded(*args, **kwargs):
        if (not _ACTIVE and not _TRANSPORT) or getattr(_TLS, "depth", 0):
            return original(*args, **kwargs)   # not recording, or called by a recorded call
        _TLS.depth = 1
        try:
            t0 = _time.perf_counter()
            if _TRANSPORT:
                out = _TRANSPORT[-1](Call(family, name, signature, original, args, kwargs))
            else:
                out = original(*args, **kwargs)
            seconds = _time.perf_counter() - t0
        finally:
            _TLS.depth = 0
        if _ACTIVE:
            _record(family, name, signature, args, kwargs, seconds)
        return out

    recorded.__course_ledger_original__ = original
    return recorded


def _install() -> None:
    """Wrap the collectives of torch.distributed, distributed_c10d and _functional_collectives."""
    import torch.distributed as dist

    if not dist.is_available():          # a torch built without distributed: nothing to patch
        return
    funcol = functional_collectives()
    import torch.distributed.distributed_c10d as c10d

    wrappers: dict[int, object] = {}
    for family, table, modules in (("c10d", _C10D, (dist, c10d)), ("funcol", _FUNCOL, (funcol,)),
                                   ("c10d", (DDP_BUFFER_BROADCAST,), (dist,))):   # DDP's buffer broadcast
        for name in table:
            for module in modules:
                original = getattr(module, name, None)
                if original is None or hasattr(original, "__course_ledger_original__"):
                    continue
                key = id(original)
                if key not in wrappers:
                    wrappers[key] = _make_wrapper(family, name, original)
                setattr(module, name, wrappers[key])
                _PATCHES.append((module, name, original, wrappers[key]))


def push_transport(transport) -> None:
    """Route every collective call through ``transport(call: Call)`` until :func:`pop_transport`."""
    with _LOCK:
        if not _ACTIVE and not _TRANSPORT:
            _install()
        _TRANSPORT.append(transport)


def pop_transport(transport) -> None:
    with _LOCK:
        if transport in _TRANSPORT:
            _TRANSPORT.remove(transport)
        if not _ACTIVE and not _TRANSPORT:
            _uninstall()


def _uninstall() -> None:
    while _PATCHES:
        module, name, original, wrapper = _PATCHES.pop()
        if getattr(module, name, None) is wrapper:   # someone patched over us: leave theirs
            setattr(module, name, original)


def ddp_comm_hook(process_group, bucket):
    """DDP's default comm hook (average, all-reduce), issued from Python so a ledger records it."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    _TLS.label = "DDP comm hook"
    try:
        return allreduce_hook(process_group, bucket)
    finally:
        _TLS.label = None


_fmt_bytes = _functools.partial(fmt_bytes, unit=None, digits=2, sep=True)


class CommLedger:
    """Record every collective this process issues while the ledger is active. ::

        with CommLedger() as ledger:
            dist.all_reduce(torch.ones(1000))       # 4000-byte message
        ledger.totals()   # {'all_reduce': 2*(N-1)/N*4000, 'reduce_scatter': 0, 'all_gather': 0}

    Ledgers nest; a collective called by a recorded one counts once. Seen: ``dist.*``, FSDP2,
    DTensor, DDP after :meth:`attach_ddp`; not seen: names bound before entering, C++ calls.
    M: the full tensor (all-gather's output, reduce-scatter's input); async calls time the issue.
    """
    def __init__(self):
        self.records: list[CommRecord] = []
        self._paused = 0

    def __enter__(self) -> "CommLedger":
        with _LOCK:
            if self.active:
                raise RuntimeError("this CommLedger is already recording; use a new CommLedger() "
                                   "to nest ledgers")
            if not _ACTIVE and not _TRANSPORT:
                _install()
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        with _LOCK:
            if self.active:
                _ACTIVE.remove(self)
            if not _ACTIVE and not _TRANSPORT:
                _uninstall()
        return False

    @property
    def active(self) -> bool:
        return any(ledger is self for ledger in _ACTIVE)

    @_contextlib.contextmanager
    def pause(self):
        """Do not record in this ledger inside the block (other ledgers still record)."""
        self._paused += 1
        try:
            yield self
        finally:
            self._paused -= 1

    def reset(self) -> None:
        """Forget every record (an active ledger keeps recording)."""
        with _LOCK:
            self.records.clear()

    ddp_hook = staticmethod(ddp_comm_hook)

    @staticmethod
    def attach_ddp(ddp_model):
        """Route a DDP model's bucket all-reduces through :func:`ddp_comm_hook` (before its first backward)."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError("attach_ddp needs a torch.nn.parallel.DistributedDataParallel model, "
                            f"got {type(ddp_model).__name__}")
        ddp_model.register_comm_hook(None, ddp_comm_hook)
        return ddp_model

    def _ops(self) -> list[str]:
        seen = {r.op for r in self.records}
        return [op for op in LEDGER_OPS if op in OPS or op in seen] + sorted(seen - set(LEDGER_OPS))

    def _per_op(self, value, zero=0) -> dict:
        out = dict.fromkeys(self._ops(), zero)
        for r in self.records:
            out[r.op] += value(r)
        return out

    def totals(self, *, exact: bool = False) -> dict:
        """``{op: ring-model bytes sent}``, summed exactly (``exact=True``: the Fractions)."""
        sums = self._per_op(_exact_sent, _Fraction(0))
        return sums if exact else {op: _from_fraction(v) for op, v in sums.items()}

    def counts(self) -> dict:
        return self._per_op(lambda r: 1)

    def message_bytes(self) -> dict:
        """``{op: sum of M}`` (before the ring factors)."""
        return self._per_op(lambda r: r.message_bytes)

    def seconds(self) -> dict:
        """``{op: wall seconds in the calls}``."""
        return self._per_op(lambda r: r.seconds, 0.0)

    def summary(self) -> dict:
        return {"totals": self.totals(), "counts": self.counts(),
                "message_bytes": self.message_bytes(), "seconds": self.seconds()}

    def table(self) -> str:
        """One row per op (calls, M, ring-model bytes, seconds) and a total."""
        rows = [("op", "calls", "message bytes", "ring-model bytes", "seconds")]
        totals, counts, msgs, secs = self.totals(), self.counts(), self.message_bytes(), self.seconds()
        for op in totals:
            rows.append((op, str(counts[op]), _fmt_bytes(msgs[op]), _fmt_bytes(totals[op]),
                         f"{secs[op]:.4f}"))
        rows.append(("total", str(sum(counts.values())), _fmt_bytes(sum(msgs.values())),
                     _fmt_bytes(_from_fraction(sum(self.totals(exact=True).values(), _Fraction(0)))),
                     f"{sum(secs.values()):.4f}"))
        return table(rows[0], rows[1:], rules=(0, len(rows) - 2))

    def compare(self, expected: dict) -> str:
        """The ledger's ring-model bytes vs ``expected`` (e.g. ``comm_volume(...)`` x steps) per op
        and "total": the exact difference, ``ok`` when zero (or < 1e-9 relative)."""
        if not isinstance(expected, dict):
            raise TypeError(f"expected must be a dict op -> bytes (like comm_volume's), got "
                            f"{type(expected).__name__}")
        measured = self.totals(exact=True)
        keys = [k for k in expected if k != "total"]
        keys += [op for op, v in measured.items() if op not in expected and v != 0]
        rows = [("op", "ledger (ring model)", "expected", "difference", "")]
        rows += [self._compare_row(op, measured.get(op, _Fraction(0)), expected.get(op, 0)) for op in keys]
        if "total" in expected:
            rows.append(self._compare_row("total", sum(measured.values(), _Fraction(0)), expected["total"]))
        return table(rows[0], rows[1:], left=(0, 4), rules=())

    @staticmethod
    def _compare_row(op, measured: _Fraction, expected) -> tuple:
        exp = _Fraction(expected)
        diff = measured - exp
        close = diff == 0 or abs(diff) <= 1e-9 * max(abs(exp), 1)
        return (op, _fmt_bytes(_from_fraction(measured)), _fmt_bytes(_from_fraction(exp)),
                _fmt_bytes(_from_fraction(diff)), "ok" if close else "DIFFERS")

    def plot(self, expected: dict | None = None, *, title: str = "bytes sent by this rank"):
        """Bars of each op's ring-model bytes (and ``expected``'s); a Figure made without pyplot."""
        from matplotlib.figure import Figure

        measured = self.totals()
        ops = [op for op, v in measured.items() if v or op in OPS]
        if expected:
            ops += [k for k in expected if k not in ops and k != "total"]
        fig = Figure(figsize=(6.5, 3.2))
        ax = fig.subplots()
        x = list(range(len(ops)))
        width = 0.38 if expected else 0.6
        ax.bar([i - (width / 2 if expected else 0) for i in x], [measured.get(op, 0) for op in ops],
               width, label="CommLedger (ring model of each call)", color="#4C72B0")
        if expected:
            ax.bar([i + width / 2 for i in x], [expected.get(op, 0) for op in ops], width,
                   label="expected", color="#DD8452")
        ax.set_xticks(x, ops)
        ax.set(ylabel="bytes", title=title)
        ax.legend(frameon=False)
        fig.tight_layout()
        return fig

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        state = "recording" if self.active else "idle"
        calls = ", ".join(f"{op}={n}" for op, n in self.counts().items() if n)
        return f"CommLedger({state}, {len(self.records)} calls{': ' + calls if calls else ''})"

    def __getstate__(self) -> dict:
        return {"records": list(self.records), "_paused": 0}    # an unpickled copy is not paused
