"""Notebook 01: the collective demos, the ring all-reduce, the alpha-beta model, the graders."""
import base64
import json

import pytest
import torch
import torch.distributed as dist

from course_utils.labs import collectives_lab as C
from course_utils.theory import alpha_beta as AB
from course_utils.runtime import compat
from course_utils.impl import ring
from course_utils.course import ring_view, widgets
from course_utils.course.plots import plot_alpha_beta
from course_utils.theory.comm import collective_bytes
from course_utils.course.exercises import check_all_reduce_from_rs_ag, check_ring_all_reduce
from course_utils.runtime.launch import launch


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    return got == want


def _check_demo(name, world_size):
    results = launch(C.DEMOS[name], world_size, quiet=True)
    for rank, got in enumerate(results):
        want = C.expected(name, rank, world_size)
        assert set(got) == set(want), name
        for key in want:
            assert _same(got[key], want[key]), f"{name}, rank {rank}, {key}: {got[key]} != {want[key]}"
    return results


# ----------------------------------------------------------------------- the demos

@pytest.mark.parametrize("name", sorted(C.DEMOS))
def test_every_demo_gives_the_documented_result_on_every_rank(name, capsys):
    _check_demo(name, 4)
    out, err = capsys.readouterr()
    assert "[rank 3]" in out
    assert "deprecated" not in err  # no FutureWarning from the ranks (torch 2.13 renames)


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "all_gather", "scatter", "gather",
                                  "allreduce_as_rs_ag"])
def test_demos_on_3_ranks(name):
    _check_demo(name, 3)


def test_demo_lines_are_readable_and_aligned(capsys):
    launch(C.demo_all_reduce, 4)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "launch: 4 ranks, gloo on CPU, forked from this process"
    assert lines[1] == "[rank 0] before: [0, 1, 2, 3]      after: [60, 64, 68, 72]"
    assert lines[2] == "[rank 1] before: [10, 11, 12, 13]  after: [60, 64, 68, 72]"
    launch(C.demo_reduce, 2, quiet=True)
    assert "[rank 1] before: [10, 11, 12, 13]  after: -" in capsys.readouterr().out


def test_expected_values():
    assert C.expected("reduce_scatter", 1, 4)["after"].tolist() == [68.0, 72.0]
    assert C.expected("all_gather", 0, 3)["after"].tolist() == [0, 1, 10, 11, 20, 21]
    assert C.expected("gather", 1, 3)["after"] is None and C.expected("scatter", 2, 3)["before"] is None
    e = C.expected("allreduce_as_rs_ag", 3, 4)  # 10 elements padded to 12: 3 per rank
    assert e["chunk"].tolist() == [96.0, 0.0, 0.0] and e["equal"] is True
    with pytest.raises(ValueError, match="unknown demo"):
        C.expected("allgather", 0, 4)
    with pytest.raises(ValueError, match="rank"):
        C.expected("all_reduce", 4, 4)
    with pytest.raises(TypeError):
        C.expected("all_reduce", 0, 4.0)


def _rs_ag_vs_all_reduce(numel):
    rank = dist.get_rank()
    x = torch.arange(numel, dtype=torch.float32).reshape(-1, 1) * 3 + rank
    direct = x.clone()
    dist.all_reduce(direct)
    return torch.equal(C.all_reduce_via_rs_ag(x), direct), x.shape


@pytest.mark.parametrize("world_size", [3, 4])
def test_all_reduce_equals_reduce_scatter_plus_all_gather(world_size):
    for equal, shape in launch(_rs_ag_vs_all_reduce, world_size, 10, quiet=True):  # 10 % 3, 10 % 4 != 0
        assert equal and shape == (10, 1)


# ---------------------------------------------------------------- the ring, simulated

@pytest.mark.parametrize("n", range(2, 9))
def test_ring_sends_the_bytes_the_cost_model_says(n):
    for m in (1000, 4096, 7e9):
        assert ring.bytes_sent_per_rank(n, m) == pytest.approx(collective_bytes("all_reduce", m, n), rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_ring_simulation(n):
    steps = ring.ring_all_reduce_steps(n)
    assert len(steps) == 2 * (n - 1)
    assert json.loads(json.dumps(steps)) == steps
    everyone = list(range(n))
    for step in steps:
        assert sorted(s["src"] for s in step["sends"]) == everyone  # every rank sends once a step
        assert all(s["dst"] == (s["src"] + 1) % n for s in step["sends"])  # to its right neighbour
    if n > 1:  # after reduce-scatter, rank r owns the complete sum of chunk r
        owned = steps[n - 2]["state"]
        assert all(owned[r][r] == everyone for r in range(n))
        assert all(steps[-1]["state"][r][c] == everyone for r in range(n) for c in range(n))
    assert ring.bytes_sent_per_rank(1, 100) == 0


def test_ring_labels_and_text():
    assert ring.chunk_label(0, [0, 1]) == "a0+a1"
    assert ring.chunk_label(2, range(6)) == "c0+…+c5"
    steps = ring.ring_all_reduce_steps(4)
    text = ring.describe_ring(steps)
    assert "step 1 of 6, reduce-scatter 1/3: 0->1 d0, 1->2 a1, 2->3 b2, 3->0 c3" in text
    assert "  rank 3: a0+a1+a2+a3 | b0+b1+b2+b3 | c0+c1+c2+c3 | d0+d1+d2+d3" in text
    assert text == ring.describe_ring(ring.ring_all_reduce_steps(4))
    for bad in (0, 27, 2.0, True):
        with pytest.raises((ValueError, TypeError)):
            ring.ring_all_reduce_steps(bad)


# ------------------------------------------------------------------ the ring, for real

def _ring_vs_all_reduce(numels):
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    out = []
    for numel in numels:
        ints = torch.arange(numel, dtype=torch.float32) * 7 - 100 * rank
        floats = torch.randn(numel, generator=g, dtype=torch.float64)
        want_i, want_f = ints.clone(), floats.clone()
        dist.all_reduce(want_i)
        dist.all_reduce(want_f)
        got_i = ring.ring_all_reduce(ints)
        ring.ring_all_reduce(floats)
        out.append((got_i is ints and torch.equal(ints, want_i), torch.allclose(floats, want_f)))
    matrix = torch.arange(6, dtype=torch.float32).reshape(2, 3).t() + rank  # not contiguous
    want = matrix.clone()
    dist.all_reduce(want)
    ring.ring_all_reduce(matrix)
    out.append((torch.equal(matrix, want), matrix.shape == (3, 2)))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_all_reduce_matches_dist_all_reduce(world_size):
    for per_rank in launch(_ring_vs_all_reduce, world_size, [1, 7, 13, 100], quiet=True):
        assert all(exact and close for exact, close in per_rank), per_rank


def test_ring_all_reduce_checks_its_input():
    with pytest.raises(TypeError):
        ring.ring_all_reduce([1.0, 2.0])
    with pytest.raises(RuntimeError, match="launch"):
        ring.ring_all_reduce(torch.ones(3))


# ----------------------------------------------------------------------- the graders

def _rs_ag_without_padding(t):
    n = dist.get_world_size()
    mine = torch.empty(t.numel() // n, dtype=t.dtype)
    compat.reduce_scatter_tensor(mine, t)  # raises on gloo unless numel % n == 0
    out = torch.empty(mine.numel() * n, dtype=t.dtype)
    compat.all_gather_into_tensor(out, mine)
    return out


def _uses_all_reduce(t):
    dist.all_reduce(t)
    return t


def _ring_dropping_the_tail(t):
    """Forgets to pad: chunks of numel // n elements, the last numel % n never summed."""
    rank, n = dist.get_rank(), dist.get_world_size()
    size = t.numel() // n
    chunks = t[: size * n].view(n, size)
    buf = torch.empty(size)
    for s in range(n - 1):
        req = dist.isend(chunks[(rank - 1 - s) % n].clone(), (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
        req.wait()
        chunks[(rank - 2 - s) % n] += buf
    for s in range(n - 1):
        req = dist.isend(chunks[(rank - s) % n].clone(), (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
        req.wait()
        chunks[(rank - 1 - s) % n] = buf
    return t


def test_rs_ag_grader(capsys):
    assert check_all_reduce_from_rs_ag(C.all_reduce_via_rs_ag)
    assert "4 gloo ranks on CPU: right: every rank returned the sum (10 elements)" in capsys.readouterr().out
    assert not check_all_reduce_from_rs_ag(_rs_ag_without_padding)
    out = capsys.readouterr().out
    assert "2 gloo ranks on CPU: right" in out and "3 ranks: rank" in out and "raised" in out
    assert "with 10 elements: " in out                     # the size the error happened at
    assert not check_all_reduce_from_rs_ag(lambda t: t)
    out = capsys.readouterr().out
    assert ("2 gloo ranks on CPU: not yet: rank 0: 10 elements: got [100, 101, 102, 103, 104, …], "
            "expected [300, 302, 304, 306, 308, …] (2 of 2 ranks differ)") in out
    assert len(out.splitlines()) <= 5                      # a committed stub's output stays short
    assert not check_all_reduce_from_rs_ag(_uses_all_reduce)
    assert "raised NotAllowed: with 10 elements: dist.all_reduce is not allowed" in capsys.readouterr().out
    assert not check_all_reduce_from_rs_ag("not a function")
    capsys.readouterr()
    assert not check_all_reduce_from_rs_ag(_gathers_everything)    # right sum, no reduce-scatter
    assert "0 reduce-scatter call(s), expected 1: one reduce-scatter" in capsys.readouterr().out


def _gathers_everything(t):
    """Right numbers, wrong algorithm: every rank gathers every tensor and sums them locally."""
    from course_utils.runtime.compat import all_gather_into_tensor
    out = torch.empty(t.numel() * dist.get_world_size(), dtype=t.dtype)
    all_gather_into_tensor(out, t)
    return out.view(dist.get_world_size(), -1).sum(0)


def test_ring_grader(capsys):
    v = check_ring_all_reduce(ring.ring_all_reduce)
    assert v and repr(v) == "ring_all_reduce: PASSED"
    assert not check_ring_all_reduce(_ring_dropping_the_tail)
    out = capsys.readouterr().out
    assert "5, 7 and 13 elements" in out and "not yet: rank 0: 5 elements: " in out
    assert "; first difference at index 4 (2 of 2 ranks differ)" in out     # the dropped tail, named
    assert not check_ring_all_reduce(lambda t: None)  # in place, but nothing done
    out = capsys.readouterr().out
    assert ("3 gloo ranks on CPU: not yet: rank 0: 5 elements: got [100, 101, 102, 103, 104], "
            "expected [600, 603, 606, 609, 612] (3 of 3 ranks differ)") in out
    assert len(out.splitlines()) <= 5
    assert not check_ring_all_reduce(_uses_all_reduce)
    assert "raised NotAllowed" in capsys.readouterr().out


# ------------------------------------------------------------------ the alpha-beta model

def test_fit_recovers_a_known_model():
    sizes = list(C.DEFAULT_SIZES)
    for op, n in (("all_reduce", 4), ("reduce_scatter", 3), ("all_gather", 8)):
        times = [AB.predict_time(op, m, n, alpha_s=30e-6, bandwidth=5e9) for m in sizes]
        fit = AB.fit_alpha_beta(sizes, times, op=op, world_size=n)
        assert fit.alpha_s == pytest.approx(30e-6, rel=1e-9)
        assert fit.bandwidth == pytest.approx(5e9, rel=1e-9)
        assert fit.fitted == pytest.approx(times, rel=1e-9)
        assert fit.crossover_bytes() == pytest.approx(n * 30e-6 * 5e9)
        assert all(type(x) is float for x in fit.fitted)
    noisy = [t * (1.1 if i % 2 else 0.9) for i, t in enumerate(times)]
    assert AB.fit_alpha_beta(sizes, noisy, op="all_gather", world_size=8).alpha_s == pytest.approx(30e-6, rel=0.15)


def test_model_arithmetic_and_validation():
    assert AB.ring_steps("all_reduce", 4) == 6 and AB.ring_steps("all_gather", 4) == 3
    assert AB.predict_time("all_reduce", 1e9, 4, alpha_s=5e-6, bandwidth=100e9) == pytest.approx(0.01503)
    with pytest.raises(ValueError):
        AB.fit_alpha_beta([1, 2], [1.0], op="all_reduce")
    with pytest.raises(ValueError, match="two different"):
        AB.fit_alpha_beta([8, 8], [1.0, 1.0])
    with pytest.raises(ValueError, match="world_size"):
        AB.fit_alpha_beta([8, 16], [1.0, 2.0], world_size=1)
    with pytest.raises(ValueError):
        AB.fit_alpha_beta([8, 16], [1.0, -2.0])
    with pytest.raises(ValueError):
        AB.ring_steps("broadcast", 4)
    with pytest.raises(ValueError):
        C.time_collective("all_to_all", [1024])
    with pytest.raises(ValueError):
        C.time_collective("all_reduce", [2])
    with pytest.raises(TypeError):
        C.time_collective("all_reduce", 1024)


def test_time_collective_and_plot():
    for op in C.TIMED_OPS:
        times = C.time_collective(op, [1024, 65536], world_size=2, repeats=2, warmup=1)
        assert list(times) == [1024, 65536] and all(t > 0 for t in times.values())
    fit = AB.fit_alpha_beta(list(times), list(times.values()), op="all_gather", world_size=2)
    assert fit.alpha_s >= 0 and fit.bandwidth > 0
    synthetic = AB.fit_alpha_beta([1024, 1 << 20], [1e-4, 1e-3], op="all_reduce", world_size=4)
    fig = plot_alpha_beta([1024, 1 << 20], [1e-4, 1e-3], synthetic)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    with pytest.raises(TypeError):
        plot_alpha_beta([1], [1.0], {"alpha": 1})


# --------------------------------------------------------------- figures and the widget

def test_ring_drawings():
    steps = ring.ring_all_reduce_steps(4)
    fig = ring_view.draw_ring_step(steps, 0)
    assert "step 1/6: reduce-scatter 1/3" == fig.axes[0].get_title()
    assert len(ring_view.draw_ring_sequence(steps).axes) == 6
    assert len(ring_view.draw_ring_sequence(ring.ring_all_reduce_steps(2)).axes) == 2  # one step per phase
    with pytest.raises(ValueError):
        ring_view.draw_ring_step(steps, 6)
    with pytest.raises(ValueError):
        ring_view.draw_ring_step(ring.ring_all_reduce_steps(9), 0)
    with pytest.raises(ValueError):
        ring_view.ring_step_widget(9)


def test_ring_widget_bundle_is_deterministic():
    w = ring_view.ring_step_widget(4)
    bundle = w._repr_mimebundle_()
    assert {"text/plain", "image/png", "application/vnd.jupyter.widget-view+json"} <= set(bundle)
    assert bundle["text/plain"] == f"{widgets.LIVE_NOTE}\n{ring.describe_ring(ring.ring_all_reduce_steps(4))}"
    assert bundle["text/plain"] == ring_view.ring_step_widget(4)._repr_mimebundle_()["text/plain"]
    assert base64.b64decode(bundle["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    w.slider.value = 4
    shown = w.out.outputs
    assert shown[0]["data"]["image/png"] and shown[1]["text"].startswith("step 4 of 6, all-gather 1/3")


def _gathers_objects(t):
    """Read 11's pass: the right sum through the pickling collective, no send or recv."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, t)
    return sum(parts)


def _sends_to_everyone(t):
    """Point-to-point, but straight to every rank: not a ring."""
    rank, n = dist.get_rank(), dist.get_world_size()
    total = t.clone()
    for step in range(1, n):
        buf = torch.empty_like(t)
        ops = [dist.P2POp(dist.isend, t, (rank + step) % n), dist.P2POp(dist.irecv, buf, (rank - step) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        total += buf
    return total


def test_collective_graders_refuse_objects_and_non_neighbours(capsys):
    assert not check_ring_all_reduce(_gathers_objects)
    assert "dist.all_gather_object is not allowed" in capsys.readouterr().out
    assert not check_all_reduce_from_rs_ag(_gathers_objects)
    assert "dist.all_gather_object is not allowed" in capsys.readouterr().out
    assert not check_ring_all_reduce(_sends_to_everyone)
    out = capsys.readouterr().out
    assert "2 gloo ranks on CPU: right" in out                       # on 2 ranks everyone is a neighbour
    assert "not neighbours on the ring of 4" in out


def _rs_ag_in_float32(t):
    """Read 13: buffers made without the input's dtype; here the whole sum in float32."""
    return C.all_reduce_via_rs_ag(t.float())


def test_rs_ag_grader_checks_the_dtype(capsys):
    assert not check_all_reduce_from_rs_ag(_rs_ag_in_float32)
    out = capsys.readouterr().out
    assert "rank r gets a float64 tensor of 10 elements" in out
    assert "the right sum, but as float32 for a float64 input" in out


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_ring_caption_is_what_the_simulated_ring_does(n):
    """01 §3's caption: rank r first sends chunk r-1; after N-1 steps rank r holds the whole sum of
    chunk r (the reduce-scatter), and the next N-1 steps pass the sums on (the all-gather)."""
    from course_utils.impl.ring import describe_ring, ring_all_reduce_steps
    steps = ring_all_reduce_steps(n)
    assert [s["chunk"] for s in steps[0]["sends"]] == [(r - 1) % n for r in range(n)]
    assert all(steps[n - 2]["state"][r][r] == list(range(n)) for r in range(n))
    assert all(c == list(range(n)) for rank in steps[-1]["state"] for c in rank)
    assert f"after {n - 1} steps it holds the whole sum of chunk r" in describe_ring(steps)
