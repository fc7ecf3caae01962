"""FSDP2 checkpoints (notebook 07): sharded (DCP: each rank its shards, rank 0 also ``.metadata``, so a load
at any world size reads only the chunks it needs) and full (one file on rank 0)."""
from __future__ import annotations

import contextlib
import math
import os
import warnings
from numbers import Integral

import torch
import torch.distributed as dist
from torch import nn

from ..checks import check_choice, check_int, check_module, check_timeout, distributed
from ..impl.ddp import unwrap
from ..runtime.fmt import max_abs_diff
from ..runtime.launch import launch, rank_device, where
from . import experiments
from .experiments import GLOBAL_BATCH, full_parameters, make_adamw, param_digest, wrap
from .model import SyntheticData, build_model, rows_per_rank, warm_up

__all__ = ["save_sharded", "load_sharded", "full_state_dict", "save_full", "load_full",
           "describe_checkpoint", "checkpoint_keys", "reshard_roundtrip", "resume_matches",
           "optimizer_tensors", "METADATA_FILE", "CHECKPOINTABLE"]

METADATA_FILE = ".metadata"  #: the index DCP's coordinator (rank 0) writes


def _rank() -> int:
    return dist.get_rank() if distributed() else 0


def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike (e.g. a pathlib.Path), "
                        f"got {type(path).__name__}")
    return os.fspath(path)


def _check_world(name: str, world_size) -> None:
    check_int(name, world_size, 1)
    rows_per_rank(GLOBAL_BATCH, world_size)


def _pair(model, optimizer):
    """(the unwrapped module, the real torch optimizer or None), checked to be DCP-nameable."""
    check_module("model", model)
    from ..impl.zero3 import Zero3
    if isinstance(model, Zero3):
        raise TypeError("the course's own 'zero3' keeps each unit as one flat shard that DCP "
                        "cannot name; checkpoint a model wrapped with 'torch-fsdp' (fully_shard)")
    module = unwrap(model)
    if optimizer is None:
        return module, None
    inner = getattr(optimizer, "inner", optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer (e.g. make_adamw(...)) or "
                        f"None, got {type(optimizer).__name__}")
    own = {id(p) for p in module.parameters()}
    if any(id(p) not in own for g in inner.param_groups for p in g["params"]):
        raise TypeError("the optimizer updates tensors that are not parameters of the model "
                        "(the flat shards of the course's 'zero1'/'zero2'?): checkpoint a model "
                        "and optimizer from wrap('torch-fsdp', ...), 'single', 'ddp' or 'torch-ddp'")
    return module, inner


@contextlib.contextmanager
def _quiet_no_dist():
    """DCP warns on every use without a process group, and torch 2.10's about ``storage()``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        yield


def _check_stepped(optim) -> None:
    """``get_state_dict`` gives a step-less AdamW a zero step: the next update would use step 2's bias correction."""
    if optim is not None and not optim.state:
        raise ValueError("the optimizer has no state yet (no step() taken): saving it would make "
                         "torch initialise it with a zero step and change the next update; save "
                         "with optimizer=None before training, or after the first step")


def _state(module, optimizer, *, full: bool = False) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    options = StateDictOptions(full_state_dict=True, cpu_offload=True) if full else None
    if optimizer is None:
        return {"model": get_model_state_dict(module, options=options)}
    msd, osd = get_state_dict(module, optimizer, options=options)
    return {"model": msd, "optim": osd}


def _set(module, optim, model_state, optim_state, options=None) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    if optim is None:
        set_model_state_dict(module, model_state, options=options)
    else:
        set_state_dict(module, optim, model_state_dict=model_state, optim_state_dict=optim_state,
                       options=options)


def optimizer_tensors(optim_state: dict) -> dict[str, torch.Tensor]:
    """``{"<param name>.<state name>": tensor}`` of a name-keyed optimizer state dict."""
    if not isinstance(optim_state, dict) or "state" not in optim_state:
        raise TypeError("optim_state must be an optimizer state dict with a 'state' entry, e.g. "
                        "full_state_dict(model, optimizer)['optimizer']")
    return {f"{name}.{key}": value for name, per_param in optim_state["state"].items()
            for key, value in per_param.items() if isinstance(value, torch.Tensor)}


def _step_count(optim) -> int | None:
    if optim is None:
        return None
    steps = [s["step"] for s in optim.state.values() if "step" in s]
    return int(steps[0]) if steps else 0


def _digest(tensors: dict) -> str:
    return param_digest({k: t.reshape(-1) for k, t in tensors.items()})


def _read_metadata(path: str):
    from torch.distributed.checkpoint import FileSystemReader
    if os.path.isfile(path):
        raise ValueError(f"{path!r} is a file, not a DCP checkpoint directory (a save_full "
                         "export? read it with load_full)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}: the directory does not exist "
                                "(write one with save_sharded(model, optimizer, path))")
    if not os.path.isfile(os.path.join(path, METADATA_FILE)):
        raise FileNotFoundError(f"no DCP checkpoint at {path!r}: it has no {METADATA_FILE} file "
                                "(save_sharded writes one; an interrupted save leaves none)")
    return FileSystemReader(path).read_metadata()


def checkpoint_keys(path) -> dict[str, tuple | None]:
    """Every key -> its global shape (None for a non-tensor value), sorted; reads ``.metadata`` only."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    meta = _read_metadata(_check_path(path))
    return {k: (tuple(v.size) if isinstance(v, TensorStorageMetadata) else None)
            for k, v in sorted(meta.state_dict_metadata.items())}


def _chunk_data_bytes(meta, index) -> int:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    entry = meta.state_dict_metadata[index.fqn]
    if not isinstance(entry, TensorStorageMetadata):
        return 0
    size = torch.empty((), dtype=entry.properties.dtype).element_size()
    for chunk in entry.chunks:
        if tuple(chunk.offsets) == tuple(index.offset or ()):
            return math.prod(chunk.sizes) * size
    raise ValueError(f"the index of this checkpoint lists no chunk of {index.fqn!r} at "
                     f"{tuple(index.offset)}: a damaged .metadata")


def describe_checkpoint(path) -> list[dict]:
    """One row per file of a DCP checkpoint directory: the chunks it stores and its bytes. DCP frames each
    chunk with ~1.5 kB (a 4-byte ``step`` takes 1,577 B); ``.metadata`` holds the path."""
    path = _check_path(path)
    meta = _read_metadata(path)
    empty = dict.fromkeys(("model_chunks", "optimizer_chunks", "objects", "payload_bytes", "data_bytes"), 0)
    per_file: dict[str, dict] = {}
    totals = dict(empty)
    for index, info in meta.storage_data.items():
        kind = ("model_chunks" if index.fqn.startswith("model.") else
                "optimizer_chunks" if index.fqn.startswith("optim.state.") else "objects")
        for counts in (per_file.setdefault(info.relative_path, dict(empty)), totals):
            counts[kind] += 1
            counts["payload_bytes"] += int(info.length)
            counts["data_bytes"] += _chunk_data_bytes(meta, index)
    rows = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isfile(full):          # .metadata counts every item (it indexes them all), no payload
            counts = (dict(totals, payload_bytes=0, data_bytes=0) if name == METADATA_FILE
                      else per_file.get(name, empty))
            rows.append({"file": name, "bytes": os.path.getsize(full), **counts})
    return rows


def save_sharded(model: nn.Module, optimizer, path, *, overwrite: bool = False) -> dict:
    """Write the state to the directory ``path`` with DCP, each rank its shards (a collective)."""
    import torch.distributed.checkpoint as dcp
    module, optim = _pair(model, optimizer)
    path = _check_path(path)
    _check_stepped(optim)
    # rank 0 deletes an old checkpoint (a larger world's stale shards would look like part of this one)
    ours = [n for n in (os.listdir(path) if os.path.isdir(path) else [])
            if n == METADATA_FILE or n.endswith(".distcp")]
    if ours and not overwrite:
        raise ValueError(f"{path!r} already holds a checkpoint ({len(ours)} files); pass "
                         "overwrite=True to replace it, or choose a new directory")
    if _rank() == 0:
        os.makedirs(path, exist_ok=True)
        for name in ours:
            os.remove(os.path.join(path, name))
    if distributed():
        dist.barrier()
    state = _state(module, optim)
    with _quiet_no_dist():
        dcp.save(state, checkpoint_id=path, no_dist=not distributed())
    rank = _rank()
    mine = sorted(n for n in os.listdir(path)
                  if n.startswith(f"__{rank}_") or (rank == 0 and n == METADATA_FILE))
    return {"rank": rank, "files": mine,
            "bytes": sum(os.path.getsize(os.path.join(path, n)) for n in mine)}


def _check_compatible(path: str, meta, state: dict, strict: bool) -> None:
    """A ValueError naming the first key that does not fit (global shapes: every rank agrees, none hangs)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    saved = meta.state_dict_metadata
    if "optim" in state and not any(k.startswith("optim.") for k in saved):
        raise ValueError(f"the checkpoint at {path!r} has no optimizer state (it was saved with "
                         "optimizer=None): pass optimizer=None to load only the model, or save "
                         "the optimizer too")
    wanted = {f"model.{k}": v for k, v in state["model"].items()}
    wanted.update({f"optim.state.{k}": v
                   for k, v in optimizer_tensors(state.get("optim", {"state": {}})).items()})
    for key, value in wanted.items():
        if key not in saved:
            raise ValueError(f"the checkpoint at {path!r} has no {key!r}: it was saved from a "
                             "different model or optimizer (keys: checkpoint_keys(path))")
        entry = saved[key]
        if isinstance(value, torch.Tensor):
            if not isinstance(entry, TensorStorageMetadata):
                raise ValueError(f"{key!r} is a tensor here but not in the checkpoint at {path!r}")
            if tuple(entry.size) != tuple(value.shape):
                raise ValueError(f"shape mismatch for {key!r}: the checkpoint at {path!r} holds "
                                 f"{tuple(entry.size)}, the model here has {tuple(value.shape)}; "
                                 "build the model with the config the checkpoint was saved from")
    if strict:
        extra = sorted(k for k in saved if (k.startswith("model.") or (
            "optim" in state and k.startswith("optim.state."))) and k not in wanted)
        if extra:
            raise ValueError(f"the checkpoint at {path!r} holds {len(extra)} keys the model here "
                             f"lacks, e.g. {extra[0]!r}: it was saved from a larger model "
                             "(strict=False loads the common keys only)")


def load_sharded(model: nn.Module, optimizer, path, *, strict: bool = True) -> dict:
    """Load the DCP checkpoint at ``path`` in place, at any world size; ``step``: where to resume."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    module, optim = _pair(model, optimizer)
    path = _check_path(path)
    meta = _read_metadata(path)
    fresh = optim is not None and not optim.state
    # get_state_dict gives a fresh optimizer its state (a step with zero grads and lr 0)
    # so that DCP has tensors to load into; if loading fails, make it fresh again.
    state = _state(module, optim)
    try:
        _check_compatible(path, meta, state, strict)
        try:
            with _quiet_no_dist():
                dcp.load(state, checkpoint_id=path, no_dist=not distributed())
        except CheckpointException as exc:      # a BaseException: one entry per failing rank
            why = "; ".join(f"rank {r}: {type(e).__name__}" + (f": {e}" if str(e) else "")
                            for r, (e, _trace) in sorted(exc.failures.items()))
            raise ValueError(f"DCP could not load the checkpoint at {path!r} into this model "
                             f"(a damaged or incomplete checkpoint?): {why}") from None
    except BaseException:
        if fresh:
            optim.state.clear()
        raise
    _set(module, optim, state["model"], state.get("optim"))
    keys = len(state["model"]) + (len(optimizer_tensors(state["optim"])) if optim else 0)
    return {"rank": _rank(), "keys": keys, "step": _step_count(optim)}


def full_state_dict(model: nn.Module, optimizer=None) -> dict:
    """``{"model", "optimizer"}`` unsharded on CPU on rank 0, ``{}`` elsewhere; a collective."""
    module, optim = _pair(model, optimizer)
    _check_stepped(optim)
    state = _state(module, optim, full=True)
    if _rank() != 0:
        return {}
    return {"model": state["model"], **({"optimizer": state["optim"]} if optim is not None else {})}


def save_full(model: nn.Module, optimizer, path) -> dict:
    """:func:`full_state_dict` written by rank 0 to the file ``path``; a collective."""
    path = _check_path(path)
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a directory; save_full writes one file (e.g. 'model.pt')")
    state = full_state_dict(model, optimizer)
    written = 0
    if _rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.save(state, path)
        written = os.path.getsize(path)
    if distributed():
        dist.barrier()
    return {"rank": _rank(), "bytes": written}


def load_full(model: nn.Module, optimizer, path, *, strict: bool = True) -> dict:
    """Load a :func:`save_full` file: every rank reads it and keeps its shards (at scale,
    ``broadcast_from_rank0=True`` lets rank 0 alone read it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    module, optim = _pair(model, optimizer)
    path = _check_path(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file at {path!r} (write one with save_full(model, optimizer, path))")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state:
        raise ValueError(f"{path!r} is not a file written by save_full (no 'model' entry)")
    if optim is not None and "optimizer" not in state:
        raise ValueError(f"{path!r} has no optimizer state (saved with optimizer=None): pass "
                         "optimizer=None to load only the model")
    for key, value in _state(module, None)["model"].items():
        saved = state["model"].get(key)
        if saved is not None and tuple(saved.shape) != tuple(value.shape):
            raise ValueError(f"shape mismatch for {key!r}: {path!r} holds {tuple(saved.shape)}, "
                             f"the model here has {tuple(value.shape)}")
    try:
        _set(module, optim, state["model"], state.get("optimizer"),
             StateDictOptions(full_state_dict=True, strict=strict))
    except (RuntimeError, KeyError) as exc:
        raise ValueError(f"{path!r} does not fit this model/optimizer: {exc}") from exc
    return {"rank": _rank(), "step": _step_count(optim)}


#: Strategies whose model and optimizer DCP can name (see :func:`_pair`).
CHECKPOINTABLE = ("torch-fsdp", "torch-fsdp-zero2", "single", "ddp", "torch-ddp")


def _session(strategy: str, seed: int, stop: int | None, load_from: str | None,
             save_to: str | None, gather: bool) -> dict:
    """One rank's life: build, wrap, load?, train up to step ``stop``, save?; ``gather``: the full state."""
    device = rank_device() if distributed() else torch.device("cpu")
    # a model that loads starts from other weights, so a load that did nothing shows
    model = build_model(seed=seed + 1 if load_from else seed, device=device)
    model, optimizer = wrap(strategy, model, make_adamw)
    start = load_sharded(model, optimizer, load_from)["step"] if load_from else 0
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=seed)
    losses = [loss for _, loss, _ in experiments.train(
        model, optimizer, data, range(start, start if stop is None else stop), device=device)]
    saved = save_sharded(model, optimizer, save_to, overwrite=True) if save_to else None
    params = full_parameters(model)                       # collective
    out = {"losses": losses, "start": start, "saved": saved,
           "param_digest": param_digest(params)}
    if gather:
        full = full_state_dict(model, optimizer)          # collective; {} except on rank 0
        if _rank() == 0:
            out["params"] = dict(full["model"])
            out["optim"] = optimizer_tensors(full["optimizer"])
            out["full_is_full_parameters"] = _same(out["params"], params)
    return out


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
                                      for k in a)


def _preload() -> None:
    warm_up(imports=("torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
                     "torch.distributed.fsdp", "torch.distributed.tensor"))


def _run_session(world_size: int, strategy: str, *args, timeout_s: float) -> tuple[dict, str]:
    _preload()
    if strategy == "single":
        return _session(strategy, *args), "1 process, no process group"
    results = launch(_session, world_size, strategy, *args, quiet=True, timeout_s=timeout_s)
    return results[0], where(results)


def _check_run(path, strategy, seed, timeout_s) -> str:
    path = _check_path(path)
    check_choice("strategy", strategy, CHECKPOINTABLE, kind="strategy", kinds="checkpointable strategies")
    check_int("seed", seed, 0)
    check_timeout(timeout_s)
    return path


def reshard_roundtrip(path, save_world: int = 4, load_worlds=(2, 1), steps: int = 2, *,
                      strategy: str = "torch-fsdp", seed: int = 0,
                      timeout_s: float = 120.0) -> dict:
    """Train on ``save_world`` ranks, save into ``path``, load on each of ``load_worlds`` (``1``: in
    this process) and compare the full states bit for bit."""
    path = _check_run(path, strategy, seed, timeout_s)
    if strategy == "single":
        raise ValueError("reshard_roundtrip saves from several ranks: use 'torch-fsdp' or "
                         "'torch-fsdp-zero2'")
    _check_world("save_world", save_world)
    check_int("steps", steps, 1)
    if isinstance(load_worlds, Integral):       # (a bool inside it: check_world says so)
        raise TypeError(f"load_worlds must be a sequence of world sizes such as (2, 1), got {load_worlds!r}")
    load_worlds = tuple(load_worlds)
    for n in load_worlds:
        _check_world("every world size in load_worlds", n)
    saved, where = _run_session(save_world, strategy, seed, steps, None, path, True,
                                timeout_s=timeout_s)

    def row(world, role, res, where):
        return {"world_size": world, "role": role, "where": where,
                "params_equal": _same(res["params"], saved["params"]),
                "optimizer_equal": _same(res["optim"], saved["optim"]),
                "full_is_full_parameters": res["full_is_full_parameters"],
                "param_digest": _digest(res["params"]), "optimizer_digest": _digest(res["optim"])}

    rows = [row(save_world, "saved", saved, where)]
    for n in load_worlds:
        res, where = _run_session(n, strategy if n > 1 else "single", seed, None, path, None,
                                  True, timeout_s=timeout_s)
        rows.append(row(n, "loaded", res, where))
    return {"steps": steps, "strategy": strategy, "rows": rows,
            "files": describe_checkpoint(path),
            "all_equal": all(r["params_equal"] and r["optimizer_equal"] and
                             r["full_is_full_parameters"] for r in rows)}


def resume_matches(path, world_size: int = 2, steps: int = 4, stop_at: int = 2, *,
                   other_world_size: int | None = 1, strategy: str = "torch-fsdp",
                   seed: int = 0, timeout_s: float = 120.0) -> dict:
    """Stop at ``stop_at``, save, resume on new ranks to ``steps``: bit for bit the same as
    ``experiments.run``; again on ``other_world_size`` ranks, where the batch sums in another order."""
    path = _check_run(path, strategy, seed, timeout_s)
    _check_world("world_size", world_size)
    check_int("steps", steps, 2)
    check_int("stop_at", stop_at, 1, steps - 1, what="a step before steps, so that there is something to resume")
    if other_world_size is not None:
        _check_world("other_world_size", other_world_size)
    if strategy == "single" and (world_size != 1 or other_world_size not in (None, 1)):
        raise ValueError("'single' is one process: use world_size=1 and other_world_size=None")
    _preload()                      # before run(), so that its ranks inherit the imports too
    base = experiments.run(strategy, world_size, steps=steps, seed=seed, quiet=True,
                           timeout_s=timeout_s)[0]
    uninterrupted = list(base.losses)
    first, where = _run_session(world_size, strategy, seed, stop_at, None, path, False,
                                timeout_s=timeout_s)
    second, _ = _run_session(world_size, strategy, seed, steps, path, None, False,
                             timeout_s=timeout_s)
    resumed = first["losses"] + second["losses"]
    report = {"strategy": strategy, "world_size": world_size, "steps": steps,
              "stop_at": stop_at, "where": where, "uninterrupted": uninterrupted,
              "resumed": resumed, "bit_exact": resumed == uninterrupted,
              "params_equal": second["param_digest"] == base.param_digest, "other": None}
    if other_world_size is not None:
        other, other_where = _run_session(other_world_size, strategy, seed, steps, path, None,
                                          False, timeout_s=timeout_s)
        losses = first["losses"] + other["losses"]
        report["other"] = {
            "world_size": other_world_size, "where": other_where, "losses": losses,
            "max_abs_diff": max_abs_diff(losses, base.losses),
            "bit_exact": losses == uninterrupted}
    return report
