"""course_utils.runtime.network (the modelled network) and labs.clock (notebooks 02, 06-08).

By construction a modelled collective never completes before its modelled arrival, and
transfers queue on a rank's link in issue order: those are asserted exactly. Elapsed times
are only compared with each other within one run (overlapped against sent after backward,
the clock against its prediction), with margins that hold on a loaded 2-core machine."""
import math
import time

import pytest
import torch
import torch.distributed as dist

from course_utils.harness import experiments
from course_utils.labs import clock, overlap
from course_utils.runtime.launch import LaunchError, launch
from course_utils.runtime.ledger import CommLedger
from course_utils.runtime.network import (FREE, Link, ModelledNetwork, Network, Transfer, as_network,
                                          current_network, modelled_network, predict_step)

from clock_checks import measured_twice

pytestmark = pytest.mark.usefixtures("no_leftover_children")

MB4 = 1_000_000            # float32 elements: a 4 MB message


# -- the model, no processes
def test_link_times_are_the_alpha_beta_ring_model():
    link = Link(50e6, 10e-6)
    # all-reduce on 2 ranks: 2 steps, 2*(1/2)*M bytes; on 4: 6 steps, 2*(3/4)*M
    assert link.seconds("all_reduce", 4_000_000, 2) == pytest.approx(2 * 10e-6 + 4_000_000 / 50e6)
    assert link.seconds("all_reduce", 4_000_000, 4) == pytest.approx(6 * 10e-6 + 6_000_000 / 50e6)
    assert link.seconds("all_gather", 4_000_000, 4) == pytest.approx(3 * 10e-6 + 3_000_000 / 50e6)
    # gloo's reduce-scatter is a whole all-reduce on the wire
    assert link.seconds("reduce_scatter", 4_000_000, 4, "gloo") == pytest.approx(
        3 * 10e-6 + 6_000_000 / 50e6)
    assert link.seconds("all_reduce", 4_000_000, 1) == 0
    assert Link(math.inf).seconds("all_reduce", 10**9, 8) == 0


@pytest.mark.parametrize("spec, error, words", [
    ({"latency": 1e-5}, ValueError, "needs 'bandwidth'"),
    ({"bandwidth": 0}, ValueError, "bandwidth must be > 0"),
    ({"bandwidth": 1e6, "latency": -1}, ValueError, "latency must be >= 0"),
    ({"bandwidth": 1e6, "speed": 3}, ValueError, "no key speed"),
    ({"bandwidth": 1e6, "inter_bandwidth": 1e5}, ValueError, "node_size"),
    ({"bandwidth": 1e6, "wire": "nccl"}, ValueError, "wire must be"),
    (50e6, TypeError, "must be a dict"),
])
def test_bad_networks_say_what_to_change(spec, error, words):
    with pytest.raises(error, match=words):
        as_network(spec)


def test_two_link_classes_pick_the_link_by_the_groups_nodes():
    net = as_network({"bandwidth": 100e6, "inter_bandwidth": 10e6, "node_size": 2})
    assert net.link_for((0, 1))[0] == "intra" and net.link_for((2, 3))[0] == "intra"
    assert net.link_for((0, 2))[0] == "inter" and net.link_for((0, 1, 2, 3))[1].bandwidth == 10e6
    assert "within a node of 2 ranks" in net.describe() and "and 10 MB/s, α 0 µs across nodes" in net.describe()
    assert as_network({"bandwidth": 6e6, "latency": 50e-6}).describe() == \
        "network modelled at 6 MB/s, α 50 µs; compute measured on this CPU"


def _tr(op, message, issued, waited, done, world=2, future=False):
    return Transfer(op=op, function=op, message_bytes=message, world_size=world, link="link", seconds=0.0,
                    async_op=True, ranks=tuple(range(world)), issued=issued, start=issued, arrival=issued,
                    waited=waited, done=done, future=future)


def test_prediction_of_sent_after_backward_and_overlapped():
    link = {"bandwidth": 1e6, "latency": 0.0}          # 1 MB/s: a 10,000-byte all-reduce on 2 ranks, 10 ms
    # after backward: 3 all-reduces issued at 100 ms, waited at once: all 30 ms exposed
    after = [_tr("all_reduce", 10_000, 0.100, 0.100, 0.100) for _ in range(3)]
    assert predict_step(0.150, after, link) == pytest.approx(0.180)
    # overlapped: issued at 40, 60 and 100 ms, waited at 100: only the last one's 10 ms shows
    over = [_tr("all_reduce", 10_000, t, 0.100, 0.100) for t in (0.040, 0.060, 0.100)]
    assert predict_step(0.150, over, link) == pytest.approx(0.160)
    # issued together at 95 ms: they queue on the link (95 -> 125), 25 ms exposed
    queued = [_tr("all_reduce", 10_000, 0.095, 0.100, 0.100) for _ in range(3)]
    assert predict_step(0.150, queued, link) == pytest.approx(0.175)
    # what the free link already waited (the loopback's real transfer) is not paid twice
    slow_free = [_tr("all_reduce", 10_000, 0.100, 0.100, 0.104)]
    assert predict_step(0.150, slow_free, link) == pytest.approx(0.156)
    # a future (torch DDP's comm hook) is waited for when the last transfer was issued
    fut = [_tr("all_reduce", 10_000, t, None, None, future=True) for t in (0.040, 0.100)]
    assert predict_step(0.150, fut, link) == pytest.approx(0.160)
    # HSDP-like: a slow cross-node link and a fast one queue apart
    two = {"bandwidth": 1e6, "inter_bandwidth": 0.5e6, "node_size": 1}
    both = [_tr("all_reduce", 10_000, 0.100, 0.100, 0.100, world=2),
            dataclasses_replace(_tr("all_reduce", 10_000, 0.100, 0.100, 0.100), ranks=(0,))]
    assert predict_step(0.150, both, two) == pytest.approx(0.170)


def dataclasses_replace(tr, **changes):
    import dataclasses
    return dataclasses.replace(tr, **changes)


# -- on ranks
def _blocking_and_async():
    t = torch.ones(MB4)
    with ModelledNetwork({"bandwidth": 50e6, "latency": 0.0}) as net:
        assert current_network() is net
        dist.all_reduce(t)                                   # blocking: 2 ranks, 4 MB -> 80 ms
        t_done = time.perf_counter()
        first = net.transfers[0]
        work = dist.all_reduce(t, async_op=True)             # returns at once ...
        returned = time.perf_counter()
        second = net.transfers[1]
        third_work = dist.all_reduce(torch.ones(10), async_op=True)
        third = net.transfers[2]
        assert isinstance(work, dist.Work) and not work.is_completed()
        work.wait()                                           # ... and completes at its arrival
        waited = time.perf_counter()
        fut = third_work.get_future()
        value = fut.wait()[0]
        fut_done = time.perf_counter()
    assert current_network() is None
    return dict(first=first, t_done=t_done, second=second, returned=returned, waited=waited, third=third,
                fut_done=fut_done, value=value.tolist(), t=t[:3].tolist())


def test_collectives_complete_at_their_modelled_arrival_in_issue_order():
    for r in launch(_blocking_and_async, 2, quiet=True):
        first, second, third = r["first"], r["second"], r["third"]
        assert first.seconds == pytest.approx(0.080) and not first.async_op
        assert r["t_done"] >= first.arrival                  # never before the model says
        assert second.async_op and r["returned"] < second.arrival
        assert r["waited"] >= second.arrival
        assert third.start == second.arrival                  # queued behind the one in flight
        assert r["fut_done"] >= third.arrival
        assert r["t"] == [4.0] * 3 and r["value"] == [2.0] * 10   # the results are real


def _waits_in_any_order():
    with modelled_network(200e6):
        xs = [torch.full((1000 * (i + 1),), float(dist.get_rank() + i)) for i in range(4)]
        works = [dist.all_reduce(x, async_op=True) for x in xs]
        y = torch.ones(5)
        dist.all_reduce(y)                                    # a blocking one after them
        for w in reversed(works):
            w.wait()
        g = torch.empty(2 * 7)
        dist.all_gather_into_tensor(g, torch.full((7,), float(dist.get_rank())))
    return [x[0].item() for x in xs], y[0].item(), g.tolist()


def test_waits_in_any_order_give_the_real_results():
    for sums, y, g in launch(_waits_in_any_order, 2, quiet=True):
        assert sums == [1.0, 3.0, 5.0, 7.0] and y == 2.0 and g == [0.0] * 7 + [1.0] * 7


def _ledger_and_network_together():
    with CommLedger() as ledger, modelled_network(100e6) as net:
        dist.all_reduce(torch.ones(250))
        dist.all_reduce(torch.ones(250), async_op=True).wait()
    return ledger.counts()["all_reduce"], len(net.transfers)


def test_a_ledger_records_each_call_once_under_a_network():
    assert launch(_ledger_and_network_together, 2, quiet=True) == [(2, 2), (2, 2)]


def _raises_inside():
    with modelled_network(100e6):
        dist.all_reduce(torch.ones(10), async_op=True)
        if dist.get_rank() == 1:
            raise RuntimeError("boom on rank 1")
        time.sleep(0.2)
        dist.all_reduce(torch.ones(10))


def test_a_failing_rank_under_a_network_is_reported_not_hung():
    with pytest.raises(LaunchError, match="rank 1"):
        launch(_raises_inside, 2, quiet=True, timeout_s=60)


def test_nested_networks_are_refused():
    with modelled_network(1e6):
        with pytest.raises(RuntimeError, match="already active"):
            with modelled_network(1e6):
                pass


# -- whole runs
@pytest.mark.parametrize("strategy, world", [("ddp", 2), ("torch-ddp", 2), ("zero2", 3), ("zero3", 2),
                                             ("torch-fsdp", 2), ("torch-hsdp", 4)])
def test_a_run_under_a_network_trains_exactly_as_without(strategy, world):
    plain = experiments.run(strategy, world, steps=3, quiet=True)
    timed = experiments.run(strategy, world, steps=3, quiet=True,
                            network={"bandwidth": 20e6, "latency": 50e-6})
    assert [r.losses for r in timed] == [r.losses for r in plain]
    assert [r.param_digest for r in timed] == [r.param_digest for r in plain]
    assert [r.comm_bytes for r in timed] == [r.comm_bytes for r in plain]
    c = timed[0].extra["clock"]
    assert "network modelled at 20 MB/s" in c.network and c.transfers
    assert all(t.arrival >= t.start >= t.issued for t in c.transfers)
    # the clock includes every blocking wait until the modelled arrival
    assert all(t.done >= t.arrival for t in c.transfers if t.done is not None)
    assert "clock" not in plain[0].extra


def test_overlap_on_the_clock_beats_sending_after_backward_as_predicted():
    """The issue's "done when": under the modelled network, the overlapped DDP step is
    <= 0.8 x the sent-after-backward one, and each is within 15 % of its prediction."""
    net, backward = clock.matched_network()          # the all-reduce takes as long as backward here
    assert net["bandwidth"] == pytest.approx(517_400 / backward, rel=0.05)

    def measure():
        return (clock.time_step("ddp", network=net, bucket_bytes=overlap.BUCKET_BYTES),
                clock.time_step("ddp", network=net, bucket_bytes=overlap.BUCKET_BYTES, overlap=False))

    def problem(pair):
        over, after = pair
        ok = over.measured_s <= 0.8 * after.measured_s and all(abs(t.error) <= 0.15 for t in pair)
        return "" if ok else clock.describe({"overlapped": over, "after": after})

    over, after = measured_twice(measure, problem)
    # what the plot draws: the link was busy for the all-reduce's time in both
    assert over.wire_s() == pytest.approx(after.wire_s(), rel=0.01)
    assert after.exposed_s() > 2 * over.exposed_s()


def test_time_step_refuses_what_it_cannot_time():
    with pytest.raises(ValueError, match="one process"):
        clock.time_step("single")
    with pytest.raises(ValueError, match="world_size"):
        clock.time_step("ddp", 1)
    with pytest.raises(TypeError, match="StepTime"):
        clock.plot_steps({"x": 1})


def test_free_is_a_network_that_costs_nothing():
    assert FREE.intra.bandwidth == math.inf and FREE.seconds((0, 1), "all_reduce", 10**9, 2)[1] == 0
    assert isinstance(as_network(Link(1e6)), Network)


@pytest.mark.parametrize("text, bandwidth, latency", [("6MB/s", 6e6, 0.0), ("6MB/s,50us", 6e6, 50e-6),
                                                      ("400mbit, 20µs", 50e6, 20e-6), ("1.5GB/s,2ms", 1.5e9, 2e-3)])
def test_parse_network(text, bandwidth, latency):
    from course_utils.runtime.network import parse_network
    net = parse_network(text)
    assert net.intra.bandwidth == pytest.approx(bandwidth) and net.intra.latency == pytest.approx(latency)


@pytest.mark.parametrize("text", ["6", "6MB", "fast", "6MB/s,50us,1", "50us"])
def test_parse_network_says_how_to_write_one(text):
    from course_utils.runtime.network import parse_network
    with pytest.raises(ValueError, match="written like 6MB/s"):
        parse_network(text)


def test_ranks_magic_runs_a_cell_under_a_network():
    from course_utils.runtime.magics import ranks
    cell = "t = torch.ones(250_000)\ndist.all_reduce(t)\nresult = (t[0].item(), round(net.transfers[0].seconds, 4))"
    assert ranks("2 --network 10MB/s", cell) == [(2.0, 0.1), (2.0, 0.1)]
    assert ranks("2", "result = net") == [None, None]


def test_a_call_across_nodes_splits_its_rings_over_the_nics():
    """Full sharding over 2 nodes of 2 ranks: 2 rings, each leaving a node once, so each rank's
    inter-node link carries half its bytes and NVLink the other half, at once (notebook 08's
    multi-node model with a NIC per GPU); HSDP's all-reduce, one rank per node, all of them."""
    net = as_network({"bandwidth": 60e6, "inter_bandwidth": 3e6, "node_size": 2})
    sent = 3 / 4 * 4_000_000                                   # all-gather of 4 MB on 4 ranks
    assert net.seconds((0, 1, 2, 3), "all_gather", 4_000_000, 4) == ("inter", pytest.approx(sent / 2 / 3e6))
    assert net.seconds((0, 2), "all_reduce", 4_000_000, 2) == ("inter", pytest.approx(4_000_000 / 3e6))
    assert net.seconds((0, 1), "all_reduce", 4_000_000, 2) == ("intra", pytest.approx(4_000_000 / 60e6))


def test_a_profiled_step_adds_the_model_to_a_real_trace(tmp_path):
    """torch.profiler's trace of one FSDP2 step under the network: Chrome JSON with the real
    threads (compute, and the network thread's gloo calls) and the model's lanes added."""
    import json
    path = tmp_path / "step.json"
    out = clock.profile_step("torch-fsdp", path=path)
    assert out["path"] == str(path) and out["step_ms"] > 0
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("gloo: ") and e["tid"] == "network thread" for e in events)
    lanes = clock.trace_lanes(path)
    assert list(lanes)[0].startswith("main thread") and any("gloo" in lane for lane in lanes)
    assert {n for n, _, _ in lanes["modelled link"]} == {"link busy: all_gather", "link busy: reduce_scatter"}
    step = next(e for e in events if e.get("tid") == "step")
    for lane in lanes.values():                      # every span inside the step, in ms from its start
        assert all(0 <= s <= step["dur"] / 1e3 + 1 for _, s, _ in lane)
    assert len(clock.plot_trace(path).axes) == 1


def test_describe_shows_the_prediction_unless_asked_not_to():
    t = clock.StepTime("a", "ddp", 2, "network modelled", free_s=0.1, predicted_s=0.2, measured_s=0.3,
                       free=[], clocked=[])
    with_model, without = clock.describe({"one bucket": t}), clock.describe({"one bucket": t}, predicted=False)
    assert "predicted" in with_model and with_model.splitlines()[1].split()[-3:] == ["100", "200", "300"]
    assert "predicted" not in without and without.splitlines()[1].split()[-2:] == ["100", "300"]


def test_describe_adds_the_measured_wait_when_asked():
    """The ``waited`` column is the clocked run's own wait, not clock minus free link: two runs
    timed apart can put a clock step a few ms under its free-link one; a wait is never negative."""
    t = clock.StepTime("a", "ddp", 2, "network modelled", free_s=0.179, predicted_s=None, measured_s=0.173,
                       free=[], clocked=[])
    t.exposed_s = lambda op=None: 0.004
    table = clock.describe({"a bucket per parameter": t}, predicted=False, waited=True)
    assert table.splitlines()[0].split()[:3] == ["no", "delay", "step"] and "waited" in table.splitlines()[0]
    assert table.splitlines()[1].split()[-3:] == ["179", "173", "4"]
    steps_only = clock.describe({"a bucket per parameter": t}, predicted=False, waited=True, free=False)
    assert "delay" not in steps_only and steps_only.splitlines()[1].split()[-2:] == ["173", "4"]


def test_exposed_time_is_the_median_over_the_steps_not_one_step():
    """One step slowed by the machine's load (a 90 ms wait) does not move ``exposed_s``: the
    median over the clocked steps does not, where the median-time step's own wait would."""
    def step(wait_s, step_s):
        return experiments.StepClock("net", step_s, [_tr("all_reduce", 8, 0.0, 0.01, 0.01 + wait_s)])
    steps = [step(0.010, 0.10), step(0.012, 0.105), step(0.090, 0.11), step(0.011, 0.12), step(0.010, 0.13)]
    t = clock.StepTime("a", "ddp", 2, "net", free_s=None, predicted_s=None, measured_s=0.11, free=[],
                       clocked=steps)
    assert t.median_clock is steps[2]                 # the median step is the stalled one...
    assert t.exposed_s() == pytest.approx(0.011)     # ...and the median wait is not
    assert t.exposed_s("all_gather") == 0.0
