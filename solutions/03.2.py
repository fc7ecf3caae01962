# Exercise 03.2: the smallest stage that fits. The course's answer.
from course_utils.course.exercises import check_smallest_fitting_stage
from course_utils.theory.memory import GB, per_gpu


def smallest_stage_solution(model, gpus, gpu_gb, micro_batch, seq):
    for stage in range(4):
        m = per_gpu(model, world_size=gpus, stage=stage, micro_batch=micro_batch, seq=seq, attention="flash")
        if m.total <= gpu_gb * GB:
            return stage
    return None


check_smallest_fitting_stage(smallest_stage_solution)
