"""The orientation demo as a torchrun script: what a notebook's launch(fn, N) does on a cluster.

    torchrun --standalone --nproc-per-node 4 scripts/hello_ranks.py          # one machine, 4 ranks
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 \\
             --rdzv-backend c10d --rdzv-endpoint HOST:29500 scripts/hello_ranks.py   # node 0 of 2

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; the script picks NCCL
when every local rank has a GPU, gloo on CPU otherwise (as launch does).
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # device_count() asks NVML and leaves CUDA uninitialised (is_available() would not)
    use_gpu = torch.cuda.device_count() >= local_world
    if use_gpu:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if use_gpu else "gloo", timeout=timedelta(seconds=120))
    device = torch.device("cuda", local_rank) if use_gpu else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    line = (f"rank {rank} of {world} on {os.uname().nodename} ({device}, {dist.get_backend()}): "
            f"all-reduced {t.item():g}, expected {world * (world + 1) / 2:g}\n")
    sys.stdout.write(line)  # one write per line: ranks share the terminal
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
