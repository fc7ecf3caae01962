"""The quiz of each notebook. Numbers in answers are computed by ``course_utils``.

Each entry builds its :class:`~course_utils.course.questions.Quiz` on demand:
``quiz.show("00")`` in notebook 00, ``quiz.check("00", 3, "28")`` in tests.
"""
from __future__ import annotations

from ..theory.memory import GB, model_states
from .questions import MultiChoice, Numeric, Quiz, SingleChoice


def quiz_00() -> Quiz:
    ddp = model_states(7e9, world_size=4, stage=0, recipe="mixed")
    everything = model_states(7e9, world_size=4, stage=3, recipe="mixed")
    budget = 80                                # GB per GPU, model states only
    gpus = next(n for n in range(1, 1000)
                if model_states(13e9, world_size=n, stage=3, recipe="mixed").total / GB <= budget)
    whole = model_states(13e9, world_size=1, stage=0, recipe="mixed").total / GB
    return Quiz("00 orientation", [
        Numeric(
            "The course map's formula: a 7B-parameter model, mixed-precision Adam (2 + 2 + 12 bytes "
            "per parameter), plain data parallelism (DDP) on 4 GPUs. GB of model states per GPU?",
            ddp.total / GB, unit="GB", tol=0.5, minimum=0,
            explanation=f"DDP keeps a full copy on every GPU: 16 bytes x 7e9 = {ddp.total / GB:g} GB, "
                        f"whatever the number of GPUs. The map's last column splits all 16 bytes "
                        f"over the 4 GPUs: {everything.total / GB:g} GB.",
        ),
        Numeric(
            f"If all 16 bytes per parameter are split evenly over the GPUs (the map's last column), "
            f"how many {budget} GB GPUs does a 13B-parameter model need, at least, for its model "
            "states alone?",
            gpus, tol=0, minimum=1,
            explanation=f"16 x 13e9 = {whole:g} GB in all; {whole:g} / {gpus - 1} = "
                        f"{whole / (gpus - 1):.1f} GB is over {budget}, {whole:g} / {gpus} = "
                        f"{whole / gpus:.1f} GB fits: {gpus} GPUs, with what is left for activations "
                        f"and buffers. Plain DDP fits on no number of them: {whole:g} GB on every GPU.",
        ),
        Numeric(
            "Section 3's hello() on 3 ranks instead of 4: each rank puts rank + 1 in a tensor and "
            "all-reduces it. What does rank 0's tensor hold afterwards?",
            1 + 2 + 3, tol=0,
            explanation="all_reduce (op=SUM) gives every rank the sum of every rank's tensor: "
                        "1 + 2 + 3 = 6, on all 3 ranks, not only rank 0.",
        ),
        SingleChoice(
            "A `%%ranks 3` cell ends with `result = rank * 10`. What is `result` in the notebook "
            "after the cell has run?",
            ["[0, 10, 20]: one entry per rank, in rank order",
             "20: the value of the last rank to finish",
             "0: rank 0's value, as torchrun would print it",
             "30: the ranks' values are summed"],
            "a",
            "Whatever each rank assigns to result comes back as a list indexed by rank. Nothing is "
            "combined across ranks unless the cell itself calls a collective.",
        ),
        SingleChoice(
            "Four processes started by hand (nothing watches them) train together. Rank 2 raises "
            "an error just before an all-reduce that ranks 0, 1 and 3 are already waiting in. "
            "What do ranks 0, 1 and 3 do?",
            ["They finish the all-reduce with the sum of their three tensors",
             "They keep waiting in the all-reduce until the process group's timeout",
             "They raise rank 2's error at the same moment",
             "They skip the all-reduce and continue with the next step"],
            "b",
            "A collective completes only when every rank of the group has joined it, and a waiting "
            "rank cannot tell a slow peer from a dead one. That is why a launcher (torchrun, or "
            "this course's launch) watches the processes and stops the others when one fails.",
        ),
        SingleChoice(
            "The same failure inside launch(fn, 4) in a notebook cell. What does the cell do?",
            ["It fails within a fraction of a second with a LaunchError naming rank 2: the launcher "
             "sees the failed process and stops the other three",
             "It waits until timeout_s, then raises LaunchTimeout for ranks 0, 1 and 3",
             "It returns the results with None in rank 2's place",
             "It prints rank 2's traceback and returns the other ranks' results"],
            "a",
            "The launcher watches every process: one that exits with an error fails the cell at "
            "once, and LaunchError carries that rank's traceback. A timeout is for the other case, "
            "a rank that never arrives (section 3.3).",
        ),
    ])


QUIZZES = {"00": quiz_00}


def quiz_03() -> Quiz:
    from ..harness.model import build_model
    from ..theory.config import PRESETS

    z2_13b = model_states(13e9, world_size=8, stage=2)
    seven = {stage: model_states(7e9, world_size=4, stage=stage, recipe="mixed") for stage in range(4)}
    budget = 40                                # GB per GPU, model states only
    fits = next(stage for stage, m in seven.items() if m.total / GB <= budget)
    names = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    gpt2 = PRESETS["gpt2-xl"].num_params
    xl = model_states(gpt2, recipe="mixed-fp32-grads")
    tensors = len({id(p) for p in build_model(device="meta").parameters()})
    steps = 4 * tensors                       # AdamW's fp32 step counter, one per tensor
    return Quiz("03 where the memory goes", [
        Numeric("Mixed-precision training with Adam, no sharding: how many bytes of model states "
                "per parameter (the ZeRO paper's 2 + 2 + K)?",
                model_states(1, recipe="mixed").total, unit="bytes", tol=0, minimum=0,
                explanation="2 (bf16/fp16 weights) + 2 (their gradients) + 12 (fp32 master copy, "
                            "Adam's momentum and variance) = 16."),
        Numeric("A classic exercise: a 13B model on 8 GPUs with ZeRO-2 (mixed precision, K = 12). "
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
        SingleChoice(f"Trained one step with AdamW, the course GPT's optimizer holds {steps} bytes more "
                     "than the formula (8 or 12 bytes x Ψ), the same in every recipe. Why?",
                     ["The allocator rounds every tensor up to a multiple of 512 bytes",
                      f"AdamW keeps a 4-byte step counter per parameter tensor, and the model has "
                      f"{tensors} of them",
                      "The fp32 master copy of the tied embedding is stored twice",
                      "The flat buffer is padded to a multiple of the world size"],
                     "b",
                     f"{tensors} parameter tensors (the tied embedding counted once) x 4 bytes = {steps} "
                     "bytes: the formula counts bytes per parameter element, the counter is one per "
                     "tensor. Allocator rounding is not counted by the tensors' bytes, and one process "
                     "has no padding."),
        SingleChoice(
            f"A 7B-parameter model, mixed-precision Adam (2 + 2 + 12 bytes per parameter), 4 GPUs of "
            f"{budget} GB each. Counting model states only, which is the least sharding that fits?",
            names, "abcd"[fits],
            "Per GPU: " + ", ".join(f"{names[st]} {m.total / GB:g} GB" for st, m in seven.items())
            + f". {names[fits]} is the first under {budget} GB; it leaves "
            f"{budget - seven[fits].total / GB:g} GB for activations and buffers, so a real run may "
            "still need the next stage.",
        ),
        Numeric(f"gpt2-xl ({gpt2:,} parameters) trained as Megatron-LM does, on one GPU: bf16 weights, "
                "fp32 gradients, fp32 Adam with master weights. Model states in GB?",
                xl.total / GB, unit="GB", tol=0.1, minimum=0,
                explanation=f"The 'mixed-fp32-grads' recipe: 2 + 4 + 12 = 18 bytes x {gpt2:,} = "
                            f"{xl.total / GB:.2f} GB, before a single activation; with 2-byte gradients "
                            f"it would be 16 bytes, {16 * gpt2 / GB:.2f} GB."),
    ])


QUIZZES["03"] = quiz_03


def quiz_01() -> Quiz:
    from ..theory.comm import collective_bytes

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
        Numeric("In the ring model, how many GB does each rank send for a reduce-scatter of the same "
                "1 GB message on 8 ranks?",
                collective_bytes("reduce_scatter", m, 8) / 1e9, unit="GB", tol=0.01, minimum=0,
                explanation="(N-1)/N x M = 7/8 GB: each rank forwards N-1 chunks of M/N. gloo's wire "
                            "shows twice that (section 3.2): it runs a reduce-scatter as an all-reduce."),
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
    from ..theory.comm import comm_volume

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
                     ["To check that every rank built the same architecture; the weights themselves "
                      "may differ", "So every rank starts from the same weights; otherwise the "
                      "replicas drift apart even with averaged gradients",
                      "So that rank 0 can skip the first gradient all-reduce",
                      "It does not: each rank keeps its own initialisation, and averaging the "
                      "gradients makes the replicas converge"],
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
                     ["A larger effective batch keeps the GPU busier, so each micro-batch runs faster",
                      "The optimizer step (and other per-step work) runs once, not 4 times",
                      "Only the last micro-batch runs a backward pass",
                      "The gradients are accumulated in bf16, which is faster than fp32"],
                     "b", "4 x (forward + backward) + 1 x optimizer step: with the published gpt2-xl numbers, about "
                          "359 ms per forward+backward and 34 ms for the step."),
    ])


QUIZZES["01"] = quiz_01
QUIZZES["02"] = quiz_02


def quiz_04() -> Quiz:
    from ..theory.comm import collective_bytes
    from ..theory.config import COURSE_CONFIG
    from ..theory.layout import padded_numel

    psi = COURSE_CONFIG.num_params()                    # the course GPT
    z1_8 = 8 * (padded_numel(psi, 8) // 8) + 4           # AdamW m, v + one step counter, 8 ranks
    rs = collective_bytes("reduce_scatter", 4 * psi, 4)
    ar = collective_bytes("all_reduce", 4 * psi, 4)
    ag = collective_bytes("all_gather", 4 * psi, 4)
    return Quiz("04 ZeRO-1", [
        MultiChoice(
            "Which states does each rank keep for its own 1/N shard only, in ZeRO-1 (mixed "
            "precision, as in the ZeRO paper)?",
            ["Adam's m and v", "the fp32 master weights", "the bf16 parameters", "the gradients"],
            "a,b",
            "ZeRO-1 shards all K = 12 bytes of optimizer state: m, v and the fp32 master copy. "
            "A calculator that shards only m and v (8 bytes) under-counts the saving.",
        ),
        SingleChoice(
            "In the ring model ZeRO-1 sends what DDP sends, but on gloo the wire measured 1.5x DDP's "
            "bytes. Why?",
            ["The 2 padding elements of the flat buffer",
             "gloo runs the reduce-scatter as a full all-reduce, so ZeRO-1 sends an all-reduce plus "
             "an all-gather",
             "The optimizer states are sent to the other ranks after each step",
             "The all-gather sends every shard twice"],
            "b",
            f"On 4 ranks with the course GPT in fp32: DDP's all-reduce sends {ar:,.0f} bytes; gloo's "
            f"reduce-scatter costs the same, and the all-gather adds {ag:,.0f}: ({ar:,.0f} + {ag:,.0f}) / "
            f"{ar:,.0f} = {(ar + ag) / ar:g}. The padding is 8 bytes of a {4 * psi:,}-byte gradient; NCCL's "
            "ring reduce-scatter sends half an all-reduce, and the 1.5 becomes 1.",
        ),
        SingleChoice(
            "Compared with DDP's all-reduce of the gradients, what does ZeRO-1 send per step "
            "(ring algorithms, Ψ divisible by N)?",
            ["half as much: only the reduce-scatter half of an all-reduce",
             "the same bytes: a reduce-scatter and an all-gather",
             "1.5 times as much: a reduce-scatter and an all-gather on top of DDP's all-reduce",
             "(N-1)/N of DDP's bytes: no rank sends its own shard"],
            "b",
            "An all-reduce is a reduce-scatter followed by an all-gather. ZeRO-1 does the same two "
            "halves, with the optimizer step in between. With padding it sends slightly more.",
        ),
        Numeric(
            "All-reduce then keep your slice, instead of a reduce-scatter: on 4 ranks with the "
            "course GPT in fp32, how many times the bytes of the gradient part does one rank send, "
            "in the ring model?",
            ar / rs, tol=0.01, minimum=0,
            explanation=f"all-reduce 2(N-1)/N·M = {ar:,.0f} bytes against reduce-scatter "
                        f"(N-1)/N·M = {rs:,.0f}: the all-gather half of the all-reduce gives every "
                        "rank gradients it throws away.",
        ),
        Numeric(
            "Section 6 measured ZeRO-1's optimizer bytes per rank on 1, 2 and 4 ranks. Predict them on 8 "
            "ranks: the course GPT in fp32 with AdamW (Ψ = 129,350 elements, padded to a multiple of 8).",
            z1_8, unit="bytes", tol=0.5, minimum=0,
            explanation=f"The padded buffer has {padded_numel(psi, 8):,} elements, {padded_numel(psi, 8) // 8:,} per "
                        f"rank; AdamW's m and v take 8 bytes per element, plus its 4-byte step counter of the one "
                        f"shard parameter: 8 x {padded_numel(psi, 8) // 8:,} + 4 = {z1_8:,} bytes.",
        ),
        SingleChoice(
            "Why must the flat buffer be padded to a multiple of the world size?",
            ["So that each shard starts on a 128-byte boundary, which the optimizer kernels need",
             "Reduce-scatter and all-gather on one flat tensor need equal chunks on every rank "
             "(gloo refuses uneven sizes)",
             "So that the padding elements can hold AdamW's step counter",
             "So that every rank's shard holds whole parameter tensors"],
            "b", "Each rank owns exactly P/N elements; the last shard ends in padding zeros, which "
                 "get zero gradients and stay zero.",
        ),
    ])


def quiz_05() -> Quiz:
    from ..theory.layout import padded_numel
    from ..theory.config import COURSE_CONFIG, PRESETS
    from ..theory.memory import activation_bytes, per_gpu

    psi = COURSE_CONFIG.num_params()
    n = 4
    padded = padded_numel(psi, n)
    ddp = per_gpu("gpt2-xl", world_size=4, stage=0, recipe="mixed-fp32-grads", micro_batch=15,
                  seq=1024, attention="flash")
    z1 = per_gpu("gpt2-xl", world_size=4, stage=1, recipe="mixed-fp32-grads", micro_batch=15,
                 seq=1024, attention="flash")
    peak_one = 4 * psi + 4 * padded_numel(psi, 2) // 2     # one bucket on 2 ranks (notebook 05 §3)
    xl = PRESETS["gpt2-xl"].num_params
    freed = (model_states(xl, world_size=8, stage=0, recipe="mixed-fp32-grads").total
             - model_states(xl, world_size=8, stage=2, recipe="mixed-fp32-grads").total)
    act = activation_bytes("gpt2-xl", micro_batch=1, seq=1024, attention="flash", cross_entropy="fused").total

    def largest_batch(stage):           # notebook 05 §5's largest_batch, on 8 GPUs
        mb = 0
        while per_gpu("gpt2-xl", world_size=8, stage=stage, recipe="mixed-fp32-grads", micro_batch=mb + 1,
                      seq=1024, attention="flash", cross_entropy="fused").total <= 80 * GB:
            mb += 1
        return mb

    ddp_mb, z2_mb = largest_batch(0), largest_batch(2)
    return Quiz("05 ZeRO-2", [
        SingleChoice(
            "What does ZeRO-2 shard that ZeRO-1 keeps whole on every rank?",
            ["the parameters", "the gradients", "the activations", "the optimizer states"],
            "b", "ZeRO-1 shards the optimizer states; ZeRO-2 also the gradients. Parameters wait for "
                 "ZeRO-3; activations are never sharded by ZeRO.",
        ),
        SingleChoice(
            "Which collective does ZeRO-2 use on the gradients during backward?",
            ["an all-reduce of every bucket, then each rank keeps its slice",
             "a reduce-scatter of each bucket",
             "an all-gather of each bucket's gradient shards",
             "none during backward: one all-reduce after the optimizer step"],
            "b", "An all-reduce would hand every rank the full gradient, the very thing ZeRO-2 avoids; "
                 "an all-gather moves parameters, not gradients to be summed. The ledger of "
                 "section 2 shows reduce-scatters only.",
        ),
        Numeric(
            f"Course GPT (Ψ = {psi:,}), fp32, ZeRO-2 on {n} ranks: bytes of gradient each rank "
            "keeps once optimizer.step() has run (one bucket)?",
            4 * padded / n, unit="bytes", tol=0.5, minimum=0,
            explanation=f"Ψ padded to {padded:,}; 4 bytes x {padded:,} / {n} = {4 * padded // n:,} bytes "
                        "(the shard's gradient). That is already all a rank holds when backward "
                        "returns: the callback ZeRO-2 queues for the end of backward waits for the "
                        "last reduce-scatter, and each full gradient was freed when its bucket was sent.",
        ),
        SingleChoice(
            f"With one 25 MiB bucket on 2 ranks, ZeRO-2's measured peak gradient memory was "
            f"{peak_one:,} bytes, more than ZeRO-1's {4 * psi:,}. Why?",
            ["ZeRO-2 keeps an fp32 master copy of the gradients",
             "With one bucket nothing is sent before backward has produced every gradient: all the "
             "full gradients wait, then sit next to the shard buffer",
             "gloo runs the reduce-scatter as an all-reduce, so every rank receives the full gradient",
             "The flat buffer is padded to a multiple of the world size"],
            "b",
            f"Peak = every full gradient, 4Ψ = {4 * psi:,} B, plus the shard buffer, 4P/N = "
            f"{4 * padded_numel(psi, 2) // 2:,} B: {peak_one:,} B. ZeRO-1 accumulates into its flat "
            "buffer directly (4Ψ). Smaller buckets are sent during backward and freed, so the "
            "peak falls towards the shard. How gloo sends changes the bytes on the wire, not the "
            "gradient bytes a rank holds, and there is no padding on 2 ranks (129,350 is even).",
        ),
        SingleChoice(
            "Once parameters, gradients and optimizer states are all sharded, what usually "
            "dominates a GPU's memory in large-batch training?",
            ["the optimizer states", "the gradients", "the activations",
             "the communication buffers (gradient buckets)"],
            "c", "ZeRO shards model states, not activations; they grow with batch and sequence "
                 "length. Recomputation or tensor/sequence parallelism address them.",
        ),
        Numeric(
            f"gpt2-xl (Ψ = {xl:,}) with fp32 gradients (2 + 4 + 12 bytes per parameter) on 8 GPUs: "
            "how many GB per GPU does ZeRO-2 free for activations, compared with DDP?",
            freed / GB, unit="GB", tol=0.2, minimum=0,
            explanation=f"ZeRO-2 shards the gradients and the optimizer states, 4 + 12 = 16 bytes: "
                        f"16 x Ψ x 7/8 = {freed / GB:.1f} GB. A sequence of 1024 tokens costs "
                        f"{act / GB:.2f} GB of activations (flash attention, fused cross-entropy), so about "
                        f"{freed / act:.0f} more sequences fit per GPU: the calculator's {ddp_mb} -> "
                        f"{z2_mb} in 80 GB. DDP's batch per GPU stays {ddp_mb} whatever the number of GPUs.",
        ),
        Numeric(
            "gpt2-xl, DP = 4, 15 sequences of 1024 per GPU, bf16 weights with fp32 gradients and "
            "fp32 Adam states (Megatron). A published benchmark measured 79 -> 65 GB when sharding was turned on. "
            "How many GB does sharding the optimizer states alone save (12 bytes per parameter, sharded 4 ways)?",
            (ddp.total - z1.total) / GB, unit="GB", tol=0.2, minimum=0,
            explanation=f"12 bytes x 1.56e9 x 3/4 = {(ddp.total - z1.total) / GB:.1f} GB: the benchmark's "
                        "14 GB drop matches ZeRO-1's saving; sharding the fp32 gradients too would "
                        "save 4.7 GB more.",
        ),
    ])


QUIZZES["04"] = quiz_04
QUIZZES["05"] = quiz_05


def quiz_06() -> Quiz:
    from ..theory.comm import collective_calls, comm_volume

    units = 5                                  # the course GPT: 4 blocks + the root
    calls = collective_calls(3, num_layers=units, skip_last_regather=True)
    z3 = comm_volume(7e9, world_size=4, stage=3)["total"]
    ddp = comm_volume(7e9, world_size=4, stage=0)["total"]
    states = model_states(7e9, world_size=4, stage=3, recipe="mixed")
    target = 10                                # GB of model states per GPU
    enough = next(n for n in range(1, 1000)
                  if model_states(7e9, world_size=n, stage=3, recipe="mixed").total / GB <= target)
    return Quiz("06 ZeRO-3", [
        SingleChoice(
            "In ZeRO-3, when does a rank hold a layer's full parameters?",
            ["always", "only while that layer runs, gathered just before (forward and backward)",
             "only during the optimizer step", "never: each rank computes with its shard only"],
            "b", "ZeRO-3 all-gathers a unit's parameters when it is needed and frees them after, in "
                 "forward and again in backward. The optimizer step needs only the shard; computing "
                 "with the shard alone would need the activations exchanged instead (tensor "
                 "parallelism, section 9).",
        ),
        Numeric("The course GPT is sharded as 5 units (4 blocks + the root, which stays gathered "
                "from its forward to the end of backward). How many all-gathers per training step?",
                calls["all_gather"], tol=0, minimum=0,
                explanation=f"Each block is gathered in forward and again in backward (2 x 4), the root "
                            f"once: {calls['all_gather']} = 2L + 1 with L = 4 blocks (5 units: the blocks and "
                            "the root)."),
        Numeric("And how many reduce-scatters per step?", calls["reduce_scatter"], tol=0, minimum=0,
                explanation="One per unit: every unit's gradients are reduce-scattered as soon as its "
                            "backward is done (a popular exercise counts one, for one layer: wrong)."),
        Numeric("Ring volume per rank of ZeRO-3 divided by DDP's (same model, same N, every unit "
                "gathered twice)?", z3 / ddp, tol=0.01, minimum=0,
                explanation="All-gather in forward + all-gather in backward + reduce-scatter = 3 x "
                            "(N-1)/N x M, against 2 x (N-1)/N x M for the all-reduce: 1.5x."),
        Numeric(f"7B parameters, mixed-precision Adam: ZeRO-3 on 4 GPUs holds {states.total / GB:g} GB "
                f"of model states per GPU (notebook 03). How many GPUs at least bring that to "
                f"{target} GB or less?", enough, tol=0, minimum=1,
                explanation=f"ZeRO-3 splits all 16 bytes: 16 x 7e9 / N = {16 * 7:g} / N GB. "
                            f"{16 * 7:g} / {enough - 1} = {16 * 7 / (enough - 1):.1f} GB is over {target}; "
                            f"{16 * 7:g} / {enough} = {16 * 7 / enough:.2f} GB: {enough} GPUs. No other "
                            "stage gets there: ZeRO-1 and ZeRO-2 keep the 14 GB of bf16 parameters on every GPU."),
        SingleChoice("Why does backward need the parameters gathered again?",
                     ["To recompute the activations that forward freed",
                      "The gradient of a layer's input is grad_output @ W: backward needs W, which "
                      "forward freed",
                      "To average the parameters across ranks",
                      "It does not: only gradients are needed"],
                     "b", "Forward freed the full W to save memory; the input gradient (and the "
                          "chain rule through the layer) needs it, so it is gathered a second time."),
        SingleChoice(
            "What hides ZeRO-3's parameter gathers behind computation?",
            ["prefetching: starting the next unit's all-gather while the current one computes",
             "compressing the gradients", "quantizing the weights",
             "keeping each unit gathered from its forward until its backward"],
            "a", "Issuing the next gather early overlaps communication with computation, at the "
                 "price of one more unit alive. Compression and quantization shrink the bytes but "
                 "still wait for them; keeping units gathered skips the backward gathers (fewer "
                 "bytes, more memory: notebook 07's reshard_after_forward=False) and hides nothing.",
        ),
        SingleChoice("With prefetching on, how many units' full parameters are alive at once at most "
                     "(the course's Zero3, root included)?",
                     ["1", "root + 1", "root + 2", "all of them"],
                     "c", "The unit computing and the next one whose all-gather is in flight, plus the "
                          "root: root + 2, against root + 1 without prefetch."),
    ])


QUIZZES["06"] = quiz_06


def quiz_07() -> Quiz:
    from ..theory.sharding import calls_per_step

    units = 4                                  # the course GPT's blocks; the root comes on top
    full = calls_per_step(units)
    zero2 = calls_per_step(units, reshard_after_forward=False)
    return Quiz("07 FSDP in PyTorch", [
        SingleChoice("FSDP1's ShardingStrategy.SHARD_GRAD_OP is which FSDP2 call?",
                     ["fully_shard(module)",
                      "fully_shard(module, reshard_after_forward=False)",
                      "fully_shard(module, mesh=init_device_mesh('cpu', (2, 2)))",
                      "FSDP2 has no equivalent"],
                     "b", "SHARD_GRAD_OP keeps a unit's parameters gathered from its forward to its "
                          "backward (ZeRO-2 behaviour for parameters): reshard_after_forward=False."),
        Numeric("fully_shard on each of the course GPT's 4 blocks, then on the root (kept gathered "
                "between forward and backward): all-gathers per training step?",
                full["all_gather"], tol=0, minimum=0,
                explanation=f"Each block twice (forward, then again for backward), the root once: "
                            f"2 x 4 + 1 = {full['all_gather']}, exactly the course's zero3."),
        Numeric("The same with reshard_after_forward=False on the blocks?", zero2["all_gather"],
                tol=0, minimum=0,
                explanation=f"Once per unit: {zero2['all_gather']}. The all-gather bytes drop by almost "
                            "half (each block gathered once instead of twice); all the bytes, with the "
                            "reduce-scatters, by about a third (1.47x DDP to 1x in the ring model). The "
                            "gathered blocks stay alive until their backward."),
        SingleChoice("You call fully_shard on the course GPT's root only, not on its 4 blocks. What "
                     "changes, compared with one fully_shard per block and then the root?",
                     ["Nothing: fully_shard finds the blocks by itself",
                      "The whole model is one unit: one all-gather brings every parameter at once, "
                      "so the peak holds the full model and no gather overlaps with compute",
                      "It uses less memory: fewer units means fewer buffers",
                      "It fails: the blocks must be sharded first"],
                     "b", f"fully_shard(module) makes one unit of the parameters no inner fully_shard "
                          f"claimed. On the root alone that is all of them: the forward waits for one "
                          f"gather of the whole model and holds it all (DDP's parameter memory while it "
                          f"runs). Per block, {full['all_gather']} smaller gathers per step, at most "
                          "the root and one or two blocks alive, and the next gather can run while "
                          "the current block computes."),
        SingleChoice("After backward on an FSDP2 model, how do you clip gradients to a global norm of 1?",
                     ["torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0): the gradients are "
                      "DTensors, so the norm is reduced over all shards",
                      "model.clip_grad_norm_(1.0), as with FSDP1",
                      "Clip each rank's local shard to norm 1/N",
                      "Clipping is impossible on sharded gradients"],
                     "a", "FSDP2 modules have no clip_grad_norm_ method; the plain utility sees "
                          "DTensor gradients and all-reduces the squared norms. Clipping each "
                          "shard by its local norm gives a different (wrong) scale per rank."),
        SingleChoice("Each rank calls torch.manual_seed(seed + rank) and builds the model, then "
                     "fully_shard. What happens?",
                     ["Nothing: fully_shard broadcasts rank 0's weights",
                      "An error: the shapes differ",
                      "Each rank keeps its own initialisation's rows: the full model is a mix of N "
                      "different inits, and the losses differ from one process",
                      "The ranks hang"],
                     "c", "FSDP2 shards what each rank holds, with no broadcast (FSDP1 had "
                          "sync_module_states=True). Seed the model the same on every rank, or "
                          "broadcast from rank 0 before sharding."),
        Numeric("Gradient accumulation over 4 micro-batches with set_requires_gradient_sync(False) "
                "on all but the last: reduce-scatters per optimizer step (4 blocks + root)?",
                full["reduce_scatter"], tol=0, minimum=0,
                explanation=f"Only the last micro-batch's backward reduce-scatters: one per unit, "
                            f"{full['reduce_scatter']}, instead of 4 x {full['reduce_scatter']}. The "
                            "price: unsharded gradients stay allocated between micro-batches."),
        SingleChoice("A sharded checkpoint written by torch.distributed.checkpoint on 4 ranks is "
                     "loaded on 2 ranks. What happens?",
                     ["It fails: the world size must match",
                      "Only rank 0 loads it and broadcasts",
                      "It loads, but the optimizer state is lost",
                      "Each of the 2 ranks reads the parts of every tensor that its new shards "
                      "cover: the state is resharded on load, bit-exact"],
                     "d", "The checkpoint's metadata records which slice of each tensor each file "
                          "holds; on load every rank reads exactly the slices of its new shards, "
                          "optimizer states included."),
    ])


QUIZZES["07"] = quiz_07


def quiz_08() -> Quiz:
    from ..theory.multinode import hsdp_vs_fsdp_time

    cost = hsdp_vs_fsdp_time(7e9, 8, 4, 450e9, 25e9)       # one 25 GB/s NIC per GPU
    return Quiz("08 Beyond one box", [
        Numeric("7B parameters in bf16, 4 nodes of 8 GPUs with one network card (NIC) per GPU, HSDP "
                "sharded inside each node: how many GB go through each NIC to other nodes per step?",
                cost.hsdp_nic_bytes / 1e9, unit="GB", tol=0.1, minimum=0,
                explanation=f"Only the all-reduce of each GPU's 1/8 gradient shard crosses nodes: 2 x (4-1)/4 "
                            f"x 2 B x 7e9 / 8 = {cost.hsdp_nic_bytes / 1e9:.3f} GB."),
        Numeric("The same cluster with full sharding over all 32 GPUs (one ring per NIC, each ring "
                "crossing every node boundary once): how many GB go through each NIC to other "
                "nodes per step?",
                cost.fsdp_nic_bytes / 1e9, unit="GB", tol=0.1, minimum=0,
                explanation=f"Two all-gathers and a reduce-scatter of 14 GB over 32 ranks: a node sends "
                            f"3 x 31/32 x 14 GB = {cost.fsdp_node_bytes / 1e9:.2f} GB through its 8 NICs, "
                            f"{cost.fsdp_nic_bytes / 1e9:.2f} GB each, against {cost.hsdp_nic_bytes / 1e9:.3f} "
                            f"for HSDP. HSDP halves the network bytes, but at 25 GB/s per NIC the times are "
                            f"close ({cost.hsdp_s:.3f} s vs {cost.fsdp_s:.3f} s): HSDP also pays its NVLink "
                            "passes on top of the network ones."),
        SingleChoice("On a 2 x 2 mesh (2 replicas x 2 shards), which collectives run across the "
                     "replicas?",
                     ["The all-gathers of the parameters",
                      "The reduce-scatters of the gradients",
                      "An all-reduce of each rank's gradient shard",
                      "A broadcast of the parameters from replica 0 after each step"],
                     "c", "All-gathers and reduce-scatters stay inside the shard group; the replicas "
                          "then all-reduce the reduced gradient shards so that they stay identical."),
        SingleChoice("Which DeepSpeed setting is ZeRO-Infinity's parameter offload?",
                     ['"zero_optimization": {"stage": 2, "offload_param": {"device": "nvme"}}',
                      '"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", '
                      '"nvme_path": "/local_nvme"}}',
                      '"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", '
                      '"nvme_path": "/local_nvme"}}',
                      '"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}'],
                     "b", "Parameter offload exists only in stage 3 (stages 1 and 2 keep full parameters "
                          "on each GPU); NVMe needs a path; offload_optimizer moves the optimizer "
                          "states (ZeRO-Offload), not the parameters."),
        SingleChoice("Under torch DDP, rank 1's data loader has one batch fewer than rank 0's. What "
                     "happens at the end of the epoch?",
                     ["Rank 1 raises StopIteration on every rank",
                      "DDP skips the missing batch",
                      "Rank 0 waits forever in its last backward, whose gradient all-reduce rank 1 "
                      "never joins",
                      "The losses are averaged over fewer ranks"],
                     "c", "Rank 1 leaves the loop; rank 0's backward starts the bucket all-reduces "
                          "and blocks. Fix: agree on the number of steps, pad the data "
                          "(DistributedSampler), or torch's Join."),
        MultiChoice("Which mistakes does TORCH_DISTRIBUTED_DEBUG=DETAIL turn into an error naming "
                    "both ranks' collectives?",
                    ["Two ranks call all-reduce on tensors of different shapes",
                     "One rank calls all-reduce while the other calls broadcast",
                     "Two ranks all-reduce two same-shaped tensors in opposite orders",
                     "A rank computes a wrong loss before the all-reduce"],
                    "a,b", "DETAIL compares each collective's fingerprint (operation, shapes, dtypes) "
                           "across ranks before running it. Two same-shaped tensors swapped look "
                           "identical to it, and it knows nothing about the values."),
    ])


QUIZZES["08"] = quiz_08
