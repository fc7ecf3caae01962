"""Notebook 07's auto-grader accepts the course's answer (course_utils/course/solutions/07.1.py)
and rejects the classic wrong steps with a message that says what differs: the root left whole,
gradients synced after every micro-batch, a norm of the local shards only, micro-batch losses
not averaged."""
import pytest
import torch
from toys import answer
from torch.distributed.fsdp import fully_shard

from course_utils.course.exercises import check_fsdp_step

pytestmark = pytest.mark.usefixtures("no_leftover_children")


def step(model, micro, max_norm, *, root=True, sync_every_time=False, local_norm=False, average=True):
    """The right step, or one of the classic mistakes."""
    for block in model.blocks:
        fully_shard(block)
    if root:
        fully_shard(model)
    for i, (x, y) in enumerate(micro):
        if not sync_every_time:
            for unit in [model] if root else model.blocks:
                unit.set_requires_gradient_sync(i == len(micro) - 1)
        (model(x, y) / (len(micro) if average else 1)).backward()
    if not local_norm:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grads = [p.grad.to_local() for p in model.parameters()]
    norm = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_(min(1.0, max_norm / (norm.item() + 1e-6)))
    return norm


def test_the_answer_passes(capsys):
    namespace, check = answer("07.1")
    assert eval(check, namespace)
    assert "units <root>, blocks.0, blocks.1, blocks.2, blocks.3; 5 reduce-scatters; norm 1.18" in \
        capsys.readouterr().out
    assert not check_fsdp_step("step")


@pytest.mark.parametrize("mistake, message", [
    (dict(root=False), "the root is not sharded"),
    (dict(sync_every_time=True), "10 reduce-scatters, expected 5"),
    (dict(local_norm=True), "a norm of the local shards only"),
    (dict(average=False), "micro-batch losses not divided by their number"),
])
def test_classic_mistakes_are_named(mistake, message, capsys):
    assert not check_fsdp_step(lambda model, micro, max_norm: step(model, micro, max_norm, **mistake))
    assert message in capsys.readouterr().out
