# Exercise 01.1: all-reduce from reduce-scatter and all-gather. The course's answer.
import torch
import torch.distributed as dist
import torch.nn.functional as F
from course_utils.course.exercises import check_all_reduce_from_rs_ag
from course_utils.runtime import compat


def my_all_reduce_solution(tensor):
    n = dist.get_world_size()
    flat = tensor.reshape(-1)
    padded = F.pad(flat, (0, (-flat.numel()) % n))
    shard = torch.empty(padded.numel() // n, dtype=padded.dtype, device=padded.device)
    compat.reduce_scatter_tensor(shard, padded)
    full = torch.empty_like(padded)
    compat.all_gather_into_tensor(full, shard)
    return full[: flat.numel()].reshape(tensor.shape)


check_all_reduce_from_rs_ag(my_all_reduce_solution)
