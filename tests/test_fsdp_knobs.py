"""FSDP2's accumulation switches (appendix 10 §3.5), run on gloo ranks and counted.

One optimizer step of K = 4 micro-batches of the course GPT, each switch set to False before
every micro-batch but the last. Numbers derived by hand, independently of the notebook's
``predict``: 5 units (the root, kept gathered from forward to backward, and 4 blocks);
padded for a shard group of 2 the root has 6,800 elements (the 101-row embedding padded to
102), a block 30,650 (no odd dim 0); 129,350 real parameters.

* all-gathers per step: default K·(1 + 2·4) = 36; ``set_reshard_after_backward(False)``:
  the first micro-batch 9, then only the blocks' backward gathers, 4 each: 21; with
  ``reshard_after_forward=False`` too, 5 (each unit once).
* reduce-scatters: 5·K = 20, or 5 without gradient sync; HSDP's all-reduces across the
  2 replicas: 20, or 5 with ``set_requires_all_reduce(False)`` or without sync.
* held after the first micro-batch: the gathered model 4·(6,800 + 4·30,650) = 517,600 B;
  unsharded gradients 4·129,350 = 517,400 B; the gradient shards (``p.grad``), or HSDP's
  shards waiting for the all-reduce, 517,600 / 2 = 258,800 B.
"""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from course_utils.harness.model import SyntheticData, build_model
from course_utils.labs.fsdp_api import HeldParams, grad_bytes, unsharded_grad_bytes
from course_utils.runtime.compat import fsdp2_param_groups
from course_utils.runtime.launch import launch
from course_utils.runtime.ledger import CommLedger

pytestmark = pytest.mark.usefixtures("no_leftover_children")

K, M_ROOT, M_BLOCK, PSI = 4, 6_800, 30_650, 129_350
GATHERED, UNSHARDED = 4 * (M_ROOT + 4 * M_BLOCK), 4 * PSI
SHARD = GATHERED // 2          # a gradient shard, or HSDP's shards waiting for the all-reduce


def _waiting(model) -> int:
    return sum(g._partial_reduce_output.nbytes for g in fsdp2_param_groups(model).values()
               if g._partial_reduce_output is not None)


def _shards(model) -> int:
    grads = (fp.sharded_param.grad.to_local() for group in fsdp2_param_groups(model).values()
             for fp in group.fsdp_params if fp.sharded_param.grad is not None)   # gathered: not model.parameters()
    return sum({g.untyped_storage().data_ptr(): g.untyped_storage().nbytes() for g in grads}.values())


def _rank(runs, hsdp: bool) -> dict:
    data = SyntheticData(global_batch=16, seed=0)
    one = build_model(seed=0)
    one_loss = one(*data.batch(0))
    one_loss.backward()
    x, y = data.shard(0, dist.get_rank(), dist.get_world_size())
    shape = (2, 2) if hsdp else (dist.get_world_size(),)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
    out = {}
    for name, switches, raf in runs:
        model = build_model(seed=0)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=raf)
        fully_shard(model, mesh=mesh)
        held, loss = HeldParams(model), torch.zeros(())
        with CommLedger() as ledger:
            for i, (xm, ym) in enumerate(zip(x.chunk(K), y.chunk(K))):
                for switch in switches:
                    getattr(model, switch)(i == K - 1)
                micro = model(xm, ym) / K
                micro.backward()
                loss += micro.detach()
                if i == 0:
                    between = (held(), unsharded_grad_bytes(model), _shards(model), _waiting(model))
                    assert between[1:] == tuple(grad_bytes(model).values())
        dist.all_reduce(loss)
        grad_diff = max((p.grad.full_tensor() - q.grad).abs().max().item()
                        for p, q in zip(model.parameters(), one.parameters()))
        groups = {r.world_size for r in ledger.records}
        out[name] = dict(counts=ledger.counts(), between=between, groups=groups, grad_diff=grad_diff,
                         loss_diff=abs(loss.item() / dist.get_world_size() - one_loss.item()))
    return out


def _check(res: list, expected: dict) -> None:
    for rank_out in res:
        for name, (ag, rs, ar, between) in expected.items():
            m = rank_out[name]
            got = (m["counts"]["all_gather"], m["counts"]["reduce_scatter"], m["counts"]["all_reduce"])
            assert got == (ag, rs, ar), (name, got)
            assert m["between"] == between, (name, m["between"])
            assert m["groups"] == {2}, (name, m["groups"])
            assert m["grad_diff"] <= 1e-6 and m["loss_diff"] <= 1e-6, (name, m)


def test_gradient_sync_and_reshard_after_backward_on_2_ranks():
    runs = (("default", [], True), ("no_sync", ["set_requires_gradient_sync"], True),
            ("keep", ["set_reshard_after_backward"], True),
            ("keep_raf_false", ["set_reshard_after_backward"], False),
            ("both", ["set_reshard_after_backward", "set_requires_gradient_sync"], False))
    res = launch(_rank, 2, runs, False, quiet=True, timeout_s=180)
    _check(res, {"default": (36, 20, 0, (0, 0, SHARD, 0)),
                 "no_sync": (36, 5, 0, (0, UNSHARDED, 0, 0)),
                 "keep": (21, 20, 0, (GATHERED, 0, SHARD, 0)),
                 "keep_raf_false": (5, 20, 0, (GATHERED, 0, SHARD, 0)),
                 "both": (5, 5, 0, (GATHERED, UNSHARDED, 0, 0))})


def test_requires_all_reduce_on_a_2x2_mesh():
    runs = (("default", [], True), ("no_all_reduce", ["set_requires_all_reduce"], True),
            ("no_sync", ["set_requires_gradient_sync"], True))
    res = launch(_rank, 4, runs, True, quiet=True, timeout_s=180)
    _check(res, {"default": (36, 20, 20, (0, 0, SHARD, 0)),
                 "no_all_reduce": (36, 20, 5, (0, 0, 0, SHARD)),
                 "no_sync": (36, 5, 5, (0, UNSHARDED, 0, 0))})
