"""course_utils.theory.estimators: DeepSpeed's and accelerate's estimators, reimplemented exactly."""
import contextlib
import io
import itertools
import textwrap

import pytest

from course_utils.course.plots import plot_estimators
from course_utils.theory.config import PRESETS, TransformerConfig
from course_utils.theory.estimators import (
    ACCELERATE_DTYPES, Row, accelerate_peak, accelerate_training_usage, compare, deepspeed_zero2,
    deepspeed_zero3, table)
from course_utils.theory.memory import GB, GiB, model_states

# Exact parameter counts behind the documented examples. The docs print only "2851M" etc.;
# these counts were obtained by building the models with transformers 5.23 on the meta
# device (T5Model from the t5-large / t5-3b / T0_3B (= t5-v1_1-xl) configs; BertModel with
# vocab 28996 for bert-base-cased) and agree with every rounded figure the docs print.
T5_LARGE = (737_668_096, 32_899_072)        # (total params, largest layer = shared embedding)
T5_3B = (2_851_598_336, 32_899_072)
T0_3B = (2_783_959_040, 65_798_144)
BERT_BASE_CASED = 108_310_272               # + two int64 [1, 512] buffers = 8192 bytes


def _lines(text):
    return [line.strip() for line in textwrap.dedent(text).strip().splitlines()]


def deepspeed_printout(num_params, largest_layer_params=None, *, stage=3, gpus_per_node=1, nodes=1):
    """The table ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` prints (its "GB" are GiB),
    from our deepspeed_zero2/3: what the documented tables below are compared with."""
    sw = f"SW: Model with {int(num_params / 1e6)}M total params"
    if stage == 3:
        sw += f", {int(largest_layer_params / 1e6)}M largest layer params"
    lines = ["Estimated memory needed for params, optim states and gradients for a:",
             f"HW: Setup with {nodes} node{'s' * (nodes > 1)}, {gpus_per_node} GPU{'s' * (gpus_per_node > 1)} per node.",
             sw + ".", "  per CPU  |  per GPU |   Options"]
    kw = dict(gpus_per_node=gpus_per_node, nodes=nodes)
    cpu = f"{'cpu':4}"
    if stage == 2:
        cases = [(deepspeed_zero2(num_params, cpu_offload=off, **kw), f"offload_optimizer={cpu if off else 'none'}")
                 for off in (True, False)]
    else:
        cases = [(deepspeed_zero3(num_params, largest_layer_params, cpu_offload=off, cpu_offload_params=off_params,
                                  zero_init=zi, **kw),
                  f"offload_param={cpu if off_params else 'none'}, "
                  f"offload_optimizer={cpu if off else 'none'}, zero_init={int(zi)}")
                 for off, off_params in ((True, True), (True, False), (False, False)) for zi in (True, False)]
    return "\n".join(lines + [f" {c / 2**30:7.2f}GB | {g / 2**30:6.2f}GB | {opts}" for (g, c), opts in cases])


def accelerate_total_size(num_params, *, dtype="float32", buffer_bytes=0):
    """The CLI's "Total Size" column (the weights only, divided per dtype as ``gather_data`` does)."""
    size = 4 * num_params + buffer_bytes
    div = {"float32": 1, "float16": 2, "bfloat16": 1, "fp8": 1, "int8": 4, "int4": 8}[dtype]
    return size / div if div > 1 else size


def accelerate_convert_bytes(size):
    """accelerate's ``convert_bytes``: divide by 1024 until below 1024; "GB" there means GiB."""
    for unit in ["bytes", "KB", "MB", "GB", "TB"]:
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


# DeepSpeed docs, "Memory Requirements" (deepspeed.readthedocs.io/en/latest/memory.html,
# source docs/code-docs/source/memory.rst), ZeRO3 examples, all_cold with
# total_params=2851e6, largest_layer_params=32e6, num_gpus_per_node=8, num_nodes=1.
DS_DOCS_ZERO3_COLD = """
    Estimated memory needed for params, optim states and gradients for a:
    HW: Setup with 1 node, 8 GPUs per node.
    SW: Model with 2851M total params, 32M largest layer params.
      per CPU  |  per GPU |   Options
       71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
      127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
       63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
      127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
        1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
      127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0
"""
# Same page, the live t5-3b model (exact counts T5_3B), 8 GPUs.
DS_DOCS_ZERO3_LIVE = """
    Estimated memory needed for params, optim states and gradients for a:
    HW: Setup with 1 node, 8 GPUs per node.
    SW: Model with 2851M total params, 32M largest layer params.
      per CPU  |  per GPU |   Options
       71.71GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
      127.48GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
       63.74GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=1
      127.48GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=0
        1.47GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=1
      127.48GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=0
"""
# Hugging Face transformers docs, DeepSpeed guide, "Memory requirements"
# (docs/source/en/deepspeed.md): bigscience/T0_3B on 1 GPU.
HF_DOCS_T0_1GPU = """
    Estimated memory needed for params, optim states and gradients for a:
    HW: Setup with 1 node, 1 GPU per node.
    SW: Model with 2783M total params, 65M largest layer params.
      per CPU  |  per GPU |   Options
       70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
       70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
       62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=1
       62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=0
        0.37GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=1
       15.56GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=0
"""
# transformers docs, main_classes/deepspeed.md "Memory Requirements" (the same run on
# 2 GPUs; kept in the ja/zh translations of that page).
HF_DOCS_T0_2GPU = """
    Estimated memory needed for params, optim states and gradients for a:
    HW: Setup with 1 node, 2 GPUs per node.
    SW: Model with 2783M total params, 65M largest layer params.
      per CPU  |  per GPU |   Options
       70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
       70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
       62.23GB |   2.84GB | offload_param=none, offload_optimizer=cpu , zero_init=1
       62.23GB |   2.84GB | offload_param=none, offload_optimizer=cpu , zero_init=0
        0.74GB |  23.58GB | offload_param=none, offload_optimizer=none, zero_init=1
       31.11GB |  23.58GB | offload_param=none, offload_optimizer=none, zero_init=0
"""


@pytest.mark.parametrize("args, gpus, documented", [
    ((2851e6, 32e6), 8, DS_DOCS_ZERO3_COLD),
    (T5_3B, 8, DS_DOCS_ZERO3_LIVE),
    (T0_3B, 1, HF_DOCS_T0_1GPU),
    (T0_3B, 2, HF_DOCS_T0_2GPU),
], ids=["deepspeed-docs-cold", "deepspeed-docs-live-t5-3b", "hf-docs-T0_3B-1gpu", "hf-docs-T0_3B-2gpu"])
def test_zero3_reproduces_documented_tables(args, gpus, documented):
    ours = deepspeed_printout(*args, stage=3, gpus_per_node=gpus)
    assert _lines(ours) == _lines(documented)


def test_zero2_reproduces_documented_table_except_the_pre_5099_gpu_line():
    # DeepSpeed docs, memory.rst, ZeRO2 all_cold example (total_params=2851e6, 8 GPUs):
    #   127.45GB |   5.31GB | offload_optimizer=cpu
    #   127.45GB |  15.93GB | offload_optimizer=none
    ours = _lines(deepspeed_printout(2851e6, stage=2, gpus_per_node=8))
    assert ours[:4] == _lines("""
        Estimated memory needed for params, optim states and gradients for a:
        HW: Setup with 1 node, 8 GPUs per node.
        SW: Model with 2851M total params.
          per CPU  |  per GPU |   Options""")
    assert ours[4] == "127.45GB |   5.31GB | offload_optimizer=cpu"
    # The no-offload GPU figure changed in DeepSpeed PR #5099 (2024) from
    # 4P + int(16P/N) (what the docs table shows) to 2P + int(18P/N) (DeepSpeed 0.19.8).
    p = 2851e6
    assert f"{(4 * p + int(16 * p / 8)) / 2**30:.2f}" == "15.93"
    assert ours[5] == "127.45GB |  11.28GB | offload_optimizer=none"


def test_zero2_live_t5_3b_offload_row():
    # memory.rst, ZeRO2 live t5-3b on 8 GPUs: "127.48GB |   5.31GB | offload_optimizer=cpu"
    gpu, cpu = deepspeed_zero2(T5_3B[0], gpus_per_node=8, cpu_offload=True)
    assert (f"{cpu / 2**30:.2f}", f"{gpu / 2**30:.2f}") == ("127.48", "5.31")


def test_zero3_t5_large_discussion_example():
    # memory.rst "Discussion", t5-large on 4 GPUs, printed with >> 20 (MiB):
    # largest layer memory 125MB, case1 3291MB, case2 125MB, case3 477MB
    total, largest = T5_LARGE
    case1, _ = deepspeed_zero3(total, largest, gpus_per_node=4)
    case2, _ = deepspeed_zero3(total, largest, gpus_per_node=4, cpu_offload=True, cpu_offload_params=True)
    case3, _ = deepspeed_zero3(total, largest, gpus_per_node=4, cpu_offload=True)
    assert (case1 >> 20, case2 >> 20, case3 >> 20) == (3291, 125, 477)
    assert f"{total / 1e6:6.2f}M" == "737.67M" and f"{largest / 1e6:6.2f}M" == " 32.90M"


def test_deepspeed_prints_gib_labelled_gb():
    gpu, _ = deepspeed_zero3(*T0_3B)
    assert "46.91GB" in deepspeed_printout(*T0_3B)
    assert round(gpu / GiB, 2) == 46.91 and round(gpu / GB, 2) == 50.37


# accelerate docs, "Model memory estimator" (docs/source/usage_guides/model_size_estimator.md),
# `accelerate estimate-memory bert-base-cased`:
#   | float32 | 84.95 MB | 413.18 MB | 1.61 GB   |
#   | float16 | 42.47 MB | 206.59 MB | 826.36 MB |
#   | int8    | 21.24 MB | 103.29 MB | 413.18 MB |
#   | int4    | 10.62 MB | 51.65 MB  | 206.59 MB |
# (the page's first table misprints float32's total as 418.18 MB). accelerate 1.15.0
# reproduces the float32/float16 training figures; for int8/int4 it now prints N/A (the
# docs show the older "4 x size" rule), and its "Largest Layer" is now a whole no-split
# block (BertEmbeddings, 86.47 MB) rather than one embedding table.
@pytest.mark.parametrize("dtype, total, training", [
    ("float32", "413.18 MB", "1.61 GB"), ("float16", "206.59 MB", "826.36 MB")])
def test_accelerate_reproduces_bert_base_cased(dtype, total, training):
    kw = dict(dtype=dtype, buffer_bytes=8192)
    assert accelerate_convert_bytes(accelerate_total_size(BERT_BASE_CASED, **kw)) == total
    assert accelerate_convert_bytes(accelerate_peak(BERT_BASE_CASED, **kw)) == training


@pytest.mark.parametrize("dtype, total", [("int8", "103.29 MB"), ("int4", "51.65 MB")])
def test_accelerate_load_sizes_for_int_dtypes(dtype, total):
    assert accelerate_convert_bytes(accelerate_total_size(BERT_BASE_CASED, dtype=dtype, buffer_bytes=8192)) == total
    with pytest.raises(ValueError, match="N/A"):
        accelerate_peak(BERT_BASE_CASED, dtype=dtype)


def test_accelerate_stage_breakdown_matches_its_code():
    m = 4 * BERT_BASE_CASED + 8192          # 433,249,280: what calculate_maximum_sizes returns
    assert accelerate_training_usage(m, "float32") == {
        "model": m, "optimizer": 2 * m, "gradients": m, "step": 4 * m}
    assert accelerate_training_usage(m, "float16") == {
        "model": m, "optimizer": 2 * m, "gradients": m + m // 2, "step": 2 * m}
    assert accelerate_training_usage(m, "bfloat16") == accelerate_training_usage(m, "float16")
    assert set(accelerate_training_usage(m, "int4").values()) == {-1}
    assert accelerate_training_usage(7, "float16")["gradients"] == 7 + 3      # bytes // 2


def test_accelerate_peak_is_the_largest_stage_not_a_sum():
    p = 7_000_000_000
    assert accelerate_peak(p, dtype="float32") == 16 * p      # step: 4x the fp32 model
    assert accelerate_peak(p, dtype="float16") == 8 * p       # Adam states alone
    assert accelerate_peak(p, dtype="bfloat16") == 8 * p
    assert accelerate_convert_bytes(1023) == "1023 bytes"
    assert accelerate_convert_bytes(2**30) == "1.0 GB"        # its "GB" is GiB


@pytest.mark.parametrize("p, n", [(7_000_000_000, 8), (129_350, 3), (1_000_001, 4), (2_783_959_040, 7)])
def test_deepspeed_formulas(p, n):
    largest = 1000
    assert deepspeed_zero2(p, gpus_per_node=n)[0] == 2 * p + 18 * p // n
    assert deepspeed_zero2(p, gpus_per_node=n, cpu_offload=True)[0] == 2 * p
    assert deepspeed_zero3(p, largest, gpus_per_node=n)[0] == 4 * largest + 18 * p // n
    assert deepspeed_zero3(p, largest, gpus_per_node=n, cpu_offload=True)[0] == 4 * largest + 2 * p // n
    assert deepspeed_zero3(p, largest, gpus_per_node=n, cpu_offload=True,
                           cpu_offload_params=True)[0] == 4 * largest


def test_int_truncates_the_shard():
    # int(18 * 1_000_001 / 4) = int(4500004.5) = 4500004: DeepSpeed floors the shard
    assert deepspeed_zero3(1_000_001, 10, gpus_per_node=4)[0] == 40 + 4_500_004
    # and where 18 * P divides evenly it is exactly 4L + 18 P / N
    assert deepspeed_zero3(7_000_000_000, 10, gpus_per_node=8)[0] == 40 + 18 * 7_000_000_000 / 8


def test_nodes_multiply_gpus_for_gpu_and_divide_cpu():
    one = deepspeed_zero3(7e9, 1e8, gpus_per_node=8, nodes=1, cpu_offload=True, cpu_offload_params=True)
    four = deepspeed_zero3(7e9, 1e8, gpus_per_node=8, nodes=4, cpu_offload=True, cpu_offload_params=True)
    assert one[0] == four[0] == 4e8
    assert one[1] == 4 * four[1] == int(7e9 * 18 * 1.5)
    assert deepspeed_zero2(7e9, gpus_per_node=2, nodes=4)[0] == deepspeed_zero2(7e9, gpus_per_node=8)[0]


def test_cpu_figures():
    p, largest = 7_000_000_000, 100_000_000
    assert deepspeed_zero2(p, gpus_per_node=8)[1] == p * 4 * 8 * 1.5
    assert deepspeed_zero2(p, gpus_per_node=2, cpu_offload=True)[1] == p * 16 * 1.5      # max(8, 16)
    assert deepspeed_zero3(p, largest, gpus_per_node=8)[1] == largest * 4 * 8 * 1.5
    assert deepspeed_zero3(p, largest, gpus_per_node=8, zero_init=False)[1] == p * 4 * 8 * 1.5
    assert deepspeed_zero3(p, largest, gpus_per_node=8, cpu_offload=True, zero_init=False)[1] == p * 32 * 1.5
    assert deepspeed_zero3(p, largest, additional_buffer_factor=1.0, cpu_offload=True)[1] == 16 * p


def test_compare_rows_relate_to_model_states():
    p, n, largest = 7_000_000_000, 8, 131_072_000
    rows = {r.name: r for r in compare(p, n, largest_layer_params=largest)}
    assert len(rows) == 15
    for stage, name in enumerate(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        assert rows[f"ZeRO paper, K=12: {name}"].gpu_bytes == model_states(p, world_size=n, stage=stage).total
        assert rows[f"fp32 grads (18 B): {name}"].gpu_bytes == model_states(
            p, world_size=n, stage=stage, recipe="mixed-fp32-grads").total
    assert [rows[f"ZeRO paper, K=12: {s}"].gpu_bytes for s in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")] == [
        16 * p, 4 * p + 12 * p // n, 2 * p + 14 * p // n, 16 * p // n]
    # DeepSpeed ZeRO-3 = the 18 B/param recipe's ZeRO-3 total + the gathered largest layer
    assert rows["DeepSpeed ZeRO-3"].gpu_bytes == 4 * largest + rows["fp32 grads (18 B): ZeRO-3"].gpu_bytes
    # DeepSpeed ZeRO-2 also counts the fp16 grads: 2 B/param more, sharded
    assert rows["DeepSpeed ZeRO-2"].gpu_bytes == rows["fp32 grads (18 B): ZeRO-2"].gpu_bytes + 2 * p // n
    assert rows["accelerate estimate-memory (float32)"].gpu_bytes == 16 * p
    assert rows["accelerate estimate-memory (float16)"].gpu_bytes == 8 * p
    assert rows["accelerate estimate-memory (float32)"].stage is None
    assert rows["DeepSpeed ZeRO-3 + offload_param+opt"].cpu_bytes == int(p * 18 * 1.5)
    for r in rows.values():
        assert isinstance(r, Row)
        assert ("GiB" in r.unit_note) != (r.unit_note == "GB = 1e9 bytes")


def test_compare_on_one_gpu():
    p, largest = 1_000_000, 1000
    rows = {r.name: r.gpu_bytes for r in compare(p, 1, largest_layer_params=largest)}
    assert {rows[f"ZeRO paper, K=12: {s}"] for s in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")} == {16 * p}
    assert {rows[f"fp32 grads (18 B): {s}"] for s in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")} == {18 * p}
    assert rows["DeepSpeed ZeRO-2"] == 20 * p
    assert rows["DeepSpeed ZeRO-3"] == 18 * p + 4 * largest


def test_compare_takes_configs_and_presets():
    cfg = PRESETS["llama-2-7b"].config
    by_cfg = compare(cfg, 8)
    assert by_cfg == compare(PRESETS["llama-2-7b"], 8) == compare("llama-2-7b", 8)
    ds3 = next(r for r in by_cfg if r.name == "DeepSpeed ZeRO-3")
    assert ds3.gpu_bytes == 4 * cfg.largest_layer_params() + int(18 * cfg.num_params() / 8)
    assert compare(cfg, 16, gpus_per_node=8) != compare(cfg, 16)        # CPU per node differs
    small = TransformerConfig(hidden=64, layers=2, heads=4, vocab=100, seq=16)
    assert deepspeed_zero3(small)[0] == 4 * small.largest_layer_params() + 18 * small.num_params()


def test_table_shows_both_units():
    rows = compare("llama-2-7b", 8)
    text = table(rows)
    head = text.splitlines()[0]
    assert "GPU GB" in head and "GPU GiB" in head and "CPU GiB" in head
    assert "GB = 10**9 bytes; GiB = 2**30 bytes" in text
    assert 'their "GB" = GiB' in text and "GB = 1e9 bytes" in text
    assert len(text.splitlines()) == len(rows) + 3
    assert all(line == line.rstrip() for line in text.splitlines())
    assert "GPU MiB" in table(rows, unit="MB")
    r = next(r for r in rows if r.name == "ZeRO paper, K=12: DDP")
    assert f"{r.gpu_bytes / GB:10.2f}  {r.gpu_bytes / GiB:10.2f}" in text


def test_plot_has_one_bar_per_estimator():
    rows = compare("llama-2-7b", 8)
    fig = plot_estimators(rows, title="llama-2-7b, 8 GPUs")
    (ax,) = fig.axes
    bars = ax.patches
    assert len(bars) == len(rows)
    assert sorted(b.get_width() for b in bars) == sorted(r.gpu_bytes / GB for r in rows)
    assert {t.get_text() for t in ax.get_yticklabels()} == {r.name for r in rows}
    assert "GB" in ax.get_xlabel() and ax.get_title() == "llama-2-7b, 8 GPUs"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ZeRO paper", "fp32 grads",
                                                                   "DeepSpeed", "accelerate"]


@pytest.mark.parametrize("call, exc, words", [
    (lambda: deepspeed_zero2(0), ValueError, "num_params must be > 0"),
    (lambda: deepspeed_zero2("7B"), ValueError, "unknown preset '7B': pass a parameter count"),
    (lambda: deepspeed_zero2([7e9]), TypeError, "num_params must be a number"),
    (lambda: deepspeed_zero2(True), TypeError, "num_params must be a number"),
    (lambda: deepspeed_zero2(7e9, gpus_per_node=0), ValueError, "gpus_per_node must be >= 1"),
    (lambda: deepspeed_zero2(7e9, nodes=1.0), TypeError, "nodes must be an int"),
    (lambda: deepspeed_zero2(7e9, cpu_offload="yes"), TypeError, "cpu_offload must be True or False"),
    (lambda: deepspeed_zero2(7e9, additional_buffer_factor=0), ValueError, "additional_buffer_factor"),
    (lambda: deepspeed_zero3(7e9), ValueError, "need largest_layer_params"),
    (lambda: deepspeed_zero3(7e9, 8e9), ValueError, "cannot exceed num_params"),
    (lambda: deepspeed_zero3(7e9, 1e8, cpu_offload_params=True), ValueError, "set cpu_offload=True"),
    (lambda: deepspeed_zero3(7e9, 1e8, zero_init=1), TypeError, "zero_init must be True or False"),
    (lambda: accelerate_peak(7e9, dtype="fp16"), ValueError, "dtype must be one of"),
    (lambda: accelerate_peak(7.5, dtype="float32"), ValueError, "whole number"),
    (lambda: accelerate_peak(7e9, buffer_bytes=-1), ValueError, "buffer_bytes"),
    (lambda: accelerate_training_usage(7e9, "float32"), ValueError, "model_bytes must be an int"),
    (lambda: compare(7e9, 8), ValueError, "need largest_layer_params"),
    (lambda: compare("zero-paper-7.5b", 64), ValueError, "need largest_layer_params"),
    (lambda: compare("gpt-5", 8), ValueError, "unknown preset"),
    (lambda: compare(7e9, 0, largest_layer_params=1e8), ValueError, "world_size must be >= 1"),
    (lambda: compare(7e9, 12, largest_layer_params=1e8, gpus_per_node=8), ValueError, "multiple of gpus_per_node"),
    (lambda: table([]), TypeError, "list of Row"),
    (lambda: plot_estimators([1, 2]), TypeError, "list of Row"),
    (lambda: plot_estimators(compare("gpt2-xl", 2), title=3), TypeError, "title must be a str"),
    (lambda: table(compare("gpt2-xl", 2), unit="GiB"), ValueError, "unit must be 'GB' or 'MB'"),
])
def test_bad_input_gets_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


# DeepSpeed and accelerate are test dependencies (pure Python on CPU): a formula change
# upstream (like DeepSpeed PR #5099) fails these tests instead of going unnoticed.

def test_matches_real_deepspeed():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2

    models = [T5_3B, T0_3B, (2851e6, 32e6), (129_350, 5_050), (1_000_001, 999), (7e9, 131_072_000)]
    clusters = [(1, 1), (2, 1), (8, 1), (3, 1), (8, 4), (4, 3)]
    for (p, largest), (g, nodes), abf in itertools.product(models, clusters, (1.5, 1.0, 2.25)):
        kw = dict(num_gpus_per_node=g, num_nodes=nodes, additional_buffer_factor=abf)
        ours = dict(gpus_per_node=g, nodes=nodes, additional_buffer_factor=abf)
        for off in (True, False):
            cpu, gpu = z2(p, cpu_offload=off, **kw)
            assert deepspeed_zero2(p, cpu_offload=off, **ours) == (gpu, cpu)
        for off, off_params, zi in ((True, True, True), (True, True, False), (True, False, True),
                                    (True, False, False), (False, False, True), (False, False, False)):
            cpu, gpu, largest_mem = z3(p, largest, cpu_offload=off, cpu_offload_params=off_params,
                                       zero_init=zi, **kw)
            assert deepspeed_zero3(p, largest, cpu_offload=off, cpu_offload_params=off_params,
                                   zero_init=zi, **ours) == (gpu, cpu)
            assert largest_mem == 4 * largest


def test_matches_real_deepspeed_printout():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    def numbers(text):      # the two number columns; DeepSpeed's options text varies with Python
        return [line.split("|")[:2] for line in text.splitlines() if "|" in line]

    for stage, fn in ((2, estimate_zero2_model_states_mem_needs_all_cold),
                      (3, estimate_zero3_model_states_mem_needs_all_cold)):
        out = io.StringIO()
        args = dict(total_params=T0_3B[0], num_gpus_per_node=2, num_nodes=1)
        if stage == 3:
            args["largest_layer_params"] = T0_3B[1]
        with contextlib.redirect_stdout(out):
            fn(**args)
        ours = deepspeed_printout(*T0_3B, stage=stage, gpus_per_node=2)
        assert numbers(out.getvalue()) == numbers(ours)
        assert out.getvalue().splitlines()[:3] == ours.splitlines()[:3]


def test_matches_real_accelerate():
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import convert_bytes

    for m in (433_249_280, 7, 28_000_000_001):
        for dtype in ACCELERATE_DTYPES:
            assert accelerate_training_usage(m, dtype) == estimate_training_usage(m, dtype)
    for size in (0, 1023, 1024, 433_249_280, 1.5 * 2**40, 3 * 2**50):
        assert accelerate_convert_bytes(size) == convert_bytes(size)
