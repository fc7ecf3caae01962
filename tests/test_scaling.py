"""Step-time arithmetic behind notebook 02's explanation of the seeds' gpt2-xl runs."""
import pytest

from course_utils.theory.scaling import (GPT2XL_RUNS, allreduce_seconds, implied_bandwidth, overhead_share,
                                  split_accumulation)

S = GPT2XL_RUNS


def test_accumulation_is_k_forward_backward_plus_one_step():
    fb, rest = split_accumulation(S["single_batch15_ms"] / 1e3, S["accum_ms"] / 1e3, S["accum_k"])
    assert fb == pytest.approx(0.359, abs=1e-3) and rest == pytest.approx(0.034, abs=1e-3)
    assert S["accum_ms"] / S["single_batch15_ms"] == pytest.approx(3.74, abs=0.01)
    with pytest.raises(ValueError):
        split_accumulation(1, 2, 1)


def test_the_overhead_is_the_gradient_all_reduce():
    # 1.56e9 fp32 gradients, ring on 4 GPUs: 9.36 GB sent per GPU per step
    bw = implied_bandwidth(S["params"], S["dp"], S["overhead_batch1_ms"] / 1e3)
    assert bw == pytest.approx(312e9, rel=1e-3)            # ~312 GB/s per GPU: NVLink-class
    t = allreduce_seconds(S["params"], S["dp"], bandwidth=bw)
    assert t == pytest.approx(0.030)
    # the same 28-30 ms is 14 % of a batch-1 step and ~7 % of a batch-15 step
    batch1 = S["overhead_batch1_ms"] / S["overhead_batch1_share"]     # +30 ms was +14 % of R1
    assert batch1 == pytest.approx(214.3, abs=0.1) and 30 / batch1 == pytest.approx(0.14)
    assert overhead_share(batch1, 30) == pytest.approx(30 / 244.3, abs=1e-3)
    assert overhead_share(S["single_batch15_ms"], S["dp4_batch15_ms"] - S["single_batch15_ms"]) == \
        pytest.approx(28 / 421)


def test_latency_term_counts_messages():
    base = allreduce_seconds(1e6, 4, bandwidth=1e9)
    assert allreduce_seconds(1e6, 4, bandwidth=1e9, alpha=1e-5, messages=10) == pytest.approx(base + 10 * 6 * 1e-5)
    with pytest.raises(ValueError):
        allreduce_seconds(1e6, 4, bandwidth=0)
