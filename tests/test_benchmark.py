"""The published gpt2-xl runs as laid out for notebooks 02, 05 and 09, the planner check as a
plot (it renders; pixels are not compared), and exercise 09.1's grader."""
import pytest

from course_utils.course import benchmark
from course_utils.course.exercises import check_megatron_states_gb
from course_utils.theory.gpt2xl import GPT2XL_BENCHMARK, BenchmarkRow, benchmark_comparison


def test_runs_carry_the_reported_figures_and_their_setup():
    r = {run.name: run for run in benchmark.runs()}
    assert [x.name for x in benchmark.runs("R3 R5")] == ["R3", "R5"]
    assert (r["R4"].gpus, r["R4"].micro_batch, r["R4"].accumulation, r["R4"].global_batch) == (1, 15, 4, 60)
    assert r["R12"].global_batch == GPT2XL_BENCHMARK["dp8_max_global_batch"] == 120
    assert r["R12+"].global_batch == GPT2XL_BENCHMARK["dp8_max_global_batch_distopt"] == 168
    assert r["R6"].distributed_optimizer and not r["R5"].distributed_optimizer
    table = benchmark.runs_table(["R1", "R2", "R3", "R4", "R5"])
    for text in ("393 ms", "1470 ms", "421 ms", "R1 + 30 ms (+14%)", "33,321 MiB"):
        assert text in table
    assert "R6" not in table and len(table.splitlines()) == 2 + 5 + 1
    assert "dist. opt." not in table and "dist. opt." in benchmark.runs_table("R5 R6")


def test_bad_run_names_are_refused():
    with pytest.raises(ValueError, match="no run 'R99'"):
        benchmark.runs("R1 R99")
    with pytest.raises(ValueError, match="at least one run"):
        benchmark.runs([])


def test_mib_to_gb():
    assert benchmark.mib_to_gb(26699.47) == pytest.approx(27.996, abs=1e-3)
    with pytest.raises(TypeError):
        benchmark.mib_to_gb("26699")
    with pytest.raises(ValueError):
        benchmark.mib_to_gb(-1)


@pytest.fixture(scope="module")
def rows():
    return benchmark_comparison()


def test_tolerance_bands_contain_the_prediction_exactly_when_the_row_is_within(rows):
    for r in rows:
        lo, hi = benchmark.tolerance_band(r)
        assert (lo <= r.predicted <= hi) == r.within, r.quantity
    bad = BenchmarkRow("x", 1.0, 1.0, "GB", "roughly", True, "")
    with pytest.raises(ValueError, match="roughly"):
        benchmark.tolerance_band(bad)


def test_plot_check_renders_one_row_per_figure(rows):
    fig = benchmark.plot_check(rows)
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == len(rows)
    fig.canvas.draw()                       # renders without error
    with pytest.raises(TypeError):
        benchmark.plot_check(["not a row"])


def test_megatron_states_grader(capsys):
    def right(num_params, dp, distributed_optimizer):
        return num_params * (2 + 4 + 12 / dp if distributed_optimizer else 18) / 1e9

    def forgets_the_gradients(num_params, dp, distributed_optimizer):
        return num_params * (2 + 16 / dp if distributed_optimizer else 18) / 1e9

    assert check_megatron_states_gb(right)
    assert not check_megatron_states_gb(forgets_the_gradients)
    assert "cases right" in capsys.readouterr().out
