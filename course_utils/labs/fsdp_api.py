"""Measuring tools for notebook 07's FSDP2 cells, used inside a launched rank (``tests/fsdp_checks.py`` checks them)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_int, check_module, require_process_group
from ..harness.experiments import GLOBAL_BATCH, local_tensor, param_digest
from ..harness.model import SyntheticData
from ..theory.sharding import fsdp_units
from ..runtime import compat
from ..runtime.launch import rank_device
from ..runtime.ledger import CommLedger

__all__ = ["batch", "HeldParams", "SavedActivations", "EventOrder", "unsharded_grad_bytes",
           "grad_bytes", "state_digest", "digest"]


def batch(step: int = 0, *, seed: int = 0):
    """``(x, y)``: this rank's rows of step ``step`` of the course data, on this rank's device."""
    check_int("step", step, 0)
    require_process_group("batch")
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=seed)
    return tuple(t.to(rank_device()) for t in data.shard(step, dist.get_rank(), dist.get_world_size()))


class HeldParams:
    """``held = HeldParams(model)`` after sharding; ``held()``: bytes of non-shard parameter storages (gathered now)."""

    def __init__(self, model: nn.Module):
        self.model = check_module("model", model)
        self._shards = {local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}

    def __call__(self) -> int:
        storages = {st.data_ptr(): st.nbytes() for st in
                    (local_tensor(p).untyped_storage() for p in self.model.parameters())}
        return sum(n for ptr, n in storages.items() if ptr not in self._shards)


class SavedActivations:
    """``with SavedActivations(model) as saved:`` around a forward: ``saved.bytes`` autograd saved for backward,
    each storage once (``.parameters``: the model's, apart), kept alive until the block ends or :meth:`reset`."""

    def __init__(self, model: nn.Module):
        self.model = check_module("model", model)
        self.reset()

    def reset(self) -> None:
        self.bytes, self.parameters, self._keep = 0, 0, {}

    def _pack(self, t):
        key = compat.storage_key(t)
        if key not in self._keep:           # the storage itself: data pointers get reused
            self._keep[key] = t             # keep it alive while counting
            kind = "parameters" if key in {compat.storage_key(p) for p in self.model.parameters()} else "bytes"
            setattr(self, kind, getattr(self, kind) + t.untyped_storage().nbytes())
        return t

    def __enter__(self) -> "SavedActivations":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        return self._hooks.__enter__() or self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc), self._keep.clear()
        return False


class EventOrder:
    """``with EventOrder(model) as order:`` around a step of a model sharded per block: ``order.forward`` /
    ``.backward``: the events as the CPU issued them (``"AG root"``, ``"fwd 0"``, ``"RS 0"``, ``"bwd 0"``...);
    ``.gathered``: the most units gathered at once per phase; ``.ledger``: a CommLedger; :meth:`reset`."""

    _LABELS = {"unshard": "AG", "pre_backward": "", "post_backward": "RS"}

    def __init__(self, model: nn.Module):
        self.ledger, self.events = CommLedger(), []
        blocks = fsdp_units(check_module("model", model))
        self._groups = {"root": compat.fsdp2_param_group(model),
                        **{f"block{i}": compat.fsdp2_param_group(u) for i, u in enumerate(blocks)}}
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda m, a, i=i: self.events.append(f"fwd block{i}"), prepend=True)
            block.register_forward_pre_hook(lambda m, a: self._note_gathered())  # after the unshard
        self._watch = compat.watch_fsdp2(self._groups, self._LABELS, self._on_call)
        self.reset()

    def _note_gathered(self) -> None:
        now = sum(map(compat.fsdp2_is_gathered, self._groups.values()))
        self.gathered[self._phase] = max(self.gathered[self._phase], now)

    def _on_call(self, name, group, method, call):
        if method == "pre_backward":
            self._phase = "backward"
            if compat.fsdp2_training_state(group) != "PRE_BACKWARD":   # its first call only
                self.events.append(f"bwd {name}")
        before = len(self.ledger.records)
        out = call()
        if self._LABELS[method] and len(self.ledger.records) > before:
            self.events.append(f"{self._LABELS[method]} {name}")
        self._note_gathered()
        return out

    def reset(self) -> None:
        self.events.clear(), self.ledger.reset()
        self.gathered, self._phase = {"forward": 0, "backward": 0}, "forward"

    def __enter__(self) -> "EventOrder":
        self.ledger.__enter__(), self._watch.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._watch.__exit__(*exc), self.ledger.__exit__(*exc)
        return False

    def _split(self, half: int) -> list[str]:
        text = [e.replace("block", "") for e in self.events]
        cut = text.index("bwd root") if "bwd root" in text else len(text)
        return (text[:cut], text[cut:])[half]

    forward = property(lambda self: self._split(0))
    backward = property(lambda self: self._split(1))


def unsharded_grad_bytes(model: nn.Module) -> int:
    """Bytes of the unsharded gradients FSDP2 holds now (0 once reduce-scattered)."""
    return compat.fsdp2_unsharded_grad_bytes(check_module("model", model))


def grad_bytes(model: nn.Module) -> dict:
    """Gradient bytes FSDP2 holds now, each storage once (appendix 10 §3.5): ``unsharded`` (sync off),
    ``shards`` (the sharded parameters' ``.grad``; while a unit is gathered its module holds the
    unsharded parameters, so they are read from FSDP2's ``sharded_param``) and ``waiting`` (HSDP with
    ``set_requires_all_reduce(False)``: reduce-scattered, summed until the all-reduce)."""
    groups = compat.fsdp2_param_groups(check_module("model", model)).values()
    shards = {g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in
              (fp.sharded_param.grad.to_local() for group in groups for fp in group.fsdp_params
               if fp.sharded_param.grad is not None)}
    return {"unsharded": unsharded_grad_bytes(model), "shards": sum(shards.values()),
            "waiting": compat.fsdp2_waiting_grad_bytes(groups)}


def digest(tensors: dict) -> str:
    """SHA-256 of names and bytes of ``{name: tensor}``: equal digests, equal tensors."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> tensor, got {type(tensors).__name__}")
    return param_digest({k: t.detach().reshape(-1) for k, t in tensors.items()})


def state_digest(model: nn.Module, optimizer=None) -> str | None:
    """A collective: on rank 0 the :func:`digest` of the full parameters and optimizer states; else None."""
    from ..harness.checkpoint import full_state_dict, optimizer_tensors

    state = full_state_dict(check_module("model", model), optimizer)
    extra = optimizer_tensors(state["optimizer"]) if state and optimizer is not None else {}
    return digest({**state["model"], **extra}) if state else None
