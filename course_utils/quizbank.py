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


def quiz_03() -> Quiz:
    from .comm import comm_volume
    from .config import PRESETS

    z2_13b = model_states(13e9, world_size=8, stage=2)
    ratio = comm_volume(1e9, world_size=8, stage=3)["total"] / comm_volume(1e9, world_size=8, stage=0)["total"]
    gpt2 = PRESETS["gpt2-xl"].num_params
    return Quiz("03 where the memory goes", [
        Numeric("Mixed-precision training with Adam, no sharding: how many bytes of model states "
                "per parameter (the ZeRO paper's 2 + 2 + K)?",
                model_states(1, recipe="mixed").total, unit="bytes", tol=0, minimum=0,
                explanation="2 (bf16/fp16 weights) + 2 (their gradients) + 12 (fp32 master copy, "
                            "Adam's momentum and variance) = 16."),
        Numeric("The seeds' exercise: a 13B model on 8 GPUs with ZeRO-2 (mixed precision, K = 12). "
                "Model states per GPU?",
                z2_13b.total / GB, unit="GB", tol=0.05, minimum=0,
                explanation=f"Params stay whole: 2 x 13 = 26 GB; gradients and optimizer states are "
                            f"sharded: (2 + 12) x 13 / 8 = 22.75 GB; total {z2_13b.total / GB:g} GB."),
        SingleChoice("A tutorial draws DDP for 7B parameters as 14 + 14 + 56 = 84 GB per GPU, then "
                     "tabulates 112 GB. What does the 84 GB drawing leave out?",
                     ["The activations", "The fp32 master copy of the weights (4 bytes/param)",
                      "The CUDA context", "Nothing: both are right for different GPUs"],
                     "b",
                     "Adam's m and v are 8 bytes per parameter (56 GB); mixed precision also keeps "
                     "an fp32 copy of the weights, 4 more bytes (28 GB): 14 + 14 + 84 = 112 GB."),
        MultiChoice("Which of these reduce activation memory per GPU?",
                    ["ZeRO-3", "Activation recomputation", "A fused (flash) attention kernel",
                     "A smaller micro-batch"],
                    "b,c,d",
                    "ZeRO shards model states, not activations: each rank's activations come from its "
                    "own data and are not redundant. Recomputation, flash attention and smaller "
                    "micro-batches all shrink them."),
        SingleChoice("DeepSpeed's estimator prints '... GB' per GPU. What unit is that?",
                     ["10^9 bytes", "2^30 bytes (GiB)", "10^6 bytes"],
                     "b",
                     "It divides by 2**30, like nvidia-smi's MiB/GiB; the ZeRO paper's GB are 10^9 "
                     "bytes, 7% smaller."),
        Numeric("With ring collectives on 8 ranks, ZeRO-3 sends how many times the bytes DDP "
                "sends per step?", ratio, tol=0.01, minimum=0,
                explanation="DDP: all-reduce = 2(N-1)/N·M. ZeRO-3: all-gather in forward and in "
                            "backward plus a reduce-scatter = 3(N-1)/N·M: 1.5x."),
        Numeric("gpt2-xl has how many billion parameters (to two decimals)?", round(gpt2 / 1e9, 2),
                unit="billion", tol=0.005, minimum=0,
                explanation=f"Exactly {gpt2:,}: 48 blocks of h = 1600, a 50257-token vocabulary "
                            "and 1024 learned positions."),
    ])


QUIZZES["03"] = quiz_03


def quiz_01() -> Quiz:
    from .comm import collective_bytes

    m = 1e9  # a 1 GB message
    return Quiz("01 collectives", [
        SingleChoice("After dist.all_reduce(t) with the default op on 4 ranks, what does each rank hold?",
                     ["Its own tensor, unchanged", "The sum of the 4 tensors",
                      "A quarter of the sum", "The tensor of rank 0"],
                     "b", "all_reduce replaces every rank's tensor with the elementwise sum (op=SUM)."),
        SingleChoice("Which pair of collectives, run one after the other, equals an all-reduce?",
                     ["broadcast then reduce", "reduce-scatter then all-gather",
                      "scatter then gather", "all-gather then reduce-scatter"],
                     "b", "Reduce-scatter leaves each rank with the sum of one shard; all-gather then gives "
                          "every rank every summed shard. That is exactly how the ring all-reduce works."),
        Numeric("Ring all-reduce of a 1 GB message on 4 ranks: how many GB does each rank send?",
                collective_bytes("all_reduce", m, 4) / 1e9, unit="GB", tol=0.01, minimum=0,
                explanation="2(N-1)/N x M = 2 x 3/4 x 1 GB = 1.5 GB: N-1 steps of reduce-scatter and "
                            "N-1 of all-gather, each sending M/N."),
        Numeric("And for a reduce-scatter of the same 1 GB message on 8 ranks?",
                collective_bytes("reduce_scatter", m, 8) / 1e9, unit="GB", tol=0.01, minimum=0,
                explanation="(N-1)/N x M = 7/8 GB: each rank forwards N-1 chunks of M/N."),
        MultiChoice("In the alpha-beta model t = alpha x steps + bytes / bandwidth, which are true?",
                    ["Small messages are dominated by the latency term alpha",
                     "Large messages are dominated by the bandwidth term",
                     "Bucketing many small tensors into one message reduces the number of alpha terms paid",
                     "The ring all-reduce sends fewer bytes per rank as N grows"],
                    "a,b,c",
                    "The ring sends 2(N-1)/N x M per rank: that grows towards 2M with N, it does not shrink. "
                    "Latency dominates small messages, which is why DDP buckets gradients."),
    ])


def quiz_02() -> Quiz:
    from .comm import comm_volume

    gpt2 = 1.56e9
    vol = comm_volume(gpt2, world_size=4, stage=0, bytes_per_elem=4)["all_reduce"]
    return Quiz("02 data parallelism", [
        SingleChoice("Four ranks each compute the mean loss on their 2 samples of an 8-sample global "
                     "batch. To match one process on all 8 samples, the gradients are...",
                     ["summed across ranks", "averaged across ranks", "taken from rank 0",
                      "averaged, then multiplied by 8"],
                     "b", "The mean over 8 samples is the average of the 4 per-rank means (equal "
                          "shares), so the gradient of the global loss is the average of the gradients."),
        SingleChoice("Why does DDP broadcast rank 0's parameters when it wraps the model?",
                     ["To save memory", "So every rank starts from the same weights; otherwise the "
                      "replicas drift apart even with averaged gradients", "To warm up the network",
                      "It does not"],
                     "b", "Averaged gradients keep equal replicas equal; they cannot make unequal ones equal."),
        Numeric("gpt2-xl (1.56B params) with fp32 gradients on 4 GPUs: GB each GPU sends in the "
                "gradient all-reduce per step (ring)?", vol / 1e9, unit="GB", tol=0.05, minimum=0,
                explanation="2(N-1)/N x 4 bytes x 1.56e9 = 1.5 x 6.24 GB = 9.36 GB, whatever the batch "
                            "size: that is why the overhead shrinks as the batch grows."),
        MultiChoice("What do DDP's gradient buckets buy?",
                    ["Fewer, larger messages: less latency overhead",
                     "Communication that starts while backward is still running (overlap)",
                     "Less communication volume",
                     "Less gradient memory"],
                    "a,b", "The bytes are the same; buckets trade many small all-reduces for a few large "
                           "ones and let them overlap with the rest of backward."),
        SingleChoice("Gradient accumulation over 4 micro-batches of 15 on one GPU took 3.7x the step "
                     "time of one micro-batch of 15, not 4x. Why?",
                     ["The GPU warmed up", "The optimizer step (and other per-step work) runs once, "
                      "not 4 times", "Accumulation skips the backward pass",
                      "Communication was overlapped"],
                     "b", "4 x (forward + backward) + 1 x optimizer step: with the seed's numbers, about "
                          "359 ms per forward+backward and 34 ms for the step."),
    ])


QUIZZES["01"] = quiz_01
QUIZZES["02"] = quiz_02
