"""course_utils.runtime.fmt: measured floats printed so that the text is the same on every machine."""
import pytest
import torch

from course_utils.runtime import fmt
from course_utils.runtime.fmt import table


def test_num_and_nums_round_to_three_significant_digits():
    assert fmt.num(4.4764524) == fmt.num(4.4764533) == "4.48"     # two machines' step-3 loss
    assert fmt.num(33.454994) == fmt.num(33.455001) == "33.5"     # at 4 digits: 33.45 / 33.46
    assert fmt.num(torch.tensor(0.4999997)) == "0.500" and fmt.num(29.965569) == "30.0"
    assert fmt.num(300.0) == "300" and fmt.num(1.5) == "1.5" and fmt.num(0.0) == "0"
    assert fmt.num(1.5e-7) == "1.5e-07" and fmt.num(1.4999e-7) == "1.50e-07"
    assert fmt.num(4.4764528, sig=5) == "4.4765"
    assert fmt.nums([4.6338592, 4.5561831]) == "[4.63, 4.56]"
    with pytest.raises(TypeError, match="x must be a number"):
        fmt.num("4.5")
    with pytest.raises(ValueError, match="sig must be an int >= 1"):
        fmt.num(1.0, sig=0)


def test_bounds_print_the_limit_not_the_value():
    # 1.6e-07 on one machine, 1.1e-07 on another: the same text
    assert fmt.bound(1.6e-7, 1e-6) == fmt.bound(1.1e-7, 1e-6) == "≤ 1e-6 ✓"
    assert fmt.bound(0.0, 1e-5) == "≤ 1e-5 ✓"
    assert fmt.bound(3.2e-5, 1e-6) == "= 3.2e-05 > 1e-6 ✗"          # a failure shows the value
    assert fmt.bound(float("nan"), 1e-6).endswith("✗")
    assert fmt.above(9.7e-5) == fmt.above(6.7e-5) == "> 0 ✓"
    assert fmt.above(0.0).endswith("✗")
    assert fmt.near(0.4999996, 0.5, 1e-5) == fmt.near(0.4999997, 0.5, 1e-5) == "0.5 ± 1e-5 ✓"
    assert fmt.near(0.49, 0.5, 1e-5).endswith("✗")
    assert fmt.sci(0.00390625) == "0.00390625" and fmt.sci(1e-6) == "1e-6" and fmt.sci(2e5) == "2e5"


def test_losses_match_is_relative_and_checks_lengths():
    ref = [4.6338592, 4.5561831, 4.4764528]
    assert fmt.losses_match([4.6338592, 4.5561836, 4.4764524], ref) == "≤ 1e-6 ✓"
    assert fmt.losses_match([4.7, 4.5561831, 4.4764528], ref).endswith("✗")
    assert fmt.losses_match([0.0], [0.0]) == "≤ 1e-6 ✓"
    with pytest.raises(ValueError, match="equally long"):
        fmt.losses_match([1.0], [1.0, 2.0])


def test_show_keeps_whole_numbers_and_rounds_the_rest():
    assert fmt.show(torch.tensor([300.0, 302.0])) == "tensor([300.0, 302.0], shape=(2,))"
    # the hang lab's expected weights on two numeric settings of one machine: the same text
    assert fmt.show(torch.tensor([0.048544962, -0.155119359])) == \
        fmt.show(torch.tensor([0.0485449694, -0.155119359])) == "tensor([0.0485, -0.155], shape=(2,))"
    assert fmt.show(torch.tensor(3.0)) == "tensor(3)" and fmt.show(1.12e11) == "1.12e+11"
    assert fmt.show(0.123456789) == "0.123" and fmt.show(None) == "None" and fmt.show(7) == "7"


def test_ratio_of_measured_values_or_not_measured():
    from course_utils.runtime.fmt import NOT_MEASURED, ratio

    assert ratio(5_833_800, 3_889_160) == "1.50" and ratio(1, 3, digits=3) == "0.333"
    assert ratio(None, 3) == ratio(3, None) == ratio(3, 0) == NOT_MEASURED   # macOS, NCCL



def test_plural_says_1_rank_and_2_ranks():
    assert fmt.plural(1, "rank") == "1 rank"
    assert [fmt.plural(n, "rank") for n in (0, 2, 4)] == ["0 ranks", "2 ranks", "4 ranks"]
    assert fmt.plural(1, "GPU") == "1 GPU" and fmt.plural(8, "GPU") == "8 GPUs"
    assert fmt.plural(2, "process") == "2 processes" and fmt.plural(3, "micro-batch") == "3 micro-batches"
    assert fmt.plural(1, "gloo rank") == "1 gloo rank"
    assert fmt.plural(2, "child", "children") == "2 children" and fmt.plural(1, "child", "children") == "1 child"
    assert fmt.plural(torch.tensor(3), "rank") == "3 ranks"        # an int-like count
    for bad in (1.0, True, "1", None):
        with pytest.raises(TypeError, match="count"):
            fmt.plural(bad, "rank")
    with pytest.raises(ValueError, match="noun"):
        fmt.plural(2, "")


def test_labels_that_count_ranks_say_1_rank():
    """Where a printed label counts ranks, GPUs or nodes, 1 is singular ("zero1, 1 ranks" was not)."""
    from course_utils.course.exercises.nb08 import CAPSTONE_SCENARIOS
    from course_utils.runtime.launch import where

    assert where(1, "gloo") == "1 rank, gloo on CPU" and where(3, "gloo") == "3 ranks, gloo on CPU"
    assert where(1, "gloo", backend_first=True) == "1 gloo rank on CPU"
    assert where(2, "gloo", backend_first=True) == "2 gloo ranks on CPU"
    assert where(1, "nccl", backend_first=True) == "1 NCCL rank, one GPU each"
    one_gpu = [s for s in CAPSTONE_SCENARIOS if s.gpus == 1]
    assert one_gpu and all("N = 1 GPU (1 node x 1)" in s.numbers() for s in one_gpu)


def test_the_one_byte_formatter_covers_every_format_the_package_prints():
    from course_utils.runtime.fmt import fmt_bytes

    assert fmt_bytes(28e9) == "28.0 GB" and fmt_bytes(2**30, "GiB", 2) == "1.00 GiB"
    assert [fmt_bytes(n, "auto", 2, sep=True) for n in (1000, 3 * 2**20, 5 * 2**40, -2000)] == [
        "1,000 B", "3.00 MiB", "5.00 TiB", "-1.95 KiB"]
    assert [fmt_bytes(n, None, 2, sep=True) for n in (4000, 925925.25)] == ["4,000", "925,925.25"]
    assert [fmt_bytes(m, "auto", 3, sig=True, largest="MiB") for m in (16, 523.7, 3 * 2**10, 2**30)] == [
        "16 B", "523.7 B", "3 KiB", "1.02e+03 MiB"]
    with pytest.raises(ValueError, match="unit must be one of"):
        fmt_bytes(1, "GiBs")


def test_the_one_table_renderer_aligns_rules_and_notes():
    from course_utils.runtime.fmt import table

    text = table(["op", "bytes", "ok"], [["all_reduce", 6000, "ok"], ["total", 6000, "DIFFERS"]],
                 left=(0, 2), rules=(0, 1), notes=["a note"])
    assert text.splitlines() == ["op          bytes  ok", "----------  -----  -------",
                                 "all_reduce  6,000  ok", "----------  -----  -------",
                                 "total       6,000  DIFFERS", "a note"]
    assert table(["a"], [["x"]], rules=()).splitlines() == ["a", "x"]


def test_table_cells_alignment_and_errors():
    text = table(["a", "b"], [["x", 1234], ["yy", None], ["z", True]], notes=["n"])
    assert text.splitlines() == ["a       b", "--  -----", "x   1,234", "yy      -", "z     yes", "n"]
    assert table(["f"], [[1234.56], [9.288e-08], [3.0]]).splitlines()[2:] == [
        "1,234.6", "9.288e-08", "3"]
    assert table(["a", "b"], [["x", "long"], ["yy", "s"]], left=(0, 1)).splitlines()[2:] == [
        "x   long", "yy  s"]
    with pytest.raises(ValueError, match="column indices"):
        table(["a", "b"], [["x", 1]], left=(2,))
    with pytest.raises(ValueError, match="cells"):
        table(["a", "b"], [["x"]])
    with pytest.raises(TypeError):
        table([], [])
