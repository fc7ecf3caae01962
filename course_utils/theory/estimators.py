"""Other people's memory estimators (notebook 03), reimplemented in pure Python, and why they
disagree: DeepSpeed's ``estimate_zero{2,3}_model_states_mem_needs`` (0.19.8) and
``accelerate estimate-memory``'s "Training using Adam" (1.15.0). Their "GB" are GiB, DeepSpeed
defaults to offload on and returns (cpu, gpu), and none counts activations or buffers.
"""
from __future__ import annotations

import dataclasses
import math

from ..checks import check_bool, check_int, check_number
from .memory import GB, STAGE_NAMES, GiB, model_states

__all__ = ["deepspeed_zero2", "deepspeed_zero3",
           "ACCELERATE_DTYPES", "accelerate_training_usage", "accelerate_peak",
           "Row", "compare", "table"]


def _resolve(model, largest_layer_params=None, *, need_largest: bool = False):
    """(num_params, largest_layer_params) from a count, a config, a Preset or a preset name."""
    from .config import PRESETS, Preset, TransformerConfig, preset

    if isinstance(model, str):
        if model not in PRESETS:
            raise ValueError(f"unknown preset {model!r}: pass a parameter count such as 7e9, a "
                             f"TransformerConfig, or one of {sorted(PRESETS)}")
        model = preset(model)
    if isinstance(model, Preset):
        num_params, config = model.num_params, model.config
    elif isinstance(model, TransformerConfig):
        num_params, config = model.num_params(), model
    else:
        num_params, config = check_number("num_params", model, above=0, example="7e9"), None
    if largest_layer_params is None and config is not None:
        largest_layer_params = config.largest_layer_params()
    if largest_layer_params is None:
        if need_largest:
            raise ValueError(
                "ZeRO-3 estimates need largest_layer_params (the parameters of the biggest "
                "single module, usually the token embedding: vocab x hidden); pass "
                "largest_layer_params=..., or pass a TransformerConfig instead of a number")
    else:
        check_number("largest_layer_params", largest_layer_params, above=0, example="32000 * 4096")
        if largest_layer_params > num_params:
            raise ValueError(f"largest_layer_params ({largest_layer_params}) cannot exceed "
                             f"num_params ({num_params})")
    return num_params, largest_layer_params


def _check_cluster(gpus_per_node, nodes, additional_buffer_factor) -> None:
    check_int("gpus_per_node", gpus_per_node, 1, what="GPUs in one machine")
    check_int("nodes", nodes, 1, what="number of machines")
    check_number("additional_buffer_factor", additional_buffer_factor, above=0, example="1.5 (DeepSpeed's default)")


def deepspeed_zero2(num_params, *, gpus_per_node: int = 1, nodes: int = 1,
                    cpu_offload: bool = False, additional_buffer_factor: float = 1.5):
    """DeepSpeed's ZeRO-2 estimate, ``(gpu_bytes, cpu_bytes)``: GPU = 2Ψ + int(18Ψ/N) (before
    PR #5099, and in its docs' table: 4Ψ + int(16Ψ/N))."""
    num_params, _ = _resolve(num_params)
    _check_cluster(gpus_per_node, nodes, additional_buffer_factor)
    check_bool("cpu_offload", cpu_offload)
    psi, n = num_params, nodes * gpus_per_node
    if cpu_offload:
        return int(2 * psi), int(psi * max(4 * n, 16) * additional_buffer_factor)
    return int(2 * psi + int(18 * psi / n)), int(psi * 4 * gpus_per_node * additional_buffer_factor)


def deepspeed_zero3(num_params, largest_layer_params=None, *, gpus_per_node: int = 1,
                    nodes: int = 1, cpu_offload: bool = False, cpu_offload_params: bool = False,
                    zero_init: bool = True, additional_buffer_factor: float = 1.5):
    """DeepSpeed's ZeRO-3 estimate, ``(gpu_bytes, cpu_bytes)`` (4L: the largest layer's fp16 params + grads).
    It shards every tensor; DeepSpeed's training keeps small ones whole (planner.deepspeed_zero3_terms)."""
    num_params, largest_layer_params = _resolve(num_params, largest_layer_params, need_largest=True)
    _check_cluster(gpus_per_node, nodes, additional_buffer_factor)
    for name in ("cpu_offload", "cpu_offload_params", "zero_init"):
        check_bool(name, locals()[name])
    if cpu_offload_params and not cpu_offload:
        raise ValueError("DeepSpeed's estimator has no case for offloading parameters without "
                         "the optimizer (it silently ignores cpu_offload_params then); "
                         "set cpu_offload=True as well")
    psi, g, buf = num_params, gpus_per_node, additional_buffer_factor
    if cpu_offload:
        host = 18 if cpu_offload_params else 16     # the fp16 params on the host too: 18
        gpu_mem = 4 * largest_layer_params + (0 if cpu_offload_params else int(2 * psi / (nodes * g)))
        cpu_mem = psi * (host * (1 / nodes) if zero_init else max(4 * g, host * (1 / nodes))) * buf
    else:
        gpu_mem = 4 * largest_layer_params + int(18 * psi / (nodes * g))
        cpu_mem = (largest_layer_params if zero_init else psi) * 4 * g * buf
    return int(gpu_mem), int(cpu_mem)


#: dtypes ``estimate_training_usage`` understands ("fp8": without MS-AMP)
ACCELERATE_DTYPES = ("float32", "float16", "bfloat16", "fp8", "int8", "int4")


def _check_dtype(dtype) -> None:
    if dtype not in ACCELERATE_DTYPES:
        raise ValueError(f"dtype must be one of {ACCELERATE_DTYPES}, got {dtype!r}")


def _fp32_model_bytes(num_params, buffer_bytes) -> int:
    num_params, _ = _resolve(num_params)
    if float(num_params) != int(num_params):
        raise ValueError(f"num_params must be a whole number of parameters, got {num_params!r}")
    if isinstance(buffer_bytes, bool) or not isinstance(buffer_bytes, int) or buffer_bytes < 0:
        raise ValueError(f"buffer_bytes must be an int >= 0 (bytes of the model's buffers), got {buffer_bytes!r}")
    return 4 * int(num_params) + buffer_bytes


def accelerate_training_usage(model_bytes: int, dtype: str = "float32") -> dict:
    """accelerate's ``estimate_training_usage(bytes, mixed_precision)``; ``model_bytes``: the fp32 size."""
    if isinstance(model_bytes, bool) or not isinstance(model_bytes, int) or model_bytes < 1:
        raise ValueError(f"model_bytes must be an int >= 1 (the model's fp32 size in bytes), got {model_bytes!r}")
    _check_dtype(dtype)
    m, half = model_bytes, dtype != "float32"
    if dtype in ("int8", "int4"):
        return dict.fromkeys(("model", "optimizer", "gradients", "step"), -1)
    return {"model": m, "optimizer": 2 * m, "gradients": m + m // 2 if half else m, "step": 2 * m if half else 4 * m}


def accelerate_peak(num_params, *, dtype: str = "float32", buffer_bytes: int = 0) -> int:
    """``accelerate estimate-memory``'s "Training using Adam" in bytes: the max of its stages,
    not their sum (16 B/param in float32, 8 in 16-bit); ``buffer_bytes``: the model's buffers."""
    _check_dtype(dtype)
    if dtype in ("int8", "int4"):
        raise ValueError(f"accelerate reports no training estimate for {dtype} (it prints N/A); "
                         "use dtype='float32', 'float16' or 'bfloat16'")
    return max(accelerate_training_usage(_fp32_model_bytes(num_params, buffer_bytes), dtype).values())


@dataclasses.dataclass(frozen=True)
class Row:
    """One estimator's answer for one model and cluster."""
    name: str
    stage: int | None          # ZeRO stage it models (None: no sharding at all)
    gpu_bytes: int | float     # per GPU
    unit_note: str             # which "GB" its own printout uses
    cpu_bytes: int | float = 0  # host memory per node (offload rows), else 0


def compare(model, world_size: int, *, largest_layer_params=None,
            gpus_per_node: int | None = None) -> list[Row]:
    """Every estimator's per-GPU bytes for the same model on ``world_size`` GPUs."""
    num_params, largest = _resolve(model, largest_layer_params, need_largest=True)
    check_int("world_size", world_size, 1, what="number of data-parallel GPUs")
    if gpus_per_node is None:
        gpus_per_node = world_size
    check_int("gpus_per_node", gpus_per_node, 1, what="GPUs in one machine")
    if world_size % gpus_per_node:
        raise ValueError(f"world_size ({world_size}) must be a multiple of gpus_per_node "
                         f"({gpus_per_node}): DeepSpeed counts whole nodes")
    nodes = world_size // gpus_per_node
    rows = []
    for recipe, label in (("mixed", "ZeRO paper, K=12"), ("mixed-fp32-grads", "fp32 grads (18 B)")):
        for stage in (0, 1, 2, 3):
            ms = model_states(num_params, world_size=world_size, stage=stage, recipe=recipe)
            rows.append(Row(f"{label}: {STAGE_NAMES[stage]}", stage, ms.total, "GB = 1e9 bytes"))
    kw = dict(gpus_per_node=gpus_per_node, nodes=nodes)
    for stage, offload in ((2, {}), (2, {"cpu_offload": True}), (3, {}), (3, {"cpu_offload": True}),
                           (3, {"cpu_offload": True, "cpu_offload_params": True})):
        gpu, cpu = (deepspeed_zero2(num_params, **kw, **offload) if stage == 2
                    else deepspeed_zero3(num_params, largest, **kw, **offload))
        name = f"DeepSpeed ZeRO-{stage}" + {0: "", 1: " + offload_optimizer", 2: " + offload_param+opt"}[len(offload)]
        rows.append(Row(name, stage, gpu, 'their "GB" = GiB', cpu))
    for dtype in ("float32", "float16"):      # the peak over a step's phases, the whole model on one GPU
        rows.append(Row(f"accelerate estimate-memory ({dtype})", None,
                        accelerate_peak(int(num_params), dtype=dtype), 'their "GB" = GiB (/1024 steps)'))
    return rows


def _rows(rows, caller: str) -> list:
    rows = list(rows)
    if not rows or not all(isinstance(r, Row) for r in rows):
        raise TypeError(f"{caller}() takes the list of Row returned by compare(...)")
    return rows


_TABLE_UNITS = {"GB": ("GB", GB, "GiB", GiB), "MB": ("MB", 10**6, "MiB", 2**20)}


def table(rows, unit: str = "GB") -> str:
    """:func:`compare` rows as a text table in ``unit`` ("GB" or "MB") and its binary twin."""
    if unit not in _TABLE_UNITS:
        raise ValueError(f"unit must be 'GB' or 'MB' (the table shows it next to GiB/MiB), got {unit!r}")
    rows = _rows(rows, "table")
    dec, dec_b, binu, bin_b = _TABLE_UNITS[unit]
    name_w = max(len("estimator"), *(len(r.name) for r in rows))
    note_w = max(len("its printout"), *(len(r.unit_note) for r in rows))
    head = (f"{'estimator':<{name_w}}  {'stage':>5}  {'GPU ' + dec:>10}  {'GPU ' + binu:>10}  "
            f"{'CPU ' + binu:>10}  {'its printout':<{note_w}}").rstrip()
    out = [head, "-" * len(head)]
    for r in rows:
        stage = "-" if r.stage is None else str(r.stage)
        cpu = f"{r.cpu_bytes / bin_b:10.2f}" if r.cpu_bytes else f"{'':>10}"
        out.append(f"{r.name:<{name_w}}  {stage:>5}  {r.gpu_bytes / dec_b:10.2f}  "
                   f"{r.gpu_bytes / bin_b:10.2f}  {cpu}  {r.unit_note:<{note_w}}".rstrip())
    out.append(f"{dec} = 10**{round(math.log10(dec_b))} bytes; {binu} = 2**{int(math.log2(bin_b))} bytes. "
               f"CPU = host memory per node (DeepSpeed rows).")
    return "\n".join(out)
