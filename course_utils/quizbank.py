"""The quiz of each notebook. Numbers in answers are computed by ``course_utils``.

Each entry builds its :class:`~course_utils.quiz.Quiz` on demand:
``quiz.show("00")`` in notebook 00, ``quiz.check("00", 3, "28")`` in tests.
"""
from __future__ import annotations

from .memory import GB, model_states
from .quiz import MultiChoice, Numeric, Quiz, SingleChoice


def quiz_00() -> Quiz:
    zero3 = model_states(7e9, world_size=4, stage=3, recipe="mixed")
    ddp = model_states(7e9, world_size=4, stage=0, recipe="mixed")
    return Quiz("00 orientation", [
        SingleChoice(
            "On a laptop with no GPU, launch(fn, 4) runs the 4 ranks with which backend?",
            ["NCCL, one GPU per rank", "gloo, on CPU processes", "a single process, simulated"],
            "b",
            "backend='auto' picks NCCL only when there is one GPU per rank; otherwise each rank "
            "is a real CPU process talking gloo.",
        ),
        SingleChoice(
            "Inside a function run by launch, how does a rank learn which rank it is?",
            ["It reads a global variable set by the notebook", "dist.get_rank()",
             "It counts the processes with os.getpid()"],
            "b",
            "launch initialises the default process group in every rank before calling fn, "
            "exactly as a torchrun script does after init_process_group.",
        ),
        MultiChoice(
            "Which model states does ZeRO-2 shard across the data-parallel ranks?",
            ["optimizer states", "gradients", "parameters", "activations"],
            "a,b",
            "ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the "
            "parameters. No ZeRO stage shards activations.",
        ),
        Numeric(
            "From the course map: a 7B-parameter model on 4 GPUs with ZeRO-3 and mixed-precision "
            "Adam (2 + 2 + 12 bytes per parameter). Model states per GPU?",
            zero3.total / GB, unit="GB", tol=0.5, minimum=0,
            explanation=f"16 bytes x 7e9 / 4 = {zero3.total / GB:g} GB, against "
                        f"{ddp.total / GB:g} GB per GPU for plain DDP.",
        ),
        SingleChoice(
            "Why are the ranks forked from the notebook's process when possible?",
            ["Forking is required by gloo",
             "It starts in about 0.1 s and functions defined in the notebook work",
             "Forked ranks share one GPU"],
            "b",
            "Spawning starts fresh interpreters (seconds) that can only run importable "
            "functions; forking copies this process, so the ranks already know your cells.",
        ),
    ])


QUIZZES = {"00": quiz_00}
