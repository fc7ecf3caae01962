"""The memory calculator widget and its headless form."""
import pytest

from course_utils.course import calculator
from course_utils.course.calculator import CUSTOM, Calculator, Setting, rows, table
from course_utils.course.widgets import LIVE_NOTE
from course_utils.theory.memory import GB


def test_default_table_is_deterministic_and_says_what_fits():
    text = table(Setting())
    assert text == table(Setting())
    assert "fits in 80 GB: ZeRO-1, ZeRO-2, ZeRO-3" in text
    assert text.splitlines()[3].split()[0] == "DDP"


def test_zero_paper_setting_reproduces_figure_1():
    r = rows(Setting(model="zero-paper-7.5b", gpus=64))
    assert [round(m.total / GB, 1) for _, m in r] == [120.0, 31.4, 16.6, 1.9]
    assert "n/a: no architecture" in table(Setting(model="zero-paper-7.5b", gpus=64))


def test_offload_moves_states_to_host():
    r = dict(rows(Setting(model="llama-2-70b", gpus=8, offload_params=True)))
    assert r[3].params == r[3].grads == r[3].optimizer == 0 and r[3].cpu > 0
    assert r[0].cpu == 0  # DDP cannot offload: shown without it
    assert r[1].optimizer == 0 and r[1].grads > 0


def test_custom_size_and_bad_settings():
    r = rows(Setting(model=CUSTOM, custom_billions=13, gpus=8, stage=1))
    assert r[0][1].total == 13e9 * 16
    with pytest.raises(ValueError, match="model must be one of"):
        Setting(model="gpt-5")
    with pytest.raises(ValueError, match="gpu_memory"):
        Setting(gpu_memory="24 GB")


def test_widget_bundle_and_interaction():
    c = Calculator()
    bundle = c._repr_mimebundle_()
    assert bundle["text/plain"] == f"{LIVE_NOTE}\n{table(Setting())}"   # and the picture says it too
    assert {"image/png", "application/vnd.jupyter.widget-view+json"} <= set(bundle)
    c.controls["gpus"].value = 64
    assert c.setting.gpus == 64
    c.controls["model"].value = "gpt2-xl"
    assert c.setting.model == "gpt2-xl" and "gpt2-xl, 64 GPUs" in c._repr_mimebundle_()["text/plain"]
    shown = c.out.outputs
    assert shown[0]["data"]["image/png"] and "gpt2-xl, 64 GPUs" in shown[1]["text"]
    c.controls["custom_billions"].value = 13
    c.controls["model"].value = "custom size"
    assert "13B custom" in c.out.outputs[1]["text"]


def test_plot_has_four_stages():
    fig = calculator.plot(Setting())
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]


def test_fitting_table_prints_the_fastest_options_that_fit():
    from course_utils.course.calculator import fitting_table
    from course_utils.theory import planner

    kw = dict(gpu_mem_gb=80, gpus_per_node=8, intra_bw_gbps=450, inter_bw_gbps=25, seq_len=4096)
    rows = planner.plan("llama-2-7b", global_batch=64, **kw)
    text = fitting_table(rows, top=3)
    fitting = sorted((r for r in rows if r.fits), key=lambda r: r.step_s)
    assert f"{len(fitting)} of {len(rows)} options fit; shown: the 3 fastest" in text
    body = [line for line in text.splitlines() if line.endswith(tuple("0123456789")) and " yes " in line]
    assert [line.split("  ")[0] for line in body] == [r.choice.label() for r in fitting[:3]]
    assert "assumptions:" in text and len(body) == 3
    nothing = planner.plan("llama-2-70b", **dict(kw, gpu_mem_gb=24, gpus_per_node=1), host_mem_gb=64)
    assert "0 of" in fitting_table(nothing) and "shown: the smallest option" in fitting_table(nothing)
    with pytest.raises(ValueError, match="top must be"):
        fitting_table(rows, top=0)
    with pytest.raises(TypeError, match="Plan"):
        fitting_table(list(rows))
