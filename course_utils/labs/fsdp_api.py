"""Small measuring tools for the FSDP2 cells of ``notebooks/07_fsdp.ipynb``, used inside a
launched rank: :func:`batch` (this rank's share of a step), :class:`HeldParams` (unsharded
parameter bytes now), :class:`SavedActivations` (activation bytes autograd saves),
:class:`EventOrder` (order of all-gathers, reduce-scatters and block forwards),
:func:`unsharded_grad_bytes`, :func:`state_digest` / :func:`digest` (compare two runs bit
for bit). :mod:`course_utils.labs.fsdp_options` runs the same measurements as checked
experiments.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_int, require_process_group
from ..harness.experiments import GLOBAL_BATCH, local_tensor, param_digest
from ..harness.model import SyntheticData
from ..theory.sharding import fsdp_units
from ..runtime import compat
from ..runtime.launch import rank_device
from ..runtime.ledger import CommLedger

__all__ = ["batch", "HeldParams", "SavedActivations", "EventOrder", "unsharded_grad_bytes",
           "state_digest", "digest"]


def _check_model(model) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")


def batch(step: int = 0, *, seed: int = 0):
    """``(x, y)``: this rank's rows of step ``step`` of the course data (global batch
    :data:`~course_utils.harness.experiments.GLOBAL_BATCH`), on this rank's device."""
    check_int("step", step, 0)
    require_process_group("batch")
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=seed)
    x, y = data.shard(step, dist.get_rank(), dist.get_world_size())
    device = rank_device()
    return x.to(device), y.to(device)


class HeldParams:
    """``held = HeldParams(model)`` right after sharding remembers the shards' storages;
    ``held()`` later returns the bytes of the parameter storages registered on the model
    now that are not those shards (each storage once): what FSDP2 keeps gathered (or, with
    an int ``reshard_after_forward``, re-sharded to a smaller group) at that moment."""

    def __init__(self, model: nn.Module):
        _check_model(model)
        self.model = model
        self._shards = {local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}

    def __call__(self) -> int:
        seen = set(self._shards)
        total = 0
        for p in self.model.parameters():
            st = local_tensor(p).untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
        return total


class SavedActivations:
    """``with SavedActivations(model) as saved:`` around a forward: ``saved.bytes`` is then
    the bytes of the activations autograd saved for backward, each storage once
    (``saved.parameters``: the storages of parameters registered on the model then, left
    out of ``bytes``). Keeps them alive until the block ends or :meth:`reset`."""

    def __init__(self, model: nn.Module):
        _check_model(model)
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Count from zero (e.g. at the start of the next step)."""
        self.bytes, self.parameters, self._keep = 0, 0, {}

    def _pack(self, t):
        key = compat.storage_key(t)
        if key not in self._keep:           # the storage itself: data pointers get reused
            self._keep[key] = t             # keep it alive while counting
            if key in {compat.storage_key(p) for p in self.model.parameters()}:
                self.parameters += t.untyped_storage().nbytes()
            else:
                self.bytes += t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> "SavedActivations":
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc)
        self._keep.clear()
        return False


class EventOrder:
    """``with EventOrder(model) as order:`` around a forward and backward of a model sharded
    per block then at the root: ``order.forward`` and ``order.backward`` are the events in
    the order the CPU issued them, e.g. ``["AG root", "fwd 0", "AG 0", ...]`` (AG/RS: an
    all-gather/reduce-scatter issued; ``fwd i``: block i's forward starts; ``bwd i``: its
    backward starts); ``order.gathered`` the most units gathered at once (unsharded, or their
    all-gather result waiting), per phase; ``order.ledger`` the collectives (a CommLedger).
    :meth:`reset` starts a new step."""

    _LABELS = {"unshard": "AG", "pre_backward": "", "post_backward": "RS"}

    def __init__(self, model: nn.Module):
        _check_model(model)
        self.ledger = CommLedger()
        self.events: list = []
        self.gathered = {"forward": 0, "backward": 0}
        self._phase = "forward"
        blocks = fsdp_units(model)
        self._groups = {"root": compat.fsdp2_param_group(model),
                        **{f"block{i}": compat.fsdp2_param_group(u) for i, u in enumerate(blocks)}}
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda m, a, i=i: self.events.append(f"fwd block{i}"),
                                            prepend=True)
            block.register_forward_pre_hook(lambda m, a: self._note_gathered())  # after the unshard
        self._watch = compat.watch_fsdp2(self._groups, self._LABELS, self._on_call)

    def _note_gathered(self) -> None:
        now = sum(map(compat.fsdp2_is_gathered, self._groups.values()))
        self.gathered[self._phase] = max(self.gathered[self._phase], now)

    def _on_call(self, name, group, method, call):
        if method == "pre_backward":
            self._phase = "backward"
            if compat.fsdp2_training_state(group) != "PRE_BACKWARD":
                self.events.append(f"bwd {name}")
        before = len(self.ledger.records)
        out = call()
        if self._LABELS[method] and len(self.ledger.records) > before:
            self.events.append(f"{self._LABELS[method]} {name}")
        self._note_gathered()
        return out

    def reset(self) -> None:
        self.events.clear()
        self.gathered.update(forward=0, backward=0)
        self._phase = "forward"
        self.ledger.reset()

    def __enter__(self) -> "EventOrder":
        self.ledger.__enter__()
        self._watch.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._watch.__exit__(*exc)
        self.ledger.__exit__(*exc)
        return False

    def _split(self):
        text = [e.replace("block", "") for e in self.events]
        cut = text.index("bwd root") if "bwd root" in text else len(text)
        return text[:cut], text[cut:]

    @property
    def forward(self) -> list[str]:
        return self._split()[0]

    @property
    def backward(self) -> list[str]:
        return self._split()[1]


def unsharded_grad_bytes(model: nn.Module) -> int:
    """Bytes of the unsharded gradients FSDP2 holds now (between micro-batches with gradient
    sync off); 0 once they have been reduce-scattered."""
    _check_model(model)
    return compat.fsdp2_unsharded_grad_bytes(model)


def digest(tensors: dict) -> str:
    """SHA-256 of names and bytes of ``{name: tensor}``: equal digests, equal tensors."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> tensor, got {type(tensors).__name__}")
    return param_digest({k: t.detach().reshape(-1) for k, t in tensors.items()})


def state_digest(model: nn.Module, optimizer=None) -> str | None:
    """A collective: every rank calls it. On rank 0, the :func:`digest` of the full
    parameters (names as in the unwrapped model) and, with ``optimizer``, of every optimizer
    state tensor (``<param>.exp_avg``...); None on the other ranks."""
    from ..harness.checkpoint import full_state_dict, optimizer_tensors

    _check_model(model)
    state = full_state_dict(model, optimizer)
    if not state:
        return None
    tensors = dict(state["model"])
    if optimizer is not None:
        tensors.update(optimizer_tensors(state["optimizer"]))
    return digest(tensors)
