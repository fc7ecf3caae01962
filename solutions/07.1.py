# Exercise 07.1: auto-wrap by hand. The course's answer.
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from course_utils.course.exercises import check_fsdp_wrap


def fsdp_wrap_solution(model):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))   # the checker's ranks are gloo CPU ranks
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


check_fsdp_wrap(fsdp_wrap_solution)
