"""course_utils.labs.fsdp_api: the measuring helpers of notebook 07's FSDP2 cells.

One launch on 2 gloo ranks exercises every helper on the course GPT sharded per block
then at the root; the expected numbers are derived by hand (the saved-activation formula
is tests/test_fsdp_options.py's), for the 129,350 parameters of the course GPT.
"""
import pytest
import torch

from course_utils.labs import fsdp_api
from course_utils.runtime.launch import launch

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PSI = 129_350


def _rank():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from course_utils.harness.experiments import make_adamw
    from course_utils.harness.model import build_model
    from course_utils.runtime.ledger import CommLedger

    def sharded(**kw):
        model = build_model(seed=0)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh, **kw)
        return fully_shard(model, mesh=mesh)

    out = {}
    x, y = fsdp_api.batch(0)
    out["batch"] = tuple(x.shape)
    model = sharded(reshard_after_forward=False)
    held = fsdp_api.HeldParams(model)
    with fsdp_api.SavedActivations(model) as saved:
        loss = model(x, y)
        out["held"] = held()
    loss.backward()
    out["held_after"] = held()
    out["saved"] = saved.bytes
    model = sharded()
    with fsdp_api.EventOrder(model) as order:
        model(x, y).backward()
    out["forward"], out["backward"], out["gathered"] = order.forward, order.backward, dict(order.gathered)
    model = sharded()
    model.set_requires_gradient_sync(False)
    with CommLedger() as ledger:
        model(x, y).backward()
    out["rs"], out["unsharded_grads"] = ledger.counts()["reduce_scatter"], fsdp_api.unsharded_grad_bytes(model)
    opt = make_adamw(model.parameters())
    model.set_requires_gradient_sync(True)
    model(x, y).backward()
    opt.step()
    out["digest"] = fsdp_api.state_digest(model, opt)
    out["model_digest"] = fsdp_api.state_digest(model)
    out["full"] = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return out


def test_helpers_on_two_ranks():
    r0, r1 = launch(_rank, 2, quiet=True)
    assert r0["batch"] == (6, 32)                          # 12 sequences of 32 tokens, halved
    # reshard_after_forward=False: every parameter stays gathered until its backward
    # (unsharded, the 101-row embedding is padded to 102 rows: +50 elements)
    assert r0["held"] == 4 * (PSI + 50) and r0["held_after"] == 0
    b, s, h, a, v = 6, 32, 50, 5, 101
    outside = 4 * (2 * s * b * h + s * b * v + 2 * b * s) + 8 * (2 * b * s + s) + 4
    assert r0["saved"] == 4 * 4 * (16 * s * b * h + 4 * b * s + a * b * s) + outside
    assert r0["forward"] == ["AG root", "fwd 0", "AG 0", "fwd 1", "AG 1", "fwd 2", "AG 2", "fwd 3", "AG 3"]
    assert r0["backward"][0] == "bwd root" and r0["backward"][-1] == "RS root"
    assert r0["gathered"] == {"forward": 2, "backward": 3}
    assert r0["rs"] == 0 and r0["unsharded_grads"] == 4 * PSI
    assert r0["digest"] and r1["digest"] is None and r0["model_digest"] != r0["digest"]
    assert r0["model_digest"] == fsdp_api.digest(r0["full"])


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="nn.Module"):
        fsdp_api.HeldParams("model")
    with pytest.raises(TypeError, match="nn.Module"):
        fsdp_api.SavedActivations(None)
    with pytest.raises(TypeError, match="dict"):
        fsdp_api.digest([torch.ones(1)])
    with pytest.raises(ValueError):
        fsdp_api.batch(-1)
    assert fsdp_api.digest({"a": torch.ones(2)}) == fsdp_api.digest({"a": torch.ones(2)}) \
        != fsdp_api.digest({"a": torch.zeros(2)})
