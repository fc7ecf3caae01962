"""The training recipes of ``memory.RECIPES``, for real on the CPU, measured to the byte.

Taught in ``notebooks/03_memory_anatomy.ipynb``. :func:`make_training` turns a model
into one of:

==================  ===========================================================  =====
recipe              what is held per trainable parameter                         bytes
==================  ===========================================================  =====
``fp32``            fp32 param + fp32 grad + AdamW's fp32 exp_avg, exp_avg_sq    4+4+8
``mixed``           bf16 param + bf16 grad + fp32 master, exp_avg, exp_avg_sq    2+2+12
``mixed-fp32-grads``bf16 param + fp32 ``main_grad`` + the same fp32 optimizer      2+4+12
``torch-amp``       fp32 param (the master) + fp32 grad + AdamW's exp_avg, exp_avg_sq 4+4+8
                    (forward under ``torch.autocast(dtype=bfloat16)``: bf16 copies
                    live only inside each op)
==================  ===========================================================  =====

The training loop is the same for every recipe::

    loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad()

:func:`state_bytes` counts what is really held (each storage once) and
:func:`memtracker_bytes` asks PyTorch's own ``MemTracker`` for a cross-check. The only
difference from :func:`course_utils.theory.memory.model_states` is AdamW's ``step`` counter:
one fp32 scalar tensor (4 bytes) per parameter tensor, kept on the CPU even when the
parameters are on a GPU.
"""
from __future__ import annotations

import warnings
from numbers import Real
from typing import Callable

import torch
from torch import nn

from ..impl.common import WrapsOptimizer, trainable
from ..runtime.launch import gpu_count
from ..theory.memory import RECIPES
from . import experiments

__all__ = ["WrapsOptimizer", "MasterWeightsAdamW", "make_training", "train_step", "state_bytes", "memtracker_bytes",
           "cuda_phases"]

LOW_PRECISION = torch.bfloat16


# -- the master-weights optimizer -------------------------------------------------------

class MasterWeightsAdamW(WrapsOptimizer):
    """AdamW for low-precision (bf16) parameters, run on fp32 master copies.

    Holds one fp32 master per parameter and a real ``torch.optim.AdamW`` (``.inner``)
    over the masters, so optimizer states are master 4 + exp_avg 4 + exp_avg_sq 4 =
    12 bytes per parameter. ``step()``: give each master its parameter's gradient in
    fp32, step AdamW, drop the fp32 gradients, copy the masters back into the bf16
    parameters (rounding them). During ``step()`` the fp32 gradient copies are a
    transient extra 4 bytes per parameter (none with ``use_main_grad``).

    ``use_main_grad=True`` (recipe ``mixed-fp32-grads``): gradients are read from each
    parameter's fp32 ``main_grad`` buffer, which the master uses directly, no copy.
    """

    def __init__(self, params, masters=None, *, lr: float = 1e-3, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.95), use_main_grad: bool = False):
        self.params = list(params)
        if not self.params:
            raise ValueError("MasterWeightsAdamW got no parameters; pass the trainable ones")
        if masters is None:
            masters = [p.detach().to(torch.float32, copy=True) for p in self.params]
        self.masters = list(masters)
        if [m.shape for m in self.masters] != [p.shape for p in self.params]:
            raise ValueError("masters must match params one to one, with the same shapes")
        self.use_main_grad = use_main_grad
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, betas=betas)

    def _grad(self, p: torch.Tensor):
        return getattr(p, "main_grad", None) if self.use_main_grad else p.grad

    @torch.no_grad()
    def step(self) -> None:
        for p, master in zip(self.params, self.masters):
            grad = self._grad(p)
            master.grad = None if grad is None else grad.float()   # main_grad is already fp32
        self.inner.step()
        for p, master in zip(self.params, self.masters):
            master.grad = None                                      # free the fp32 copies
            p.copy_(master)                                         # fp32 -> bf16

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the bf16 ``.grad``; with ``use_main_grad``, zero each ``main_grad`` in
        place (the fp32 buffers stay allocated: 4 bytes per parameter, all the time)."""
        for p in self.params:
            if self.use_main_grad:
                p.main_grad.zero_()
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "masters": self.masters}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict["inner"])
        for p, master, saved in zip(self.params, self.masters, state_dict["masters"]):
            master.copy_(saved)
            p.copy_(master)

    def __repr__(self) -> str:
        group = self.inner.param_groups[0]
        return (f"MasterWeightsAdamW({len(self.params)} tensors, lr={group['lr']}, "
                f"betas={group['betas']}, weight_decay={group['weight_decay']}, "
                f"use_main_grad={self.use_main_grad})")


# -- building a recipe -------------------------------------------------------------------

def _check_hyperparameters(lr, weight_decay, betas) -> None:
    for name, value in (("lr", lr), ("weight_decay", weight_decay)):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0 (e.g. 1e-3), got {lr!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if (not isinstance(betas, (tuple, list)) or len(betas) != 2
            or not all(isinstance(b, Real) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"betas must be two numbers in [0, 1) such as (0.9, 0.95), got {betas!r}")


def _attach_main_grad(p: nn.Parameter) -> None:
    """Give ``p`` an fp32 ``main_grad`` that every backward adds its gradient into."""
    p.main_grad = torch.zeros_like(p, dtype=torch.float32)

    def accumulate(param: nn.Parameter) -> None:
        param.main_grad.add_(param.grad)    # upcasts bf16 -> fp32 element by element
        param.grad = None                   # the bf16 gradient is freed right away

    p.register_post_accumulate_grad_hook(accumulate)


def _autocast_forward(model: nn.Module) -> None:
    """Run ``model``'s forward under ``torch.autocast`` in bf16 (on its parameters' device)."""
    device_type = next(model.parameters()).device.type
    forward = model.forward

    def autocast_forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=LOW_PRECISION):
            return forward(*args, **kwargs)

    model.forward = autocast_forward


def make_training(model: nn.Module, recipe: str, *, lr: float = 1e-3, weight_decay: float = 0.0,
                  betas: tuple[float, float] = (0.9, 0.95)):
    """``(model, optimizer)`` for ``recipe``, a key of :data:`course_utils.theory.memory.RECIPES`.

    * ``fp32``: the model in fp32 and ``torch.optim.AdamW``.
    * ``mixed``: the model (every parameter and buffer) in bf16 and a
      :class:`MasterWeightsAdamW` whose fp32 masters are copied *before* rounding.
    * ``mixed-fp32-grads``: as ``mixed``, and every trainable parameter gets an fp32
      ``main_grad`` that backward accumulates into (the bf16 ``.grad`` is freed at once).
    * ``torch-amp``: PyTorch's own mixed precision: the model stays fp32 (the parameters
      are the master copy), ``torch.optim.AdamW``, and the model's forward runs under
      ``torch.autocast`` in bf16, so matmuls compute in bf16 and gradients arrive in fp32.

    The model is converted in place. Frozen parameters (``requires_grad=False``) get no
    optimizer state and no ``main_grad``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    _check_hyperparameters(lr, weight_decay, betas)
    params = trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    if any(hasattr(p, "main_grad") for p in model.parameters()):
        raise ValueError("this model already went through make_training(..., 'mixed-fp32-grads') "
                         "and has main_grad hooks; build a fresh model for a new recipe")
    hyper = dict(lr=lr, weight_decay=weight_decay, betas=tuple(betas))
    if recipe in ("fp32", "torch-amp"):
        model.float()
        if recipe == "torch-amp":
            _autocast_forward(model)
        return model, torch.optim.AdamW(params, **hyper)
    masters = [p.detach().to(torch.float32, copy=True) for p in params]
    model.to(LOW_PRECISION)             # Parameters keep their identity; only .data changes
    use_main_grad = recipe == "mixed-fp32-grads"
    if use_main_grad:
        for p in params:
            _attach_main_grad(p)
    return model, MasterWeightsAdamW(params, masters, use_main_grad=use_main_grad, **hyper)


def train_step(model: nn.Module, optimizer, inputs: torch.Tensor, targets: torch.Tensor,
               *, zero_grad: bool = True) -> float:
    """One step of the course loop; returns the loss. ``zero_grad=False`` leaves the
    gradients in place (to measure them with :func:`state_bytes`)."""
    loss = model(inputs, targets)
    loss.backward()
    optimizer.step()
    if zero_grad:
        optimizer.zero_grad()
    return loss.item()


# -- measuring ----------------------------------------------------------------------------

def _torch_optimizer(optimizer) -> torch.optim.Optimizer:
    if isinstance(optimizer, MasterWeightsAdamW):
        return optimizer.inner
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    raise TypeError("optimizer must be a torch.optim.Optimizer or a MasterWeightsAdamW "
                    f"(from make_training), got {type(optimizer).__name__}")


def state_bytes(model: nn.Module, optimizer) -> dict:
    """Bytes of model states held right now (call after ``step()``, before ``zero_grad()``):
    :func:`course_utils.harness.experiments.state_bytes` with ``"optimizer_detail"``, the
    optimizer's bytes by name (``master``, ``exp_avg``, ``exp_avg_sq``, ``step``)."""
    _torch_optimizer(optimizer)
    return experiments.state_bytes(model, optimizer, detail=True)


def memtracker_bytes(model: nn.Module, optimizer, run_step: Callable[[], object]) -> dict:
    """Run ``run_step()`` (one training step) under PyTorch's ``MemTracker`` and return
    ``{"current": {...}, "peak": {...}}``, bytes by MemTracker category ("Parameter",
    "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other", "Total"), summed
    over devices. "current" is after ``run_step``; "peak" is the snapshot at the highest
    total. ``run_step`` may run the model forward once only (MemTracker refuses a second
    forward of the same model in one tracking session).

    Tensors that existed before (the model, optimizer states, masters, ``main_grad``)
    are registered with ``track_external``; MemTracker files as "Optstate" only tensors
    in a ``torch.optim`` optimizer's ``state``, so the fp32 masters and ``main_grad``
    buffers, which live outside it, show up as "Other". Inputs are not registered;
    targets show up as "Activation" once the loss reshapes them.
    """
    from ..runtime.compat import mem_tracker

    MemTracker = mem_tracker()

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not callable(run_step):
        raise TypeError("run_step must be a function of no arguments that runs one step, e.g. "
                        "lambda: train_step(model, opt, x, y, zero_grad=False)")
    extras = [p.main_grad for p in model.parameters() if hasattr(p, "main_grad")]
    if isinstance(optimizer, MasterWeightsAdamW):
        extras += optimizer.masters
    tracker = MemTracker()
    tracker.track_external(model, _torch_optimizer(optimizer), *extras)
    with warnings.catch_warnings():
        # main_grad's hook frees .grad before MemTracker's own hook looks at it
        warnings.filterwarnings("ignore", message="Expected a tensor or a traceable wrapper")
        with tracker:
            run_step()
    return {kind: _by_category(tracker.get_tracker_snapshot(kind)) for kind in ("current", "peak")}


def _by_category(snapshot: dict) -> dict[str, int]:
    totals: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, nbytes in per_device.items():
            name = getattr(key, "value", key)       # _MemRefType enum -> "Parameter", ...
            totals[name] = totals.get(name, 0) + nbytes
    return totals


def cuda_phases(recipe: str = "mixed", *, config=None, micro_batch: int = 4, seed: int = 0) -> dict:
    """On a CUDA GPU: ``torch.cuda.max_memory_allocated`` after each phase of one step.

    Phases: ``init`` (model and fp32 masters built; AdamW creates m and v lazily, in the
    first step), ``forward``, ``backward``, ``step``. Each
    value is the peak since the previous phase began (the counter is reset in between),
    so ``forward`` includes the activations and ``step`` the optimizer's temporary
    buffers. Also returns the predicted model states. Initialises CUDA in this process.
    """
    from ..theory.config import TransformerConfig
    from ..theory.memory import model_states
    from .model import SyntheticData, build_model

    if not gpu_count():
        raise RuntimeError("cuda_phases needs a CUDA GPU; none is visible in this process")
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    config = config or TransformerConfig(hidden=1024, layers=8, heads=16, vocab=32000, seq=1024)
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    model, opt = make_training(build_model(config, seed=seed, device=device), recipe)
    data = SyntheticData(config, global_batch=micro_batch, seed=seed)
    x, y = (t.to(device) for t in data.batch(0))
    phases = {}

    def mark(name):
        torch.cuda.synchronize(device)
        phases[name] = torch.cuda.max_memory_allocated(device) - base
        torch.cuda.reset_peak_memory_stats(device)

    mark("init")
    loss = model(x, y)
    mark("forward")
    loss.backward()
    mark("backward")
    opt.step()
    mark("step")
    predicted = model_states(config.num_params(), recipe=recipe)
    return {"phases": phases, "predicted": predicted, "reserved": torch.cuda.memory_reserved(device),
            "config": config, "micro_batch": micro_batch}
