"""Every difference between the torch versions the course supports (from :data:`MIN_TORCH`),
and every private torch API it touches, in one place (``tests/test_architecture.py`` checks).
torch 2.13 renamed the flat-buffer collectives ``all_gather_single``/``reduce_scatter_single``
(the old names warn): course code calls :func:`all_gather_into_tensor` and
:func:`reduce_scatter_tensor` here, which look the function up at call time, so a recording
``CommLedger`` sees the call. With gloo, pad flat buffers to a multiple of the world size.
"""
from __future__ import annotations

import contextlib
import functools
import re

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten  # private: the one place it is imported

__all__ = ["all_gather_into_tensor", "reduce_scatter_tensor", "HAS_SINGLE_NAMES",
           "ALL_GATHER_NAME", "REDUCE_SCATTER_NAME", "fsdp2_replicate",
           "MIN_TORCH", "require_supported_torch",
           "fsdp2_param_group", "fsdp2_param_groups", "fsdp2_training_state", "fsdp2_is_gathered",
           "fsdp2_unsharded_bytes", "fsdp2_unsharded_grad_bytes", "fsdp2_waiting_grad_bytes", "watch_fsdp2", "queue_backward_callback", "storage_key",
           "resolve_process_group", "functional_collectives", "mem_tracker",
           "checkpoint_functions", "fsdp1_allow_cpu_sync_module_states", "tree_flatten", "DDP_BUFFER_BROADCAST",
           "release_forkserver_pipe", "stop_resource_tracker", "cpu_default_stream"]

#: The oldest torch the course runs on (measured on CPU/gloo: on 2.9 FSDP2's ``replicate``
#: and sharded clipping differ; on 2.7 its gradients come out N times too large, silently).
MIN_TORCH = (2, 10)


def require_supported_torch(version: str | None = None) -> None:
    """Raise ``ImportError`` naming the torch to install when ``version`` (default: this
    torch's) is older than :data:`MIN_TORCH`; a version string it cannot read passes."""
    version = torch.__version__ if version is None else version
    if not isinstance(version, str):
        raise TypeError(f"version must be a string like '2.10.0', got {type(version).__name__}")
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and (int(found[1]), int(found[2])) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"ZeRO to FSDP needs torch >= {need}, and this is torch {version}: "
            f"run `pip install 'torch>={need}'` and restart the kernel.")


#: True when this torch has ``all_gather_single`` / ``reduce_scatter_single`` (2.13+).
HAS_SINGLE_NAMES = hasattr(dist, "all_gather_single") and hasattr(dist, "reduce_scatter_single")
#: The names of the two flat-tensor collectives on this torch (what a traceback shows).
ALL_GATHER_NAME = "all_gather_single" if HAS_SINGLE_NAMES else "all_gather_into_tensor"
REDUCE_SCATTER_NAME = "reduce_scatter_single" if HAS_SINGLE_NAMES else "reduce_scatter_tensor"


def all_gather_into_tensor(output, input, group=None, async_op=False):
    """Gather every rank's ``input`` into ``output`` (rank r's part at ``r*input.numel()``)."""
    return getattr(dist, ALL_GATHER_NAME)(output, input, group=group, async_op=async_op)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``input`` (``world_size`` chunks) over the ranks; rank r gets chunk r in ``output``."""
    return getattr(dist, REDUCE_SCATTER_NAME)(output, input, op=op, group=group, async_op=async_op)


def fsdp2_replicate(modules, group=None) -> bool:
    """Apply FSDP2's own data parallelism (``replicate``) to each of ``modules``, in order,
    over ``group`` (default: all ranks); False, changing nothing, where this torch has none.
    Its mesh is named ``("replicate",)`` as torch 2.13 names its own: torch 2.10 refuses an unnamed one."""
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError:
        return False
    from torch.distributed.device_mesh import DeviceMesh

    modules = list(modules)
    device_type = next(modules[-1].parameters()).device.type    # cpu on gloo ranks
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device_type,
                                 mesh_dim_names=("replicate",))
    for module in modules:
        replicate(module, mesh=mesh)
    return True


# ==================================================== private torch APIs, each named once
# Not APIs: each may move in any release. The course reads FSDP2's private state only to
# observe what it holds, never to change what it does.

#: The private ``torch.distributed`` function torch DDP broadcasts its buffers with.
DDP_BUFFER_BROADCAST = "_broadcast_coalesced"


def fsdp2_param_group(module):
    """The ``FSDPParamGroup`` (the flat unit FSDP2 gathers and reduce-scatters) of one
    ``fully_shard`` module; None when not sharded or without parameters of its own."""
    from torch.distributed.fsdp import fully_shard

    state = fully_shard.state(module)
    if state is None:
        return None
    groups = getattr(state, "_fsdp_param_groups", None)   # torch 2.13: a list
    if groups is None:                                   # torch 2.11 (Colab's): one group or None
        return state._fsdp_param_group
    return groups[0] if groups else None


def fsdp2_param_groups(model) -> dict:
    """``{unit name ("root", "blocks.0", ...): FSDPParamGroup}`` of ``model``'s units, in order."""
    from torch.distributed.fsdp import FSDPModule

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule) and (group := fsdp2_param_group(m)) is not None:
            out[name or "root"] = group
    return out


def fsdp2_training_state(group) -> str:
    """What the unit is doing: ``"IDLE"``, ``"FORWARD"``, ``"PRE_BACKWARD"``, ``"POST_BACKWARD"``."""
    return group._training_state.name


def fsdp2_is_gathered(group) -> bool:
    """Whether the unit's parameters are unsharded, or their all-gather has landed in its buffer."""
    return group.is_unsharded or group._all_gather_result is not None


def _bytes_once(tensors, seen: set) -> int:
    """Bytes of the storages behind ``tensors`` not yet in ``seen`` (adds them)."""
    total = 0
    for t in tensors:
        st = t.untyped_storage()
        if st.nbytes() and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def fsdp2_unsharded_bytes(groups) -> tuple[int, int]:
    """``(parameter bytes, all-gather buffer bytes)`` unsharded now over ``groups``: every
    ``FSDPParam.all_gather_outputs`` and pending ``all_gather_output``, each storage once."""
    groups, seen = list(groups), set()
    params = _bytes_once((t for g in groups for fp in g.fsdp_params
                          for t in getattr(fp, "all_gather_outputs", ())), seen)
    results = [g._all_gather_result for g in groups]
    state = getattr(groups[0].comm_ctx, "all_gather_state", None) if groups else None
    if state is not None:           # the all-gather state is shared by all units
        results.append(state.all_gather_result)
    return params, _bytes_once((r.all_gather_output for r in results if r is not None), seen)


def fsdp2_unsharded_grad_bytes(model) -> int:
    """Bytes of the unsharded gradients FSDP2 keeps between micro-batches while gradient
    sync is off (``unsharded_accumulated_grad`` or ``_unsharded_param.grad``), each storage once."""
    grads = (g for group in fsdp2_param_groups(model).values() for fp in group.fsdp_params
             for g in (getattr(fp, "unsharded_accumulated_grad", None),
                       getattr(getattr(fp, "_unsharded_param", None), "grad", None)) if g is not None)
    return _bytes_once(grads, set())


def fsdp2_waiting_grad_bytes(groups) -> int:
    """Bytes of reduce-scattered gradients an HSDP group keeps summing while
    ``set_requires_all_reduce(False)`` defers the all-reduce (``_partial_reduce_output``)."""
    return sum(g._partial_reduce_output.nbytes for g in groups if g._partial_reduce_output is not None)


@contextlib.contextmanager
def watch_fsdp2(groups: dict, methods, on_call):
    """While inside, each call of ``group.<method>()`` (``methods``: e.g. ``"unshard"``) on
    ``{name: group}`` runs ``on_call(name, group, method, call)``; ``call()`` runs FSDP2's own."""
    methods = tuple(methods)
    for name, group in groups.items():
        for method in methods:
            original = getattr(group, method)

            def wrapper(*args, _name=name, _group=group, _method=method, _original=original, **kwargs):
                return on_call(_name, _group, _method, lambda: _original(*args, **kwargs))

            setattr(group, method, functools.wraps(original)(wrapper))   # FSDP2 calls self.<method>
    try:
        yield
    finally:
        for group in groups.values():
            for method in methods:
                group.__dict__.pop(method, None)      # back to the class's method


def queue_backward_callback(fn) -> None:
    """Run ``fn()`` once the current backward pass has finished (autograd's engine queue)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def storage_key(t) -> int:
    """An id of the storage behind ``t`` that stays unique while the storage lives (data
    pointers are reused after a free)."""
    return t.untyped_storage()._cdata


def resolve_process_group(group):
    """The ``ProcessGroup`` behind ``group`` (a group, a group name, None for the default)."""
    return dist.distributed_c10d._resolve_process_group(group)


def functional_collectives():
    """``torch.distributed._functional_collectives``: the collectives DTensor issues."""
    import torch.distributed._functional_collectives as funcol
    return funcol


def functional_reduce_scatter_op():
    """``torch.ops._c10d_functional.reduce_scatter_tensor.default``: the op FSDP2's DTensors call
    (torchtitan's selective-checkpointing policy names it)."""
    return torch.ops._c10d_functional.reduce_scatter_tensor.default


def mem_tracker():
    """PyTorch's ``MemTracker`` class (memory by category: parameters, gradients, ...)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    return MemTracker


def checkpoint_functions():
    """``(checkpoint, apply_activation_checkpointing)``: activation checkpointing as a
    composable API on one module, and as a wrapper applied to the modules a test picks."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    return checkpoint, apply_activation_checkpointing


def fsdp1_allow_cpu_sync_module_states():
    """A context manager under which FSDP1's ``sync_module_states=True`` accepts CPU
    tensors (its check in ``torch.distributed.fsdp._init_utils`` is NCCL's limit)."""
    from unittest import mock
    return mock.patch("torch.distributed.fsdp._init_utils._check_module_states_for_sync_module_states")


# -- multiprocessing's private state (the launcher's, runtime/launch.py) --------------

def release_forkserver_pipe() -> None:
    """In a rank forked by the forkserver: close the server's "a client is alive" pipe; while
    a rank holds it, the server (and its ranks) outlive a killed kernel."""
    import os
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def stop_resource_tracker() -> None:
    """Stop the resource tracker spawning started (it would outlive the launch; nothing of
    ours is registered with it, and it restarts on demand)."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    if tracker is not None and hasattr(tracker, "_stop"):
        with contextlib.suppress(Exception):
            tracker._stop()


def cpu_default_stream():
    """``torch.cpu``'s default stream (private, ``_default_cpu_stream``): the one a CPU computes
    on, next to which FSDP2 creates its side streams; None where this torch has none."""
    import torch

    return getattr(getattr(torch, "cpu", None), "_default_cpu_stream", None)


def flight_recorder_trace() -> dict:
    """This process's Flight Recorder trace (private ``_dump_fr_trace``: the pickle NCCL's watchdog
    writes at its timeout; gloo records it too, torch 2.10-2.13), unpickled: ``entries``, ``pg_status``..."""
    import pickle

    import torch

    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, True, False))
