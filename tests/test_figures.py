"""Figures in vis/ are drawn by code and up to date, and what they draw is what the code does:
the collectives figure against the live demos and the CommLedger (4 gloo ranks), the ZeRO-3
timeline against the one labs.zero3_timeline measures on 2 and 3 ranks, the tables against the formulas."""
import pytest

from course_utils.course import figures
from course_utils.theory.comm import collective_calls, comm_volume
from course_utils.runtime.ledger import CommLedger
from course_utils.runtime.launch import launch
from course_utils.theory.memory import GB, model_states
from course_utils.theory.timeline import predicted_timeline

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def test_committed_figures_are_up_to_date():
    assert figures.stale() == {}, "run `make figures` and commit vis/"


def test_every_figure_is_shown_by_some_notebook():
    import glob

    text = "".join(open(p, encoding="utf-8").read() for p in glob.glob(str(figures.VIS_DIR.parent / "notebooks" / "*.ipynb")))
    for name in figures.FIGURES:
        assert f'figures.show(\\"{name}\\")' in text, f"figure {name} is not shown in any notebook"


def test_saving_is_deterministic_and_detects_stale_data(tmp_path, monkeypatch):
    first = {p.name: p.read_bytes() for p in figures.make_all(tmp_path)}
    assert set(first) == {f"{n}.{fmt}" for n in figures.FIGURES for fmt in ("svg", "png")}
    for name in figures.FIGURES:
        for p in figures.save(name, tmp_path):           # the SVG and the PNG, byte for byte
            assert p.read_bytes() == first[p.name], p.name
        png = first[f"{name}.png"]
        assert png.startswith(b"\x89PNG") and b"Matplotlib" not in png, name   # no version stamp
        assert f"data-sha256={figures.data_hash(name)}".encode() in png, name
    assert figures.stale(tmp_path) == {}
    data_fn, draw_fn = figures.FIGURES["zero_stages"]

    def changed():
        d = data_fn()
        d["stages"][0]["total_GB"] = 84  # the seed's wrong DDP figure
        return d

    monkeypatch.setitem(figures.FIGURES, "zero_stages", (changed, draw_fn))
    assert "other data" in figures.stale(tmp_path)["zero_stages"]
    assert "missing" in figures.stale(tmp_path / "nowhere")["zero_stages"]
    monkeypatch.undo()
    (tmp_path / "zero_stages.png").unlink()                # an SVG without its PNG is stale
    assert "zero_stages.png is missing" in figures.stale(tmp_path)["zero_stages"]


def test_committed_pngs_are_sharp_and_show_displays_them_at_svg_width(monkeypatch):
    """show() displays the committed PNG (an untrusted notebook and GitHub draw it; an SVG
    output they do not), as wide in CSS pixels as the SVG, with a short text form."""
    import base64
    import re

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.append((a, k)))
    for name in figures.FIGURES:
        png = figures.path(name, fmt="png").read_bytes()
        svg = figures.path(name).read_text(encoding="utf-8")
        svg_pt = float(re.search(r'<svg[^>]* width="([0-9.]+)pt"', svg).group(1))
        px = int.from_bytes(png[16:20], "big")
        assert px == round(svg_pt / 72 * figures.DPI), name           # same drawing, DPI dots/inch
        figures.show(name)
        (bundle,), kwargs = shown.pop()
        assert bundle == {"image/png": base64.b64encode(png).decode(), "text/plain": f"figure: {name}"}
        assert kwargs["raw"] is True
        assert abs(kwargs["metadata"]["image/png"]["width"] - svg_pt * 96 / 72) <= 1, name   # CSS px
    committed = figures.path("zero_stages", fmt="png").read_bytes()
    monkeypatch.setattr(figures, "VIS_DIR", figures.VIS_DIR / "nowhere")   # no vis/: drawn live
    figures.show("zero_stages")
    (bundle,), _ = shown.pop()
    assert bundle["text/plain"] == "figure: zero_stages"
    assert base64.b64decode(bundle["image/png"]) == committed


def test_zero_stages_data_comes_from_the_calculator():
    d = figures.data("zero_stages")
    assert [s["total_GB"] for s in d["stages"]] == [112, 49, 38.5, 28]


def test_unknown_figure():
    with pytest.raises(ValueError, match="unknown figure"):
        figures.data("nope")


TIMELINE_KEYS = ("phase", "unit", "event", "alive_units", "alive_bytes")


def _collectives_on_ranks():
    from course_utils.labs import collectives_lab as C

    out = {}
    for name in ("broadcast", "all_reduce", "reduce_scatter", "all_gather"):
        with CommLedger() as ledger:
            res = C.DEMOS[name]()
        out[name] = {"before": res["before"].tolist(), "after": res["after"].tolist(),
                     "sent": ledger.totals()[name]}
    return out


def test_collectives_figure_is_what_the_demos_do_and_send():
    d = figures.data("collectives")
    n = d["world_size"]
    by_rank = launch(_collectives_on_ranks, n, quiet=True, timeout_s=120)
    assert [c["name"] for c in d["collectives"]] == ["broadcast", "all_reduce", "reduce_scatter", "all_gather"]
    for c in d["collectives"]:
        for r in range(n):
            got = by_rank[r][c["name"]]
            assert got["before"] == c["before"][r] and got["after"] == c["after"][r], (c["name"], r)
            assert got["sent"] == c["sent_bytes"][r], (c["name"], r)   # what the ledger measured
    sent = {c["name"]: c["sent_bytes"] for c in d["collectives"]}
    assert sent["all_reduce"] == [24] * n      # 2(N-1)/N x 16 B
    assert sent["reduce_scatter"] == sent["all_gather"] == [24] * n   # (N-1)/N x 32 B
    assert sorted(sent["broadcast"]) == [0, 16, 16, 16]


def _zero3_timelines():
    """notebook 06 §8's rank function, one step."""
    from course_utils.labs.zero3_timeline import timeline_on_rank
    return {p: [{k: e[k] for k in TIMELINE_KEYS} for e in timeline_on_rank(p, steps=1)] for p in (False, True)}


@pytest.mark.parametrize("world_size", [2, 3])   # 3: 129,350 params are padded
def test_zero3_timeline_prediction_is_what_zero3_does(world_size):
    measured = launch(_zero3_timelines, world_size, quiet=True, timeout_s=120)
    for prefetch in (False, True):
        predicted = predicted_timeline(world_size, prefetch=prefetch)
        for r, rank_result in enumerate(measured):
            assert rank_result[prefetch] == predicted, (world_size, prefetch, r)
    d = figures.data("zero3_timeline")
    if world_size == d["world_size"]:
        assert d["timelines"] == {"false": measured[0][False], "true": measured[0][True]}


def test_zero3_timeline_figure_numbers():
    d = figures.data("zero3_timeline")
    root, block = d["padded_numels"][0], d["padded_numels"][1]
    assert d["num_params"] == sum(d["unit_numels"]) == 129_350
    for key, extra in (("false", 1), ("true", 2)):
        tl = d["timelines"][key]
        assert max(e["alive_bytes"] for e in tl) == 4 * (root + extra * block)
        assert tl[-1] == {"phase": "backward", "unit": "root", "event": "free", "alive_units": 0,
                          "alive_bytes": 0}
        gathers = sum(e["event"] == "gather" for e in tl)
        assert gathers == collective_calls(3, num_layers=5, skip_last_regather=True)["all_gather"] == 9


def test_zero3_predicted_timeline_validates():
    with pytest.raises(ValueError, match="world_size"):
        predicted_timeline(0, prefetch=False)
    with pytest.raises(TypeError, match="prefetch"):
        predicted_timeline(2, prefetch="yes")


def test_comm_table_numbers():
    from course_utils.theory.config import preset

    d = figures.data("comm_table")
    cfg = preset(d["preset"]).config
    psi, n, b, L = d["num_params"], d["world_size"], d["bytes_per_elem"], d["layers"]
    assert psi == cfg.num_params() and L == cfg.layers
    rows = {r["name"].split(" ")[0]: r for r in d["rows"]}
    assert set(rows) == {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP2"}
    ddp = comm_volume(psi, world_size=n, stage=0, bytes_per_elem=b)["total"]
    assert ddp == 2 * (n - 1) * psi * b / n
    assert rows["DDP"]["total"] == rows["ZeRO-1"]["total"] == rows["ZeRO-2"]["total"] == ddp
    assert rows["ZeRO-3"]["total"] == 1.5 * ddp and rows["ZeRO-3"]["x_ddp"] == 1.5
    assert rows["ZeRO-3"]["paper_elements"] == 3 * psi and rows["DDP"]["paper_elements"] == 2 * psi
    fsdp = rows["FSDP2"]
    assert fsdp["calls"]["all_gather"] == 2 * L + 1 and fsdp["calls"]["reduce_scatter"] == L + 1
    assert fsdp["calls"] == collective_calls(3, num_layers=L + 1, skip_last_regather=True)
    root = psi - L * cfg.block_params()          # embeddings, output layer, final norm
    assert fsdp["total"] == (3 * psi - root) * b * (n - 1) / n   # the root is gathered once


def test_memory_vs_gpus_numbers():
    d = figures.data("memory_vs_gpus")
    for s in d["stages"]:
        want = [model_states(d["num_params"], world_size=n, stage=s["stage"]).total / GB for n in d["gpus"]]
        assert s["total_GB"] == want
        assert all(v >= s["floor_GB"] for v in s["total_GB"])
    ddp, z1, z2, z3 = d["stages"]
    assert ddp["total_GB"] == [112] * len(d["gpus"])
    assert [v * n for v, n in zip(z3["total_GB"], d["gpus"])] == [112] * len(d["gpus"])   # exactly 1/N
    assert (z1["floor_GB"], z2["floor_GB"]) == (28, 14)   # 4 and 2 bytes/param stay whole
