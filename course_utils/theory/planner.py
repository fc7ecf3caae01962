"""Choosing a strategy (notebook 08): memory, communication and compute of every option.

:func:`plan` puts DDP, ZeRO-1/2/3 and HSDP side by side, with and without CPU offload, under
each recompute policy; every figure it assumes is a field of :class:`Assumptions`.
``framework``: DeepSpeed's layout (bf16 params, fp32 master in the optimizer) or torch's
(the fp32 parameter is the master). Its types and defaults
(:class:`Choice`, :class:`Assumptions`, :class:`PlanRow`) are in :mod:`.plan_types`, re-exported
here; :mod:`.gpt2xl` checks it against a published Megatron-LM gpt2-xl run on H100 80GB.
"""
from __future__ import annotations

import dataclasses
import math
from numbers import Real
from typing import Sequence

from ..checks import check_bool, check_int, check_number
from .alpha_beta import ring_steps
from .comm import comm_volume
from .config import PRESETS, Preset, TransformerConfig, preset
from .memory import ATTENTION, CROSS_ENTROPY, GB, OP_SELECTIVE, RECIPES, per_gpu
from .multinode import cross_node_wire, flat_ring_wire
from .plan_types import (  # noqa: F401  (re-exported: the planner's names, one import path)
    _POLICIES, _TORCH_OFFLOADS_OF, DEFAULT_ACTIVATION_SLACK, DEFAULT_OVERHEAD_GB,
    DS_MAX_REUSE_DISTANCE, DS_PERSISTENCE_THRESHOLD, FRAMEWORKS, NEAR_TIE, OFFLOADS, RECOMPUTE, STRATEGIES,
    TORCH_NAMES, Assumptions, Choice, PlanRow, _all_choices, _check_framework, as_choice, deepspeed_zero3_terms)

__all__ = [
    "STRATEGIES", "OFFLOADS", "RECOMPUTE", "FRAMEWORKS", "TORCH_NAMES", "Choice",
    "as_choice", "matmul_weights", "recomputed_weights", "Assumptions", "PlanRow", "Plan", "plan",
    "table", "Recommendation", "recommend", "DEFAULT_OVERHEAD_GB",
    "DS_PERSISTENCE_THRESHOLD", "DS_MAX_REUSE_DISTANCE", "deepspeed_zero3_terms",
    "DEFAULT_ACTIVATION_SLACK", "NEAR_TIE",
]


class Plan(list):
    """The rows of :func:`plan` (a list of :class:`PlanRow`) with their :class:`Assumptions`."""
    def __init__(self, rows, assumptions: Assumptions):
        super().__init__(rows)
        self.assumptions = assumptions

    def row(self, choice) -> PlanRow:
        choice = as_choice(choice)
        for r in self:
            if r.choice == choice:
                return r
        raise ValueError(f"{choice.label(self.assumptions.framework)} is not an option of this plan"
                         + (" (HSDP needs more than one node)" if choice.strategy == "HSDP" else ""))

    def recommend(self) -> "Recommendation":
        return recommend(self)


def _resolve_model(model):
    if isinstance(model, str):
        if model not in PRESETS:
            raise ValueError(f"unknown model {model!r}: pass one of {sorted(PRESETS)}, a "
                             "TransformerConfig or a parameter count such as 7e9")
        model = preset(model)
    if isinstance(model, Preset):
        return model.name, int(model.num_params), model.config
    if isinstance(model, TransformerConfig):
        n = model.num_params()
        return f"custom ({n / 1e9:.2f}B)", n, model
    if isinstance(model, bool) or not isinstance(model, Real):
        raise TypeError("model must be a preset name such as 'gpt2-xl', a TransformerConfig or a "
                        f"parameter count such as 7e9; got {type(model).__name__}")
    check_number("model (parameter count)", model, above=0, example="7e9")
    if model < 1000:
        raise ValueError(f"a parameter count of {model!r} looks like billions: pass {model}e9")
    return f"{model / 1e9:g}B params", int(model), None


def matmul_weights(config: TransformerConfig | None, num_params: int) -> int:
    """Parameters autocast casts to bf16 and autograd saves (a bare count: all, an upper bound)."""
    if config is None:
        return num_params
    h, kv, f = config.hidden, config.kv_heads_ * config.head_dim, config.ffn_
    block = 2 * h * h + 2 * h * kv + (3 if config.mlp == "swiglu" else 2) * h * f
    return config.layers * block + config.vocab * h


def recomputed_weights(config: TransformerConfig | None, recompute: str, num_params: int) -> int:
    """Weights whose forward matmul backward re-runs (2 FLOPs each per token, on top of 6Ψ; the
    elementwise ops recomputed count as free): "full" every one (8Ψ); an :data:`OP_SELECTIVE` policy
    the block matmuls it does not save: torchtitan saves every second ``aten.mm`` (q, v, gate, down of a
    Llama block), so k, out-proj and up re-run, 37% of llama-3.1-8b's block matmul FLOPs (a bias makes
    them ``addmm``: none saved); "selective" re-runs only the s² part 6Ψ leaves out. A bare count:
    1 - 1/k of it."""
    if recompute not in OP_SELECTIVE:
        return num_params if recompute == "full" else 0
    k = OP_SELECTIVE[recompute]
    if config is None:
        return round(num_params * (1 - 1 / k))
    h, kv, f = config.hidden, config.kv_heads_ * config.head_dim, config.ffn_
    mms = [h * h, h * kv, h * kv, h * h] + [h * f] * (2 if config.mlp == "swiglu" else 1) + [f * h]
    return config.layers * sum(w for i, w in enumerate(mms) if config.bias or i % k)


def _latency_s(op: str, world: int, calls: int, alpha_s: float) -> float:
    """Alpha part of ``calls`` ring collectives over ``world`` ranks."""
    return calls * ring_steps(op, world) * alpha_s


def _comm(choice: Choice, a: Assumptions, k: int) -> tuple[float, dict]:
    """(comm seconds per step, {"intra": NVLink bytes of the busiest GPU, "inter": bytes per NIC}). Frozen
    parameters (``a.trainable`` < 1) have no gradients: reductions and DDP/ZeRO-1/2's gathers of updated
    parameters carry the trainable part; ZeRO-3/HSDP and FSDP2 still gather every parameter."""
    psi, t = a.num_params, a.trainable
    pb, gb = a.wire_bytes
    torch = a.framework == "torch"
    n, g, nodes, nics = a.world_size, a.gpus_per_node, a.nodes, a.nics_per_node
    intra, nic_bw = a.intra_bw_gbps * 1e9, a.inter_bw_gbps * 1e9
    al_in, al_out = a.alpha_intra_us * 1e-6, a.alpha_inter_us * 1e-6
    units, bucket = a.units, a.bucket_elems
    if choice.strategy == "HSDP":
        rs = comm_volume(psi * t, world_size=g, stage=3, bytes_per_elem=gb)
        ag = comm_volume(psi, world_size=g, stage=3, bytes_per_elem=pb)
        sent_in = k * (ag["all_gather"] * a.gather_share(k) + rs["reduce_scatter"])
        t_in = 0.0
        if g > 1:
            t_in = k * (_latency_s("all_gather", g, 2 * units, al_in)
                        + _latency_s("reduce_scatter", g, units, al_in)) + sent_in / intra
        shard = psi * t / g
        ar = comm_volume(shard, world_size=nodes, stage=0, bytes_per_elem=gb)
        wire, per_nic = cross_node_wire(ar["all_reduce"], g, nodes, nic_bw, nics)
        t_out = _latency_s("all_reduce", nodes, max(1, math.ceil(shard / bucket)), al_out) + wire
        return t_in + t_out, {"intra": sent_in, "inter": per_nic}
    stage = choice.stage
    calls = max(1, math.ceil(psi * t / bucket))
    if stage == 0 or (torch and stage == 1):
        parts = [("all_reduce", calls)]
        sent = comm_volume(psi * t, world_size=n, stage=0, bytes_per_elem=gb)["all_reduce"]
        if stage == 1:      # ZeroRedundancyOptimizer: + every rank broadcasts its updated shard (stored dtype)
            parts.append(("all_gather", calls))
            sent += comm_volume(psi * t, world_size=n, stage=1, bytes_per_elem=RECIPES[a.recipe][0])["all_gather"]
    else:
        rs = comm_volume(psi * t, world_size=n, stage=stage, bytes_per_elem=gb)
        ag = comm_volume(psi * (1 if stage == 3 or torch else t), world_size=n, stage=stage, bytes_per_elem=pb)
        if stage == 3 or torch:     # FSDP2 without reshard (torch's stage 2) gathers once per micro-batch
            parts = [("all_gather", k * (2 if stage == 3 else 1) * units), ("reduce_scatter", k * units)]
            sent = k * (ag["all_gather"] * (a.gather_share(k) if stage == 3 else 1) + rs["reduce_scatter"])
        else:
            # DeepSpeed 0.19 (stage_1_and_2.average_tensor): use_multi_rank_bucket_allreduce (default True)
            # all-reduces each gradient bucket and keeps this rank's slice; False: one dist.reduce per owner
            # (a reduce-scatter's bytes). Neither calls reduce_scatter.
            rs_times = k if stage == 2 else 1
            op = "all_reduce" if a.multi_rank_bucket_allreduce else "reduce_scatter"
            red = comm_volume(psi * t, world_size=n, stage=0 if op == "all_reduce" else stage, bytes_per_elem=gb)
            parts = [(op, rs_times * calls), ("all_gather", calls)]
            sent = rs_times * red[op] + ag["all_gather"]
    if n == 1:
        return 0.0, {"intra": 0, "inter": 0}
    alpha = al_in if nodes == 1 else al_out
    wire, per_nic, nvlink = flat_ring_wire(sent, g, nodes, intra, nic_bw, nics)
    t = sum(_latency_s(op, n, c, alpha) for op, c in parts) + wire
    return t, {"intra": sent if nodes == 1 else nvlink, "inter": per_nic}


def _offload_s(choice: Choice, a: Assumptions, shard_size: int, k: int) -> float:
    if choice.offload == "none":
        return 0.0
    pb, gb, _ = RECIPES[a.recipe]
    shard, t = a.num_params / shard_size, a.trainable     # frozen parameters: no grads, no update
    if choice.offload_params:   # every micro-batch: params up for forward and backward, grads down
        moved = k * shard * (2 * pb + t * gb)
    else:                       # grads down (every micro-batch from stage 2 on), updated params up once
        moved = (k if choice.stage >= 2 else 1) * shard * t * gb + shard * t * pb
    return moved / (a.pcie_gbps * 1e9) + shard * t * a.gpus_per_node / a.host_adam_params_per_s


def _memory(choice: Choice, a: Assumptions, model_arg, config, shard_size: int, mb: int):
    """(GpuMemory, activations, buffers, copies); copies: torch's bf16 parameter copies."""
    # FSDP2 without reshard keeps stage 3's sharded states plus gathered bf16 copies
    stage = 3 if a.framework == "torch" and choice.stage == 2 else choice.stage
    mem = per_gpu(model_arg, world_size=shard_size, stage=stage, recipe=a.recipe,
                  offload_optimizer=choice.offload_optimizer, offload_params=choice.offload_params,
                  micro_batch=mb if config is not None else None, seq=a.seq_len,
                  attention=a.attention, recompute=choice.recompute,
                  cross_entropy=a.cross_entropy, trainable=a.trainable)
    acts, (pb, gb), torch, copies = mem.activations, a.wire_bytes, a.framework == "torch", 0
    if choice.stage == 3:   # two gathered units + one unit of grads (torch: + its reduce-scatter input)
        comm_buf = a.unit_params * (2 * pb + (pb if torch else 0) + gb)
        _, p, kept = a.ds_terms     # DeepSpeed: persistent tensors whole (and, offloaded, their shard:
        # partition_parameters.py L1801) on the GPU; the kept ones + the next unit gathered
        mem = dataclasses.replace(mem, params=mem.params + p * pb * (1 + (-1, 1)[choice.offload_params] / shard_size))
        comm_buf += max(0, kept - a.unit_params) * pb
    elif torch and choice.stage == 2:
        comm_buf, copies = a.unit_params * (pb + gb), a.num_params * pb
    else:
        comm_buf = a.bucket_buffers * a.bucket_elems * gb
        copies = 2 * matmul_weights(config, a.num_params) if torch and a.amp else 0
    return mem, acts, a.overhead_gb * GB + comm_buf + a.activation_slack * acts, copies


def _row(choice: Choice, a: Assumptions, model_arg, config) -> PlanRow:
    n = a.world_size
    shard_size = a.gpus_per_node if choice.strategy == "HSDP" else n
    cap = a.gpu_mem_gb * GB

    def total(mb):
        mem, acts, buf, copies = _memory(choice, a, model_arg, config, shard_size, mb)
        return mem.params + mem.grads + mem.optimizer + copies + acts + buf

    # memory is linear in the micro-batch: total(b) = fixed + per_seq * b
    t1, t2 = total(1), total(2)
    per_seq, fixed = t2 - t1, 2 * t1 - t2
    if config is None or per_seq <= 0:
        max_mb = a.max_micro_batch if t1 <= cap else 0
    else:
        max_mb = max(0, min(a.max_micro_batch, math.floor((cap - fixed) / per_seq)))
        while max_mb > 0 and total(max_mb) > cap:      # guard against float rounding
            max_mb -= 1
        while max_mb < a.max_micro_batch and total(max_mb + 1) <= cap:
            max_mb += 1

    per_rank = (a.global_batch // n) if a.global_batch is not None else None
    if a.micro_batch is not None:
        mb = a.micro_batch
    elif per_rank is None:
        mb = max(1, max_mb)
    else:   # the largest micro-batch that fits and divides this rank's share of the batch
        mb = max(d for d in range(1, min(max(1, max_mb), per_rank) + 1) if per_rank % d == 0)
    k = 1 if per_rank is None else per_rank // mb
    mem, acts, buf, copies = _memory(choice, a, model_arg, config, shard_size, mb)
    states = mem.params + mem.grads + mem.optimizer
    used = states + copies + acts + buf
    host = mem.cpu * a.gpus_per_node
    why = []
    if used > cap:
        why.append(f"needs {used / GB:.1f} GB > {a.gpu_mem_gb:g} GB at micro-batch {mb}"
                   + (f"; model states alone {states / GB:.1f} GB" if states > cap else ""))
    if a.host_mem_gb is not None and host > a.host_mem_gb * GB:
        why.append(f"host needs {host / GB:.0f} GB > {a.host_mem_gb:g} GB per node")

    tokens = mb * k * a.seq_len                     # per GPU per optimizer step
    flops = (4 + 2 * a.trainable) * a.num_params + 2 * recomputed_weights(config, choice.recompute, a.num_params)
    compute = flops * tokens / (a.gpu_flops * a.mfu)
    comm, detail = _comm(choice, a, k)
    off = _offload_s(choice, a, shard_size, k)
    step = compute + off + max(0.0, comm - a.overlap * compute)
    return PlanRow(choice=choice, shard_size=shard_size, world_size=n, gpus_per_node=a.gpus_per_node,
                   micro_batch=mb, max_micro_batch=max_mb, grad_accum=k, fits=not why,
                   why="; ".join(why), params=mem.params, grads=mem.grads, optimizer=mem.optimizer,
                   activations=acts, buffers=buf, host_bytes_per_node=host, compute_s=compute,
                   comm_s=comm, offload_s=off, step_s=step, tokens_per_step=tokens * n,
                   seq_len=a.seq_len, recipe=a.recipe, comm_detail=detail, config=config,
                   copies=copies, framework=a.framework)


def plan(model, *, gpu_mem_gb: float, gpus_per_node: int, nodes: int = 1,
         intra_bw_gbps: float, inter_bw_gbps: float, seq_len: int,
         nics_per_node: int | None = None, micro_batch: int | None = None, global_batch: int | None = None,
         recipe: str | None = None, framework: str | None = None,
         attention: str = "flash", cross_entropy: str = "torch",
         gpu_flops: float = 989e12, mfu: float = 0.4, overlap: float = 0.0,
         alpha_intra_us: float = 5.0, alpha_inter_us: float = 10.0,
         overhead_gb: float = DEFAULT_OVERHEAD_GB, activation_slack: float = DEFAULT_ACTIVATION_SLACK,
         bucket_elems: int = 50_000_000, bucket_buffers: int = 2, pcie_gbps: float = 25.0,
         host_adam_params_per_s: float = 2e9, host_mem_gb: float | None = None,
         max_micro_batch: int = 256, choices: Sequence | None = None,
         persistence_threshold: int = DS_PERSISTENCE_THRESHOLD, max_reuse_distance: int = DS_MAX_REUSE_DISTANCE,
         trainable: float = 1, multi_rank_bucket_allreduce: bool = True) -> Plan:
    """Every option for ``model`` (preset, TransformerConfig or parameter count) on
    ``nodes`` x ``gpus_per_node`` GPUs. GB = 1e9 bytes; ``*_bw_gbps``: GB/s one GPU sends over
    NVLink / one NIC between nodes; ``micro_batch`` None: the largest that fits (dividing
    ``global_batch`` / GPUs); ``recipe`` None: "mixed" (deepspeed) or "torch-amp" (torch);
    ``bucket_buffers=0`` when buckets are views of one gradient buffer; ``persistence_threshold``,
    ``max_reuse_distance``: DeepSpeed's stage3_* keys (:func:`deepspeed_zero3_terms`);
    ``multi_rank_bucket_allreduce``: DeepSpeed ZeRO-1/2's key (True, its default: each gradient bucket is
    all-reduced, 1.5x DDP's bytes with the parameter gather; False: reduced to its owner); ``trainable``: the
    fraction that trains (LoRA ~0.01; the frozen rest has no gradients, optimizer states or dW matmuls)."""
    label, num_params, config = _resolve_model(model)
    optional = ("micro_batch", "global_batch", "host_mem_gb")     # None: not given
    for name, example in (("gpu_mem_gb", "80"), ("intra_bw_gbps", "450 (NVLink 4)"),
                          ("inter_bw_gbps", "50 (one 400 Gb/s InfiniBand NIC)"), ("gpu_flops", "989e12"),
                          ("alpha_intra_us", "5"), ("alpha_inter_us", "10"), ("pcie_gbps", "25"),
                          ("host_adam_params_per_s", "2e9"), ("host_mem_gb", "1024")):
        if locals()[name] is not None or name not in optional:
            check_number(name, locals()[name], above=0, example=example)
    if nics_per_node is None:
        nics_per_node = gpus_per_node
    for name, what in (("gpus_per_node", "GPUs in one machine"), ("nodes", "number of machines"),
                       ("nics_per_node", "network cards per node; None: one per GPU"), ("seq_len", "tokens per sequence"),
                       ("micro_batch", "sequences per GPU per forward; None: the largest that fits"),
                       ("global_batch", "sequences per optimizer step over all GPUs"),
                       ("bucket_elems", "gradient elements per communication bucket"), ("max_micro_batch", "")):
        if locals()[name] is not None or name not in optional:
            check_int(name, locals()[name], 1, what=what)
    world = gpus_per_node * nodes
    if global_batch is not None:
        if global_batch % world:
            raise ValueError(f"global_batch ({global_batch}) must be a multiple of the number of GPUs "
                             f"({world}) so every rank gets the same number of sequences")
        if micro_batch is not None and (global_batch // world) % micro_batch:
            raise ValueError(f"global_batch / GPUs = {global_batch // world} sequences per GPU is not a "
                             f"multiple of micro_batch ({micro_batch}); change one of them")
    if framework is None:
        framework = "torch" if recipe == "torch-amp" else "deepspeed"
    _check_framework(framework)
    if recipe is None:
        recipe = "torch-amp" if framework == "torch" else "mixed"
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(RECIPES)}")
    if framework == "deepspeed" and recipe == "torch-amp":
        raise ValueError("recipe 'torch-amp' is torch's layout (the fp32 parameters are the master): "
                         "pass framework='torch' (or leave framework out), or recipe='mixed' for DeepSpeed")
    if framework == "torch" and recipe not in ("torch-amp", "fp32"):
        raise ValueError(f"recipe {recipe!r} is DeepSpeed's / Megatron's layout (bf16 parameters, an fp32 "
                         "master copy in the optimizer); torch's are 'torch-amp' (autocast, "
                         "MixedPrecisionPolicy) and 'fp32': pass one of them, or framework='deepspeed'")
    for name, value, options in (("attention", attention, ATTENTION), ("cross_entropy", cross_entropy, CROSS_ENTROPY)):
        if value not in options:
            raise ValueError(f"{name} must be one of {options}, got {value!r}")
    check_number("mfu", mfu, above=0, maximum=1, example="0.4")
    check_bool("multi_rank_bucket_allreduce", multi_rank_bucket_allreduce)
    check_number("trainable", trainable, above=0, maximum=1, example="0.01 (1% trains, as with LoRA)")
    check_number("overlap", overlap, minimum=0, maximum=1, example="0.5")
    check_number("overhead_gb", overhead_gb, minimum=0, example="3.6")
    check_number("activation_slack", activation_slack, minimum=0, example="0.15")
    check_int("bucket_buffers", bucket_buffers, minimum=0, what="bucket-sized temporary buffers")
    if choices is None:
        wanted = _all_choices(nodes, framework, attention, config is not None)
    else:
        wanted = [as_choice(c) for c in choices]
        if any(c.strategy == "HSDP" for c in wanted) and nodes == 1:
            raise ValueError("HSDP needs nodes > 1 (on one node it is ZeRO-3)")
        for c in wanted:
            if framework == "torch" and c.offload not in _TORCH_OFFLOADS_OF[c.strategy]:
                raise ValueError(f"{c.label()} has no torch form: torch offloads only with FSDP2's "
                                 "CPUOffloadPolicy (parameters, gradients and optimizer states): use "
                                 "offload='optimizer+params' with ZeRO-3 or HSDP, or framework='deepspeed'")
            if framework == "deepspeed" and c.recompute in OP_SELECTIVE:
                raise ValueError(f"recompute={c.recompute!r} is torch's op-level selective checkpointing "
                                 "(create_selective_checkpoint_contexts); DeepSpeed checkpoints whole modules: "
                                 "use framework='torch', or recompute='full'")
    derived = dict(model=label, num_params=num_params, has_architecture=config is not None,
                   unit_params=(math.ceil(num_params / 32) if config is None else
                                max(config.block_params(), config.embedding_params())),
                   units=config.layers + 1 if config is not None else 32,
                   recompute_options=tuple(r for r in _POLICIES if any(c.recompute == r for c in wanted)),
                   ds_terms=(deepspeed_zero3_terms(config, persistence_threshold, max_reuse_distance)
                             if framework == "deepspeed" and config is not None else (0, 0, 0)))
    given = locals()    # every other field of Assumptions is an argument of plan() of the same name
    a = Assumptions(**derived, **{f.name: given[f.name] for f in dataclasses.fields(Assumptions)
                                  if f.name not in derived})
    return Plan([_row(c, a, config if config is not None else num_params, config) for c in wanted], a)


def table(rows: Plan) -> str:
    """A fixed-width text table of a :func:`plan`, then its assumptions."""
    if not isinstance(rows, Plan):
        raise TypeError("table() takes the Plan returned by plan(...)")
    a = rows.assumptions
    torch = a.framework == "torch"
    head = (f"{a.model} ({a.num_params / 1e9:.2f}B params) on {a.nodes} node(s) x {a.gpus_per_node} "
            f"GPU(s) of {a.gpu_mem_gb:g} GB, seq {a.seq_len}" + (", torch's layout" if torch else ""))
    w = max([46] + [len(r.label()) + 2 for r in rows])
    cols = (f"{'option':<{w}}{'mb':>4}{'acc':>4}{'states':>8}" + (f"{'copies':>7}" if torch else "")
            + f"{'activ':>7}{'buffer':>7}{'total':>7}"
            f"{'host':>7}  {'fits':<4}{'compute':>9}{'comm':>8}{'offload':>8}{'step s':>8}{'tok/s':>10}")
    out = [head, "GB per GPU (host: GB per node); seconds per optimizer step", cols, "-" * len(cols)]
    for r in rows:
        out.append(f"{r.label():<{w}}{r.micro_batch:>4}{r.grad_accum:>4}{r.states / GB:8.1f}"
                   + (f"{r.copies / GB:7.1f}" if torch else "")
                   + f"{r.activations / GB:7.1f}{r.buffers / GB:7.1f}{r.total / GB:7.1f}"
                   f"{r.host_bytes_per_node / GB:7.0f}  {'yes' if r.fits else 'no':<4}"
                   f"{r.compute_s:9.3f}{r.comm_s:8.3f}{r.offload_s:8.3f}{r.step_s:8.3f}"
                   f"{r.tokens_per_s:10.0f}")
    return "\n".join(out + ["assumptions:"] + [f"  - {line}" for line in a.lines()])


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The fastest option that fits, the reason, and the near ties."""
    row: PlanRow | None
    reason: str
    near_ties: tuple = ()

    @property
    def choice(self) -> Choice | None:
        return None if self.row is None else self.row.choice

    def label(self) -> str | None:
        return None if self.row is None else self.row.label()

    def __str__(self) -> str:
        return self.reason


def _simplicity(r: PlanRow) -> tuple:
    return (OFFLOADS.index(r.choice.offload), list(_POLICIES).index(r.choice.recompute), STRATEGIES.index(r.strategy))


def recommend(rows: Plan, *, near_tie: float = NEAR_TIE) -> Recommendation:
    """The fastest option that fits (ties: fewer offloads, less recompute, lower stage), with why."""
    if not isinstance(rows, Plan):
        raise TypeError("recommend() takes the Plan returned by plan(...)")
    check_number("near_tie", near_tie, minimum=0, maximum=1)
    fitting = [r for r in rows if r.fits]
    if not fitting:
        closest = min(rows, key=lambda r: r.total)
        return Recommendation(None, (
            f"nothing fits: the smallest option, {closest.label()}, {closest.why}. "
            "Add GPUs or nodes, shorten the sequences, or use a GPU with more memory."))
    best = min(fitting, key=lambda r: (r.step_s, _simplicity(r)))
    ties = tuple(r for r in fitting if r is not best and r.step_s <= best.step_s * (1 + near_tie))
    head = (f"{best.label()}: fits ({best.total / GB:.1f} of {rows.assumptions.gpu_mem_gb:g} GB "
            f"per GPU at micro-batch {best.micro_batch}, {best.grad_accum} accumulation step(s)) and is "
            f"the fastest option that fits: {best.step_s:.3f} s per step = compute "
            f"{best.compute_s:.3f} + offload {best.offload_s:.3f} + exposed comm "
            f"{best.step_s - best.compute_s - best.offload_s:.3f}.")
    lower = [r for r in rows if not r.fits and r.stage <= best.stage and not r.choice.recomputes
             and r.choice.offload == "none"]
    why_not = ""
    if lower:
        simplest = min(lower, key=lambda r: (r.stage, r.strategy))
        why_not = f" {simplest.label()} does not fit: {simplest.why}."
    faster_unfit = [r for r in rows if not r.fits and r.step_s < best.step_s]
    if faster_unfit and not why_not:
        f = min(faster_unfit, key=lambda r: r.step_s)
        why_not = f" {f.label()} would be faster but does not fit: {f.why}."
    others = [r for r in fitting if r.strategy != best.strategy and r not in ties]
    if others:
        o = min(others, key=lambda r: (r.step_s, _simplicity(r)))
        why_not += (f" The best other strategy, {o.label()}, is {o.step_s / best.step_s - 1:+.0%}: "
                    f"compute {o.compute_s:.3f} + offload {o.offload_s:.3f} + exposed comm "
                    f"{o.step_s - o.compute_s - o.offload_s:.3f} s.")
    tie = (f" Within {near_tie:.0%}: " + ", ".join(f"{r.label()} ({r.step_s / best.step_s - 1:+.1%})" for r in ties)
           + "." if ties else "")
    return Recommendation(best, head + why_not + tie, ties)
