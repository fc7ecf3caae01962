"""From a planner choice to a DeepSpeed ZeRO config and to the same thing in FSDP2 (notebook 08).

DeepSpeed's ``activation_checkpointing`` cannot say what the model wraps in ``checkpoint()``: "full"
means every block, "selective" each block's attention core (Megatron-DeepSpeed's ``--recompute-granularity
selective``). Buckets follow the HF Trainer's "auto" rule: ``reduce_bucket_size = h²``,
``stage3_prefetch_bucket_size = 0.9·h²``, ``stage3_param_persistence_threshold = 10·h``; else 5e7 elements.
"""
from __future__ import annotations

import dataclasses

from ..checks import check_bool, check_choice, check_int, check_number, is_int, is_number
from ..harness.experiments import BETAS, LR, WEIGHT_DECAY
from ..theory.memory import OP_SELECTIVE
from ..theory.planner import Choice, PlanRow, as_choice

__all__ = ["PRECISIONS", "OFFLOAD_DEVICES", "DEFAULT_BUCKET_ELEMS", "STAGE3_KEYS", "FSDP2_COUNTERPARTS",
           "deepspeed_config", "validate_deepspeed_config",
           "FSDP2Equivalent", "fsdp2_equivalent"]

PRECISIONS = ("bf16", "fp16", "fp32")
OFFLOAD_DEVICES = ("cpu", "nvme")
DEFAULT_BUCKET_ELEMS = 50_000_000     # the planner's default bucket (100 MB of bf16 gradients)
_ADAMW = f"lr={LR}, betas={BETAS}, weight_decay={WEIGHT_DECAY}"   # the course's make_adamw

#: What each stage-3 key the config writes does. DeepSpeed 0.19.6 (commit edaa722): runtime/zero/config.py
#: L175, L215-255; read in parameter_offload.py L311-329 and partitioned_param_coordinator.py L440-460, L634-662.
STAGE3_KEYS = {
    "stage3_prefetch_bucket_size": "elements all-gathered ahead of their use (0.9·h², HF's 'auto'; default 5e7)",
    "stage3_param_persistence_threshold": "a tensor of at most this many elements is never partitioned: whole on "
    "every GPU, gathered once per step after the optimizer step, not per micro-batch (10·h; default 1e5)",
    "stage3_max_live_parameters": "gathered elements per GPU beyond which prefetching stops (default 1e9)",
    "stage3_max_reuse_distance": "a parameter used again within this many elements is not released: 1e9 (the "
    "default) keeps forward's last 5e8 elements gathered into backward, which skips their re-gather (1 GB of "
    "bf16 for llama-2-7b); 0 releases every parameter after use, as FSDP2 does below its root",
    "stage3_gather_16bit_weights_on_model_save": "engine.save_16bit_model(dir) gathers the whole bf16 model "
    "into one file (engine.py L5567); without it a ZeRO-3 checkpoint holds shards only",
    "sub_group_size": "elements the optimizer steps at a time (the fp32 master split into sub-groups; default 1e9)",
}
#: DeepSpeed's ZeRO-3 tools and what FSDP2 does instead.
FSDP2_COUNTERPARTS = {
    "deepspeed.zero.Init(config_dict_or_path=cfg) (partition_parameters.py L940)":
        "build under torch.device('meta'), fully_shard, then model.to_empty(device=...) and reset_parameters()",
    "stage3_gather_16bit_weights_on_model_save + engine.save_16bit_model(dir)":
        "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))",
    "engine.save_checkpoint(dir), then zero_to_fp32.py (utils/zero_to_fp32.py L563, L628)":
        "dcp.save(sharded state dict), then torch.distributed.checkpoint.format_utils.dcp_to_torch_save",
}

_TOP_KEYS = set("""
    train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps gradient_clipping
    steps_per_print wall_clock_breakdown bf16 fp16 zero_optimization optimizer scheduler
    activation_checkpointing data_types aio zero_allow_untested_optimizer zero_force_ds_cpu_optimizer
    communication_data_type prescale_gradients gradient_predivide_factor flops_profiler tensorboard wandb
    csv_monitor comms_logger seq_parallel_communication_data_type dump_state memory_breakdown checkpoint
    compile torch_autocast
""".split())
#: DeepSpeed 0.19's zero_optimization keys (DeepSpeedZeroConfig fields and their aliases)
_ZERO_KEYS = set("""
    stage contiguous_gradients reduce_scatter reduce_bucket_size use_multi_rank_bucket_allreduce
    allgather_partitions allgather_bucket_size overlap_comm compute_grad_norm load_from_fp32_weights
    elastic_checkpoint offload_param offload_optimizer zenflow sub_group_size cpu_offload_param
    cpu_offload_use_pin_memory cpu_offload ignore_unused_parameters legacy_stage1 round_robin_gradients
    parameter_alignment zero_hpz_partition_size zero_quantized_weights zero_quantized_nontrainable_weights
    zero_quantized_gradients memory_efficient_linear pipeline_loading_checkpoint override_module_apply
    log_trace_cache_warnings enable_sanity_checks save_muon_momentum_buffer_in_memory leaf_module
    stage3_prefetch_bucket_size stage3_param_persistence_threshold stage3_model_persistence_threshold
    stage3_max_live_parameters stage3_max_reuse_distance stage3_gather_16bit_weights_on_model_save
    stage3_module_granularity_threshold stage3_use_all_reduce_for_fetch_params stage3_allgather_sequential
    stage3_gather_fp16_weights_on_model_save prefetch_bucket_size param_persistence_threshold
    model_persistence_threshold max_live_parameters max_reuse_distance gather_16bit_weights_on_model_save
""".split())
_STAGE3_ONLY = {k for k in _ZERO_KEYS if k.startswith("stage3_") or "stage3_" + k in _ZERO_KEYS} | {
    "zero_hpz_partition_size", "sub_group_size"}      # offload_param has its own message
_REMOVED = {"mics_shard_size": "MiCS (DeepSpeed's HSDP) was removed in DeepSpeed 0.19.7; use "
                               "zero_hpz_partition_size (ZeRO++ hpZ) or FSDP2 with a 2-D mesh",
            "mics_hierarchical_params_gather": "MiCS was removed in DeepSpeed 0.19.7"}
_COUNT_KEY_ENDS = ("bucket_size", "threshold", "parameters", "distance", "sub_group_size")   # element counts
_BOOL_KEYS = ("overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
              "stage3_gather_16bit_weights_on_model_save", "round_robin_gradients")
_OFFLOAD_KEYS = {"offload_optimizer": set("device nvme_path buffer_count pin_memory pipeline_read pipeline_write "
                                           "fast_init ratio super_offload cpuadam_cores_perc".split()),
                 "offload_param": set("device nvme_path buffer_count buffer_size max_in_cpu pin_memory".split())}


def _resolve_batch(train_batch_size, micro_batch, grad_accum, world_size) -> tuple[int, int, int]:
    """Fill in the one missing of (train_batch_size, micro_batch, grad_accum), check the rest."""
    check_int("world_size", world_size, 1, what="data-parallel GPUs")
    given = {"train_batch_size": train_batch_size, "micro_batch": micro_batch, "grad_accum": grad_accum}
    for name, value in given.items():
        if value is not None:
            check_int(name, value, 1, what="see deepspeed_config's docstring")
    missing = [k for k, v in given.items() if v is None]
    if len(missing) > 1:
        raise ValueError(f"give at least two of train_batch_size, micro_batch, grad_accum "
                         f"(missing {', '.join(missing)})")
    if train_batch_size is None:
        train_batch_size = micro_batch * grad_accum * world_size
    elif missing:
        name, known = ("grad_accum", grad_accum) if micro_batch is None else ("micro_batch", micro_batch)
        if train_batch_size % (known * world_size):
            raise ValueError(f"train_batch_size {train_batch_size} is not a multiple of {name} x "
                             f"GPUs = {known} x {world_size}")
        found = train_batch_size // (known * world_size)
        micro_batch, grad_accum = (found, grad_accum) if micro_batch is None else (micro_batch, found)
    if train_batch_size != micro_batch * grad_accum * world_size:
        raise ValueError(f"train_batch_size ({train_batch_size}) must equal micro_batch x grad_accum x GPUs = "
                         f"{micro_batch} x {grad_accum} x {world_size} = {micro_batch * grad_accum * world_size}")
    return train_batch_size, micro_batch, grad_accum


def deepspeed_config(plan_row_or_choice, *, train_batch_size: int | None = None,
                     micro_batch: int | None = None, grad_accum: int | None = None,
                     world_size: int | None = None, gpus_per_node: int | None = None,
                     precision: str | None = None, recipe: str | None = None,
                     offload_device: str = "cpu", nvme_path: str | None = None,
                     hidden: int | None = None, bucket_elems: int | None = None,
                     gradient_clipping: float = 1.0) -> dict:
    """A DeepSpeed config dict for one planner choice (a PlanRow gives micro-batch, accumulation, GPUs, recipe and
    hidden size unless given). Give two of train_batch_size, micro_batch, grad_accum (or three, consistent).
    "mixed-fp32-grads" accumulates in fp32; "nvme" is ZeRO-Infinity; ``bucket_elems``: default h² or 5e7."""
    row = plan_row_or_choice if isinstance(plan_row_or_choice, PlanRow) else None
    choice = as_choice(plan_row_or_choice)
    if choice.recompute in OP_SELECTIVE:
        raise ValueError(f"recompute={choice.recompute!r} is torch's op-level selective checkpointing: a DeepSpeed "
                         "config has none (activation_checkpointing recomputes the modules the model wraps whole): "
                         "use recompute='full', or fsdp2_equivalent(...) for torch's code")
    config = row.config if row is not None else None
    if row is not None:
        micro_batch = row.micro_batch if micro_batch is None else micro_batch
        if grad_accum is None and train_batch_size is None:
            grad_accum = row.grad_accum
        world_size = row.world_size if world_size is None else world_size
        gpus_per_node = row.gpus_per_node if gpus_per_node is None else gpus_per_node
        recipe = row.recipe if recipe is None else recipe
        hidden = config.hidden if hidden is None and config is not None else hidden
    if world_size is None:
        raise ValueError("world_size (data-parallel GPUs) is needed to compute the batch sizes; "
                         "pass world_size=..., or pass a planner row")
    tbs, mb, ga = _resolve_batch(train_batch_size, micro_batch, grad_accum, world_size)
    if recipe == "torch-amp":
        raise ValueError("recipe 'torch-amp' is torch's layout (a plan with framework='torch'): DeepSpeed "
                         "keeps bf16 parameters and an fp32 master copy; plan with framework='deepspeed' "
                         "(recipe 'mixed'), or use fsdp2_equivalent(...) for the torch code")
    if recipe is not None and recipe not in ("fp32", "mixed", "mixed-fp32-grads"):
        raise ValueError(f"recipe must be 'fp32', 'mixed' or 'mixed-fp32-grads', got {recipe!r}")
    precision = precision or ("fp32" if recipe == "fp32" else "bf16")
    check_choice("precision", precision, PRECISIONS, kind="precision", kinds="precisions")
    if recipe == "fp32" and precision != "fp32":
        raise ValueError("recipe 'fp32' keeps everything in fp32: use precision='fp32'")
    check_choice("offload_device", offload_device, OFFLOAD_DEVICES, kind="offload device", kinds="devices")
    if offload_device == "nvme" and choice.offload != "none" and not nvme_path:
        raise ValueError("offload to nvme (ZeRO-Infinity) needs nvme_path='/local_nvme' (a fast local disk)")
    for name, value in (("hidden", hidden), ("bucket_elems", bucket_elems)):
        if value is not None:
            check_int(name, value, 1, what="elements")
    check_number("gradient_clipping", gradient_clipping, minimum=0, example="1.0")
    cfg: dict = {"train_batch_size": tbs, "train_micro_batch_size_per_gpu": mb,
                 "gradient_accumulation_steps": ga, "gradient_clipping": float(gradient_clipping),
                 "steps_per_print": 100, "wall_clock_breakdown": False,
                 "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS),
                                                           "weight_decay": WEIGHT_DECAY}}}
    if precision != "fp32":     # fp16: dynamic loss scaling
        cfg[precision] = {"enabled": True} if precision == "bf16" else {
            "enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
            "hysteresis": 2, "min_loss_scale": 1}
    if recipe == "mixed-fp32-grads" and precision != "fp32":
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    stage = choice.stage
    cfg["zero_optimization"] = zero = {"stage": stage}
    if stage >= 1:
        bucket = bucket_elems or (hidden * hidden if hidden else DEFAULT_BUCKET_ELEMS)
        zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=int(bucket))
        if stage in (1, 2):
            zero.update(reduce_scatter=True, allgather_partitions=True, allgather_bucket_size=int(bucket))
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * hidden * hidden) if hidden else DEFAULT_BUCKET_ELEMS,
                    stage3_param_persistence_threshold=10 * hidden if hidden else 100_000,
                    stage3_max_live_parameters=int(1e9), stage3_max_reuse_distance=int(1e9),
                    stage3_gather_16bit_weights_on_model_save=True, sub_group_size=int(1e9))
        if choice.strategy == "HSDP":
            if gpus_per_node is None:
                raise ValueError("HSDP needs gpus_per_node (the shard group) for zero_hpz_partition_size")
            check_int("gpus_per_node", gpus_per_node, 1, what="GPUs in one machine")
            zero["zero_hpz_partition_size"] = gpus_per_node
    param_buffer = max(int(1e8), config.largest_layer_params()) if config is not None else int(1e8)
    for key, on, nvme in (("offload_optimizer", choice.offload_optimizer, dict(buffer_count=4, fast_init=False)),
                          ("offload_param", choice.offload_params,
                           dict(buffer_count=5, buffer_size=param_buffer, max_in_cpu=int(1e9)))):
        if on:
            zero[key] = {"device": offload_device, "pin_memory": True,
                         **({"nvme_path": str(nvme_path), **nvme} if offload_device == "nvme" else {})}
    if offload_device == "nvme" and choice.offload != "none":
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "thread_count": 1,
                      "single_submit": False, "overlap_events": True}
    if choice.recomputes:       # "full": checkpoint() every block; "selective": each attention core
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False}
    return cfg


def _int_below(value, minimum: int) -> bool:
    return not is_int(value) or value < minimum


def validate_deepspeed_config(cfg, *, world_size: int | None = None) -> str:
    """Check a DeepSpeed config without DeepSpeed, stricter than its parser (which ignores ``offload_param``
    below stage 3): a one-line summary, or a ValueError listing every problem."""
    if not isinstance(cfg, dict):
        raise TypeError(f"a DeepSpeed config is a dict, got {type(cfg).__name__}")
    if world_size is not None:
        check_int("world_size", world_size, 1, what="data-parallel GPUs")
    problems: list[str] = []
    bad = lambda where, value, want: problems.append(f"{where} must be {want}, got {value!r}")  # noqa: E731
    for key in cfg:
        if key in _REMOVED:
            problems.append(f"{key}: {_REMOVED[key]}")
        elif key not in _TOP_KEYS:
            problems.append(f"unknown top-level key {key!r} (a typo? e.g. 'zero_optimisation' "
                            "for 'zero_optimization')")
    batch_keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    for key in batch_keys:
        if key in cfg and _int_below(cfg[key], 1):
            bad(key, cfg[key], "an int >= 1")
    batch = [cfg[k] for k in batch_keys if k in cfg and not _int_below(cfg[k], 1)]
    if "train_batch_size" not in cfg and "train_micro_batch_size_per_gpu" not in cfg:
        problems.append("give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs one)")
    if len(batch) == 3:
        tbs, mb, ga = batch
        if world_size is not None and tbs != mb * ga * world_size:
            problems.append(f"train_batch_size ({tbs}) must equal micro x accumulation x GPUs = "
                            f"{mb} x {ga} x {world_size} = {mb * ga * world_size}")
        elif world_size is None and tbs % (mb * ga):
            problems.append(f"train_batch_size ({tbs}) is not a multiple of micro x accumulation "
                            f"= {mb} x {ga}: no whole number of GPUs fits")
    enabled = []
    for key in ("bf16", "fp16"):
        sec = cfg.get(key, {})
        if not isinstance(sec, dict) or not isinstance(sec.get("enabled", False), bool):
            bad(key, sec, "a dict with 'enabled': True/False")
        elif sec.get("enabled"):
            enabled.append(key)
    if len(enabled) == 2:
        problems.append("bf16 and fp16 are both enabled: choose one")
    clip = cfg.get("gradient_clipping", 0)
    if not is_number(clip) or clip < 0:
        bad("gradient_clipping", clip, "a number >= 0")
    zero, stage = cfg.get("zero_optimization", {"stage": 0}), 0
    if not isinstance(zero, dict):
        bad("zero_optimization", zero, "a dict such as {'stage': 2}")
        zero = {}
    elif _int_below(zero.get("stage", 0), 0) or zero.get("stage", 0) > 3:
        bad("zero_optimization.stage", zero["stage"], "0, 1, 2 or 3")
    else:
        stage = zero.get("stage", 0)
    for key, value in zero.items():
        where = f"zero_optimization.{key}"
        if key in _REMOVED:
            problems.append(f"{where}: {_REMOVED[key]}")
        elif key not in _ZERO_KEYS:
            problems.append(f"unknown key {where} (see DeepSpeedZeroConfig for the valid names)")
        elif key in _STAGE3_ONLY and stage != 3:
            problems.append(f"{where} only applies to stage 3 (this config is stage {stage}): remove it")
        elif key.endswith(_COUNT_KEY_ENDS) and _int_below(value, 0):
            bad(where, value, "an int >= 0 (elements)")
        elif key in _BOOL_KEYS and not isinstance(value, bool):
            bad(where, value, "True or False")
        elif key == "zero_hpz_partition_size" and _int_below(value, 1):
            bad(where, value, "an int >= 1 (GPUs per node)")
        elif key == "zero_hpz_partition_size" and world_size is not None and world_size % value:
            problems.append(f"zero_hpz_partition_size ({value}) must divide the number of GPUs ({world_size})")
    devices = {}
    for sec_name in ("offload_optimizer", "offload_param"):
        sec, where = zero.get(sec_name), f"zero_optimization.{sec_name}"
        if sec is None:
            continue
        if not isinstance(sec, dict):
            bad(where, sec, "a dict such as {'device': 'cpu'}")
            continue
        problems += [f"unknown key {where}.{k}; valid: {sorted(_OFFLOAD_KEYS[sec_name])}"
                     for k in sec if k not in _OFFLOAD_KEYS[sec_name]]
        device = sec.get("device", "none")
        if device not in ("none", "cpu", "nvme"):
            bad(f"{where}.device", device, "'none', 'cpu' or 'nvme'")
            continue
        devices[sec_name] = device
        if device == "nvme" and not sec.get("nvme_path"):
            problems.append(f"{where}: device 'nvme' needs nvme_path (a directory on a local NVMe disk)")
        if device != "nvme" and sec.get("nvme_path"):
            problems.append(f"{where}: nvme_path is only used with device 'nvme' (device is {device!r})")
        if not isinstance(sec.get("pin_memory", False), bool):
            bad(f"{where}.pin_memory", sec["pin_memory"], "True or False")
    if devices.get("offload_param", "none") != "none" and stage != 3:
        problems.append(f"zero_optimization.offload_param needs stage 3 (only ZeRO-3 shards the "
                        f"parameters); this config is stage {stage}: use stage 3 or remove it")
    if devices.get("offload_optimizer", "none") != "none" and stage == 0:
        problems.append("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (stage 0 keeps "
                        "the whole optimizer on every GPU)")
    if problems:
        raise ValueError("invalid DeepSpeed config:\n  - " + "\n  - ".join(problems))
    parts = [f"stage {stage}"] + [f"{label} -> {devices[k]}" for k, label in (
        ("offload_optimizer", "optimizer"), ("offload_param", "params")) if devices.get(k, "none") != "none"]
    parts.append(enabled[0] if enabled else "fp32")
    if len(batch) == 3:
        parts.append(f"{batch[0]} = {batch[1]} x {batch[2]} x {batch[0] // (batch[1] * batch[2])} GPUs")
    return "valid: " + ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class FSDP2Equivalent:
    """The PyTorch form of a choice. kwargs: ``fully_shard``'s keyword arguments as objects (no
    ``mesh``: it needs process groups); code: a runnable snippet (needs ``model`` and a process
    group, defines ``optimizer``); exact: whether it does what the DeepSpeed config does."""
    choice: Choice
    api: str
    kwargs: dict
    mesh_shape: tuple | None
    mesh_dim_names: tuple | None
    code: str
    exact: bool
    notes: tuple


def _recompute_code(recompute: str, blocks: str, where: str) -> tuple[list[str], list[str]]:
    """The imports and the code that wrap every block for ``recompute`` ("none": nothing)."""
    if recompute == "none":
        return [], []
    imports = ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper"]
    head = f"for i, block in enumerate({blocks}):  # {recompute} recompute{':' if where else ''}{where}"
    if recompute == "full":
        return imports, [head, f"    {blocks}[i] = checkpoint_wrapper(block)"]
    if recompute in OP_SELECTIVE:    # torchtitan's _save_list and _custom_policy (notebook 09 §7), k-th mm saved
        return imports + ["from collections import Counter", "from functools import partial", "from torch.utils."
                          "checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts"], [
            "aten = torch.ops.aten", "save_list = {aten.mm.default, aten._scaled_dot_product_efficient_attention."
            "default, aten._scaled_dot_product_flash_attention.default,", "             aten._scaled_dot_product_"
            "flash_attention_for_cpu.default, aten.abs.default, aten.max.default,",
            "             torch.ops._c10d_functional.reduce_scatter_tensor.default}",
            "def policy(count, ctx, op, *args, **kwargs):  # save the listed ops' outputs, recompute the rest",
            "    mode = 'recompute' if ctx.is_recompute else 'forward'", "    count[mode] += op == aten.mm.default",
            f"    keep = op in save_list and (op != aten.mm.default or (count[mode] - 1) % {OP_SELECTIVE[recompute]} == 0)",
            "    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE", head,
            f"    {blocks}[i] = checkpoint_wrapper(block, context_fn=lambda: create_selective_checkpoint_contexts("
            "partial(policy, Counter())))"]
    # "selective" is the attention core's recomputation (Korthikanti et al.): fused attention (SDPA)
    # already recomputes it in backward. torch's op-level policy is another trade (recompute="torchtitan").
    return [], ["# selective recompute: SDPA already recomputes the attention core in backward: nothing to wrap"]


def fsdp2_equivalent(choice, *, gpus_per_node: int | None = None, nodes: int | None = None,
                     precision: str = "bf16", recipe: str = "mixed", device_type: str = "cuda",
                     pin_memory: bool | None = None, blocks: str = "model.blocks") -> FSDP2Equivalent:
    """``fully_shard`` (FSDP2) settings and code for the choice (a PlanRow also gives gpus_per_node, nodes, recipe).
    ``pin_memory`` (offload): None is True for ``device_type="cuda"`` (pinned host memory copies to and from
    the GPU faster), False for ``"cpu"`` (nothing to pin for); ``blocks``: the model's list of blocks."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
    row = choice if isinstance(choice, PlanRow) else None
    c = as_choice(choice)
    if row is not None:
        gpus_per_node = row.gpus_per_node if gpus_per_node is None else gpus_per_node
        nodes = row.world_size // row.gpus_per_node if nodes is None else nodes
        recipe = row.recipe
    check_choice("precision", precision, PRECISIONS, kind="precision", kinds="precisions")
    check_choice("recipe", recipe, ("fp32", "mixed", "mixed-fp32-grads", "torch-amp"), kind="recipe", kinds="recipes")
    check_choice("device_type", device_type, ("cuda", "cpu"), kind="device type", kinds="device types")
    pin_memory = device_type == "cuda" if pin_memory is None else pin_memory
    check_bool("pin_memory", pin_memory)
    if not isinstance(blocks, str) or not all(part.isidentifier() for part in blocks.split(".")):
        raise ValueError(f"blocks must be a dotted name such as 'model.blocks', got {blocks!r}")
    if c.strategy == "HSDP":
        for name, value in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
            if value is None:
                raise ValueError(f"HSDP needs {name} for its 2-D mesh (replicate across nodes, shard inside one)")
            check_int(name, value, 1, what="the cluster")

    notes: list[str] = []
    kwargs: dict = {}
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(precision)
    if dtype:        # reduce in fp32: the course's advice (notebook 07), see the note
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)
        notes.append("reduce_dtype=float32: the gradients are summed in fp32")
        if precision == "fp16":
            notes.append("fp16 needs loss scaling: torch.amp.GradScaler (DeepSpeed's fp16 section does it)")
    if c.offload != "none":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=pin_memory)
        if c.offload == "optimizer":
            notes.append("FSDP2 has no optimizer-only offload: CPUOffloadPolicy moves the parameters "
                         "and gradients to the host too")
    exact = not (c.offload == "optimizer" or c.strategy in ("ZeRO-1", "HSDP")
                 or (c.strategy == "DDP" and c.offload != "none"))
    if c.strategy in ("ZeRO-2", "ZeRO-3", "HSDP") or c.offload != "none":
        api = "fully_shard"
        kwargs["reshard_after_forward"] = c.strategy in ("ZeRO-3", "HSDP")
        if c.strategy == "ZeRO-2":
            notes.append("reshard_after_forward=False: parameters gathered from forward to backward, "
                         "sharded between steps")
        if c.strategy in ("DDP", "ZeRO-1"):
            notes.append(f"{c.strategy} with offload has no torch equivalent: this is FSDP2 with "
                         "CPUOffloadPolicy, which also shards the parameters and gradients")
    elif c.strategy == "ZeRO-1":
        api = "DistributedDataParallel + ZeroRedundancyOptimizer"
        notes.append("ZeRO-1 in torch is DDP + ZeroRedundancyOptimizer: it keeps 4 + 4 + 8/N bytes per "
                     "parameter (DeepSpeed: " + ("the same" if precision == "fp32" else "2 + 2 + 12/N")
                     + ") and broadcasts the updated parameters")
    else:
        api = "DistributedDataParallel"
        notes.append("plain DDP (FSDP2's form of it, a mesh with a shard dimension of 1, is no simpler)")
    hsdp = c.strategy == "HSDP"
    mesh_shape, mesh_names = ((nodes, gpus_per_node), ("replicate", "shard")) if hsdp else (None, None)
    if hsdp:
        notes.append("HSDP: DeepSpeed's config uses zero_hpz_partition_size (ZeRO++), which still shards "
                     "optimizer states and gradients over all GPUs")
    rc_imports, rc_lines = _recompute_code(c.recompute, blocks, " before sharding" if api == "fully_shard" else "")
    adamw = f"optimizer = torch.optim.AdamW(model.parameters(), {_ADAMW})"
    if api == "fully_shard":
        offload = "offload_policy" in kwargs
        args = (["mesh=mesh"] * hsdp + [f"reshard_after_forward={kwargs['reshard_after_forward']}"]
                + ["mp_policy=mp"] * bool(dtype) + ["offload_policy=offload"] * offload)
        root_args = "".join(f", {a}" for a in args if not a.startswith("reshard_after_forward"))
        lines = (["import torch", "from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy, CPUOffloadPolicy"]
                 + ["from torch.distributed.device_mesh import init_device_mesh"] * hsdp + rc_imports + [""]
                 + [f"mesh = init_device_mesh({device_type!r}, {mesh_shape}, mesh_dim_names={mesh_names})"] * hsdp
                 + [f"mp = MixedPrecisionPolicy(param_dtype=torch.{dtype}, reduce_dtype=torch.float32)"] * bool(dtype)
                 + [f"offload = CPUOffloadPolicy(pin_memory={pin_memory})"] * offload + rc_lines
                 + [f"for block in {blocks}:", f"    fully_shard(block, {', '.join(args)})",
                    f"fully_shard(model{root_args})  # root: stays gathered after forward", adamw])
    else:
        zero1, kwargs = c.strategy == "ZeRO-1", {}
        lines = (["import torch", "from torch.nn.parallel import DistributedDataParallel as DDP"]
                 + ["from torch.distributed.optim import ZeroRedundancyOptimizer"] * zero1 + rc_imports + [""]
                 + rc_lines + ["model = DDP(model)  # on GPUs: DDP(model, device_ids=[local_rank])"]
                 + [f"# mixed precision: run forward under torch.autocast({device_type!r}, dtype=torch.{dtype})"]
                 * bool(dtype) + [f"optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class="
                                  f"torch.optim.AdamW, {_ADAMW})" if zero1 else adamw])
    if c.recompute == "full":
        notes.append("full recomputation: checkpoint_wrapper on every block, before sharding")
    elif c.recompute in OP_SELECTIVE:
        notes.append(f"{c.recompute} op-level selective checkpointing: checkpoint_wrapper with a policy on every block "
                     "(memory.op_selective_terms); a DeepSpeed config has no such thing (deepspeed_config refuses it)")
    elif c.recomputes:
        notes.append("selective recomputation: fused attention (SDPA) already recomputes the attention core, "
                     "so there is nothing to wrap; torch's op-level selective checkpointing "
                     "(create_selective_checkpoint_contexts, torchtitan's policy) saves more and is "
                     "modelled as memory.per_gpu(recompute='torchtitan')")
    return FSDP2Equivalent(c, api, kwargs, mesh_shape, mesh_names, "\n".join(lines) + "\n", exact,
                           tuple(notes))


def init_deepspeed_on_gloo() -> None:
    """``deepspeed.init_distributed`` on gloo CPU ranks, without the C++ shared-memory all-reduce
    DeepSpeed would JIT-compile first (a minute and a compiler; gloo's all-reduce does the job)."""
    import importlib

    import deepspeed
    # by module name: the attribute deepspeed.comm.torch is the torch package itself
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    # DeepSpeed binds torch's all_gather_into_tensor / reduce_scatter_tensor once, at init: look them
    # up at each call instead, so that a CommLedger entered later sees them on every torch version
    # (torch 2.13's deprecated names forward at call time; 2.10's and 2.11's do not).
    import torch.distributed as dist

    cdb = importlib.import_module("deepspeed.comm.comm").cdb
    if getattr(cdb, "all_gather_function", None) is not None:
        cdb.all_gather_function = lambda *a, **k: dist.all_gather_into_tensor(*a, **k)
    if getattr(cdb, "reduce_scatter_function", None) is not None:
        cdb.reduce_scatter_function = lambda *a, **k: dist.reduce_scatter_tensor(*a, **k)
