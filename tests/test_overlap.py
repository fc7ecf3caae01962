"""DataParallel.record_events and course_utils.labs.overlap (notebook 02 §6's timeline).

What is exact is asserted exactly (buckets, the order of launches relative to the
gradient hooks); times are only checked for consistency (a launch precedes its
completion), never for their values."""
import pytest
import torch
import torch.distributed as dist

from course_utils.harness.model import SyntheticData, build_model
from course_utils.impl.ddp import DataParallel
from course_utils.labs import overlap
from course_utils.runtime.launch import launch

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _grads_with_and_without_log():
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = SyntheticData(global_batch=12, seed=0).shard(0, rank, world)
    out = {}
    for overlap_on in (True, False):
        model = DataParallel(build_model(seed=0), bucket_bytes=overlap.BUCKET_BYTES, overlap=overlap_on)
        model(x, y).backward()
        plain = [p.grad.clone() for p in model.params]
        model.module.zero_grad(set_to_none=True)
        with model.record_events() as log:
            model(x, y).backward()
        dist.barrier()
        assert model.event_log is None                   # off again after the block
        same = all(torch.equal(a, p.grad) for a, p in zip(plain, model.params))
        events = [(e["event"], e.get("bucket"), e.get("during_backward")) for e in log]
        out[overlap_on] = (same, events, len(model.buckets))
    return out


def test_recording_changes_nothing_and_logs_every_step_of_the_sync():
    for by_flag in launch(_grads_with_and_without_log, 2, quiet=True):
        for overlap_on, (same, events, buckets) in by_flag.items():
            assert same                                   # bitwise the same gradients
            names = [e[0] for e in events]
            assert names.count("grad_ready") == 68 and names.count("launch") == buckets
            assert names.count("done") == buckets                # "done" comes from the backend's thread:
            assert [n for n in names if n != "done"][-1] == "synced"   # its place may vary
            launches = [e for e in events if e[0] == "launch"]
            assert [e[1] for e in launches] == list(range(buckets))      # strictly in order
            assert all(e[2] is overlap_on for e in launches)
            end = names.index("backward_end")
            assert names[:end].count("grad_ready") == 68                # every hook before the end
            assert names[:end].count("launch") == (buckets if overlap_on else 0)


@pytest.fixture(scope="module")
def timelines():
    return {flag: overlap.ddp_step_timeline(2, overlap=flag, warmup=1) for flag in (True, False)}


def test_timelines_exact_facts(timelines):
    on, off = timelines[True][0], timelines[False][0]
    assert on.bucket_numels == off.bucket_numels and sum(on.bucket_numels) == 129_350
    assert on.num_buckets > 4 and on.num_grads == 68
    assert all(on.during_backward) and not any(off.during_backward)
    left = on.still_to_come()
    assert left == sorted(left, reverse=True) and left[0] > 0 and left[-1] == 0
    assert off.still_to_come() == [0] * off.num_buckets
    for flag, (r0, r1) in timelines.items():              # exact facts: the same on every rank
        assert r0.describe() == r1.describe()
    assert "bucket 1 of" in on.describe() and "during backward" in on.describe()


def test_timelines_times_are_consistent(timelines):
    for tl in (t for pair in timelines.values() for t in pair):
        assert len(tl.grad_ready_s) == tl.num_grads and tl.grad_ready_s == sorted(tl.grad_ready_s)
        assert tl.backward_end_s <= tl.synced_s and tl.forward_s > 0
        for start, done in zip(tl.launch_s, tl.done_s):
            assert 0 <= start and (done is None or start <= done)
        assert 0 <= tl.hidden_s()
    assert timelines[False][0].hidden_s() == 0.0          # nothing launched before the end


def test_plot_renders(timelines):
    fig = overlap.plot_timelines({"overlapped": timelines[True][0], "after backward": timelines[False][0]})
    assert len(fig.axes) == 2
    fig.savefig(__import__("io").BytesIO(), format="png")


def test_bad_input():
    with pytest.raises(ValueError, match="world_size"):
        overlap.ddp_step_timeline(1)
    with pytest.raises(ValueError, match="global batch"):
        overlap.ddp_step_timeline(5)
    with pytest.raises(TypeError, match="overlap"):
        overlap.ddp_step_timeline(2, overlap="yes")
    with pytest.raises(TypeError, match="StepTimeline"):
        overlap.plot_timelines({"x": 1})
