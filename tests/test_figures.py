"""Figures in vis/ are drawn by code and up to date."""
import pytest

from course_utils import figures


def test_committed_figures_are_up_to_date():
    assert figures.stale() == {}, "run `make figures` and commit vis/"


def test_every_figure_is_shown_by_some_notebook():
    import glob

    text = "".join(open(p, encoding="utf-8").read() for p in glob.glob(str(figures.VIS_DIR.parent / "notebooks" / "*.ipynb")))
    for name in figures.FIGURES:
        assert f'figures.show(\\"{name}\\")' in text, f"figure {name} is not shown in any notebook"


def test_saving_is_deterministic_and_detects_stale_data(tmp_path, monkeypatch):
    figures.make_all(tmp_path)
    a = figures.path("zero_stages", tmp_path).read_bytes()
    b = figures.save("zero_stages", tmp_path).read_bytes()
    assert a == b
    assert figures.stale(tmp_path) == {}
    data_fn, draw_fn = figures.FIGURES["zero_stages"]

    def changed():
        d = data_fn()
        d["stages"][0]["total_GB"] = 84  # the seed's wrong DDP figure
        return d

    monkeypatch.setitem(figures.FIGURES, "zero_stages", (changed, draw_fn))
    assert "other data" in figures.stale(tmp_path)["zero_stages"]
    assert "missing" in figures.stale(tmp_path / "nowhere")["zero_stages"]


def test_zero_stages_data_comes_from_the_calculator():
    d = figures.data("zero_stages")
    assert [s["total_GB"] for s in d["stages"]] == [112, 49, 38.5, 28]


def test_unknown_figure():
    with pytest.raises(ValueError, match="unknown figure"):
        figures.data("nope")
