"""scripts/gpu_check.py (`make gpu-check`): its plan, its comparisons and its table, on the CPU.

The GPU checks themselves need GPUs; here every piece they are built from runs: the row
builders with fake and with measured numbers (a CPU stand-in for the memory check, measured
with PyTorch's MemTracker on a config with the GPU config's proportions), the all-reduce
and strategy checks on gloo ranks, and the no-GPU run of the script.
"""
import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest

from course_utils.harness import strategies
from course_utils.course.badges import ROOT
from course_utils.theory.config import TransformerConfig
from course_utils.theory.memory import per_gpu

SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module          # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["gpu_check"]


def test_without_a_gpu_it_says_so_lists_its_plan_and_exits_0():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.startswith("no CUDA GPU visible: nothing to check here")
    one, several = text.split("With one GPU", 1)[1].split("With N >= 2 GPUs", 1)
    assert "1 NCCL rank, one GPU each" in one and "vs memory.per_gpu" in one
    assert "2 gloo ranks on CPU next to a visible GPU" in one and "NCCL ranks" not in one
    assert "4 NCCL ranks, one GPU each" in several
    for name in strategies.strategies():
        if strategies.STRATEGIES[name].distributed:
            assert f"{name}: losses = one process's" in several, name


def test_plan_follows_the_gpu_count(gpu_check):
    def checks(gpus):
        return [(p.check, p.where) for p in gpu_check.plan(gpus)]

    one = checks(1)
    assert one[0] == ("all-reduce of rank + 1 on 1 rank",
                      "1 NCCL rank, one GPU each, forked from this process")
    assert one[1][1].startswith("2 gloo ranks on CPU after a backward here, forked from the forkserver")
    assert [w for _, w in one[2:5]] == ["this process, GPU 0"] * 2 + ["this process, GPU 0 (1 NCCL rank)"]
    assert [c.split(":")[0] for c, _ in one[5:-1]] == list(gpu_check.GLOO_NEXT_TO_GPU)
    # last: 1 NCCL rank from the forkserver once CUDA is initialised here (its preload must not)
    assert one[-1] == ("all-reduce of rank + 1 on 1 rank after CUDA was initialised here",
                       "1 NCCL rank, one GPU each, forked from the forkserver")
    assert all("NCCL" not in w for _, w in one[1:-1] if "GPU 0" not in w)   # one GPU: no NCCL ranks forked
    three = dict(checks(3))
    assert three["all-reduce of rank + 1 on 3 ranks"].startswith("3 NCCL ranks")
    assert three["zero3: losses = one process's (3 steps)"].startswith("3 NCCL ranks")
    assert three["torch-hsdp: losses = one process's (3 steps)"].startswith("2 NCCL ranks")
    eight = checks(8)
    assert "all-reduce of rank + 1 on 8 ranks" in dict(eight)
    assert [w.split(",")[0] for c, w in eight if c.startswith("ddp:")] == [
        "4 NCCL ranks", "2 gloo ranks on CPU after a backward here", "2 gloo ranks on CPU next to a visible GPU"]
    # NCCL ranks are forked before this process touches CUDA (the memory check), gloo ranks after
    kinds = ["memory" if "GPU 0" in w else "nccl" if "NCCL" in w else "backward" if "backward" in w
             else "gloo" for _, w in eight[:-1]]
    assert kinds == sorted(kinds, key=["nccl", "backward", "memory", "gloo"].index)
    for bad, exc in ((0, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(exc):
            gpu_check.plan(bad)
    assert [gpu_check.strategy_world_size("torch-hsdp", n) for n in (2, 3, 4, 8)] == [2, 2, 4, 4]
    assert [gpu_check.strategy_world_size("zero1", n) for n in (2, 3, 4, 8)] == [2, 3, 4, 4]


def test_bytes_row_compares_measured_with_predicted(gpu_check):
    exact = gpu_check.bytes_row("states", "here", 1024, 1024)
    assert exact.ok and exact.measured == exact.predicted == "0.000 GiB"
    assert "tolerance exact" in exact.note
    assert not gpu_check.bytes_row("states", "here", 1025, 1024).ok
    mib = 2**20
    near = gpu_check.bytes_row("peak", "here", 110 * mib, 100 * mib, rtol=0.10, why="activations")
    assert near.ok and "gap +10.0 MiB (+10.0%), tolerance ± 10%; activations" in near.note
    assert not gpu_check.bytes_row("peak", "here", 111 * mib, 100 * mib, rtol=0.10).ok
    assert gpu_check.bytes_row("peak", "here", 89 * mib, 100 * mib, rtol=0.10, atol=mib).ok
    below = gpu_check.bytes_row("held", "here", 100 * mib, 200 * mib, rtol=0.01, atol=64 * mib)
    assert not below.ok and "gap -100.0 MiB (-50.0%), tolerance ± 1% + 64 MiB" in below.note
    with pytest.raises(TypeError, match="measured must be a number of bytes"):
        gpu_check.bytes_row("x", "here", "1", 1)
    with pytest.raises(TypeError):
        gpu_check.bytes_row("x", "here", 1, True)
    with pytest.raises(ValueError, match=">= 0 bytes"):
        gpu_check.bytes_row("x", "here", -1, 1)
    with pytest.raises(ValueError, match="rtol"):
        gpu_check.bytes_row("x", "here", 1, 1, rtol=-0.1)


def test_losses_row_uses_the_course_tolerance(gpu_check):
    ref = [4.0, 3.5, 3.0]
    ok = gpu_check.losses_row("ddp", "here", [4.0, 3.5 * (1 + 5e-7), 3.0], ref)
    assert ok.ok and ok.measured == "max rel. diff 5.0e-07" and ok.predicted == "≤ 1e-6 (fmt.LOSS_RTOL)"
    assert not gpu_check.losses_row("ddp", "here", [4.0, 3.5 * (1 + 2e-6), 3.0], ref).ok
    split = gpu_check.losses_row("ddp", "here", ref, ref, same_parameters=False)
    assert not split.ok and "different full parameters" in split.note
    with pytest.raises(ValueError, match="equally long"):
        gpu_check.losses_row("ddp", "here", [4.0], ref)


def test_table_and_summary(gpu_check):
    rows = [gpu_check.Row("a", "1 NCCL rank", "3", "3", True),
            gpu_check.bytes_row("b", "GPU 0", 2, 1),
            gpu_check.error_row("c", "GPU 0", gpu_check.NotRun("needs Ampere")),
            gpu_check.error_row("d", "2 ranks", RuntimeError("rank 1 raised\ntraceback..."))]
    text = gpu_check.table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["check", "where", "measured", "predicted", "result"]
    assert lines[2].endswith("ok") and lines[3].endswith("FAIL [1]")
    assert lines[4].endswith("not run [2]") and lines[5].endswith("FAIL [3]")
    assert "[2] needs Ampere" in text and "[3] RuntimeError: rank 1 raised" in text
    assert "traceback" not in text
    assert gpu_check.summary(rows) == "2 of 4 checks FAILED"
    assert gpu_check.summary(rows[:1] + rows[2:3]) == "all 1 checks ok, 1 not run"
    with pytest.raises(TypeError):
        gpu_check.table(["not a row"])


def test_a_failing_check_does_not_stop_the_others(gpu_check):
    seen = []
    planned = [gpu_check.Planned("boom", "GPU 0", lambda: 1 / 0),
               gpu_check.Planned("fine", "GPU 0", lambda: [gpu_check.Row("fine", "GPU 0", ok=True)])]
    rows = gpu_check.run_checks(planned, progress=seen.append)
    assert [(r.check, r.ok) for r in rows] == [("boom", False), ("fine", True)]
    assert "ZeroDivisionError" in rows[0].note and len(seen) == 2


def _fake_measurement(config, micro_batch, **changes):
    predicted = per_gpu(config, recipe="mixed", micro_batch=micro_batch, attention="flash")
    held = {"params": predicted.params, "grads": predicted.grads,
            "optimizer": predicted.optimizer + 4 * 10, "optimizer_detail": {"step": 4 * 10}}
    m = {"peak": predicted.total, "allocated": predicted.states.total + 32 * 2**20, "held": held,
         "predicted": predicted, "device": "a fake GPU"}
    m.update(changes)
    return m


def test_memory_rows_with_fake_numbers(gpu_check):
    cfg, b = gpu_check.MEMORY_CONFIG, gpu_check.MEMORY_MICRO_BATCH
    rows = gpu_check.memory_rows(_fake_measurement(cfg, b))
    assert [r.ok for r in rows] == [True, True, True]
    assert all(r.where == "this process, GPU 0 (a fake GPU)" for r in rows)
    assert "step counters" in rows[0].note and "expected gap about" in rows[2].note
    m = _fake_measurement(cfg, b)
    predicted = m["predicted"]
    # the same total, split differently: the parts are compared too
    held = dict(m["held"], params=predicted.params - 2, grads=predicted.grads + 2)
    states = gpu_check.memory_rows(dict(m, held=held))[0]
    assert not states.ok and "the parts differ" in states.note
    assert not gpu_check.memory_rows(_fake_measurement(cfg, b, peak=int(predicted.total * 1.2)))[2].ok
    assert not gpu_check.memory_rows(_fake_measurement(cfg, b, allocated=predicted.states.total * 2))[1].ok


def test_op_selective_rows_with_fake_numbers(gpu_check):
    """torchtitan's policy keeps q, v, gate, down, the attention output, its logsumexp and the
    input: 2·t·(h + h + kv + f + h + h) + 4·a·t bytes (t tokens); every mm: + k, out-proj, up."""
    t, h, kv, f, a = 2 * 8192, 4096, 1024, 14336, 32
    want = {"torchtitan": 2 * t * (4 * h + kv + f) + 4 * a * t,
            "op-selective": 2 * t * (5 * h + 2 * kv + 2 * f) + 4 * a * t}
    m = {"kept": dict(want), "device": "a fake GPU", "model": "llama-3.1-8b", "micro_batch": 2, "seq": 8192}
    rows = gpu_check.op_selective_rows(m)
    assert [r.ok for r in rows] == [True, True] and "'torchtitan'" in rows[0].check
    assert "logsumexp" in rows[0].note and rows[0].where == "this process, GPU 0 (a fake GPU)"
    off = dict(m, kept={k: v + gpu_check.SAC_ATOL + 512 for k, v in want.items()})
    assert [r.ok for r in gpu_check.op_selective_rows(off)] == [False, False]


def test_peak_gap_terms(gpu_check):
    cfg = TransformerConfig(hidden=8, layers=2, heads=2, vocab=16, seq=4)
    terms = gpu_check.peak_gap_terms(cfg, 3)
    assert terms == {"gradients not yet allocated": -2 * cfg.num_params(),
                     "no dropout masks": -(2 * 2 + 1) * 4 * 3 * 8,
                     "expected gap": -2 * cfg.num_params() - 480}
    # the loss's fp32 gradient buffers (2 x 4·s·b·V), a gap term before, are predicted now
    from course_utils.theory.memory import activation_bytes
    assert activation_bytes(cfg, micro_batch=3, seq=4).loss_grads == 8 * 4 * 3 * 16


def test_memory_check_holds_for_a_cpu_stand_in(gpu_check):
    """The memory check's numbers, measured on the CPU with PyTorch's MemTracker for a
    config with the GPU config's proportions (hidden, vocab and seq / 4, the same layers
    and micro-batch: every term scales by 1/16): every row is ok, and the peak's gap is
    the one peak_gap_terms explains."""
    from course_utils.harness.model import SyntheticData, build_model
    from course_utils.harness.experiments import state_bytes
    from course_utils.harness.precision import make_training, memtracker_bytes, train_step

    big, b = gpu_check.MEMORY_CONFIG, gpu_check.MEMORY_MICRO_BATCH
    cfg = dataclasses.replace(big, hidden=big.hidden // 4, heads=big.heads // 4,
                              vocab=big.vocab // 4, seq=big.seq // 4)
    model, opt = make_training(build_model(cfg, seed=0), "mixed")
    x, y = SyntheticData(cfg, global_batch=b, seed=0).batch(0)
    train_step(model, opt, x, y)                       # AdamW's m and v exist from here on
    tracked = memtracker_bytes(model, opt, lambda: train_step(model, opt, x, y, zero_grad=False))
    m = _fake_measurement(cfg, b, peak=tracked["peak"]["Total"],
                          allocated=tracked["current"]["Total"], held=state_bytes(model, opt, detail=True))
    rows = gpu_check.memory_rows(m, cfg, b)
    assert [r.ok for r in rows] == [True, True, True], gpu_check.table(rows)
    gap = m["peak"] - m["predicted"].total
    expected = gpu_check.peak_gap_terms(cfg, b)["expected gap"]
    assert abs(gap - expected) <= 0.01 * m["predicted"].total, (gap, expected)


def test_all_reduce_and_strategy_checks_on_gloo_ranks(gpu_check):
    (row,) = gpu_check.check_all_reduce(2, "gloo")
    assert row.ok and row.measured == row.predicted == "3 on cpu, cpu"
    assert row.where == "2 gloo ranks on CPU, forked"
    (row,) = gpu_check.check_strategy("zero2", 2, "gloo", " next to a visible GPU")
    assert row.ok, row
    assert row.where == "2 gloo ranks on CPU next to a visible GPU, forked"
    assert row.check == "zero2: losses = one process's (3 steps)"
    # next to a GPU the ranks must start from the forkserver (CUDA initialised here); forked ones fail
    (row,) = gpu_check.check_strategy("ddp", 2, "gloo", start_method="forkserver")
    assert not row.ok and row.note == "the ranks were forked, not forked from the forkserver"
