"""Notebook 07's auto-graders accept a right answer and reject the classic wrong ones with
a message that says what differs."""
import pytest
import torch
from torch.distributed.fsdp import fully_shard

from course_utils.course.exercises import check_accumulation, check_fsdp_wrap, check_sharded_clip

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def per_block(model):
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def root_only(model):
    fully_shard(model)


def global_clip(model, max_norm):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def local_clip(model, max_norm):
    grads = [p.grad.to_local() for p in model.parameters()]
    norm = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_(min(1.0, max_norm / (norm.item() + 1e-6)))
    return norm


def accumulate(model, micro):
    for i, (x, y) in enumerate(micro):
        model.set_requires_gradient_sync(i == len(micro) - 1)
        (model(x, y) / len(micro)).backward()


def accumulate_syncing_every_time(model, micro):
    for x, y in micro:
        (model(x, y) / len(micro)).backward()


def test_fsdp_wrap(capsys):
    assert check_fsdp_wrap(per_block)
    assert "units <root>, blocks.0, blocks.1, blocks.2, blocks.3; 9 all-gathers" in capsys.readouterr().out
    assert not check_fsdp_wrap(root_only)
    assert "not sharded on their own: blocks.0" in capsys.readouterr().out
    assert not check_fsdp_wrap("per_block")


def test_sharded_clip(capsys):
    assert check_sharded_clip(global_clip)
    assert "gradients scaled by" in capsys.readouterr().out
    assert not check_sharded_clip(local_clip)
    assert "a norm of the local shards only" in capsys.readouterr().out


def test_accumulation(capsys):
    assert check_accumulation(accumulate)
    assert not check_accumulation(accumulate_syncing_every_time)
    out = capsys.readouterr().out
    assert "10 reduce-scatters, expected 5" in out and "15 reduce-scatters" in out
