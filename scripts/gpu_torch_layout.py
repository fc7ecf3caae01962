"""Torch's memory layout on one GPU, measured against the planner's ``framework="torch"``.

    .venv/bin/python scripts/gpu_torch_layout.py        # needs one CUDA GPU; about a minute

The planner (``course_utils.theory.planner``, ``framework="torch"``) says that FSDP2 with
``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`` and
``torch.optim.AdamW`` holds 4 + 4 + 8 bytes per parameter, sharded (the fp32 parameter is
the master: no separate copy), and that ``reshard_after_forward=False`` adds every
block's gathered bf16 parameters from forward to backward (2 B per parameter). This
script builds a Llama-style course GPT (:data:`CONFIG`) on one NCCL rank, shards it with
``fully_shard`` per block and on the root, trains :data:`WARMUP_STEPS` + 1 steps and
compares, with ``torch.cuda.memory_allocated``:

1. **states**: the CUDA storages of the parameters (sharded, fp32), their gradients and
   AdamW's states after the optimizer step, against
   ``memory.model_states(Ψ, stage=3, recipe="torch-amp")`` on one rank = 16·Ψ; what else
   ``memory_allocated`` holds then (cuBLAS workspaces, ...) is printed beside it;
2. **gathered blocks**: with ``reshard_after_forward=False``, the storages of the
   unsharded (bf16) parameters the blocks hold right after forward, against 2 B x the
   blocks' parameters (the planner's ``copies`` of an FSDP2 ``reshard_after_forward=False``
   row, less the root, which stays gathered either way); beside it, how much more
   ``memory_allocated`` grew over that forward than with ``True``, less those bytes.

It prints one table (measured, predicted, relative gap, other allocations, ok/FAIL) and exits 1 if a gap is
above :data:`TOLERANCE`. Without a CUDA GPU it says so and exits 0. Nothing in the course
imports this file; the numbers it prints are measured on the GPU it ran on.
"""
from __future__ import annotations

import gc
import os
import sys

import torch

from course_utils.harness.model import SyntheticData, build_model
from course_utils.runtime.launch import gpu_count
from course_utils.theory.config import TransformerConfig
from course_utils.theory.memory import model_states
from course_utils.theory.planner import plan

#: A Llama-style block (RMSNorm, SwiGLU, RoPE, no biases, untied output): about 0.17B parameters.
CONFIG = TransformerConfig(hidden=1024, layers=8, heads=16, vocab=32000, seq=512, ffn=2816,
                           tied_embeddings=False, bias=False, norm="rmsnorm", mlp="swiglu",
                           position="rope")
MICRO_BATCH = 4
#: Steps before the measured one: AdamW creates m and v in its first step.
WARMUP_STEPS = 1
#: Largest relative gap accepted between measured and predicted bytes (allocator rounding
#: to 512 B blocks, AdamW's step counters if they land on the GPU).
TOLERANCE = 0.01


def _plan_row(strategy: str):
    """The planner's torch-layout row for ``strategy`` on one GPU (FSDP2 for ZeRO-3,
    ``reshard_after_forward=False`` for ZeRO-2)."""
    return plan(CONFIG, framework="torch", gpu_mem_gb=80, gpus_per_node=1, intra_bw_gbps=450,
                inter_bw_gbps=50, seq_len=CONFIG.seq, micro_batch=MICRO_BATCH, choices=[strategy])[0]


def init_one_rank() -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))


def _sharded_model(reshard_after_forward: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cuda", (1,))
    model = build_model(CONFIG, seed=0, device="cuda")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _buffer_bytes(model) -> int:
    return sum(b.numel() * b.element_size() for b in model.buffers() if b.is_cuda)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct CUDA storages behind ``tensors`` (a DTensor counts its local
    shard): what the allocator holds for them, each storage once."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = t.to_local() if hasattr(t, "to_local") else t
            if t.is_cuda:
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def measure_states() -> tuple[int, int, int]:
    """(measured, predicted, other) bytes after an AdamW step, FSDP2 on one rank: measured =
    the storages of the parameters, their gradients and AdamW's states; other = everything
    else ``memory_allocated`` holds then (cuBLAS workspaces, ...)."""
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = _sharded_model(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = SyntheticData(CONFIG, global_batch=MICRO_BATCH, seed=0)
    for step in range(WARMUP_STEPS + 1):
        if step:
            opt.zero_grad(set_to_none=False)
        x, y = (t.cuda() for t in data.batch(step))
        model(x, y).backward()
        opt.step()
        del x, y
    gc.collect()
    torch.cuda.synchronize()
    params = list(model.parameters())
    measured = _storage_bytes(params + [p.grad for p in params]
                              + [v for st in opt.state.values() for v in st.values()])
    other = torch.cuda.memory_allocated() - before - measured
    predicted = _plan_row("ZeRO-3").states
    assert predicted == model_states(CONFIG.num_params(), world_size=1, stage=3, recipe="torch-amp").total
    del model, opt, params
    return measured, predicted, other


def measure_gathered_blocks() -> tuple[int, int, int]:
    """(measured, predicted, other): the bf16 parameters the blocks hold right after forward
    with reshard_after_forward=False (FSDP2 registers the unsharded tensors then), against
    the planner's copies of that row less the root's; other = the growth of
    ``memory_allocated`` over the forward with False minus with True, minus measured."""
    after_forward, held = {}, 0
    data = SyntheticData(CONFIG, global_batch=MICRO_BATCH, seed=0)
    for reshard in (True, False):
        gc.collect()
        torch.cuda.synchronize()
        model = _sharded_model(reshard)
        x, y = (t.cuda() for t in data.batch(0))
        base = torch.cuda.memory_allocated()
        loss = model(x, y)
        torch.cuda.synchronize()
        after_forward[reshard] = torch.cuda.memory_allocated() - base
        if not reshard:
            held = _storage_bytes(p for b in model.blocks for p in b.parameters()
                                  if not hasattr(p, "to_local"))
        loss.backward()
        del model, loss, x, y
    # the planner's copies of that row are every unit's bf16 parameters, root included; the
    # root stays gathered after forward either way, so the blocks' share is what is held
    copies = _plan_row("ZeRO-2").copies
    predicted = copies - 2 * (CONFIG.num_params() - CONFIG.layers * CONFIG.block_params())
    return held, predicted, after_forward[False] - after_forward[True] - held


def main() -> int:
    if not gpu_count():
        print("no CUDA GPU visible: nothing measured. With one GPU this script measures FSDP2's "
              "model states (4 + 4 + 8 B per parameter) and reshard_after_forward=False's gathered "
              "blocks (2 B per parameter) against the planner's torch layout.")
        return 0
    import torch.distributed as dist

    torch.cuda.set_device(0)
    init_one_rank()
    rows = []
    try:
        for what, fn in (("FSDP2 states after AdamW step (16 B/param)", measure_states),
                         ("reshard_after_forward=False: blocks' bf16 params after forward (2 B/param)",
                          measure_gathered_blocks)):
            try:
                m, p, other = fn()
                gap = abs(m - p) / p
                rows.append((what, f"{m:,}", f"{p:,}", f"{gap:.2%}", f"{other:,}",
                             "ok" if gap <= TOLERANCE else "FAIL"))
            except Exception as exc:      # one failing check still lets the other run
                rows.append((what, "-", "-", "-", "-", f"FAIL: {type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()
    head = ("check", "measured B", "predicted B", "gap", "other allocated B", "verdict")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(6)]
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {CONFIG.num_params():,} parameters")
    for r in [head] + rows:
        print("  ".join(f"{str(v):<{w}}" for v, w in zip(r, widths)).rstrip())
    return 0 if all(r[-1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
