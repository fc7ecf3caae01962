"""The quiz of each notebook. Numbers in answers are computed by ``course_utils``.

Each entry builds its :class:`~course_utils.course.questions.Quiz` on demand:
``quiz.show("00")`` in notebook 00, ``quiz.check("00", 3, "28")`` in tests.
"""
from __future__ import annotations

import random
import zlib

from ..theory.memory import GB, model_states
from .questions import Numeric, Quiz, SingleChoice


class NumberChoice(SingleChoice):
    """A number to pick, not to type (issue 27: at most one typed-in number per quiz): the right
    value and wrong ones, each what a typical mistake gives, shown with ``fmt``. The order is
    shuffled by the prompt's CRC: the same on every run, the right one not always first."""

    def __init__(self, prompt, right, wrong, fmt="{:,}", explanation="", **kw):
        values = [right, *wrong]
        random.Random(zlib.crc32(prompt.encode())).shuffle(values)
        options = [fmt.format(v) for v in values]
        if len(set(values)) != len(values) or len(set(options)) != len(options):
            raise ValueError(f"the options must be distinct numbers: {options}")
        super().__init__(prompt, options, values.index(right), explanation, **kw)


def quiz_00() -> Quiz:
    return Quiz("00 orientation", [
        Numeric(
            "Section 3's hello() on 3 ranks instead of 4: each rank puts rank + 1 in a tensor and "
            "all-reduces it. Then every rank doubles its tensor and all-reduces it once more. What "
            "does rank 2's tensor hold at the end?",
            3 * 2 * (1 + 2 + 3), tol=0, kind="predict",
            explanation="all_reduce (op=SUM) leaves the sum of every rank's tensor on every rank: after the "
                        "first, all 3 hold 1 + 2 + 3 = 6. Doubled, each holds 12, and the second all-reduce "
                        "sums the three: 36, on every rank. (12: the second all-reduce taken to change "
                        "nothing, since the ranks already agree; but it sums, it does not average.)",
        ),
        SingleChoice(
            "Four ranks each put rank + 1 in a tensor and all-reduce it, as in section 3. Rank 2 alone "
            "then all-reduces its tensor a second time, while ranks 0, 1 and 3 go on to a computation "
            "longer than the process group's timeout, with no collective. What happens?",
            ["Ranks 0, 1 and 3 get 10 and go on; rank 2 waits in its second call until the timeout",
             "The first all-reduce fails on every rank, since rank 2 makes more calls than the others",
             "Every rank gets 10; rank 2's second call returns at once, its tensor unchanged, since no peer joins",
             "Rank 2 ends with 40, two sums of the four ranks, and the other three with 10"],
            "a",
            "Collectives are matched by call order: the first call of every rank forms the first all-reduce, "
            "which completes with 1 + 2 + 3 + 4 = 10 everywhere. Rank 2's second call waits for three peers "
            "that never come, and a waiting rank cannot tell a slow peer from one that will never call: it "
            "waits until the timeout given to init_process_group (section 3.2). No rank can know in advance "
            "that the counts will differ, so nothing fails early. (Had the others called their next "
            "all-reduce before the timeout, it would have been matched with rank 2's second call: a silent "
            "sum of the wrong tensors.)",
            kind="predict",
        ),
    ])


QUIZZES = {"00": quiz_00}


def quiz_03() -> Quiz:
    from ..theory.config import PRESETS

    names = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    four = {st: model_states(7e9, world_size=4, stage=st, recipe="mixed").total / GB for st in range(4)}
    eight = {st: model_states(7e9, world_size=8, stage=st, recipe="mixed").total / GB for st in range(4)}
    drop = {st: four[st] - eight[st] for st in range(4)}
    most = max(drop, key=drop.get)
    whole7 = model_states(7e9, recipe="mixed")
    amp = model_states(7e9, recipe="torch-amp")
    xl_cfg = PRESETS["gpt2-xl"].config
    per_token = ((34 + 5 * xl_cfg.heads * 2048 / xl_cfg.hidden)           # (34 + 5·a·s/h) alone
                 / (34 + 5 * xl_cfg.heads * 1024 / xl_cfg.hidden))
    blocks_grow = 2 * per_token                                           # s·b·h·(34 + 5·a·s/h)
    return Quiz("03 where the memory goes", [
        SingleChoice(
            "Section 3's table put the 7B model (mixed precision) on 4 GPUs. On 8 GPUs instead, which "
            "stage's model states per GPU drop the most, in GB?",
            names, "abcd"[most],
            "From 4 to 8 GPUs: " + ", ".join(f"{names[st]} {four[st]:g} -> {eight[st]:g} GB" for st in range(4))
            + ". Only the sharded parts shrink, and ZeRO-3 shards all 16 bytes; DDP gains nothing.",
            kind="compare"),
        SingleChoice(
            "The same 7B model with ZeRO-2 as section 3 defines it (gradients and optimizer states "
            "sharded, parameters whole), but in the torch-amp recipe: fp32 parameters, gradients and Adam "
            "moments, 4 + 4 + 8 bytes. On ever more GPUs, what do its model states per GPU approach, and why?",
            [f"{amp.params / GB:g} GB: the 4-byte fp32 parameters stay whole; the other 12 bytes split ever finer",
             f"{whole7.params / GB:g} GB: the 2-byte weights stay whole, as in section 3's mixed recipe",
             f"{(amp.params + amp.grads) / GB:g} GB: parameters and gradients stay whole, only Adam's "
             "moments are split",
             "0 GB: with no 16-bit copy left, every byte of every parameter is split over the GPUs, with no floor"],
            "a",
            f"ZeRO-2 keeps the parameters whole and shards the rest: {amp.params / GB:g} + "
            f"{(amp.total - amp.params) / GB:g} / N GB, which falls towards {amp.params / GB:g} GB. The floor is "
            f"whatever the parameters weigh: {whole7.params / GB:g} GB in mixed precision's 2 bytes, twice that "
            f"in torch's fp32. ({(amp.params + amp.grads) / GB:g}: ZeRO-1's floor; 0: only ZeRO-3 has none.)",
            kind="predict"),
        SingleChoice(f"gpt2-xl's blocks (h = {xl_cfg.hidden}, a = {xl_cfg.heads} heads), micro-batch 1, "
                     "standard (not fused) attention: the sequence doubles from 1024 to 2048 tokens. How "
                     "do a block's activations grow (section 4's formula), and why?",
                     ["4x: attention compares every token with every other, so every saved tensor "
                      "grows with the square of the sequence",
                      "2x exactly: each token's activations are the same size whatever the sequence, "
                      "so twice the tokens save twice the bytes",
                      f"{blocks_grow:.2f}x: most terms hold one value per token and double, the "
                      "attention scores hold one per pair of tokens and grow 4x",
                      f"{per_token:.2f}x: only the bracket 34 + 5·a·s/h grows with the sequence; "
                      "the s·b·h in front of it is the model's fixed size"],
                     "c", f"s·b·h·(34 + 5·a·s/h): the bracket is 34 + 5 x {xl_cfg.heads} x 1024 / "
                          f"{xl_cfg.hidden} = {34 + 5 * xl_cfg.heads * 1024 / xl_cfg.hidden:g} at s = 1024 and "
                          f"{34 + 5 * xl_cfg.heads * 2048 / xl_cfg.hidden:g} at 2048; with the s in front "
                          f"doubling, {blocks_grow:.2f}x. The 34 terms are per token (linear in s), the "
                          "5·a·s/h term is the s x s scores (quadratic); with flash attention there are no "
                          "saved scores: exactly 2x.", kind="explain"),
        NumberChoice("A model trains on 8 GPUs with ZeRO-1, micro-batch 4 per GPU: 40 GB of model states "
                     "and 30 GB of activations per GPU. You move to ZeRO-3 on 16 GPUs, with the same global "
                     "batch, so each GPU now runs micro-batch 2. Predict the activations' GB per GPU.",
                     15, [30, 30 / 16, 7.5], "{:g} GB", kind="predict",
                     explanation="15 GB: activations are linear in the micro-batch (section 4), which halves, "
                                 "and ZeRO shards model states, not activations: each GPU's activations come "
                                 "from its own micro-batch and are not redundant, so there is nothing to "
                                 "shard. (30: the smaller micro-batch forgotten; 1.875: sharded over 16 GPUs "
                                 "like the states; 7.5: halved twice, once more for ZeRO-3.) What does shrink "
                                 "them: recomputation (section 4), a fused attention (no s x s scores), a "
                                 "smaller micro-batch.")
    ])


QUIZZES["03"] = quiz_03


def quiz_01() -> Quiz:
    from ..theory.comm import collective_bytes

    m = 1e9  # a 1 GB message
    start = [[10 * r + i for i in range(6)] for r in range(3)]       # section 1.3's pattern, 3 ranks
    summed = [sum(col) for col in zip(*start)]
    keeps = summed[2:4]                                               # rank 1's third of the sum
    from ..theory.alpha_beta import predict_time, ring_steps
    alpha, beta, small = 10e-6, 300e9, 40e3
    one_by_one = 100 * predict_time("all_reduce", small, 8, alpha, beta)
    bucket = predict_time("all_reduce", 100 * small, 8, alpha, beta)
    bytes_part = one_by_one / 100 - alpha * ring_steps("all_reduce", 8)
    t8, t64 = (predict_time("all_reduce", m, n, alpha, beta) for n in (8, 64))
    return Quiz("01 collectives", [
        SingleChoice("Section 1.3's reduce-scatter on 3 ranks, each holding 6 elements (rank r holds "
                     "[10r, ..., 10r+5]): what does rank 1 keep?",
                     [str(summed[:2]), str(start[1][2:4]), str(keeps), "all 6 sums"],
                     "c", f"The sum is {summed}; each rank keeps its 1/N piece of it, rank 1 the middle "
                          f"third, {keeps}. ({summed[:2]}: rank 0's piece; {start[1][2:4]}: rank 1's own "
                          "elements there, not summed.) An all-gather would then give everyone all 6: the "
                          "all-reduce.",
                     kind="predict"),
        SingleChoice("A ring all-reduce of 1 GB on 8 ranks, then on 64 ranks, over links like section 4's "
                     "(alpha = 10 us per step, 300 GB/s per rank). What happens to its time?",
                     [f"It falls about 8x, to {t8 / 8 * 1e3:.2f} ms: each rank is responsible for only its 1/N "
                      "of the message",
                      f"It grows about 8x, to {8 * t8 * 1e3:.0f} ms: each rank exchanges data with eight times "
                      "as many peers",
                      f"It stays at {t8 * 1e3:.2f} ms: every rank sends just under 2M bytes whatever N, and "
                      "bytes set the time",
                      f"It grows from {t8 * 1e3:.2f} to {t64 * 1e3:.2f} ms: the bytes per rank grow by an "
                      "eighth, and 126 latency steps replace 14"],
                     "d", f"Each of the 2(N-1) steps moves one chunk of M/N: 2(N-1)/N x M, "
                          f"{collective_bytes('all_reduce', m, 8) / 1e9:.2f} GB on 8 ranks and "
                          f"{collective_bytes('all_reduce', m, 64) / 1e9:.2f} on 64, so the bandwidth part hardly "
                          f"grows (the ring is bandwidth-optimal). What grows is the number of steps, 2(N-1): "
                          f"from 14 to 126, each paying alpha, {14 * alpha * 1e3:.2f} -> {126 * alpha * 1e3:.2f} ms. "
                          "On many ranks the ring's latency grows, not its bytes.", kind="predict"),
        SingleChoice("Section 4's NVLink-class link (alpha = 10 us per step, 300 GB/s): 8 GPUs all-reduce "
                     "100 gradient tensors of 40 kB each, one collective per tensor. Which change cuts "
                     "that time the most?",
                     ["Halve alpha, so that each of the ring's steps starts sooner",
                      "Double the bandwidth to 600 GB/s, so that every byte crosses in half the time",
                      "Send the 100 tensors as one 4 MB all-reduce instead of 100 small ones",
                      "All-reduce over 4 of the GPUs instead of 8, so that each ring has fewer steps"],
                     "c", f"Each 40 kB all-reduce pays 2(N-1) = 14 steps of alpha, 140 us, and only "
                          f"{bytes_part * 1e6:.2f} us of bandwidth: {one_by_one * 1e3:.2f} ms for 100, almost all "
                          f"latency. One bucket pays the 14 alphas once: {bucket * 1e3:.2f} ms, about "
                          f"{one_by_one / bucket:.0f}x less. Halving alpha halves it at best "
                          f"({(one_by_one - 100 * alpha * ring_steps('all_reduce', 8) / 2) * 1e3:.2f} ms); twice the "
                          f"bandwidth saves a few us; 4 GPUs pay 6 steps instead of 14 "
                          f"({100 * predict_time('all_reduce', small, 4, alpha, beta) * 1e3:.2f} ms), still per tensor. "
                          "The bytes are not the problem. That is why DDP buckets.",
                     kind="compare"),
    ])


def quiz_02() -> Quiz:
    from ..theory.comm import comm_volume
    from ..theory.config import COURSE_CONFIG

    psi = COURSE_CONFIG.num_params()
    sent = {n: comm_volume(psi, world_size=n, stage=0, bytes_per_elem=4)["total"] for n in (4, 6)}    # per step
    return Quiz("02 data parallelism", [
        SingleChoice("In section 7 the gradients' all-reduce takes about as long on the link as backward "
                     "takes, say 80 ms. The link becomes 4x faster (20 ms). Which step gets shorter by more?",
                     ["64 KiB buckets, by more than 60 ms",
                      "one bucket, by about 60 ms",
                      "both, by the same 60 ms",
                      "neither shortens by more than a few ms"],
                     "b", "One bucket waits for the whole all-reduce after backward, so its step falls by "
                          "80 - 20 = 60 ms. With 64 KiB buckets most of the 80 ms was already hidden behind "
                          "backward; only the exposed tail (the red part of section 7's plot) can shrink. "
                          "The bytes are equal; what the link's speed changes is only the exposed time.",
                     kind="compare"),
        SingleChoice("You drop the broadcast from MyDDP's __init__, and each rank builds the model with "
                     "its own random initialisation. After 5 steps with correctly averaged gradients, "
                     "how many distinct parameter digests do 4 ranks show (section 4 printed 1)?",
                     ["1: averaging the gradients pulls the replicas together over the steps",
                      "2: the ranks pair up in the ring, and each pair's weights converge",
                      "none: the all-reduce raises an error because the weights differ",
                      "4: the same update applied to different weights keeps them different"],
                     "d", "Every rank adds the same averaged update to its own weights: equal replicas "
                          "stay equal, unequal ones stay unequal (and the gradients they average come "
                          "from different models). Nothing in the all-reduce looks at the weights.",
                     kind="predict"),
        SingleChoice(f"Section 6 printed {sent[4]:,.0f} B sent by rank 0 per DDP step on 4 ranks, whatever the "
                     "buckets. Which one change makes that number different?",
                     ["Doubling the global batch from 12 to 24 rows, on the same 4 ranks",
                      "Overlapping the all-reduces with backward instead of sending after it",
                      "Running on 6 ranks instead of 4, with the same global batch of 12 rows",
                      "Sending 64 KiB buckets instead of one bucket holding every gradient"],
                     "c", f"The all-reduce carries one gradient per parameter, 2(N-1)/N x 4 bytes x {psi:,}: "
                          f"only N changes it. Section 6 printed {sent[4]:,.0f} on 4 ranks. On 6 it is {sent[6]:,.0f}, "
                          "towards 2 x 4 x Ψ. The batch changes the compute, not the gradients' size (a bigger batch "
                          "makes communication a smaller share of the step); buckets change the number of "
                          "messages, overlap their timing, never the bytes.",
                     kind="explain", printed="02"),
    ])


QUIZZES["01"] = quiz_01
QUIZZES["02"] = quiz_02


def quiz_04() -> Quiz:
    from ..theory.comm import collective_bytes
    from ..theory.config import COURSE_CONFIG

    psi = COURSE_CONFIG.num_params()                    # the course GPT
    ms = {(r, st): model_states(7e9, world_size=4, stage=st, recipe=r).total / GB
          for r in ("mixed", "fp32") for st in (0, 1)}
    m8 = 4 * psi                                         # the fp32 gradient, bytes
    ar8, ag8 = (collective_bytes(op, m8, 8) for op in ("all_reduce", "all_gather"))
    return Quiz("04 ZeRO-1", [
        SingleChoice(
            "Section 1 gave ZeRO-1 on 4 GPUs for 7B parameters: mixed precision falls from "
            f"{ms['mixed', 0]:g} to {ms['mixed', 1]:g} GB, fp32 only from {ms['fp32', 0]:g} to "
            f"{ms['fp32', 1]:g} GB, although both hold 16 bytes per parameter. Why does ZeRO-1 save "
            "less in fp32?",
            ["In fp32 m and v are 8 of the 16 bytes; in mixed precision the master copy makes 12",
             "fp32 gradients get sharded too, and their shard buffers cost more than they save",
             "ZeRO-1 cannot shard fp32 tensors, so it keeps part of them whole on every GPU",
             "The fp32 parameters need twice the padding, which eats most of the saving"],
            "a",
            f"ZeRO-1 shards the optimizer state only, 12 of the 16 bytes in mixed precision, 8 in fp32: "
            f"on 4 GPUs it saves 3/4 x 12 x 7 = {ms['mixed', 0] - ms['mixed', 1]:g} GB against "
            f"3/4 x 8 x 7 = {ms['fp32', 0] - ms['fp32', 1]:g} GB: {ms['mixed', 1]:g} and {ms['fp32', 1]:g} GB "
            "are left.", kind="explain"),
        NumberChoice(
            "DeepSpeed's ZeRO-1, as it runs by default, all-reduces the gradients (each rank then keeps "
            "its slice) instead of reduce-scattering them, then all-gathers the updated parameters. In the "
            "ring model, predict its bytes over DDP's on 8 ranks.",
            (ar8 + ag8) / ar8, [1, 2, (ar8 + m8) / ar8], "{:.2f}",
            kind="predict",
            explanation=f"An all-reduce plus an all-gather against DDP's all-reduce: on 8 ranks "
                        f"(2 x 7/8 + 7/8) / (2 x 7/8) = {(ar8 + ag8) / ar8:g}, whatever N, because every term "
                        f"carries the same (N-1)/N. With the reduce-scatter you built the ratio is 1 (section 6). "
                        f"(2: the all-gather counted as an all-reduce; {(ar8 + m8) / ar8:.2f}: its (N-1)/N "
                        "forgotten.) Appendix 11 §3.2 runs DeepSpeed and counts 1.50.",
        ),
        SingleChoice(
            "A learner's MyZero1 builds its inner AdamW inside step(), a new one at every step, over the same "
            "shard parameters. What happens over two steps, against one process training on the whole batch?",
            ["Nothing wrong: AdamW derives m and v from the current gradient, so a new one gives the same update",
             "A hang in step 2: the ranks build their optimizers at different moments, so the collectives mismatch",
             "Step 1 matches one process and step 2 does not: each new AdamW starts from m = v = 0 and step 1",
             "Right numbers, but the optimizer bytes per rank grow by 8·P/N each step as the old states pile up"],
            "c",
            "AdamW's m and v are running averages over the steps, and its step counter sets the bias "
            "correction (Adam's rescaling of m and v, which start at zero): "
            "a new AdamW makes every step a first step (an update of about lr x the gradient's sign). Step 1 is "
            "right, step 2 is not. The states are what ZeRO-1 shards; they must live from step to step, so the "
            "inner optimizer is built once, in __init__. (No collective runs in building it, and the old one is "
            "freed.)", kind="explain"),
    ])


def quiz_05() -> Quiz:
    from ..theory.config import COURSE_CONFIG
    from ..theory.layout import padded_numel

    psi = COURSE_CONFIG.num_params()
    p2 = padded_numel(psi, 2)
    p4 = padded_numel(psi, 4)
    peak_one = 4 * psi + 4 * p2 + 4 * p2 // 2               # one bucket on 2 ranks (notebook 05 §4)
    peak_four = 4 * psi + 4 * p4 + 4 * p4 // 4
    return Quiz("05 ZeRO-2", [
        NumberChoice(
            f"A variant of ZeRO-2 reduce-scatters each bucket during backward, as ZeRO-2 does, but frees the "
            f"full .grad tensors only in step(). Predict the gradient bytes a rank holds once backward has "
            f"ended, every message waited for and its buffer freed: "
            f"the course GPT on 2 ranks, fp32, Ψ = P = {psi:,}.",
            4 * psi + 4 * p2 // 2, [4 * p2 // 2, 4 * psi, peak_one], "{:,} B", kind="predict",
            explanation=f"{4 * psi + 4 * p2 // 2:,} B: the full gradients, 4·Ψ = {4 * psi:,}, which nothing freed, "
                        f"plus the shard gradients the reduce-scatters filled, 4·P/N = {4 * p2 // 2:,}: more than "
                        f"ZeRO-1's {4 * psi:,}. Sending during backward saves nothing by itself; what saves "
                        f"memory is freeing each bucket's gradients once its message holds them. ({4 * p2 // 2:,}: "
                        f"ZeRO-2's, the full gradients freed; {peak_one:,}: the one-bucket peak, a message "
                        "still alive.)"),
        NumberChoice(
            "ZeRO-2 on 8 ranks accumulates over 8 micro-batches per optimizer step, as section 5 runs it "
            "(fp32 gradients and parameters: one size M). In the ring model, predict the bytes a rank sends per "
            "step over those of DDP with no_sync(), which all-reduces once per step.",
            (8 + 1) / 2, [1, 8 / 2, (2 * 8 + 1) / 2], "{:g}x", kind="predict",
            explanation="ZeRO-2 freed the full gradients, so every micro-batch's backward reduce-scatters its own: "
                        "8 x (N-1)/N·M, plus the step's all-gather of the parameters, (N-1)/N·M, against no_sync's "
                        "one all-reduce, 2 x (N-1)/N·M: 9/2 = 4.5, whatever N. Section 5 printed 1,293,500 against "
                        "517,400 B for 4 micro-batches: 5/2. (1: as if ZeRO-2 could wait for the last micro-batch, "
                        "which needs the full gradients it freed; 4: the all-gather left out; 8.5: the "
                        "reduce-scatters counted as all-reduces.)", printed="05"),
        SingleChoice(
            f"Section 4: with one 25 MiB bucket, ZeRO-2's peak of gradient bytes on 2 ranks was {peak_one:,} B, "
            "above ZeRO-1's. Which change brings it down the most?",
            ["Running on 4 ranks instead of 2, so that each rank's shard of the gradient halves",
             "64 KiB buckets instead of one, so that each bucket is sent as soon as it is complete",
             "Dividing each gradient by N before the reduce-scatter rather than the shard's after it",
             "Moving the reduce-scatter into step(), as ZeRO-1 does, keeping the one bucket"],
            "b",
            f"Section 4's rule: the peak is the shard's gradient (4·P/N) plus the largest bucket twice (its .grads "
            f"and its message). With one bucket, the largest bucket is the whole model. 64 KiB buckets leave "
            f"as they fill: about 442 kB at the peak, the shard's {4 * p2 // 2:,} plus twice its largest "
            f"bucket (section 4's plot). 4 ranks shrink only the shard's term: {peak_four:,} B. ZeRO-1's step keeps all "
            f"the gradients, {4 * psi:,} B. Dividing earlier moves no byte.", kind="compare"),
    ])


QUIZZES["04"] = quiz_04
QUIZZES["05"] = quiz_05


def quiz_06() -> Quiz:
    from ..theory.comm import collective_calls

    deeper = collective_calls(3, num_layers=8 + 1, skip_last_regather=True)   # 8 blocks + the root
    small = (2 * 2 + 1 + 3) / (2 * 3)           # 2 blocks gathered twice, the root once, 3 reduce-scatters
    return Quiz("06 ZeRO-3", [
        NumberChoice("ZeRO-3 on a model of 8 transformer blocks and a root unit, the root kept gathered "
                     "as in section 3, prefetching on (section 8), trains with 4 micro-batches per optimizer "
                     "step (a forward and a backward each, gradients added into the shards, as ZeRO-2 does in "
                     "notebook 05 §5). Predict the all-gathers per optimizer step.",
                     4 * deeper["all_gather"], [deeper["all_gather"], 4 * 2 * (8 + 1), 4 * (8 + 1)], "{:g}",
                     kind="predict",
                     explanation=f"4 x (2L + 1) = {4 * deeper['all_gather']}: the parameters are freed after each "
                                 "use, so every micro-batch gathers them again: each block in its forward and "
                                 "again in its backward (for its input's gradient), the root once, as it stays "
                                 "gathered from the start of forward to the end of backward. Prefetching starts "
                                 "each all-gather earlier; it adds none. Likewise 4 x "
                                 f"{deeper['reduce_scatter']} reduce-scatters. ({deeper['all_gather']}: gathered "
                                 "once per optimizer step, as if the parameters stayed whole between micro-batches; "
                                 "72: the root gathered twice like a block; 36: once per unit.)"),
        NumberChoice("Section 7 measured the course GPT at 1.474x DDP's bytes: its root, gathered once, holds "
                     "5.2 % of the parameters. A model of 2 blocks and a root as large as a block, the root kept "
                     "gathered as in section 3, on 4 ranks: predict ZeRO-3's bytes over DDP's, in the ring model.",
                     small, [1.5, 1.474, (2 * 2 + 1) / (2 * 3)], "{:.2f}", kind="predict",
                     explanation=f"Per unit of P elements each collective sends (N-1)/N x 4P. ZeRO-3: 2 all-gathers "
                                 "per block, 1 for the root, 1 reduce-scatter per unit: 5 + 3 = 8 unit-sized "
                                 f"collectives; DDP's all-reduce of all 3 units counts 2 x 3 = 6. {small:.2f}, "
                                 "whatever N (the factor (N-1)/N cancels). The bigger the root's share, the further "
                                 "below 1.5. (1.50: the root gathered twice like a block; 1.47: the course GPT's; "
                                 "0.83: the reduce-scatters left out.)"),
        SingleChoice("Section 8's timeline held the root + 1 block gathered at the peak without prefetching. "
                     "A 32-block model whose blocks hold 0.5 GB of bf16 weights each (whole, before "
                     "sharding), on 8 GPUs: what does turning prefetching on do to the peak and to the step?",
                     ["Lowers the peak by 0.5 GB, since each block is freed as soon as the next one has "
                      "arrived; the step is unchanged",
                      "Raises the peak by 0.5 GB/8 per GPU, a shard more; the step sends fewer bytes, "
                      "since the next all-gather starts early",
                      "Raises the peak by 0.5 GB, one more gathered block; the same bytes, but the next "
                      "all-gather can hide behind compute",
                      "Leaves the peak unchanged, since the next block's buffer reuses the freed one's "
                      "memory; the losses shift slightly"],
                     "c", "Prefetch starts the next unit's all-gather while the current one computes, so two "
                          "blocks are whole at once: root + 2 blocks at the peak, one more 0.5 GB block (a "
                          "gathered block is whole on every GPU, not 1/8 of it). The calls, bytes and losses stay "
                          "the same; what changes is when the all-gather travels: behind compute, instead of "
                          "in front of it (section 9 times it).", kind="compare"),
    ])


QUIZZES["06"] = quiz_06


def quiz_07() -> Quiz:
    return Quiz("07 FSDP in PyTorch", [
        NumberChoice("FSDP2 on 2 ranks: the squared norms of rank 0's gradient shards add up to 9 (its "
                     "shards' norm is 3), rank 1's to 16 (norm 4). Both call torch.nn.utils.clip_grad_norm_("
                     "model.parameters(), max_norm=1.0). Predict the factor rank 0's gradients are multiplied by.",
                     1 / 5, [1 / 3, 1 / 7, 1 / 4], "{:.3g}", kind="predict",
                     explanation="The gradients are DTensors: the utility adds the shards' squared norms with one "
                                 "all-reduce, 9 + 16 = 25, so both ranks see the global norm 5 and scale by 1/5 "
                                 "(times max_norm 1.0), exactly as one process would. (1/3: each rank clips by its "
                                 "own shard's norm, and the two halves of the model get different factors; 1/7: "
                                 "the norms added instead of their squares; 1/4: the other rank's.)"),
        NumberChoice("An 8-billion-parameter model under FSDP2 on 8 GPUs, fp32 gradients, 4 micro-batches per "
                     "step with set_requires_gradient_sync(False) on all but the last (section 5.5). Predict the "
                     "gradient GB a GPU holds between micro-batches (syncing every micro-batch: 4 GB, its shards).",
                     32, [4, 16, 128], "{:g} GB", kind="predict",
                     explanation="32 GB: without the reduce-scatter each backward adds into full-size, unsharded "
                                 "gradients, 4 bytes x 8e9 on every GPU, until the last micro-batch reduce-scatters "
                                 "their sum. What it buys: one reduce-scatter per unit per step instead of four. "
                                 "Section 5.5 gave the same for the course GPT: 517,400 B held, twice the "
                                 "2-rank shard. (4: the shards, as with sync every time; 16: the shards kept per "
                                 "micro-batch; 128: a full copy per micro-batch, but they add into one.)"),
    ])


QUIZZES["07"] = quiz_07


def quiz_08() -> Quiz:
    from ..theory.multinode import hsdp_vs_fsdp_time

    from ..theory.config import COURSE_CONFIG
    two_by_two = dict(alpha_intra_s=20e-6, alpha_inter_s=50e-6, bytes_per_elem=4)       # 08 §2.1's links
    slow, fast10 = (hsdp_vs_fsdp_time(COURSE_CONFIG.num_params(), 2, 2, 60e6, inter, **two_by_two) for inter in (1e6, 10e6))
    return Quiz("08 Beyond one box", [
        SingleChoice(f"Section 2.1's two nodes of two, 60 MB/s inside a node and 1 MB/s across: per step each NIC "
                     f"carries {slow.fsdp_nic_bytes:,.0f} B of full sharding's passes and {slow.hsdp_nic_bytes:,.0f} B "
                     "of HSDP's all-reduce. The link across nodes becomes ten times faster, 10 MB/s; nothing else "
                     "changes. What happens to HSDP's lead in link time (how many fewer ms per step its links are "
                     "busy than full sharding's)?",
                     ["It stays about the same: the link inside a node, unchanged, sets the pace of both strategies",
                      "It shrinks to about a tenth: both times are mostly bytes crossing the slow link",
                      "It grows: full sharding's time falls tenfold while HSDP's all-reduce stays inside a node",
                      "It reverses: full sharding's ring now runs mostly on the fast link and overtakes HSDP"],
                     "b", f"The multi-node model (appendix 11 §1) gives full sharding {slow.fsdp_s * 1e3:.0f} ms of "
                          f"communication per step and HSDP {slow.hsdp_s * 1e3:.0f} ms. Nearly all of both is bytes crossing the 1 MB/s link (full sharding's 3 passes, "
                          f"HSDP's all-reduce of half the gradient), so a tenfold faster link cuts both about "
                          f"tenfold: {slow.fsdp_s * 1e3:.0f} -> {fast10.fsdp_s * 1e3:.0f} ms and {slow.hsdp_s * 1e3:.0f} "
                          f"-> {fast10.hsdp_s * 1e3:.0f} ms, so HSDP's lead goes from {(slow.fsdp_s - slow.hsdp_s) * 1e3:.0f} to "
                          f"{(fast10.fsdp_s - fast10.hsdp_s) * 1e3:.0f} ms. HSDP still wins, since it sends fewer bytes across; "
                          "inside a node both use the same fast link. (HSDP's all-reduce is what crosses the nodes: "
                          "the faster link speeds it up too.)", kind="predict"),
        SingleChoice("Rank 1's data loader has one batch fewer than rank 0's (section 4's uneven data), on "
                     "gloo ranks; the model is wrapped with fully_shard (notebook 07), not torch DDP. Rank 1 "
                     "leaves the loop and then computes for a long time, calling no collective. Where does "
                     "rank 0 wait?",
                     ["In backward, in the gradient all-reduce, as with DDP, since the gradients still need "
                      "averaging",
                      "Nowhere: fully_shard notices that rank 1 has left and skips the step on the others",
                      "In optimizer.step(), in a broadcast of the updated shards to the other ranks",
                      "In its next forward: the first unit's all-gather of its parameters, which rank 1 "
                      "never joins"],
                     "d", "A sharded model needs the other ranks before it can compute at all: the forward "
                          "gathers each unit's parameters first. With DDP the first collective of a step "
                          "is the gradient all-reduce, in backward; here it is the first all-gather. The "
                          "fixes are the same. (With NCCL the all-gather is only queued on the GPU: rank 0's "
                          "stack would show the next point that waits for the GPU, and the Flight Recorder "
                          "the all-gather.)", kind="predict"),
    ])


QUIZZES["08"] = quiz_08
