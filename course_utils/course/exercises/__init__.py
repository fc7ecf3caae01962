"""The exercises' graders (``check_*``), one module per notebook, on :mod:`course_utils.labs.grading`."""
from ...labs.grading import GRADER_BACKEND, Verdict, compare, grade_cases, grade_on_ranks
from .nb00 import check_rank_sum
from .nb01 import NotAllowed, check_all_reduce_from_rs_ag, check_ring_all_reduce
from .nb02 import check_ddp, check_grad_average_hook
from .nb03 import check_bytes_per_gpu
from .nb04 import check_mixed, check_zero1
from .nb05 import check_zero2
from .nb06 import check_prefetch, check_zero3
from .nb07 import check_fsdp_step
from .nb08 import CAPSTONE_SCENARIOS, Scenario, check_capstone, check_skipped_collective, reference_choice
from .nb09 import check_megatron_states_gb
from .nb10 import check_real_rows
from .nb12 import check_zero3_step_bytes
from .solutions import BUILDS, answer, course_answer, hint, once_predicted, skeleton, solution, versus, yours

__all__ = ["GRADER_BACKEND", "Verdict", "compare", "grade_cases", "grade_on_ranks",
           "check_rank_sum",
           "NotAllowed", "check_all_reduce_from_rs_ag", "check_ring_all_reduce",
           "check_grad_average_hook", "check_ddp",
           "check_bytes_per_gpu",
           "check_zero1", "check_mixed",
           "check_zero2", "check_zero3", "check_prefetch",
           "check_fsdp_step", "check_skipped_collective",
           "CAPSTONE_SCENARIOS", "Scenario", "reference_choice", "check_capstone",
           "check_megatron_states_gb", "check_real_rows", "check_zero3_step_bytes", "BUILDS", "answer", "course_answer", "hint", "once_predicted", "skeleton", "solution", "yours", "versus"]
