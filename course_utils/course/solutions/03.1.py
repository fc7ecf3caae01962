# Exercise 03.1: bytes per GPU. The course's answer.
from course_utils.course.exercises import check_bytes_per_gpu


def bytes_per_gpu_solution(num_params, world_size, stage):
    params = 2 * num_params / (world_size if stage >= 3 else 1)
    grads = 2 * num_params / (world_size if stage >= 2 else 1)
    optimizer = 12 * num_params / (world_size if stage >= 1 else 1)
    return params + grads + optimizer


check_bytes_per_gpu(bytes_per_gpu_solution)
