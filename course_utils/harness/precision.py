"""The training recipes of ``memory.RECIPES``, for real on the CPU, measured to the byte.

Taught in ``notebooks/03_memory_anatomy.ipynb``. Bytes per trainable parameter:
``fp32`` 4+4+8 (param, grad, AdamW's m and v); ``mixed`` 2+2+12 (bf16 param and grad, fp32
master, m, v); ``mixed-fp32-grads`` 2+4+12 (fp32 ``main_grad``); ``torch-amp`` 4+4+8 (fp32
model, forward under ``torch.autocast``: bf16 copies live only inside each op). The one
difference from :func:`course_utils.theory.memory.model_states`: AdamW's ``step``, one fp32
scalar (4 bytes) per parameter tensor, on the CPU even when the parameters are on a GPU.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

from ..checks import check_module, check_number, is_number
from ..impl.common import WrapsOptimizer, trainable
from ..runtime.launch import gpu_count
from ..theory.memory import RECIPES

__all__ = ["MasterWeightsAdamW", "make_training", "train_step", "memtracker_bytes", "cuda_phases"]

LOW_PRECISION = torch.bfloat16


class MasterWeightsAdamW(WrapsOptimizer):
    """AdamW for bf16 parameters, run on fp32 masters (``.inner``: a real AdamW over them):
    12 bytes per parameter, plus 4 transient during ``step()`` for the fp32 gradient copies
    (none with ``use_main_grad``, which reads each parameter's fp32 ``main_grad``)."""

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

    @torch.no_grad()
    def step(self) -> None:
        for p, master in zip(self.params, self.masters):
            grad = getattr(p, "main_grad", None) if self.use_main_grad else p.grad
            master.grad = None if grad is None else grad.float()   # main_grad is already fp32
        self.inner.step()
        for p, master in zip(self.params, self.masters):
            master.grad = None                                      # free the fp32 copies
            p.copy_(master)                                         # fp32 -> bf16

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``.grad``; ``main_grad`` is zeroed in place (it stays allocated)."""
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


def _accumulate_main_grad(param: nn.Parameter) -> None:
    """The ``mixed-fp32-grads`` hook: add ``.grad`` into the fp32 ``main_grad``, free it at once."""
    param.main_grad.add_(param.grad)    # upcasts bf16 -> fp32 element by element
    param.grad = None


def make_training(model: nn.Module, recipe: str, *, lr: float = 1e-3, weight_decay: float = 0.0,
                  betas: tuple[float, float] = (0.9, 0.95)):
    """``(model, optimizer)`` for ``recipe``, the model converted in place; the fp32 masters
    are copied *before* rounding to bf16."""
    check_module("model", model)
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    check_number("lr", lr, above=0, example="1e-3")
    check_number("weight_decay", weight_decay, minimum=0)
    if (not isinstance(betas, (tuple, list)) or len(betas) != 2
            or not all(is_number(b) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"betas must be two numbers in [0, 1) such as (0.9, 0.95), got {betas!r}")
    params = trainable(model)
    if not params:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    if any(hasattr(p, "main_grad") for p in model.parameters()):
        raise ValueError("this model already went through make_training(..., 'mixed-fp32-grads') "
                         "and has main_grad hooks; build a fresh model for a new recipe")
    hyper = dict(lr=lr, weight_decay=weight_decay, betas=tuple(betas))
    if recipe in ("fp32", "torch-amp"):
        model.float()
        if recipe == "torch-amp":       # forward under torch.autocast in bf16
            device_type, forward = next(model.parameters()).device.type, model.forward

            def autocast_forward(*args, **kwargs):
                with torch.autocast(device_type, dtype=LOW_PRECISION):
                    return forward(*args, **kwargs)
            model.forward = autocast_forward
        return model, torch.optim.AdamW(params, **hyper)
    masters = [p.detach().to(torch.float32, copy=True) for p in params]
    model.to(LOW_PRECISION)             # Parameters keep their identity; only .data changes
    use_main_grad = recipe == "mixed-fp32-grads"
    if use_main_grad:
        for p in params:
            p.main_grad = torch.zeros_like(p, dtype=torch.float32)
            p.register_post_accumulate_grad_hook(_accumulate_main_grad)
    return model, MasterWeightsAdamW(params, masters, use_main_grad=use_main_grad, **hyper)


def train_step(model: nn.Module, optimizer, inputs: torch.Tensor, targets: torch.Tensor,
               *, zero_grad: bool = True) -> float:
    """One step of the course loop; returns the loss. ``zero_grad=False`` leaves the
    gradients in place (to measure them with :func:`~course_utils.harness.experiments.state_bytes`)."""
    loss = model(inputs, targets)
    loss.backward()
    optimizer.step()
    if zero_grad:
        optimizer.zero_grad()
    return loss.item()


def _torch_optimizer(optimizer) -> torch.optim.Optimizer:
    if isinstance(optimizer, MasterWeightsAdamW):
        return optimizer.inner
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    raise TypeError("optimizer must be a torch.optim.Optimizer or a MasterWeightsAdamW "
                    f"(from make_training), got {type(optimizer).__name__}")


def memtracker_bytes(model: nn.Module, optimizer, run_step: Callable[[], object]) -> dict:
    """``{"current", "peak"}``: bytes by MemTracker category ("Parameter", ..., "Total"),
    summed over devices, of ``run_step()`` (one step, one forward: MemTracker refuses a
    second) under PyTorch's ``MemTracker``. Masters and ``main_grad`` live outside a
    ``torch.optim`` state, so they show as "Other", not "Optstate"."""
    from ..runtime.compat import mem_tracker
    MemTracker = mem_tracker()
    check_module("model", model)
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
    out = {}
    for kind in ("current", "peak"):
        totals = out[kind] = {}
        for per_device in tracker.get_tracker_snapshot(kind).values():
            for key, nbytes in per_device.items():
                name = getattr(key, "value", key)       # _MemRefType enum -> "Parameter", ...
                totals[name] = totals.get(name, 0) + nbytes
    return out


def cuda_phases(recipe: str = "mixed", *, config=None, micro_batch: int = 4, seed: int = 0) -> dict:
    """On a CUDA GPU (initialised here): the peak bytes of each phase of one step (AdamW
    makes m and v lazily, in ``step``) and the predicted model states."""
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
