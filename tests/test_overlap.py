"""course_utils.labs.overlap (notebook 02 §6's timeline): RecordedDDP observes DataParallel
from outside.

What is exact is asserted exactly (buckets, the order of launches relative to the
gradient hooks); what overlap buys in time is tests/test_network.py's."""
import pytest
import torch
import torch.distributed as dist

from course_utils.harness.model import SyntheticData, build_model
from course_utils.impl.ddp import DataParallel
from course_utils.labs import overlap
from course_utils.runtime.launch import launch

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def _grads_with_and_without_recording():
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = SyntheticData(global_batch=12, seed=0).shard(0, rank, world)
    out = {}
    for overlap_on in (True, False):
        plain = DataParallel(build_model(seed=0), overlap.BUCKET_BYTES, overlap=overlap_on)
        plain(x, y).backward()
        model = overlap.RecordedDDP(build_model(seed=0), overlap.BUCKET_BYTES, overlap=overlap_on)
        with model.record() as rec:
            model(x, y).backward()
        assert model.rec is None                          # off again after the block
        same = all(torch.equal(a.grad, p.grad) for a, p in zip(plain.params, model.params))
        out[overlap_on] = (same, rec, len(model.buckets))
    return out


def test_recording_changes_nothing_and_sees_every_step_of_the_sync():
    for by_flag in launch(_grads_with_and_without_recording, 2, quiet=True):
        for overlap_on, (same, rec, buckets) in by_flag.items():
            assert same                                   # bitwise the same gradients
            assert rec["grads"] == 68 and len(rec["launch"]) == buckets and rec["ended"]
            assert all(hook is overlap_on for _, hook in rec["launch"])
            after = [n for n, _ in rec["launch"]]
            assert after == sorted(after) and after[-1] == 68      # strictly in order, the last at the end
            assert (after[0] < 68) is overlap_on                       # the first during backward, if overlapped


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


def test_bad_input():
    with pytest.raises(ValueError, match="world_size"):
        overlap.ddp_step_timeline(1)
    with pytest.raises(ValueError, match="global batch"):
        overlap.ddp_step_timeline(5)
    with pytest.raises(TypeError, match="overlap"):
        overlap.ddp_step_timeline(2, overlap="yes")
