"""Train a model with any strategy and measure it: ``wrap``, the loop ``train``, ``run``. The
global batch does not depend on the number of ranks: every strategy gives ``"single"``'s losses."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import math
import statistics
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_int, check_module, check_number, distributed, require_process_group
from ..impl.common import check_bucket_bytes, grad_owners, storage_bytes, trainable
from ..impl.ddp import DataParallel, unwrap
from ..runtime.ledger import CommLedger
from ..runtime.network import ModelledNetwork, as_network, current_network
from ..runtime.wire import WireMeter, group_wire_bytes
from ..theory.config import COURSE_CONFIG, TransformerConfig
from .model import rows_per_rank
from .strategies import STRATEGIES
from .strategies import get as _get_strategy

__all__ = ["train", "local_tensor", "global_loss", "GLOBAL_BATCH", "LR", "BETAS", "WEIGHT_DECAY",
           "wrap", "full_parameters", "run", "run_rank", "RunResult", "StepClock", "make_adamw",
           "state_bytes", "param_digest", "reference_grads", "full_grads", "clip_grad_norm_"]

#: Rows in the global batch of :func:`run`: divisible by 1, 2, 3, 4, 6 and 12 ranks.
GLOBAL_BATCH = 12
#: AdamW hyperparameters of :func:`run` (fixed, so every strategy trains the same way).
LR, BETAS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 0.01


def make_adamw(params) -> torch.optim.AdamW:
    """The optimizer of :func:`run`: ``AdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)``."""
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)


def _check_options(spec, options: dict) -> None:
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise TypeError(f"strategy {spec.name!r} has no option {', '.join(unknown)}; its options: "
                        f"{', '.join(spec.options) or 'none'}")
    check_bucket_bytes(options.get("bucket_bytes"))
    impl = options.get("impl")
    if impl is not None:                      # a learner's class runs as it is (a unit with prefetch(): overlap too)
        if not isinstance(impl, type):
            raise TypeError(f"impl must be a class (e.g. your MyZero1), got {type(impl).__name__}")
        defaults = {n: p.default for n, p in inspect.signature(spec.wrap).parameters.items()}
        allowed = ("impl", "bucket_bytes") + (("overlap",) if callable(getattr(impl, "prefetch", None)) else ())
        changed = [k for k, v in options.items() if k not in allowed and v != defaults[k]]
        if changed:
            raise ValueError(f"impl={impl.__name__} runs your class as it is: drop {', '.join(changed)}")


def wrap(strategy: str, model: nn.Module, make_optimizer: Callable, **options):
    """``(model, optimizer)`` for ``strategy``: every rank starts from rank 0's state;
    ``make_optimizer(params)`` gets the parameters this rank updates; ``options``: ``Strategy.options``."""
    spec = _get_strategy(strategy)
    check_module("model", model)
    if not callable(make_optimizer):
        raise TypeError("make_optimizer must be a function params -> optimizer, e.g. "
                        "course_utils.harness.experiments.make_adamw")
    from torch.nn.parallel import DistributedDataParallel
    if isinstance(model, (DataParallel, DistributedDataParallel)):
        raise ValueError(f"model is already wrapped ({type(model).__name__}); pass the plain module")
    if not trainable(model):
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    _check_options(spec, options)
    if spec.distributed:
        require_process_group(f"strategy {strategy!r}")
    wrapped, optimizer = spec.wrap(model, make_optimizer, **options)
    for name in ("step", "zero_grad"):
        if not callable(getattr(optimizer, name, None)):
            raise TypeError(f"make_optimizer returned a {type(optimizer).__name__} without "
                            f"{name}(); return a torch.optim optimizer")
    return wrapped, optimizer


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` (detached CPU clones, names of the unwrapped module) on
    every rank; sharded parameters are gathered (a collective)."""
    check_module("model", model)
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


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for any strategy: the *global* norm before clipping,
    the same on every rank (shards torch cannot see are clipped by their owner: a collective)."""
    check_module("model", model, what="the wrapped model")
    if max_norm != math.inf:                # inf: the norm only, nothing clipped (as torch's)
        check_number("max_norm", max_norm, above=0)
    params = list(model.parameters())
    owners = grad_owners(params)
    if len(owners) > 1:
        raise ValueError(f"the model's gradients are held by {len(owners)} sharded optimizers; "
                         "clip each one with its own clip_grad_norm_")
    if owners:
        return owners[0].clip_grad_norm_(max_norm, norm_type)
    norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm,
                                          norm_type=norm_type)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@dataclasses.dataclass
class RunResult:
    """One rank's result of :func:`run`, also readable as a dict. comm_bytes: sent *in the ring
    model* (CommLedger); wire_bytes: sent by its TCP sockets (None where unmeasurable)."""
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
    extra: dict = dataclasses.field(default_factory=dict)
    wire_bytes: int | None = None

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


def state_bytes(model: nn.Module, optimizer, *, detail: bool = False) -> dict:
    """Bytes of ``"params"``, ``"grads"``, ``"optimizer"`` this rank holds now (after ``step()``,
    before ``zero_grad()``), each storage once; not torch DDP's C++ bucket buffers."""
    check_module("model", model)
    inners = inner_optimizers(optimizer)
    params = list(unwrap(model).parameters())
    if any(p.is_meta for p in params):
        raise ValueError("the model is on the meta device (shapes only, no memory); "
                         "build it on 'cpu' to measure bytes")
    updated = [p for inner in inners for g in inner.param_groups for p in g["params"]]
    seen: set = set()
    grads = [g for p in params + updated for g in (p.grad, getattr(p, "main_grad", None))]
    grads += [getattr(b, "shard_grad", None) for b in getattr(optimizer, "buckets", ())]   # ZeRO-2 (mixed)
    out = {"params": storage_bytes(map(local_tensor, params), seen),
           "grads": storage_bytes(map(local_tensor, grads), seen)}
    found = {"master": storage_bytes(map(local_tensor, updated), seen)}
    for per_param in (v for inner in inners for v in inner.state.values()):
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                found[name] = found.get(name, 0) + storage_bytes([local_tensor(value)], seen)
    out["optimizer"] = sum(found.values())
    if detail:
        out["optimizer_detail"] = {k: v for k, v in found.items() if v or k != "master"}
    return out


def inner_optimizers(optimizer) -> list:
    """The optimizers that hold the states: those ``optimizer`` wraps (any attribute that is a
    torch optimizer, or a list, tuple or dict of them, whatever its name: a learner's
    ``MyZero1`` may call it ``self.opt``), else ``optimizer`` itself."""
    if not isinstance(getattr(optimizer, "state", None), dict):
        raise TypeError(f"optimizer must be a torch optimizer, got {type(optimizer).__name__}")
    found = []
    for value in vars(optimizer).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        found += [v for v in items if isinstance(v, torch.optim.Optimizer) and v is not optimizer]
    return found or [optimizer]


def local_tensor(t):
    return t.to_local() if hasattr(t, "to_local") else t


def param_digest(params: dict) -> str:
    """SHA-256 of ``{name: tensor}`` (names and exact bytes): equal digests, equal models."""
    h = hashlib.sha256()
    for name, t in params.items():
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def global_loss(loss: torch.Tensor) -> float:
    """The global batch's loss: the ranks' losses summed in float64 / world size (a collective)."""
    total = loss.detach().double()
    if distributed() and dist.get_world_size() > 1:
        dist.all_reduce(total)
        return total.item() / dist.get_world_size()
    return total.item()


def reference_grads(max_norm: float | None = None):
    """(loss, grad norm, {name: grad}) of step 0's whole global batch in one process: the
    notebook-07 graders' reference (``max_norm``: clipped as ``clip_grad_norm_`` would)."""
    from .model import SyntheticData, build_model
    model = build_model(seed=0)
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, 0, 1)
    loss = model(x, y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm else float("inf"))
    return loss.item(), norm.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def full_grads(model) -> dict:
    """``{name: full gradient}`` (sharded DTensor gradients gathered: a collective)."""
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters() if p.grad is not None}


def train(model: nn.Module, optimizer, data, steps, *, rank: int | None = None,
          world: int | None = None, device=None, meters=(), spans: list | None = None):
    """The course's training loop, a generator of ``(step, loss, seconds)`` yielded between
    ``optimizer.step()`` and ``zero_grad()``; ``steps``: a count or the step numbers
    (``range(2, 4)`` resumes); ``loss``: :func:`global_loss`, with the ``meters`` paused;
    ``spans``: a list to which each step's ``(start, backward start, end)`` (``time.perf_counter()``)
    is appended."""
    if rank is None or world is None:
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed() else (0, 1)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    net = current_network()                       # a modelled network: its transfers have arrived
    sync_device = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def sync():
        sync_device()
        if net is not None:
            net.synchronize()

    for step in range(steps) if isinstance(steps, int) else steps:
        x, y = (t.to(device) for t in data.shard(step, rank, world))
        sync()
        t0 = time.perf_counter()
        loss = model(x, y)
        t_backward = time.perf_counter()
        loss.backward()
        optimizer.step()
        sync()
        t1 = time.perf_counter()
        seconds = t1 - t0
        if spans is not None:
            spans.append((t0, t_backward, t1))
        with contextlib.ExitStack() as paused:
            for meter in meters:
                paused.enter_context(meter.pause())
            loss = global_loss(loss)
        yield step, loss, seconds
        optimizer.zero_grad()


@dataclasses.dataclass
class StepClock:
    """One step under a modelled network, as one rank saw it: its time, when its backward
    started and its transfers, times in seconds from the step's start (``Transfer.shifted``)."""
    network: str
    step_s: float
    transfers: list
    backward_at: float | None = None


def run_rank(strategy: str, steps: int, seed: int, config: TransformerConfig = COURSE_CONFIG,
             global_batch: int = GLOBAL_BATCH, options: dict | None = None, network=None, *,
             on_step: Callable | None = None, digest: bool = True) -> RunResult:
    """One rank's part of :func:`run` (and of ``python -m course_utils.harness.train_cli``): the
    course GPT wrapped with ``strategy``, trained ``steps`` steps with :func:`train`, measured.
    ``on_step(step, loss, seconds)`` is called after each step; ``digest=False`` skips
    ``param_digest`` (it gathers every parameter to the CPU of every rank)."""
    from ..runtime.launch import rank_device
    from .model import SyntheticData, build_model
    spec = STRATEGIES[strategy]
    device = rank_device() if spec.distributed else torch.device("cpu")
    model, optimizer = wrap(strategy, build_model(config, seed=seed, device=device), make_adamw,
                            **(options or {}))
    data = SyntheticData(config, global_batch=global_batch, seed=seed)
    losses, times, peaks, spans = [], [], [], []
    clocked = ModelledNetwork(network) if network is not None else contextlib.nullcontext()
    with CommLedger() as ledger, WireMeter() as wire, clocked as net:
        for step, loss, seconds in train(model, optimizer, data, steps, device=device,
                                         meters=(ledger, wire), spans=spans):
            losses.append(loss)
            times.append(seconds)
            if hasattr(optimizer, "peak_grad_bytes"):      # ZeRO's gradient peak, step by step
                peaks.append(optimizer.peak_grad_bytes)
                optimizer.reset_peak()
            if step == steps - 1:
                state = state_bytes(model, optimizer)
            if on_step is not None:
                on_step(step, loss, seconds)
    # one process sends nothing; NCCL's NVLink/InfiniBand traffic has no TCP socket
    wire_bytes = group_wire_bytes(wire) if spec.distributed else (0 if wire.available else None)
    extra = dict(spec.extras(model, optimizer)) if spec.extras else {}
    if peaks:
        extra["peak_grad_bytes"] = max(peaks)
    if net is not None:                  # the median step's clock, with its transfers
        t0, tb, t1 = spans[times.index(statistics.median_low(times))]
        extra["clock"] = StepClock(net.describe(), t1 - t0, [t.shifted(t0) for t in net.between(t0, t1)], tb - t0)
    rank, world = (dist.get_rank(), dist.get_world_size()) if spec.distributed else (0, 1)
    return RunResult(strategy=strategy, rank=rank, world_size=world, losses=losses,
                     comm_bytes=ledger.totals(), comm_calls=ledger.counts(), state_bytes=state,
                     step_time_s=statistics.median(times), step_times_s=times,
                     param_digest=param_digest(full_parameters(model)) if digest else "", extra=extra,
                     wire_bytes=wire_bytes)


def run(strategy: str, world_size: int, *, steps: int = 5, seed: int = 0,
        config: TransformerConfig = COURSE_CONFIG, global_batch: int = GLOBAL_BATCH,
        backend: str = "auto", quiet: bool = False, timeout_s: float = 120.0, network=None,
        **options) -> list[RunResult]:
    """Train the course GPT with ``strategy`` on ``world_size`` ranks; one :class:`RunResult` per rank.
    ``options`` go to :func:`wrap`; communication is measured over the training steps only
    (not the start-up broadcast, not the loss averaging). ``network={"bandwidth": bytes/s,
    "latency": s}``: the steps run under that modelled network
    (:class:`~course_utils.runtime.network.ModelledNetwork`), ``step_time_s`` is its clock and
    ``extra["clock"]`` the median step's transfers (:class:`StepClock`)."""
    spec = _get_strategy(strategy)
    check_int("world_size", world_size, 1)
    check_int("steps", steps, 1)
    check_int("seed", seed, 0)
    check_int("global_batch", global_batch, 1)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig (e.g. COURSE_CONFIG), got "
                        f"{type(config).__name__}")
    _check_options(spec, options)
    network = as_network(network)
    rows_per_rank(global_batch, world_size)
    if not spec.distributed:
        if world_size != 1:
            raise ValueError(f"strategy {strategy!r} is one process on the whole global batch; "
                             "pass world_size=1")
        return [run_rank(strategy, steps, seed, config, global_batch, options, network)]
    from ..runtime.launch import launch
    from .model import warm_up
    warm_up(config)
    return launch(run_rank, world_size, strategy, steps, seed, config, global_batch, options, network,
                  backend=backend, quiet=quiet, timeout_s=timeout_s)
