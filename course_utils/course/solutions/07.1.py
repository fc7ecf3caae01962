# Exercise 07.1: an FSDP2 step, composed. The course's answer.
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from course_utils.course.exercises import check_fsdp_step


def fsdp_step_solution(model, micro_batches, max_norm):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))   # the checker's ranks are gloo CPU ranks
    for block in model.blocks:                                  # 1. a unit per block, then the root
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):                  # 2. reduce-scatter after the last only
        model.set_requires_gradient_sync(i == k - 1)
        (model(x, y) / k).backward()                            # the mean over the k micro-batches
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)   # 3. the global norm


check_fsdp_step(fsdp_step_solution)
