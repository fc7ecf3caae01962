# Exercise 08.1: fix the hang. The course's answer.
import torch
import torch.distributed as dist
from course_utils.course import exercises


def skipped_collective_solution():
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.tensor(float(rank + 1))
    dist.all_reduce(loss)                 # every rank
    loss /= world
    if rank == 0:                         # only the printing is rank 0's
        print(f"mean loss {loss.item():.3f}")
    return loss.item()


exercises.check_skipped_collective(skipped_collective_solution)
