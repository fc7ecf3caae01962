"""Training strategies side by side: wrap a model for a strategy, train it, measure it.

Taught in ``notebooks/02_data_parallelism.ipynb``: data parallelism written from scratch
(``"ddp"``: :class:`DataParallel` and :class:`DataParallelOptimizer`, read them
below) next to PyTorch's ``DistributedDataParallel`` (``"torch-ddp"``) and one process
on the whole batch (``"single"``). The ZeRO and FSDP strategies of notebooks 04-07
register themselves in :data:`STRATEGIES` the same way (:func:`register_strategy`).

Every strategy keeps the same training loop::

    model, optimizer = wrap(strategy, model, make_optimizer)
    loss = model(x, y)           # x, y: this rank's shard of the global batch
    loss.backward()              # gradient hooks may start communication here
    optimizer.step()             # ... and it finishes here
    optimizer.zero_grad()

:func:`run` trains the course GPT for a few steps with one strategy and reports, per
rank, the loss of the *global* batch at each step, the bytes each collective sent
(measured by :class:`~course_utils.comm.CommLedger`), the bytes of model states held,
and the median step time. The global batch (:data:`GLOBAL_BATCH` rows) does not depend
on the number of ranks, so every strategy must reproduce the losses of ``"single"``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from numbers import Integral
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from .comm import CommLedger
from .config import COURSE_CONFIG, TransformerConfig
from .precision import WrapsOptimizer

__all__ = ["train_steps", "global_loss", "GLOBAL_BATCH", "LR", "BETAS", "WEIGHT_DECAY", "DEFAULT_BUCKET_BYTES", "STRATEGIES",
           "Strategy", "register_strategy", "strategies", "wrap", "full_parameters", "run",
           "RunResult", "DataParallel", "DataParallelOptimizer", "make_adamw", "unwrap",
           "broadcast_from_rank0", "max_abs_diff", "max_rel_diff"]

#: Rows in the global batch of :func:`run`: divisible by 1, 2, 3, 4, 6 and 12 ranks.
GLOBAL_BATCH = 12
#: AdamW hyperparameters of :func:`run` (fixed, so every strategy trains the same way).
LR, BETAS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 0.01
#: Gradient bucket size of ``"ddp"`` and ``"torch-ddp"``: 25 MiB, torch DDP's default.
DEFAULT_BUCKET_BYTES = 25 * 2**20


def make_adamw(params) -> torch.optim.AdamW:
    """The optimizer of :func:`run`: ``AdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)``."""
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module, group=None) -> None:
    """Copy rank 0's parameters and buffers into every rank's ``module`` (in place), so all
    replicas start equal: the first thing DDP, ZeRO and FSDP do."""
    src = 0 if group is None else dist.get_global_rank(group, 0)
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=src, group=group)


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    """Parameters with requires_grad, a shared (tied) Parameter once."""
    return [p for p in module.parameters() if p.requires_grad]


# ======================================================================= "ddp" from scratch

@dataclasses.dataclass
class _Bucket:
    """Gradients all-reduced together as one flat message."""

    params: list[nn.Parameter]
    numel: int
    ready: set = dataclasses.field(default_factory=set)   # ids of params whose grad is in
    flat: torch.Tensor | None = None                      # the message, reused every step
    work: object = None                                   # its async work handle, in flight


class DataParallel(nn.Module):
    """Data parallelism from scratch: what ``torch.nn.parallel.DistributedDataParallel`` does.

    1. At construction every parameter and buffer is broadcast from rank 0, so all
       ranks start from the same model.
    2. Trainable parameters are grouped into *buckets* of about ``bucket_bytes``, in
       reverse registration order (roughly the order backward produces gradients).
       ``bucket_bytes=0`` (or None): one bucket per parameter.
    3. During backward a hook on each parameter marks its gradient ready. When every
       gradient of the next bucket is ready, the bucket is flattened into one tensor and
       an asynchronous all-reduce (SUM) is started: communication *overlaps* with the
       rest of backward. Buckets are launched strictly in order, so every rank issues
       the same collectives in the same order.
    4. :meth:`finish_gradient_sync` (called by :class:`DataParallelOptimizer.step`)
       launches whatever is left, waits for every all-reduce, divides by the world size
       and copies the averages back into ``.grad``.

    Like torch DDP's, the flat bucket buffers are allocated once and kept: one more
    gradient-sized buffer per rank, outside what ``state_bytes`` counts.

    ``overlap=False`` does all the communication in ``step()``, after backward (to
    measure what overlapping buys). Inside :meth:`no_sync` (gradient accumulation) the
    hooks do nothing and everything is reduced in the next ``step()``; without it, a
    second backward before ``step()`` is an error (its gradients would miss the
    all-reduce already in flight).

    Frozen parameters (``requires_grad=False``) are broadcast once and never
    communicated again; a tied Parameter (one object used twice) is one entry, so it is
    communicated once. A parameter that got no gradient this step on some rank
    contributes zeros there (every rank still sends every bucket, so the collectives stay
    matched); after the average every rank has a ``.grad`` for it (zeros if no rank used
    it, where torch DDP would leave ``None``).
    """

    def __init__(self, module: nn.Module, *, bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
                 overlap: bool = True, group=None):
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DataParallel needs torch.distributed initialised: run it inside "
                               "course_utils.launch.launch(...) or %%ranks")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.overlap = bool(overlap)
        self._sync_enabled = True
        self._broadcast_from_rank0()
        self.params = _trainable(module)
        self.buckets = self._make_buckets(self.params, bucket_bytes)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b.params}
        self._next = 0                      # the next bucket to launch
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self.params]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- 1. same start everywhere
    def _broadcast_from_rank0(self) -> None:
        broadcast_from_rank0(self.module, self.group)

    # -- 2. buckets
    @staticmethod
    def _make_buckets(params, bucket_bytes) -> list[_Bucket]:
        buckets: list[_Bucket] = []
        current: list[nn.Parameter] = []
        size = 0
        for p in reversed(params):
            if current and current[0].dtype != p.dtype:       # one dtype per flat message
                buckets.append(_Bucket(current, sum(q.numel() for q in current)))
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
            if not bucket_bytes or size >= bucket_bytes:
                buckets.append(_Bucket(current, sum(q.numel() for q in current)))
                current, size = [], 0
        if current:
            buckets.append(_Bucket(current, sum(q.numel() for q in current)))
        return buckets

    # -- 3. during backward
    def _grad_ready(self, p: nn.Parameter) -> None:
        if not (self.overlap and self._sync_enabled):
            return
        bucket = self.buckets[self._bucket_of[id(p)]]
        if id(p) in bucket.ready:
            raise RuntimeError("a second backward before optimizer.step(): its gradients would "
                               "miss the all-reduce already started. For gradient accumulation "
                               "run the earlier backwards inside `with model.no_sync():`")
        bucket.ready.add(id(p))
        while self._next < len(self.buckets) and \
                len(self.buckets[self._next].ready) == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        if bucket.flat is None:         # allocated once, like torch DDP's bucket buffers
            p0 = bucket.params[0]
            bucket.flat = torch.empty(bucket.numel, dtype=p0.dtype, device=p0.device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        torch.cat([g.reshape(-1) for g in grads], out=bucket.flat)
        bucket.work = dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self.group,
                                      async_op=True)

    # -- 4. in optimizer.step()
    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """Launch the buckets not launched yet, wait for all, write averaged grads to ``.grad``."""
        for bucket in self.buckets[self._next:]:
            self._launch(bucket)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.flat.div_(self.world_size)
            offset = 0
            for p in bucket.params:
                average = bucket.flat[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = average.clone()
                else:
                    p.grad.copy_(average)
                offset += p.numel()
            bucket.work = None
            bucket.ready.clear()
        self._next = 0

    @contextmanager
    def no_sync(self):
        """Gradient accumulation: backwards inside this block start no communication;
        the accumulated gradients are all-reduced by the next ``optimizer.step()``."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the module's parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def extra_repr(self) -> str:
        sizes = [b.numel for b in self.buckets]
        return (f"world_size={self.world_size}, buckets={len(sizes)} (elements {sizes}), "
                f"overlap={self.overlap}")


class DataParallelOptimizer(WrapsOptimizer):
    """The optimizer ``wrap("ddp", ...)`` returns: ``step()`` first finishes the gradient
    all-reduce of its :class:`DataParallel` model, then steps the real optimizer
    (``.inner``). ``param_groups``, ``state``, ``zero_grad`` and ``state_dict`` are the
    real optimizer's."""

    def __init__(self, model: DataParallel, inner):
        self.model, self.inner = model, inner

    def step(self, closure=None):
        self.model.finish_gradient_sync()
        return self.inner.step() if closure is None else self.inner.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"DataParallelOptimizer({self.inner!r})"


# ============================================================================ the registry

@dataclasses.dataclass(frozen=True)
class Strategy:
    """A registered strategy.

    wrap: ``(model, make_optimizer, **options) -> (model, optimizer)``; options are
    ``bucket_bytes``, ``overlap`` and ``group`` (a strategy ignores those it has no use
    for). distributed: needs ``torch.distributed`` (run under ``launch``); False only for
    ``"single"``. state_bytes: ``(model, optimizer) -> {"params", "grads", "optimizer"}``
    when the default (:func:`_default_state_bytes`) does not fit.
    """

    name: str
    wrap: Callable
    distributed: bool = True
    description: str = ""
    notebook: str = ""
    state_bytes: Callable | None = None


#: name -> :class:`Strategy`; later notebooks' modules add theirs with :func:`register_strategy`.
STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str, wrap_fn: Callable, *, distributed: bool = True,
                      description: str = "", notebook: str = "",
                      state_bytes: Callable | None = None) -> Strategy:
    """Add a strategy to :data:`STRATEGIES` (a name may be registered once)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a strategy name must be a non-empty str, got {name!r}")
    if name in STRATEGIES:
        raise ValueError(f"strategy {name!r} is already registered")
    if not callable(wrap_fn):
        raise TypeError("wrap_fn must be callable: (model, make_optimizer, **options) -> (model, optimizer)")
    STRATEGIES[name] = Strategy(name, wrap_fn, distributed, description, notebook, state_bytes)
    return STRATEGIES[name]


def strategies() -> list[str]:
    """The registered strategy names, in registration order."""
    return list(STRATEGIES)


def _strategy(name) -> Strategy:
    if not isinstance(name, str):
        raise TypeError(f"strategy must be a str such as 'ddp', got {type(name).__name__}")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def _wrap_single(model, make_optimizer, **_options):
    return model, make_optimizer(_trainable(model))


def _wrap_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, overlap=True,
              group=None, **_options):
    ddp = DataParallel(model, bucket_bytes=bucket_bytes, overlap=overlap, group=group)
    return ddp, DataParallelOptimizer(ddp, make_optimizer(ddp.params))


def _wrap_torch_ddp(model, make_optimizer, *, bucket_bytes=DEFAULT_BUCKET_BYTES, group=None,
                    **_options):
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch-ddp needs torch.distributed initialised: run it inside "
                           "course_utils.launch.launch(...) or %%ranks")
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    # bucket_bytes=0/None: a cap of one byte, i.e. one bucket per parameter, as in "ddp"
    cap_mb = (bucket_bytes or 1) / 2**20
    ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=group,
                                  bucket_cap_mb=cap_mb)
    # DDP's default averaging, but issued from Python, so a CommLedger sees each bucket.
    CommLedger.attach_ddp(ddp)
    return ddp, make_optimizer(_trainable(model))


register_strategy("single", _wrap_single, distributed=False, notebook="02_data_parallelism",
                  description="one process, the whole global batch; no communication")
register_strategy("ddp", _wrap_ddp, notebook="02_data_parallelism",
                  description="data parallelism from scratch: bucketed async all-reduce of the "
                              "gradients during backward (DataParallel)")
register_strategy("torch-ddp", _wrap_torch_ddp, notebook="02_data_parallelism",
                  description="torch.nn.parallel.DistributedDataParallel")


# ================================================================================ wrap

def _check_bucket_bytes(bucket_bytes) -> None:
    if bucket_bytes is None:
        return
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, Integral) or bucket_bytes < 0:
        raise ValueError(f"bucket_bytes must be an int >= 0 (0 or None: one bucket per parameter), "
                         f"got {bucket_bytes!r}")


def wrap(strategy: str, model: nn.Module, make_optimizer: Callable, *,
         bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True, group=None):
    """``(model, optimizer)`` for ``strategy``; train with the usual loop.

    Args:
        strategy: a name in :data:`STRATEGIES` (``"single"``, ``"ddp"``, ``"torch-ddp"``...).
        model: any ``nn.Module``; "ddp"/"torch-ddp" broadcast rank 0's parameters and
            buffers to every rank. Frozen parameters are left alone, tied weights work.
        make_optimizer: ``params -> optimizer``, called with the trainable parameters this
            rank updates, e.g. :func:`make_adamw` or ``lambda ps: torch.optim.SGD(ps, lr=0.1)``.
        bucket_bytes: gradient bucket size of "ddp" and "torch-ddp" (0/None: one bucket
            per parameter). overlap: "ddp" only; False moves all communication into
            ``step()``. group: the process group (default: all ranks).
    """
    spec = _strategy(strategy)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(make_optimizer):
        raise TypeError("make_optimizer must be a function params -> optimizer, e.g. "
                        "course_utils.experiments.make_adamw")
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, (DataParallel, DistributedDataParallel)):
        raise ValueError(f"model is already wrapped ({type(model).__name__}); pass the plain module")
    if not _trainable(model):
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    _check_bucket_bytes(bucket_bytes)
    if spec.distributed and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"strategy {strategy!r} needs torch.distributed initialised: call wrap "
                           "inside course_utils.launch.launch(fn, N) or a %%ranks cell")
    wrapped, optimizer = spec.wrap(model, make_optimizer, bucket_bytes=bucket_bytes,
                                   overlap=overlap, group=group)
    for name in ("step", "zero_grad"):
        if not callable(getattr(optimizer, name, None)):
            raise TypeError(f"make_optimizer returned a {type(optimizer).__name__} without "
                            f"{name}(); return a torch.optim optimizer")
    return wrapped, optimizer


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a wrapper (torch DDP's or :class:`DataParallel`'s ``.module``)."""
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(model, (DataParallel, DistributedDataParallel)):
        model = model.module
    return model


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` (detached CPU clones) with the names of the unwrapped module
    (``model.named_parameters()``: a tied Parameter under its first name), on every rank.

    Sharded parameters (DTensors, as FSDP2 makes them) are gathered, which is a
    collective: call it on every rank.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if callable(getattr(model, "full_parameters", None)):   # e.g. zero3.Zero3 gathers its shards
        return model.full_parameters()
    # No DTensor can exist unless torch.distributed.tensor was imported (importing it
    # here would cost every rank about a second).
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    out = {}
    for name, p in unwrap(model).named_parameters():
        t = p.full_tensor() if dtensor is not None and isinstance(p, dtensor) else p
        out[name] = t.detach().cpu().clone()
    return out


# ================================================================================= run

@dataclasses.dataclass
class RunResult:
    """One rank's result of :func:`run`; fields also readable as keys (``r["losses"]``).

    losses: loss of the global batch after each step's forward (same on every rank);
    comm_bytes: op -> bytes this rank sent over the run (CommLedger; the loss averaging
    for ``losses`` excluded); comm_calls: op -> calls; state_bytes: ``"params"``,
    ``"grads"``, ``"optimizer"`` held right after the last ``optimizer.step()``, before
    ``zero_grad()``; step_time_s: median of ``step_times_s`` (forward + backward + step
    + zero_grad of each step); param_digest: SHA-256 of the final full parameters.
    """

    strategy: str
    rank: int
    world_size: int
    losses: list
    comm_bytes: dict
    comm_calls: dict
    state_bytes: dict
    step_time_s: float
    step_times_s: list
    param_digest: str

    def __getitem__(self, key: str):
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def get(self, key: str, default=None):
        return getattr(self, key) if key in self.keys() else default

    def __contains__(self, key) -> bool:
        return key in self.keys()


def max_abs_diff(losses, reference) -> float:
    """``max |a - b|`` over the pairs of ``losses`` and ``reference`` (e.g. a strategy's
    losses and ``"single"``'s), step by step."""
    return max(abs(a - b) for a, b in zip(losses, reference))


def max_rel_diff(losses, reference) -> float:
    """``max |a - b| / |b|`` over the pairs of ``losses`` and ``reference`` (the
    reference in the denominator), step by step."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


def _storage_bytes(tensors, seen: set) -> int:
    """Bytes of the storages behind ``tensors``, each storage once (``seen`` carries the
    ones already counted across calls); freed (0-byte) storages count nothing."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr(), st.nbytes())
        if st.nbytes() and key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total


def _default_state_bytes(model: nn.Module, optimizer) -> dict:
    """Bytes of every parameter, ``.grad`` and optimizer-state tensor of this rank, each
    storage once (as :func:`course_utils.precision.state_bytes`). torch DDP's own bucket
    buffers live in C++ and are not counted."""
    inner = getattr(optimizer, "inner", optimizer)
    params = list(unwrap(model).parameters())
    seen: set = set()
    out = {"params": _storage_bytes(params, seen),
           "grads": _storage_bytes([p.grad for p in params], seen)}
    state = [v for per_param in inner.state.values() for v in per_param.values()
             if isinstance(v, torch.Tensor)]
    out["optimizer"] = _storage_bytes(state, seen)
    return out


def _digest(params: dict) -> str:
    h = hashlib.sha256()
    for name, t in params.items():
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def global_loss(loss: torch.Tensor) -> float:
    """The loss of the global batch from this rank's loss on its rows: the ranks' losses
    summed in float64 and divided by the world size (every rank holds the same number of
    rows). Collective when ``torch.distributed`` is initialised; one process: the loss."""
    total = loss.detach().double()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
        return total.item() / dist.get_world_size()
    return total.item()


def train_steps(model: nn.Module, optimizer, data, steps, *, rank: int, world: int, device,
                ledger: CommLedger | None = None,
                after_step: Callable | None = None,
                on_step_end: Callable | None = None) -> tuple[list, list]:
    """The training loop of :func:`run`, over the step numbers ``steps`` (e.g. ``range(2, 4)``
    to resume at step 2): this rank's rows of each step's global batch, forward,
    backward, ``optimizer.step()``, ``after_step(step)`` (if given: e.g. measure the state
    before the gradients are dropped), ``optimizer.zero_grad()``.

    Returns ``(losses, times)``: the loss of the *global* batch per step (:func:`global_loss`;
    that all-reduce is left out of ``ledger``, it is for the log only) and the seconds of each step without ``after_step`` (on a GPU
    the device is synchronised around the timed part). ``on_step_end(step, loss,
    seconds)`` is called last in each step (e.g. to print a log line).
    Used by :func:`run` and by :mod:`course_utils.checkpoint` (stop, save, resume).
    """
    losses, times = [], []
    for step in steps:
        x, y = (t.to(device) for t in data.shard(step, rank, world))
        cuda = torch.device(device).type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        if after_step is not None:
            after_step(step)
        t2 = time.perf_counter()
        optimizer.zero_grad()
        times.append((t1 - t0) + (time.perf_counter() - t2))
        with ledger.pause() if ledger is not None else nullcontext():
            losses.append(global_loss(loss))
        if on_step_end is not None:
            on_step_end(step, losses[-1], times[-1])
    return losses, times


def _train(strategy: str, steps: int, seed: int, config: TransformerConfig, global_batch: int,
           options: dict) -> RunResult:
    """One rank's training run (the body of :func:`run`)."""
    from .launch import rank_device
    from .model import SyntheticData, build_model

    spec = STRATEGIES[strategy]
    distributed = spec.distributed
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = rank_device() if distributed else torch.device("cpu")
    model = build_model(config, seed=seed, device=device)
    data = SyntheticData(config, global_batch=global_batch, seed=seed)
    model, optimizer = wrap(strategy, model, make_adamw, **options)
    measure = spec.state_bytes or _default_state_bytes
    state = {}

    def measure_last(step):
        if step == steps - 1:
            state.update({k: int(v) for k, v in measure(model, optimizer).items()
                          if k in ("params", "grads", "optimizer")})

    ledger = CommLedger()
    with ledger:
        losses, times = train_steps(model, optimizer, data, range(steps), rank=rank, world=world,
                                    device=device, ledger=ledger,
                                    after_step=measure_last)
        with ledger.pause():
            digest = _digest(full_parameters(model))
    comm = ledger.totals()
    return RunResult(strategy=strategy, rank=rank, world_size=world, losses=losses,
                     comm_bytes=comm, comm_calls=ledger.counts(), state_bytes=state,
                     step_time_s=statistics.median(times), step_times_s=times, param_digest=digest)


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def run(strategy: str, world_size: int, *, steps: int = 5, seed: int = 0,
        config: TransformerConfig = COURSE_CONFIG, global_batch: int = GLOBAL_BATCH,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES, overlap: bool = True,
        backend: str = "auto", quiet: bool = False, timeout_s: float = 120.0) -> list[RunResult]:
    """Train the course GPT with ``strategy`` on ``world_size`` ranks; one :class:`RunResult` per rank.

    Same model (``build_model(config, seed=seed)``), data (``SyntheticData`` with
    ``global_batch`` rows, split evenly over the ranks) and AdamW (:func:`make_adamw`, fp32)
    for every strategy, so the losses are comparable with ``run("single", 1)``.
    ``"single"`` runs here, in this process, and needs ``world_size=1``; the others run
    on ``world_size`` ranks through :func:`course_utils.launch.launch`, which prints
    one line saying where (``quiet=True``: not even that). Communication is measured
    over the ``steps`` training steps only: the start-up broadcast of rank 0's weights
    and the all-reduce that averages the logged loss are not counted.
    """
    spec = _strategy(strategy)
    _check_int("world_size", world_size, 1)
    _check_int("steps", steps, 1)
    _check_int("seed", seed, 0)
    _check_int("global_batch", global_batch, 1)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig (e.g. COURSE_CONFIG), got "
                        f"{type(config).__name__}")
    _check_bucket_bytes(bucket_bytes)
    if global_batch % world_size:
        fits = [n for n in range(1, global_batch + 1) if global_batch % n == 0]
        raise ValueError(f"the global batch of {global_batch} rows cannot be split evenly over "
                         f"{world_size} ranks; use world_size in {fits} (or another global_batch)")
    options = {"bucket_bytes": bucket_bytes, "overlap": overlap}
    if not spec.distributed:
        if world_size != 1:
            raise ValueError(f"strategy {strategy!r} is one process on the whole global batch; "
                             "pass world_size=1")
        return [_train(strategy, steps, seed, config, global_batch, options)]
    from .launch import launch
    from .model import build_model

    # Building a model on the meta device imports torch's reference ops the first time
    # (~1-2 s); do it once here so that the forked ranks inherit them instead of each
    # importing them again.
    build_model(config, seed=seed, device="meta")
    return launch(_train, world_size, strategy, steps, seed, config, global_batch, options,
                  backend=backend, quiet=quiet, timeout_s=timeout_s)


# The ZeRO and FSDP strategies of notebooks 04-07 live in their own modules and register themselves
# when imported; importing them here (after the registry exists) makes run("zero1") work.
from . import zero as _zero  # noqa: E402,F401
from . import zero3 as _zero3  # noqa: E402,F401
from . import fsdp as _fsdp  # noqa: E402,F401  (torch FSDP2: "torch-fsdp", "torch-fsdp-zero2")
from . import hsdp as _hsdp  # noqa: E402,F401
