"""The planner's vocabulary (notebook 08): an option (:class:`Choice`: a strategy, an offload
and a recompute policy), every figure a plan assumes (:class:`Assumptions`), one option's costs
(:class:`PlanRow`) and the defaults they start from. :mod:`course_utils.theory.planner` computes
the rows and re-exports every name here.
"""
from __future__ import annotations

import dataclasses
import math

from ..checks import check_int
from .config import TransformerConfig
from .memory import OP_SELECTIVE, RECIPES, RECOMPUTE, recompute_policy

__all__ = [
    "STRATEGIES", "OFFLOADS", "RECOMPUTE", "FRAMEWORKS", "TORCH_NAMES", "Choice", "as_choice",
    "Assumptions", "PlanRow", "DEFAULT_OVERHEAD_GB", "DS_PERSISTENCE_THRESHOLD", "DS_MAX_REUSE_DISTANCE",
    "deepspeed_zero3_terms", "DEFAULT_ACTIVATION_SLACK", "NEAR_TIE",
]

OFFLOADS = ("none", "optimizer", "optimizer+params")
#: strategy: (ZeRO stage, DeepSpeed's offloads, torch's offloads, torch's name (the row
#: label with framework="torch"), torch's short name). Torch has no optimizer-only offload:
#: FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer states to the host.
_SPEC = {"DDP": (0, ("none",), ("none",), "DDP + autocast", "DDP+amp"),
         "ZeRO-1": (1, OFFLOADS[:2], ("none",), "DDP + ZeroRedundancyOptimizer", "DDP+ZeROopt"),
         "ZeRO-2": (2, OFFLOADS[:2], ("none",), "FSDP2 reshard_after_forward=False", "FSDP2 no-reshard"),
         "ZeRO-3": (3, OFFLOADS, OFFLOADS[::2], "FSDP2", "FSDP2"),
         "HSDP": (3, OFFLOADS, OFFLOADS[::2], "FSDP2 on a 2-D mesh (HSDP)", "FSDP2 HSDP")}
STRATEGIES = tuple(_SPEC)
_STAGE, _OFFLOADS_OF, _TORCH_OFFLOADS_OF, TORCH_NAMES, _TORCH_SHORT = (
    {k: v[i] for k, v in _SPEC.items()} for i in range(5))
#: whose memory layout and messages a plan models (see the module docstring)
FRAMEWORKS = ("deepspeed", "torch")
#: DeepSpeed's ZeRO-3 defaults (0.19.6, commit edaa722, deepspeed/runtime/zero/config.py L221, L244):
#: ``stage3_param_persistence_threshold`` and ``stage3_max_reuse_distance``, in elements.
DS_PERSISTENCE_THRESHOLD, DS_MAX_REUSE_DISTANCE = 100_000, 1_000_000_000
#: GB per GPU outside states, activations and comm buffers (CUDA context, workspaces,
#: allocator cache); fitted to the benchmark's R1 (33321 MiB at batch 1) in test_planner.py.
DEFAULT_OVERHEAD_GB = 3.6
#: Fraction added to activations for backward's transients and fragmentation: one gpt2-xl
#: sequence costs 3.32 GB, inside the benchmark's DP=8 band (see :func:`.gpt2xl.linear_model_bounds`).
DEFAULT_ACTIVATION_SLACK = 0.15
#: Options within this fraction of the fastest step are a near tie (the MFU and bandwidth
#: assumptions are not more accurate than that).
NEAR_TIE = 0.05
#: every recompute policy a Choice takes, least recomputation first, with its labels (long, short)
_POLICIES = {"none": ("", ""), "selective": ("selective recompute (attention core)", " +sel-rc"),
             "op-selective": ("op-level SAC (every matmul saved)", " +op-sac"),
             "torchtitan": ("torchtitan's op-level SAC", " +tt-sac"), "full": ("full recompute", " +full-rc")}


@dataclasses.dataclass(frozen=True)
class Choice:
    """A strategy, an offload and a recompute policy (False/True read as "none"/"full")."""
    strategy: str
    offload: str = "none"
    recompute: str = "none"

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.offload not in OFFLOADS:
            raise ValueError(f"offload must be one of {OFFLOADS}, got {self.offload!r}")
        if self.offload not in _OFFLOADS_OF[self.strategy]:
            if self.strategy == "DDP":
                raise ValueError("DDP cannot offload: offload needs sharded optimizer states "
                                 "(ZeRO-1 or higher); use offload='none' or a ZeRO strategy")
            raise ValueError(f"{self.strategy} cannot offload parameters (only ZeRO-3 and HSDP "
                             "shard them); use offload='optimizer' or strategy='ZeRO-3'")
        if not isinstance(self.recompute, (bool, str)):
            raise TypeError(f"recompute must be one of {RECOMPUTE} (or True/False for full/none), "
                            f"got {self.recompute!r}")
        object.__setattr__(self, "recompute", recompute_policy(self.recompute))

    @property
    def stage(self) -> int:
        return _STAGE[self.strategy]

    @property
    def offload_optimizer(self) -> bool:
        return self.offload != "none"

    @property
    def offload_params(self) -> bool:
        return self.offload == "optimizer+params"

    @property
    def recomputes(self) -> bool:
        return self.recompute != "none"

    def label(self, framework: str = "deepspeed", *, amp: bool = True) -> str:
        """E.g. "ZeRO-3 + offload optimizer+params + full recompute" or, torch, "FSDP2 + CPUOffloadPolicy"."""
        _check_framework(framework)
        off = "" if self.offload == "none" else f"offload {self.offload}"
        if framework == "torch":
            parts = ["DDP" if (self.strategy == "DDP" and not amp) else TORCH_NAMES[self.strategy],
                     "CPUOffloadPolicy" if self.offload_params else off and off + " (no torch API)"]
        else:
            parts = [self.strategy, off]
        parts.append(_POLICIES[self.recompute][0])
        return " + ".join(p for p in parts if p)

    def short(self, framework: str = "deepspeed") -> str:
        """Compact label for plots: ``"ZeRO-3 +opt+par +full-rc"``, ``"FSDP2 +cpu +sel-rc"``."""
        _check_framework(framework)
        off = {"none": "", "optimizer": " +opt", "optimizer+params": " +opt+par"}[self.offload]
        name = self.strategy
        if framework == "torch":
            name, off = _TORCH_SHORT[self.strategy], (" +cpu" if self.offload_params else off)
        return f"{name}{off}{_POLICIES[self.recompute][1]}"


def _check_framework(framework) -> None:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS} ('deepspeed': bf16 parameters and "
                         f"an fp32 master copy in the optimizer; 'torch': autocast / FSDP2, the fp32 "
                         f"parameters are the master), got {framework!r}")


def as_choice(value) -> Choice:
    """A :class:`Choice` from a Choice, a PlanRow, a dict, a tuple or a strategy name."""
    if isinstance(value, Choice):
        return value
    if isinstance(value, PlanRow):
        return value.choice
    if isinstance(value, str):
        return Choice(value)
    if isinstance(value, dict):
        unknown = set(value) - {"strategy", "offload", "recompute"}
        if unknown or "strategy" not in value:
            raise ValueError("a choice dict needs 'strategy' and may have 'offload' and 'recompute'; "
                             f"got keys {sorted(value)}")
        return Choice(**value)
    if isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        return Choice(*value)
    raise TypeError("a choice is a Choice, a strategy name such as 'ZeRO-2', a dict "
                    "{'strategy': ..., 'offload': ..., 'recompute': ...} or a tuple "
                    f"(strategy, offload, recompute); got {type(value).__name__}")


def deepspeed_zero3_terms(config: TransformerConfig, persistence_threshold: int = DS_PERSISTENCE_THRESHOLD,
                          max_reuse_distance: int = DS_MAX_REUSE_DISTANCE) -> tuple[int, int, int]:
    """ZeRO-3 as DeepSpeed runs it: (persistent tensors, their elements, elements kept gathered from
    forward into backward). A tensor of <= threshold elements is never partitioned: whole on every GPU,
    gathered once per step after the optimizer step, not per micro-batch (parameter_offload.py
    L311-329, stage3.py L2571). A released parameter stays gathered if the trace reaches its next
    use within ``max_reuse_distance`` elements (partitioned_param_coordinator.py L634-662): in
    forward, the rest of forward plus backward back to it, twice the elements after it; backward
    re-gathers none of these. Per tensor (DeepSpeed walks modules); a tied embedding at the head.
    FSDP2 and the course's ZeRO-3 shard every tensor and keep nothing: 16Ψ/N, 1.5x DDP."""
    check_int("persistence_threshold", persistence_threshold, 0, what="elements")
    check_int("max_reuse_distance", max_reuse_distance, 0, what="elements")
    numels = config.param_numels()
    trace = numels[1:] + numels[:1] if config.tied_embeddings else numels
    persistent = [n for n in numels if n <= persistence_threshold]
    kept = after = 0
    for n in reversed(trace):
        if 2 * after >= max_reuse_distance:
            break
        kept, after = kept + n * (n > persistence_threshold), after + n
    return len(persistent), sum(persistent), kept


def _all_choices(nodes: int, framework: str = "deepspeed", attention: str = "flash",
                 architecture: bool = True) -> list[Choice]:
    # with flash attention no s x s scores are stored: "selective" would keep what "none" keeps;
    # torch's op-level policy (torchtitan's) saves a block's matmul outputs: it needs the architecture
    offloads = _TORCH_OFFLOADS_OF if framework == "torch" else _OFFLOADS_OF
    recompute = RECOMPUTE if attention == "standard" else ("none", "full")
    if framework == "torch" and architecture:
        recompute = (*recompute[:-1], "torchtitan", "full")
    return [Choice(s, o, r) for s in STRATEGIES if s != "HSDP" or nodes > 1
            for o in offloads[s] for r in recompute]


@dataclasses.dataclass(frozen=True)
class Assumptions:
    """Every figure :func:`plan` assumes (units in the names; GB = 1e9 bytes)."""
    model: str
    num_params: int
    gpu_mem_gb: float
    gpus_per_node: int
    nodes: int
    intra_bw_gbps: float
    inter_bw_gbps: float
    nics_per_node: int
    alpha_intra_us: float
    alpha_inter_us: float
    seq_len: int
    micro_batch: int | None
    global_batch: int | None
    recipe: str
    attention: str
    cross_entropy: str
    gpu_flops: float
    mfu: float
    overlap: float
    overhead_gb: float
    activation_slack: float
    bucket_elems: int
    bucket_buffers: int
    unit_params: int
    units: int
    pcie_gbps: float
    host_adam_params_per_s: float
    host_mem_gb: float | None
    max_micro_batch: int
    has_architecture: bool
    framework: str = "deepspeed"
    recompute_options: tuple = ("none", "full")     # the policies among the plan's rows
    persistence_threshold: int = DS_PERSISTENCE_THRESHOLD   # DeepSpeed's ZeRO-3 (deepspeed_zero3_terms)
    max_reuse_distance: int = DS_MAX_REUSE_DISTANCE
    ds_terms: tuple = (0, 0, 0)     # deepspeed_zero3_terms(...) (zeros: torch, or a bare count)
    trainable: float = 1            # the fraction of the parameters that trains (memory.model_states)
    multi_rank_bucket_allreduce: bool = True    # DeepSpeed ZeRO-1/2's default: all-reduce each gradient bucket

    def gather_share(self, k: int) -> float:
        """DeepSpeed ZeRO-3's all-gathered elements per step over the ideal 2Ψ per micro-batch."""
        _, p, kept = self.ds_terms
        return (k * (2 * (self.num_params - p) - kept) + p) / (2 * k * self.num_params)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def amp(self) -> bool:
        return self.recipe != "fp32"

    @property
    def wire_bytes(self) -> tuple[int, int]:
        """(gather, reduce) bytes per element: DeepSpeed's stored ones; torch's bf16 and fp32."""
        if self.framework == "torch":
            return (2 if self.amp else 4), 4
        return RECIPES[self.recipe][:2]

    def layout(self) -> str:
        if self.framework == "torch":
            return ("torch's layout (the fp32 parameters are the master; "
                    + ("autocast and MixedPrecisionPolicy make bf16 copies, gradients are fp32)"
                       if self.amp else "no mixed precision)"))
        return {"mixed": "DeepSpeed's layout (bf16 parameters and gradients, an fp32 master copy in "
                         "the optimizer)",
                "mixed-fp32-grads": "Megatron-LM's layout (bf16 parameters, fp32 gradients, an fp32 "
                                    "master copy in the optimizer)",
                "fp32": "fp32 throughout (no mixed precision)"}[self.recipe]

    def lines(self) -> list[str]:
        """The assumptions, one sentence each (printed under :func:`table`)."""
        p, g, o = RECIPES[self.recipe]
        gather_b, reduce_b = self.wire_bytes
        torch = self.framework == "torch"
        selective = "selective" in self.recompute_options
        op_sac = ("; op-level SAC keeps each block's input and the outputs its policy saves (memory."
                  "op_selective_terms) and re-runs the matmuls it does not save: + 2 x their weights x tokens "
                  "FLOPs (recomputed_weights)") if set(OP_SELECTIVE) & set(self.recompute_options) else ""
        loss = ("F.cross_entropy's two fp32 gradients at its backward" if self.cross_entropy == "torch"
                else "an in-place (fused) loss")
        acts = (f"activations: memory.activation_bytes (Korthikanti et al. for GPT blocks, a Llama "
                f"block's own count), {self.attention} attention, 16-bit, fp32 "
                f"log-probabilities, {loss}; +{self.activation_slack:.0%} allocator slack; with "
                f"full recomputation each block keeps its input, one block is rematerialised at a time "
                f"(after the loss's buffers are freed: the larger of the two counts)"
                + ("; with selective recomputation each block keeps all but its s x s attention "
                   "scores, recomputed one block at a time" if selective else "")
                if self.has_architecture else
                "activations: not counted (the model is a bare parameter count: pass a preset "
                "or TransformerConfig to count them)")
        if torch:
            bufs = (f"stages 0-1 {self.bucket_buffers} bucket(s) of {self.bucket_elems:.3g} fp32 gradient "
                    f"elements, FSDP2 two gathered units of {self.unit_params:,} params in {gather_b} B "
                    f"+ one unit of their gradients in {gather_b} B and its {reduce_b} B reduce-scatter "
                    f"input ({self.units} units; reshard_after_forward=False: one unit of gradients)")
        else:
            bufs = (f"stages 0-2 {self.bucket_buffers} bucket(s) of {self.bucket_elems:.3g} gradient "
                    f"elements, ZeRO-3/HSDP two gathered units of {self.unit_params:,} params + one "
                    f"unit of their gradients ({self.units} units)")
        lines = [
            f"GPU memory {self.gpu_mem_gb:g} GB usable per GPU; {self.nodes} node(s) x "
            f"{self.gpus_per_node} GPU(s) = {self.world_size} data-parallel ranks (no tensor/pipeline parallelism)",
            f"model states: {self.layout()}: recipe {self.recipe} = {p} B params + {g} B grads + {o} B "
            f"optimizer per parameter (memory.RECIPES); ZeRO shards the analytic share (memory.model_states)",
        ]
        if torch:
            lines.append("copies (held from forward to backward): "
                         + ("DDP under autocast: every matmul weight cast to bf16 (2 B per parameter); " if self.amp else "")
                         + f"FSDP2 with reshard_after_forward=False: every unit's gathered parameters ({gather_b} B)")
        lines += [
            acts,
            f"buffer allowance per GPU: {self.overhead_gb:g} GB runtime (CUDA context, workspaces, "
            f"allocator cache) + comm buffers: {bufs}",
            "compute: 6 x params x tokens FLOPs (8 x with full recomputation"
            + ("; selective recomputation re-runs only the attention core, whose s^2 FLOPs this "
               "count leaves out, so 6 x" if selective else "") + op_sac
            + f") at {self.gpu_flops / 1e12:g} TFLOP/s x MFU {self.mfu:g}; attention's s^2 FLOPs ignored",
            f"communication: ring alpha-beta model, {self.intra_bw_gbps:g} GB/s per GPU inside a node "
            f"(alpha {self.alpha_intra_us:g} us/step)"
            + ("" if self.nodes == 1 else
               f", {self.nics_per_node} NIC(s) of {self.inter_bw_gbps:g} GB/s per node across nodes "
               f"(alpha {self.alpha_inter_us:g} us/step); a ring over all GPUs runs one ring per NIC, "
               f"each leaving a node once: a node's NICs carry what one rank sends, 1/{self.nics_per_node} "
               f"each, while NVLink carries the hops inside the node at the same time")
            + f"; params gathered in {gather_b} B, grads reduced in {reduce_b} B"
            + (f"; ZeroRedundancyOptimizer adds a broadcast of every updated parameter in {p} B"
               if torch else "; ZeRO-1/2 " + ("all-reduce each gradient bucket (DeepSpeed's default "
                                              "use_multi_rank_bucket_allreduce=True: 1.5x DDP's bytes with the gather)"
                                              if self.multi_rank_bucket_allreduce else
                                              "reduce each bucket slice to its owner (use_multi_rank_bucket_allreduce"
                                              "=False: a reduce-scatter's bytes)"))
            + ("" if self.nodes == 1 else
               f"; HSDP: ZeRO-3 inside the node + all-reduce of a 1/{self.gpus_per_node} gradient "
               f"shard across nodes over the node's NICs"),
            ("accumulation: DDP and ZeroRedundancyOptimizer reduce once per step; FSDP2 all-gathers "
             "twice per micro-batch (once with reshard_after_forward=False) and reduce-scatters every "
             "micro-batch; HSDP's cross-node all-reduce once per step" if torch else
             "accumulation: DDP and ZeRO-1 reduce once per step; ZeRO-2 reduces every "
             "micro-batch; ZeRO-3/HSDP gather and reduce-scatter every micro-batch (HSDP's "
             "cross-node all-reduce once per step)"),
            f"overlap: {self.overlap:.0%} of compute time can hide communication "
            f"(step = compute + offload + max(0, comm - overlap x compute))",
            f"offload: host<->GPU at {self.pcie_gbps:g} GB/s per GPU; optimizer step on the host at "
            f"{self.host_adam_params_per_s / 1e9:g}e9 params/s per node; transfers not overlapped"
            + (f"; host memory {self.host_mem_gb:g} GB per node" if self.host_mem_gb is not None
               else "; host memory not checked")
            + ("; torch offloads only with FSDP2's CPUOffloadPolicy" if torch else ""),
            "micro-batch: " + (f"{self.micro_batch} for every option" if self.micro_batch is not None
                               else f"the largest that fits (at most {self.max_micro_batch})")
            + "; global batch " + (f"{self.global_batch} sequences per step (accumulation fills it)"
                                   if self.global_batch is not None else
                                   "= ranks x micro-batch (no accumulation)"),
        ]
        count, p, kept = self.ds_terms
        lines.append("ZeRO-3 as FSDP2 (and the course's Zero3) runs it: every tensor sharded, 16Ψ/N, 1.5x DDP" if torch else
                     f"ZeRO-3/HSDP as DeepSpeed runs it: {count} tensors ({p:,} elements) <= "
                     f"stage3_param_persistence_threshold {self.persistence_threshold:.3g} whole on every GPU, "
                     f"gathered once per step; stage3_max_reuse_distance {self.max_reuse_distance:.3g} keeps "
                     f"{kept:,} elements gathered from forward into backward (not re-gathered). 16Ψ/N and "
                     "1.5x DDP are FSDP2's and the course's ZeRO-3")
        if self.trainable < 1:
            lines.append(f"trainable {self.trainable:g} of the parameters: the frozen rest keeps its parameters only "
                         "(sharded by ZeRO-3/FSDP2, still gathered), reduces no gradient, gathers no update and "
                         f"skips its weight-gradient matmuls: (4 + 2 x {self.trainable:g}) x params x tokens FLOPs")
        if self.nodes == 1:
            lines.append("HSDP rows left out: on one node HSDP is ZeRO-3")
        if self.has_architecture and not selective and self.attention == "flash":
            lines.append("selective-recompute rows left out: flash attention stores no s x s "
                         "scores, so selective recomputation keeps what no recomputation keeps")
        return lines


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One option of a :func:`plan`, in bytes per GPU and seconds per optimizer step."""
    choice: Choice
    shard_size: int            # ranks the model states are sharded over
    world_size: int
    gpus_per_node: int
    micro_batch: int           # evaluated micro-batch (given, or the largest that fits; 1 if none fits)
    max_micro_batch: int       # largest micro-batch that fits (0: not even 1)
    grad_accum: int
    fits: bool
    why: str                   # why it does not fit ("" when it fits)
    params: float              # model states on this GPU after offload, bytes
    grads: float
    optimizer: float
    activations: float         # activation_bytes(...).total at micro_batch
    buffers: float             # runtime overhead + comm buffers + allocator slack
    host_bytes_per_node: float
    compute_s: float
    comm_s: float
    offload_s: float
    step_s: float
    tokens_per_step: int       # over all GPUs
    seq_len: int
    recipe: str
    comm_detail: dict          # bytes per step: {"intra": the busiest GPU over NVLink, "inter": one NIC}
    config: TransformerConfig | None = None
    copies: float = 0          # torch: bf16 copies of parameters held from forward to backward, bytes
    framework: str = "deepspeed"

    @property
    def strategy(self) -> str:
        return self.choice.strategy

    @property
    def stage(self) -> int:
        return self.choice.stage

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.copies + self.activations + self.buffers

    def label(self) -> str:
        return self.choice.label(self.framework, amp=self.recipe != "fp32")

    def short(self) -> str:
        return self.choice.short(self.framework)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else math.inf
