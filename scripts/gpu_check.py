"""`make gpu-check`: run what the course can only check on GPUs, on the GPUs this machine has.

    make gpu-check                       # or: .venv/bin/python scripts/gpu_check.py

It prints one table (what ran, where, measured vs predicted, ok or FAIL, notes under it)
and exits non-zero if any check failed; a check that raises is a FAIL row, the others
still run. Without a CUDA GPU it lists what it would run and exits 0. With GPUs (see
:func:`plan`): all-reduces on NCCL ranks, every strategy's losses against one process's
on min(N, 4) NCCL ranks, the launcher's forkserver after a backward or CUDA init here,
the memory of one ``mixed`` training step against ``memory.per_gpu``, what one Llama 3.1 8B
block keeps under op-level selective checkpointing against ``memory.op_selective_terms``, and
torch's FSDP2 layout against the planner (``scripts/gpu_torch_layout.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import sys
from numbers import Integral, Real
from typing import Callable

from course_utils.harness import experiments
from course_utils.harness import strategies
from course_utils.theory.config import TransformerConfig
from course_utils.runtime.env import gpu_names
from course_utils.runtime.fmt import LOSS_RTOL, max_rel_diff, sci, table as text_table
from course_utils.theory.sharding import DEFAULT_SHARDS
from course_utils.runtime.launch import gpu_count, launch, where
from course_utils.theory.memory import OP_SELECTIVE, fmt_bytes, op_selective_terms, per_gpu

STEPS = 3                     # training steps of every loss comparison
MAX_RANKS = 4                 # the most NCCL ranks a strategy runs on
#: On 2 gloo CPU ranks next to a visible GPU (FSDP2's default mesh would be a CUDA one there).
GLOO_NEXT_TO_GPU = ("ddp", "zero2", "torch-fsdp")
TIMEOUT_S = 300.0             # per launch (NCCL's first communicator, spawned interpreters)

#: ~161M parameters, about 6 GiB at micro-batch 8 (any GPU with 8 GB); activations
#: outweigh the model states, so the peak is the activation model's (start of backward).
MEMORY_CONFIG = TransformerConfig(hidden=1024, layers=12, heads=16, vocab=8192, seq=1024)
MEMORY_MICRO_BATCH = 8
#: Steps before the measured one: AdamW creates m and v in its first step, cuBLAS its workspace.
MEMORY_WARMUP_STEPS = 2
#: memory_allocated after step() may exceed the model states by this much (cuBLAS
#: workspace, the token batch, 512-byte rounding of every tensor).
HELD_RTOL, HELD_ATOL = 0.01, 64 * 2**20
#: The measured peak of a step may differ from per_gpu's total by this fraction.
PEAK_RTOL = 0.10


#: One block of torchtitan's published Llama 3.1 8B run (local batch 2, seq 8192; appendix 09 §7)
#: under torch's op-level selective checkpointing: what it keeps vs ``memory.op_selective_terms``.
SAC_MODEL, SAC_MICRO_BATCH, SAC_SEQ = "llama-3.1-8b", 2, 8192
#: memory_allocated rounds each tensor up to 512 B: the flash kernel's RNG seed and offset (16 + 8 B
#: on the GPU, kept with its output) add 1,024 B (H200, torch 2.11); anything larger would show here.
SAC_ATOL = 64 * 2**10


class NotRun(Exception):
    """A check whose precondition this machine does not meet: reported, not a failure."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table. ``ok``: True (ok), False (FAIL) or None (not run)."""

    check: str
    where: str
    measured: str = "-"
    predicted: str = "-"
    ok: bool | None = None
    note: str = ""

    @property
    def result(self) -> str:
        return {True: "ok", False: "FAIL", None: "not run"}[self.ok]


@dataclasses.dataclass(frozen=True)
class Planned:
    """A check to run: what, where (as planned), and the function that runs it."""

    check: str
    where: str
    run: Callable[[], list]


# ----------------------------------------------------------------- comparing, printing

def _gib(n) -> str:
    return fmt_bytes(n, "GiB", 3)


def _signed(n) -> str:
    return ("+" if n >= 0 else "-") + fmt_bytes(abs(n), "MiB", 1)


def bytes_row(check: str, where_: str, measured, predicted, *, rtol: float = 0.0, atol=0,
              why: str = "") -> Row:
    """ok when ``|measured - predicted| <= atol + rtol * predicted``; the note gives the gap,
    the tolerance and ``why`` (what the gap is made of)."""
    for name, value in (("measured", measured), ("predicted", predicted)):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"{name} must be a number of bytes, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0 bytes, got {value!r}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, Real) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    gap = measured - predicted
    ok = abs(gap) <= atol + rtol * predicted
    parts = ([f"{rtol:.0%}"] if rtol else []) + ([fmt_bytes(atol, "auto", 0, largest="MiB")] if atol else [])
    tolerance = "± " + " + ".join(parts) if parts else "exact"
    share = f" ({gap / predicted:+.1%})" if predicted else ""
    note = f"gap {_signed(gap)}{share}, tolerance {tolerance}" + (f"; {why}" if why else "")
    return Row(check, where_, _gib(measured), _gib(predicted), ok, note)


def losses_row(check: str, where_: str, losses, reference, *, same_parameters: bool = True,
               rtol: float = LOSS_RTOL) -> Row:
    """Losses against one process's (relative, step by step), and equal final parameters."""
    losses, reference = list(losses), list(reference)
    if len(losses) != len(reference) or not losses:
        raise ValueError(f"need two equally long, non-empty loss lists, got {len(losses)} "
                         f"and {len(reference)}")
    diff = max_rel_diff(losses, reference)
    ok = diff <= rtol and bool(same_parameters)
    note = "" if same_parameters else "the ranks ended with different full parameters"
    return Row(check, where_, f"max rel. diff {diff:.1e}", f"≤ {sci(rtol)} (fmt.LOSS_RTOL)", ok,
               note)


def error_row(check: str, where_: str, exc: BaseException) -> Row:
    """The row of a check that raised: FAIL with the error (not run for :class:`NotRun`)."""
    if isinstance(exc, NotRun):
        return Row(check, where_, ok=None, note=str(exc))
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0] if message else ''}"
    return Row(check, where_, ok=False, note=text[:400])


def table(rows) -> str:
    """The one table: check, where, measured, predicted, result; numbered notes under it."""
    rows = list(rows)
    if not all(isinstance(r, Row) for r in rows):
        raise TypeError("table() takes Row objects")
    notes, body = [], []
    for r in rows:
        result = r.result
        if r.note:
            notes.append(f"[{len(notes) + 1}] {r.note}")
            result += f" [{len(notes)}]"
        body.append([r.check, r.where, r.measured, r.predicted, result])
    return text_table(["check", "where", "measured", "predicted", "result"], body,
                      notes=([""] if notes else []) + notes, left=(0, 1, 4))


def summary(rows) -> str:
    """The last line: how many checks failed, or that all ran ok (and how many did not run)."""
    rows = list(rows)
    failed = sum(r.ok is False for r in rows)
    skipped = sum(r.ok is None for r in rows)
    if failed:
        return f"{failed} of {len(rows)} checks FAILED"
    return f"all {len(rows) - skipped} checks ok" + (f", {skipped} not run" if skipped else "")


def run_checks(planned, *, progress=None) -> list[Row]:
    """Run each planned check; one that raises becomes its FAIL (or not run) row."""
    rows = []
    for p in planned:
        if progress is not None:
            progress(f"gpu-check: {p.check} ({p.where})")
        try:
            rows.extend(p.run())
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
            rows.append(error_row(p.check, p.where, exc))
    return rows


# ------------------------------------------------------------------------- the checks

def _all_reduce_rank(rank: int, world_size: int):
    import torch
    import torch.distributed as dist
    from course_utils.runtime.launch import rank_device

    t = torch.tensor([float(rank + 1)], device=rank_device())
    dist.all_reduce(t)
    return t.item(), str(t.device)


_STARTED = {"fork": "forked", "forkserver": "forked from the forkserver", "spawn": "spawned"}


def _ran(results, suffix: str = "") -> str:
    """Where a launch ran, and how its ranks started: "1 NCCL rank, one GPU each, forked"."""
    return f"{where(results, backend_first=True)}{suffix}, {_STARTED[results.start_method]}"


def check_all_reduce(world_size: int, backend: str = "nccl", start_method: str = "auto") -> list[Row]:
    """Every rank must hold N(N+1)/2, on cuda:r under NCCL, on the CPU under gloo."""
    results = launch(_all_reduce_rank, world_size, backend=backend, quiet=True, timeout_s=TIMEOUT_S,
                     start_method=start_method)
    total = world_size * (world_size + 1) / 2
    devices = [d for _, d in results]
    want = [f"cuda:{r}" if backend == "nccl" else "cpu" for r in range(world_size)]
    ok = all(v == total for v, _ in results) and devices == want
    got = "/".join(sorted({f"{v:g}" for v, _ in results}))
    plural = "s" if world_size > 1 else ""
    return [Row(f"all-reduce of rank + 1 on {world_size} rank{plural}", _ran(results),
                f"{got} on {', '.join(devices)}", f"{total:g} on {', '.join(want)}", ok)]


@functools.lru_cache(maxsize=None)
def _single_losses() -> tuple:
    """One process on the whole global batch (on the CPU, in this process): the reference."""
    return tuple(experiments.run("single", 1, steps=STEPS)[0].losses)


def check_strategy(strategy: str, world_size: int, backend: str, suffix: str = "", *,
                   start_method: str | None = None) -> list[Row]:
    """Losses against one process's, equal parameters, and (if given) the start method."""
    results = experiments.run(strategy, world_size, steps=STEPS, backend=backend, quiet=True,
                              timeout_s=TIMEOUT_S)
    same = len({r.param_digest for r in results}) == 1
    row = losses_row(f"{strategy}: losses = one process's ({STEPS} steps)", _ran(results, suffix),
                     results[0].losses, _single_losses(), same_parameters=same)
    if start_method is not None and results.start_method != start_method:
        row = dataclasses.replace(row, ok=False, note="; ".join(filter(None, [
            row.note, f"the ranks were {_STARTED[results.start_method]}, not {_STARTED[start_method]}"])))
    return [row]


def check_gloo_next_to_gpu(strategy: str) -> list[Row]:
    """One-GPU Colab: CUDA initialised here, so gloo ranks must start from the forkserver."""
    import torch

    torch.cuda.init()
    return check_strategy(strategy, 2, "gloo", " next to a visible GPU", start_method="forkserver")


def check_nccl_from_forkserver() -> list[Row]:
    """The forkserver's preload must leave CUDA uninitialised, or its rank has no GPU."""
    import torch

    torch.cuda.init()
    rows = check_all_reduce(1, "nccl")
    return [dataclasses.replace(r, check=r.check + " after CUDA was initialised here") for r in rows]


def check_after_backward(strategy: str = "ddp") -> list[Row]:
    """A backward here next to a GPU starts autograd's device threads (CUDA stays
    uninitialised): only ``autograd_survives_fork`` tells, ranks must use the forkserver."""
    import torch

    x = torch.ones(2, requires_grad=True)
    (x * x).sum().backward()                       # on the CPU, as notebook 02's single()
    if torch.cuda.is_initialized():
        raise RuntimeError("a CPU backward initialised CUDA: this check cannot tell anything")
    return check_strategy(strategy, 2, "gloo", " after a backward here", start_method="forkserver")


def strategy_world_size(strategy: str, gpus: int) -> int:
    """min(gpus, MAX_RANKS); for torch-hsdp a multiple of ``DEFAULT_SHARDS``."""
    n = min(gpus, MAX_RANKS)
    return n - n % DEFAULT_SHARDS if strategy == "torch-hsdp" else n


def peak_gap_terms(config: TransformerConfig, micro_batch: int) -> dict:
    """Bytes the measured ``mixed`` peak (start of backward) differs from ``per_gpu`` by: bf16
    grads not allocated yet, and no 1-byte dropout masks (2 per layer + the embedding's)."""
    s, b, h = config.seq, micro_batch, config.hidden
    terms = {"gradients not yet allocated": -2 * config.num_params(),
             "no dropout masks": -(2 * config.layers + 1) * s * b * h}
    terms["expected gap"] = sum(terms.values())
    return terms


def measure_memory(config: TransformerConfig = MEMORY_CONFIG, micro_batch: int = MEMORY_MICRO_BATCH,
                   *, device_index: int = 0) -> dict:
    """One measured ``mixed`` step on GPU ``device_index`` after warm-up: bytes ``held``,
    ``allocated`` after ``step()``, the ``peak``, and ``per_gpu``'s prediction."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_utils.harness.model import SyntheticData, build_model
    from course_utils.harness.experiments import state_bytes
    from course_utils.harness.precision import make_training, train_step

    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 0):
        raise NotRun(f"needs bf16 flash attention, i.e. compute capability 8.0 or newer "
                     f"(Ampere); this GPU has {capability[0]}.{capability[1]}")
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    model, opt = make_training(build_model(config, seed=0, device=device), "mixed")
    x, y = (t.to(device) for t in SyntheticData(config, global_batch=micro_batch, seed=0).batch(0))
    # what the prediction assumes: a fused attention kernel that keeps no s x s scores
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        for _ in range(MEMORY_WARMUP_STEPS):
            train_step(model, opt, x, y)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        train_step(model, opt, x, y, zero_grad=False)     # after step(), before zero_grad()
        torch.cuda.synchronize(device)
    out = {"peak": torch.cuda.max_memory_allocated(device) - base,
           "allocated": torch.cuda.memory_allocated(device) - base,
           "held": state_bytes(model, opt, detail=True),
           "predicted": per_gpu(config, recipe="mixed", micro_batch=micro_batch, attention="flash"),
           "device": torch.cuda.get_device_name(device)}
    del model, opt, x, y
    gc.collect()
    torch.cuda.empty_cache()
    return out


def memory_rows(m: dict, config: TransformerConfig = MEMORY_CONFIG,
                micro_batch: int = MEMORY_MICRO_BATCH) -> list[Row]:
    """Model states (exact), memory after ``step()`` and the peak, against ``per_gpu``."""
    predicted, held = m["predicted"], m["held"]
    place = f"this process, GPU 0 ({m['device']})"
    counters = held["optimizer_detail"].get("step", 0)
    states = held["params"] + held["grads"] + held["optimizer"] - counters
    exact = (held["params"], held["grads"], held["optimizer"] - counters) == (
        predicted.params, predicted.grads, predicted.optimizer)
    states_row = bytes_row(
        "model states after step(): params + grads + optimizer", place, states,
        predicted.states.total,
        why=("bf16 params 2 B + bf16 grads 2 B + fp32 master, m, v 12 B per parameter "
             f"(experiments.state_bytes; AdamW's {counters:,} B of step counters, kept on "
             "the CPU, left out)" + ("" if exact else "; the parts differ: "
                                    f"measured {held['params']:,} / {held['grads']:,} / "
                                    f"{held['optimizer'] - counters:,} B, predicted "
                                    f"{predicted.params:,} / {predicted.grads:,} / "
                                    f"{predicted.optimizer:,} B")))
    if not exact:
        states_row = dataclasses.replace(states_row, ok=False)
    terms = peak_gap_terms(config, micro_batch)
    why_peak = ("per_gpu = model states + activations (Korthikanti et al., flash attention); "
                f"expected gap about {_signed(terms['expected gap'])} = "
                + ", ".join(f"{k} {_signed(v)}" for k, v in terms.items() if k != "expected gap")
                + ", plus small terms (LayerNorm statistics, the cuBLAS workspace, the "
                "allocator's rounding)")
    return [
        states_row,
        bytes_row("GPU memory allocated after step() (memory_allocated)", place, m["allocated"],
                  predicted.states.total, rtol=HELD_RTOL, atol=HELD_ATOL,
                  why="above the model states: cuBLAS workspace, the token batch, 512-byte "
                      "rounding of every tensor"),
        bytes_row(f"peak of one training step (max_memory_allocated), micro-batch "
                  f"{micro_batch} x {config.seq} tokens", place, m["peak"],
                  predicted.total, rtol=PEAK_RTOL, why=why_peak),
    ]


def check_memory() -> list[Row]:
    return memory_rows(measure_memory())


def measure_op_selective(model: str = SAC_MODEL, micro_batch: int = SAC_MICRO_BATCH, seq: int = SAC_SEQ,
                         *, device_index: int = 0) -> dict:
    """Bytes one bf16 block keeps after ``checkpoint(block, x, context_fn=sac_context(k))``'s
    forward (its output left out; the input, made inside, counted), for each :data:`OP_SELECTIVE`
    policy, read from ``memory_allocated`` after a warm-up pass (the first matmul allocates cuBLAS's
    32 MiB workspace); backward then runs the recompute for real."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint

    from course_utils.harness.model import Block
    from course_utils.harness.recompute import sac_context
    from course_utils.theory.config import preset

    config = preset(model).config
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    if torch.cuda.get_device_capability(device) < (8, 0):
        raise NotRun("needs bf16 flash attention (compute capability 8.0 or newer)")
    torch.manual_seed(0)
    with torch.device(device):
        block = Block(config).to(torch.bfloat16)
        x0 = torch.randn(micro_batch, seq, config.hidden, dtype=torch.bfloat16, requires_grad=True)
    kept = {}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):     # torchtitan's runs: the flash kernel
        for policy, every in (("warm-up", 1), *OP_SELECTIVE.items()):   # warm-up: cuBLAS's workspace
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            x = x0 * 1
            y = checkpoint(block, x, use_reentrant=False, preserve_rng_state=False,
                           context_fn=functools.partial(sac_context, every))
            del x
            torch.cuda.synchronize(device)
            kept[policy] = torch.cuda.memory_allocated(device) - before - y.untyped_storage().nbytes()
            y.float().sum().backward()
            del y
            x0.grad = None
            block.zero_grad(set_to_none=True)
    kept.pop("warm-up")
    name = torch.cuda.get_device_name(device)
    del block, x0
    gc.collect()
    torch.cuda.empty_cache()
    return {"kept": kept, "device": name, "model": model, "micro_batch": micro_batch, "seq": seq}


def op_selective_rows(m: dict) -> list[Row]:
    """Each policy's kept bytes against ``op_selective_terms`` (flash attention)."""
    place = f"this process, GPU 0 ({m['device']})"
    rows = []
    for policy, kept in m["kept"].items():
        terms = op_selective_terms(m["model"], micro_batch=m["micro_batch"], seq=m["seq"],
                                   attention="flash", policy=policy)
        rows.append(bytes_row(
            f"op-level SAC ({policy!r}): what one {m['model']} block keeps, micro-batch "
            f"{m['micro_batch']} x {m['seq']} tokens, bf16, flash", place, kept, sum(terms.values()),
            atol=SAC_ATOL, why=f"measured {kept:,} B, predicted {sum(terms.values()):,} B "
                               "(memory.op_selective_terms: " + ", ".join(terms) + "; the flash "
                               "kernel's RNG seed and offset, 512 B each as allocated, are not in it)"))
    return rows


def check_op_selective() -> list[Row]:
    return op_selective_rows(measure_op_selective())


def check_torch_layout() -> list[Row]:
    """torch's layout (``planner.plan(..., framework="torch")``) on one NCCL rank, to the
    byte (``scripts/gpu_torch_layout.py``, which also runs on its own)."""
    import torch
    import torch.distributed as dist

    import gpu_torch_layout as layout       # scripts/ is on the path: this file runs from it

    torch.cuda.set_device(0)
    layout.init_one_rank()
    try:
        states, want_states, other = layout.measure_states()
        held, want_held, _ = layout.measure_gathered_blocks()
    finally:
        dist.destroy_process_group()
    here = f"1 NCCL rank, GPU 0, {layout.CONFIG.num_params() / 1e6:.0f}M-parameter Llama-style GPT"
    return [bytes_row("FSDP2 + MixedPrecisionPolicy: states after an AdamW step (16 B/param)", here,
                      states, want_states,
                      why=f"storages of parameters, gradients and AdamW states; memory_allocated holds "
                          f"{fmt_bytes(other, 'MiB', 1)} more (cuBLAS workspaces, allocator rounding)"),
            bytes_row("reshard_after_forward=False: blocks' bf16 parameters after forward", here,
                      held, want_held, why="the planner's torch copies of that row, less the root's")]


# ----------------------------------------------------------------------------- the plan

def plan(gpus: int) -> list[Planned]:
    """The checks ``make gpu-check`` runs with ``gpus`` CUDA GPUs (>= 1), in order."""
    if isinstance(gpus, bool) or not isinstance(gpus, Integral):
        raise TypeError(f"gpus must be an int, got {type(gpus).__name__}")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1 (with no GPU there is nothing to run), got {gpus}")

    def on(n, backend, how):
        return where(n, backend, backend_first=True) + how
    forked, served = ", forked from this process", ", forked from the forkserver"
    losses = f": losses = one process's ({STEPS} steps)"
    checks = [Planned(f"all-reduce of rank + 1 on {n} rank{'s' if n > 1 else ''}", on(n, "nccl", forked),
                      functools.partial(check_all_reduce, n)) for n in sorted({1, gpus})]
    if gpus >= 2:
        checks += [Planned(name + losses, on(strategy_world_size(name, gpus), "nccl", forked),
                           functools.partial(check_strategy, name, strategy_world_size(name, gpus), "nccl"))
                   for name in strategies.strategies() if strategies.STRATEGIES[name].distributed]
    checks.append(Planned("ddp" + losses, on(2, "gloo", " after a backward here" + served
                                             + " (autograd's GPU threads started here)"), check_after_backward))
    checks.append(Planned(
        f"memory of a training step, course GPT at {MEMORY_CONFIG.num_params() / 1e6:.0f}M "
        "parameters (mixed) vs memory.per_gpu", "this process, GPU 0", check_memory))
    checks.append(Planned(f"op-level selective checkpointing of one {SAC_MODEL} block vs "
                          "memory.op_selective_terms", "this process, GPU 0", check_op_selective))
    checks.append(Planned("torch's layout: FSDP2 states and gathered blocks vs planner(framework='torch')",
                          "this process, GPU 0 (1 NCCL rank)", check_torch_layout))
    checks += [Planned(name + losses, on(2, "gloo", " next to a visible GPU" + served + " (CUDA initialised here)"),
                       functools.partial(check_gloo_next_to_gpu, name)) for name in GLOO_NEXT_TO_GPU]
    checks.append(Planned("all-reduce of rank + 1 on 1 rank after CUDA was initialised here",
                          on(1, "nccl", served), check_nccl_from_forkserver))
    return checks


def _listing(planned) -> str:
    return text_table(["check", "where"], [[p.check, p.where] for p in planned], left=(0, 1))


def describe_without_gpu(example_gpus: int = MAX_RANKS) -> str:
    """What ``make gpu-check`` says on a machine with no CUDA GPU."""
    return "\n".join([
        "no CUDA GPU visible: nothing to check here.",
        "",
        "With one GPU, make gpu-check runs:",
        _listing(plan(1)),
        "",
        f"With N >= 2 GPUs it runs these (shown for N = {example_gpus}; each strategy on "
        f"min(N, {MAX_RANKS}) NCCL ranks, torch-hsdp on an even number):",
        _listing(plan(example_gpus)),
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    gpus = gpu_count()
    if gpus == 0:
        print(describe_without_gpu())
        return 0
    names = ", ".join(gpu_names())                  # nvidia-smi: CUDA stays uninitialised
    rows = run_checks(plan(gpus), progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"make gpu-check: {gpus} CUDA GPU{'s' if gpus > 1 else ''} visible ({names})")
    print(table(rows), "", summary(rows), sep="\n")
    return 1 if any(r.ok is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
