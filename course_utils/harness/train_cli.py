"""``python -m course_utils.harness.train_cli --help``: :func:`course_utils.harness.experiments.run`
as a torchrun script: each rank runs :func:`~course_utils.harness.experiments.run_rank` (its model,
data, AdamW and loop: the losses match ``run("single", 1)``) and rank 0 prints and writes the result."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ..impl.common import DEFAULT_BUCKET_BYTES
from ..runtime.fmt import fmt_bytes, plural
from ..runtime.launch import gpu_count
from ..theory.config import COURSE_CONFIG, PRESETS, TransformerConfig
from . import experiments, strategies
from .model import rows_per_rank

__all__ = ["run_and_exit", "main", "parse_args", "model_config", "EPILOG"]

#: The commands ``--help`` ends with: one node, two nodes, one process.
EPILOG = """\
commands:
  one node, 4 ranks:
    torchrun --standalone --nproc-per-node 4 -m course_utils.harness.train_cli --strategy ddp --steps 20
  two nodes of 8 GPUs (run on each node; --node-rank 0 on HOST, 1 on the other):
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank R \\
             --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
             -m course_utils.harness.train_cli --strategy torch-hsdp --shards 8 \\
             --global-batch 32 --steps 20
  one process, no torchrun:
    python -m course_utils.harness.train_cli --strategy single --steps 20

Each rank uses NCCL on GPU LOCAL_RANK when the node has a GPU per local rank,
gloo on CPU (one thread per rank) otherwise. The global batch does not depend on
the number of ranks: it must be divisible by it (default 12 rows: 1, 2, 3, 4, 6, 12 ranks).
"""


def parse_args(argv=None) -> argparse.Namespace:
    names = strategies.strategies()
    p = argparse.ArgumentParser(
        prog="python -m course_utils.harness.train_cli",
        description="Train the course GPT with one strategy; run it under torchrun "
                    "(one process per rank) or alone as one process.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", required=True, metavar="NAME",
                   help=f"one of: {', '.join(names)}")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    p.add_argument("--global-batch", type=int, default=experiments.GLOBAL_BATCH,
                   help=f"rows per step over all ranks (default {experiments.GLOBAL_BATCH}); "
                        "must be divisible by the number of ranks")
    p.add_argument("--config", default="course",
                   choices=["course"] + [n for n, preset in PRESETS.items() if preset.config is not None],
                   help="base model config (default: course, the course's small GPT)")
    for field in ("hidden", "layers", "heads", "vocab", "seq", "ffn"):
        p.add_argument(f"--{field}", type=int, default=None,
                       help=f"override the config's {field}")
    p.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES,
                   help="gradient bucket size of the bucketed strategies (0: one per parameter)")
    p.add_argument("--shards", type=int, default=None,
                   help="torch-hsdp: ranks each model copy is sharded over (default 2; on a cluster, "
                        "the GPUs of one node, so that the all-gathers stay on NVLink)")
    p.add_argument("--no-overlap", action="store_true",
                   help='"ddp": communicate in step(), not during backward')
    p.add_argument("--log-every", type=int, default=1, help="log every N steps (default 1)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="write losses, step times, comm and state bytes here (rank 0)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait before the job fails (default 300)")
    args = p.parse_args(argv)
    if args.strategy not in names:
        p.error(f"unknown strategy {args.strategy!r}; known strategies: {', '.join(names)}")
    for name, least in (("steps", 1), ("global_batch", 1), ("log_every", 1), ("seed", 0), ("bucket_bytes", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if args.shards is not None:
        if "shards" not in strategies.get(args.strategy).options:
            p.error(f"--shards is for torch-hsdp, not {args.strategy!r}")
        if args.shards < 1:
            p.error(f"--shards must be >= 1, got {args.shards}")
    try:
        args.model_config = model_config(args)
    except (TypeError, ValueError) as e:
        p.error(f"invalid model config: {e}")
    return args


def model_config(args: argparse.Namespace) -> TransformerConfig:
    """The config named by ``--config`` with the ``--hidden``... overrides applied."""
    base = COURSE_CONFIG if args.config == "course" else PRESETS[args.config].config
    overrides = {k: getattr(args, k) for k in ("hidden", "layers", "heads", "vocab", "seq", "ffn")
                 if getattr(args, k) is not None}
    return dataclasses.replace(base, **overrides) if overrides else base


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _setup(spec: strategies.Strategy, timeout_s: float):
    """Initialise torch.distributed from torchrun's environment (``COURSE_BACKEND`` tells
    :func:`~course_utils.runtime.launch.rank_device` the device); ``(rank, world, where)``."""
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = _env_int("WORLD_SIZE", 1) if under_torchrun else 1
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    if not spec.distributed:
        if world != 1:
            raise SystemExit(f"error: strategy {spec.name!r} is one process on the whole global "
                             f"batch; run it with --nproc-per-node 1 (or without torchrun), "
                             f"not on {world} ranks")
        return 0, 1, "1 process on CPU, no torch.distributed"
    use_gpu = gpu_count() >= local_world         # NVML: CUDA stays uninitialised until set_device
    backend = "nccl" if use_gpu else "gloo"
    os.environ["COURSE_BACKEND"] = backend     # what course_utils.runtime.launch.rank_device reads
    if use_gpu:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(1)
    alone = {} if under_torchrun else dict(store=dist.HashStore(), rank=0, world_size=1)  # no rendezvous
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **alone)
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = max(1, world // max(local_world, 1))
    where = plural(world, "rank") + (f" on {nodes} nodes" if nodes > 1 else "")
    return rank, world, f"{where}, {'NCCL' if use_gpu else 'gloo on CPU'}"


def _bytes(n) -> str:
    return fmt_bytes(n, "auto", 2, sep=True)


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")   # one write per line: ranks share the terminal
    sys.stdout.flush()


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = strategies.get(args.strategy)
    config: TransformerConfig = args.model_config
    rank, world, where = _setup(spec, args.timeout)
    distributed = spec.distributed
    try:
        try:
            rows = rows_per_rank(args.global_batch, world)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        if rank == 0:
            _print(f"{args.strategy}: {where}; {config.num_params():,} parameters, "
                   f"global batch {args.global_batch} ({rows} rows per rank), {args.steps} steps")
        options = {k: v for k, v in (("bucket_bytes", args.bucket_bytes), ("overlap", not args.no_overlap),
                                     ("shards", args.shards))
                   if k in spec.options and v is not None}          # the flags a strategy has no use for are ignored

        def log(step, loss, seconds):
            if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
                _print(f"step {step + 1} loss {loss:.4f} step_time {seconds * 1e3:.1f} ms")

        # no digest: it would gather the whole model onto every rank's CPU
        result = experiments.run_rank(args.strategy, args.steps, args.seed, config, args.global_batch,
                                      options, on_step=log, digest=False)
        comm, calls, state = result.comm_bytes, result.comm_calls, result.state_bytes
        if rank == 0:
            sent = ", ".join(f"{op} {_bytes(b)} ({calls.get(op, 0)} calls)"
                             for op, b in comm.items() if b or calls.get(op, 0))
            _print(f"sent by rank 0 over {args.steps} steps: {sent or 'nothing'}")
            _print("model states on rank 0: " + ", ".join(f"{k} {_bytes(v)}"
                                                         for k, v in state.items())
                   + f" (total {_bytes(sum(state.values()))})")
            _print(f"median step time {result.step_time_s * 1e3:.1f} ms")
            if args.json:
                out = {"strategy": args.strategy, "world_size": world, "where": where,
                       "steps": args.steps, "seed": args.seed, "global_batch": args.global_batch,
                       "config": dataclasses.asdict(config), "losses": result.losses,
                       "step_times_s": result.step_times_s, "step_time_s": result.step_time_s,
                       "comm_bytes": {k: float(v) for k, v in comm.items()},
                       "comm_calls": {k: int(v) for k, v in calls.items()},
                       "state_bytes": state, "wire_bytes": result.wire_bytes}
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
                _print(f"wrote {args.json}")
        if distributed:
            dist.barrier()
    finally:
        if distributed and dist.is_initialized():
            dist.destroy_process_group()
    return 0


def run_and_exit(argv=None) -> None:
    """Run :func:`main`, then ``os._exit`` with its code, skipping C++ static destruction,
    where a leftover gloo thread can abort a finished run (SIGABRT): seen in about 1 of 11
    runs on torch 2.10 (tests/test_train_cli.py) and once in CI on 2.13 (notebook 07)."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
