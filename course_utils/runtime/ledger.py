"""CommLedger: record every collective this process issues, with the bytes the ring model
says it sends.

Taught in ``notebooks/01_collectives.ipynb``. The ledger wraps ``torch.distributed``'s
collectives (and the functional collectives DTensor uses) while it is entered; each call
becomes a :class:`CommRecord` with the message size and, from it,
:func:`course_utils.theory.comm.sent_bytes`: a *model* of the bytes sent, not a
measurement of the wire. What really went on the wire is measured by
:mod:`course_utils.runtime.wire` (on gloo the two differ: its reduce-scatter is a full
all-reduce, its broadcast a tree).
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
    """One collective call seen by a :class:`CommLedger` (its docstring says what each
    field means); ``function``: what was called, e.g. ``"funcol.all_reduce"``."""
    op: str
    function: str
    message_bytes: int
    sent_bytes: int | float
    world_size: int
    rank: int
    seconds: float
    async_op: bool = False


# -- what each torch function is ---------------------------------------------------------
# name -> (normalised op, the argument holding the message, how to size it):
#   "tensor": its bytes; "list": bytes of the tensors in it; "lists": of the tensors in
#   its lists; "times_n": its bytes times the group size (a gather's input); None: 0.
_C10D = {
    "all_reduce": ("all_reduce", "tensor", "tensor"),
    "all_reduce_coalesced": ("all_reduce", "tensors", "list"),
    "reduce": ("reduce", "tensor", "tensor"),
    "broadcast": ("broadcast", "tensor", "tensor"),
    "all_gather": ("all_gather", "tensor_list", "list"),                 # the gathered size
    "all_gather_single": ("all_gather", "output_tensor", "tensor"),
    "all_gather_into_tensor": ("all_gather", "output_tensor", "tensor"),
    "_all_gather_base": ("all_gather", "output_tensor", "tensor"),
    "all_gather_coalesced": ("all_gather", "output_tensor_lists", "lists"),
    "reduce_scatter": ("reduce_scatter", "input_list", "list"),          # the unreduced size
    "reduce_scatter_single": ("reduce_scatter", "input", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "tensor"),
    "_reduce_scatter_base": ("reduce_scatter", "input", "tensor"),
    "scatter": ("scatter", "tensor", "tensor"),                          # one rank's chunk
    "gather": ("gather", "tensor", "tensor"),                            # one rank's chunk
    "all_to_all": ("all_to_all", "input_tensor_list", "list"),
    "all_to_all_single": ("all_to_all", "input", "tensor"),
    "send": ("send", "tensor", "tensor"),
    "isend": ("send", "tensor", "tensor"),
    "recv": ("recv", "tensor", "tensor"),
    "irecv": ("recv", "tensor", "tensor"),
    "barrier": ("barrier", None, None),
    "monitored_barrier": ("barrier", None, None),
}
# torch.distributed._functional_collectives (DTensor's collectives: full_tensor(),
# redistribute, clip_grad_norm_ on sharded grads). All return async tensors.
_FUNCOL = {
    "broadcast": ("broadcast", "self", "tensor"),
    "all_reduce": ("all_reduce", "self", "tensor"),
    "all_gather_single": ("all_gather", "self", "times_n"),
    "all_gather_single_autograd": ("all_gather", "self", "times_n"),
    "all_gather_tensor": ("all_gather", "self", "times_n"),
    "all_gather_tensor_autograd": ("all_gather", "self", "times_n"),
    "reduce_scatter_single": ("reduce_scatter", "self", "tensor"),
    "reduce_scatter_single_autograd": ("reduce_scatter", "self", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "self", "tensor"),
    "reduce_scatter_tensor_autograd": ("reduce_scatter", "self", "tensor"),
    "all_to_all_single": ("all_to_all", "self", "tensor"),
    "all_to_all_single_autograd": ("all_to_all", "self", "tensor"),
}

_LOCK = _threading.RLock()
_ACTIVE: list = []          # ledgers recording now, in the order they were entered
_PATCHES: list = []         # (module, name, original, wrapper) while installed
_TLS = _threading.local()   # .depth: inside a recorded call; .label: who is calling


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _sum_bytes(ts) -> int:
    return sum(_nbytes(t) for t in ts if t is not None)


def _group_rank(group, global_root, group_root) -> int:
    """The root's rank inside ``group`` from a global ``src``/``dst`` or a ``group_src``."""
    import torch.distributed as dist

    if group_root is not None:
        return group_root
    if global_root is None:
        return 0
    if group is None or group is dist.group.WORLD:
        return global_root
    return dist.get_group_rank(group, global_root)


def _funcol_group(group):
    """(world size, rank) of a functional-collective group (ProcessGroup, group name,
    DeviceMesh, (mesh, dim) or a list of ranks)."""
    import torch.distributed as dist

    if isinstance(group, list) and group and all(isinstance(r, int) for r in group):
        return len(group), group.index(dist.get_rank())
    if isinstance(group, tuple):                       # (DeviceMesh, dim)
        group = group[0].get_group(group[1])
    elif isinstance(group, str):                       # a group name
        group = resolve_process_group(group)
    elif hasattr(group, "get_group"):                  # a 1-D DeviceMesh
        group = group.get_group()
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
        return _nbytes(tensor) // world
    row = _nbytes(tensor) // max(1, tensor.shape[0]) if tensor.dim() else _nbytes(tensor)
    return splits[rank] * row


def _size(value, how: str | None, world: int) -> int:
    if how is None or value is None:
        return 0
    if how == "tensor":
        return _nbytes(value)
    if how == "times_n":
        return _nbytes(value) * world
    if how == "list":
        return _sum_bytes(value)
    return sum(_sum_bytes(lst) for lst in value)      # "lists"


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
    bound = signature.bind(*args, **kwargs)
    a = bound.arguments
    group = a.get("group")
    if family == "funcol":
        world, rank = _funcol_group(group)
        is_async = True
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        is_async = name in ("isend", "irecv") or bool(a.get("async_op", False))
    message = _size(a.get(arg_name), how, world)
    root = own = 0
    if op in ("broadcast", "scatter"):
        if family == "funcol":               # a rank within the group already
            root = a.get("src") or 0
        else:
            root = _group_rank(group, a.get("src"), a.get("group_src"))
    elif op in ("reduce", "gather"):
        root = _group_rank(group, a.get("dst"), a.get("group_dst"))
    elif op == "all_to_all":
        if how == "list":
            own = _nbytes(a[arg_name][rank])
        else:
            own = _own_chunk(a[arg_name], a.get("input_split_sizes"), world, rank)
    return op, message, world, rank, sent_bytes(op, message, world, rank, root, own), is_async


def _record(family: str, name: str, signature, args, kwargs, seconds: float) -> None:
    try:
        op, message, world, rank, sent, is_async = _describe(family, name, signature, args, kwargs)
    except Exception as exc:  # noqa: BLE001 - bookkeeping must never break communication
        import warnings

        warnings.warn(f"CommLedger could not size a call of {name} ({exc!r}); recorded with "
                      "0 bytes and world_size -1", RuntimeWarning, stacklevel=3)
        op = (_FUNCOL if family == "funcol" else _C10D).get(name, ("broadcast",))[0]
        message, world, rank, sent, is_async = 0, -1, -1, 0, False
    label = getattr(_TLS, "label", None)
    function = ("funcol." + name) if family == "funcol" else name
    if label:
        function = f"{function} ({label})"
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
        if not _ACTIVE or getattr(_TLS, "depth", 0):
            return original(*args, **kwargs)   # not recording, or called by a recorded call
        _TLS.depth = 1
        try:
            t0 = _time.perf_counter()
            out = original(*args, **kwargs)
            seconds = _time.perf_counter() - t0
        finally:
            _TLS.depth = 0
        _record(family, name, signature, args, kwargs, seconds)
        return out

    recorded.__course_ledger_original__ = original
    return recorded


def _install() -> None:
    """Replace the collectives in torch.distributed, its distributed_c10d module and
    _functional_collectives by recording wrappers (once, while any ledger is active)."""
    import torch.distributed as dist

    if not dist.is_available():          # a torch built without distributed: nothing to patch
        return
    funcol = functional_collectives()
    import torch.distributed.distributed_c10d as c10d

    wrappers: dict[int, object] = {}
    for family, table, modules in (("c10d", _C10D, (dist, c10d)), ("funcol", _FUNCOL, (funcol,))):
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
    original = getattr(dist, DDP_BUFFER_BROADCAST, None)     # torch DDP's buffer broadcast
    if original is not None and not hasattr(original, "__course_ledger_original__"):
        wrapper = _make_wrapper("c10d", DDP_BUFFER_BROADCAST, original)
        setattr(dist, DDP_BUFFER_BROADCAST, wrapper)
        _PATCHES.append((dist, DDP_BUFFER_BROADCAST, original, wrapper))


def _uninstall() -> None:
    while _PATCHES:
        module, name, original, wrapper = _PATCHES.pop()
        if getattr(module, name, None) is wrapper:   # someone patched over us: leave theirs
            setattr(module, name, original)


def ddp_comm_hook(process_group, bucket):
    """A torch DDP communication hook equal to DDP's default (divide the bucket by the
    world size, all-reduce SUM), issued from Python so that a :class:`CommLedger` records
    it. ``ddp_model.register_comm_hook(None, ddp_comm_hook)``; see :meth:`CommLedger.attach_ddp`.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    _TLS.label = "DDP comm hook"
    try:
        return allreduce_hook(process_group, bucket)
    finally:
        _TLS.label = None


_fmt_bytes = _functools.partial(fmt_bytes, unit=None, digits=2, sep=True)


class CommLedger:
    """Record every collective this process issues while the ledger is active.

    Taught in ``notebooks/01_collectives.ipynb``; used by ``experiments.run`` to measure
    each strategy's communication. ::

        with CommLedger() as ledger:
            dist.all_reduce(torch.ones(1000))       # 4000-byte message
        ledger.totals()   # {'all_reduce': 2*(N-1)/N*4000, 'reduce_scatter': 0, 'all_gather': 0}

    **How.** While any ledger is active, the collectives of ``torch.distributed`` (also
    reachable as ``torch.distributed.distributed_c10d.*``) and of
    ``torch.distributed._functional_collectives`` (DTensor's) are replaced by wrappers
    that time the call and record it, then restored when the last ledger exits (also on
    an exception). Ledgers nest: every active, unpaused ledger records each call. A
    collective called *by* a recorded one (``all_gather_into_tensor`` calls
    ``all_gather_single`` in torch 2.13) is recorded once, as the outer call.
    Object collectives (``all_gather_object``...) show up as the tensor collectives
    they issue. Seen: course code calling ``dist.*`` or ``course_utils.runtime.compat.*``;
    torch FSDP2 (``fully_shard`` calls ``dist.all_gather_single`` and
    ``dist.reduce_scatter_single`` in 2.13, ``dist.all_reduce`` for HSDP); DTensor;
    torch DDP once :meth:`attach_ddp` routed its bucket all-reduces through Python (by
    default DDP's C++ reducer calls the backend directly, invisible from Python).
    Not seen: names bound before the ledger started (``from torch.distributed import
    all_reduce``), collectives issued from C++.

    **Bytes.** ``message_bytes`` M of one call: the full tensor for all-reduce,
    broadcast and reduce; the full (gathered) tensor for all-gather, i.e. N × the
    input; the full (unreduced) input for reduce-scatter, N × the output (so the
    ring formulas of :func:`collective_bytes` apply with the same M); this rank's chunk
    for scatter and gather; this rank's whole input for all-to-all; the tensor for
    send/recv; 0 for barrier. ``sent_bytes``: what this rank puts on the wire in the ring
    model (:func:`course_utils.theory.comm.sent_bytes`; broadcast and reduce as pipelined
    rings, NCCL's algorithm).

    With N = 1 nothing is sent. ``seconds`` is the wall time of the call; for
    ``async_op=True`` calls (and DDP's hook, and functional collectives) that is the time
    to *issue* it, and ``async_op`` says so.

    Results (:meth:`totals`, :meth:`counts`, :meth:`message_bytes`, :meth:`summary`)
    are plain dicts that depend only on the calls made, in :data:`LEDGER_OPS` order
    with ``all_reduce``, ``reduce_scatter`` and ``all_gather`` always present; the ledger
    itself pickles (its records), so a rank can return it from ``launch``.
    """
    def __init__(self):
        self.records: list[CommRecord] = []
        self._paused = 0
        self._active = False

    # -- recording
    def __enter__(self) -> "CommLedger":
        with _LOCK:
            if self._active:
                raise RuntimeError("this CommLedger is already recording; use a new CommLedger() "
                                   "to nest ledgers")
            if not _ACTIVE:
                _install()
            _ACTIVE.append(self)
            self._active = True
        return self

    def __exit__(self, *exc) -> bool:
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            self._active = False
            if not _ACTIVE:
                _uninstall()
        return False

    @property
    def active(self) -> bool:
        """Whether the ledger is recording now (inside its ``with`` block)."""
        return self._active

    @_contextlib.contextmanager
    def pause(self):
        """Do not record in this ledger inside the block (e.g. a loss all-reduce done
        only for logging). Other active ledgers still record."""
        self._paused += 1
        try:
            yield self
        finally:
            self._paused -= 1

    def reset(self) -> None:
        """Forget every record (the ledger keeps recording if it is active)."""
        with _LOCK:
            self.records.clear()

    # -- torch DDP
    ddp_hook = staticmethod(ddp_comm_hook)

    @staticmethod
    def attach_ddp(ddp_model):
        """Route a ``DistributedDataParallel`` model's bucket all-reduces through
        :func:`ddp_comm_hook` (DDP's default averaging, issued from Python) so that any
        active ledger records them: one all-reduce per bucket, M = the bucket's bytes.
        Call once per DDP model, before its first backward. Returns the model."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError("attach_ddp needs a torch.nn.parallel.DistributedDataParallel model, "
                            f"got {type(ddp_model).__name__}")
        ddp_model.register_comm_hook(None, ddp_comm_hook)
        return ddp_model

    # -- results
    def _ops(self) -> list[str]:
        seen = {r.op for r in self.records}
        return [op for op in LEDGER_OPS if op in OPS or op in seen] + sorted(seen - set(LEDGER_OPS))

    def _per_op(self, value, zero=0) -> dict:
        out = dict.fromkeys(self._ops(), zero)
        for r in self.records:
            out[r.op] += value(r)
        return out

    def totals(self, *, exact: bool = False) -> dict:
        """``{op: bytes this rank sent in the ring model}``, summed exactly (ring ops as
        fractions), then an int when whole, else a float; ``exact=True``: the Fractions."""
        sums = self._per_op(_exact_sent, _Fraction(0))
        return sums if exact else {op: _from_fraction(v) for op, v in sums.items()}

    def counts(self) -> dict:
        """``{op: number of calls}``."""
        return self._per_op(lambda r: 1)

    def message_bytes(self) -> dict:
        """``{op: sum of M}`` (the message sizes, before the ring factors)."""
        return self._per_op(lambda r: r.message_bytes)

    def seconds(self) -> dict:
        """``{op: wall seconds spent in the calls}`` (issue time for async calls)."""
        return self._per_op(lambda r: r.seconds, 0.0)

    def summary(self) -> dict:
        """Plain, picklable dicts: ``totals``, ``counts``, ``message_bytes``, ``seconds``."""
        return {"totals": self.totals(), "counts": self.counts(),
                "message_bytes": self.message_bytes(), "seconds": self.seconds()}

    def table(self) -> str:
        """A text table: one row per op (calls, message bytes M, bytes sent in the ring
        model, seconds) and a total."""
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
        """The ledger's bytes (the ring model applied to each recorded call) vs ``expected``
        bytes, per op: e.g. ``comm_volume(...)`` times the number of steps. This checks
        which calls were made and how large they were, not the wire (for that:
        :mod:`course_utils.runtime.wire`). A ``"total"`` key is compared with the sum over ops. Each line
        gives the exact difference (measured - expected) and ``ok`` when it is zero
        (or below 1e-9 relative, float rounding of (N-1)/N)."""
        if not isinstance(expected, dict):
            raise TypeError(f"expected must be a dict op -> bytes (like comm_volume's), got "
                            f"{type(expected).__name__}")
        measured = self.totals(exact=True)
        keys = [k for k in expected if k != "total"]
        keys += [op for op, v in measured.items() if op not in expected and v != 0]
        rows = [("op", "ledger (ring model)", "expected", "difference", "")]
        total_m = _Fraction(0)
        for op in keys:
            m = measured.get(op, _Fraction(0))
            total_m += m
            rows.append(self._compare_row(op, m, expected.get(op, 0)))
        if "total" in expected:
            all_m = sum(measured.values(), _Fraction(0))
            rows.append(self._compare_row("total", all_m, expected["total"]))
        return table(rows[0], rows[1:], left=(0, 4), rules=())

    @staticmethod
    def _compare_row(op, measured: _Fraction, expected) -> tuple:
        exp = _Fraction(expected)
        diff = measured - exp
        close = diff == 0 or abs(diff) <= 1e-9 * max(abs(exp), 1)
        return (op, _fmt_bytes(_from_fraction(measured)), _fmt_bytes(_from_fraction(exp)),
                _fmt_bytes(_from_fraction(diff)), "ok" if close else "DIFFERS")

    def plot(self, expected: dict | None = None, *, title: str = "bytes sent by this rank"):
        """A bar chart of the bytes each op sends in the ring model; with ``expected`` (e.g. ``comm_volume(...)``
        times steps) a second bar per op. Returns the matplotlib Figure (made without
        pyplot, so a notebook shows it once, as the cell's value)."""
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
        ax.set_ylabel("bytes")
        ax.set_title(title)
        ax.legend(frameon=False)
        fig.tight_layout()
        return fig

    # -- plumbing
    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        state = "recording" if self._active else "idle"
        calls = ", ".join(f"{op}={n}" for op, n in self.counts().items() if n)
        return f"CommLedger({state}, {len(self.records)} calls{': ' + calls if calls else ''})"

    def __getstate__(self) -> dict:
        return {"records": list(self.records)}

    def __setstate__(self, state: dict) -> None:
        self.records = list(state["records"])
        self._paused = 0
        self._active = False
