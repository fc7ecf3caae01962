"""course_utils.theory.comm.CommLedger and course_utils.runtime.compat: every collective recorded, bytes exact.

Multi-rank tests run on gloo ranks (CPU), forked from this process: what they import is
imported here first, so each rank does not import it again. Bytes follow CommLedger's definitions: M is the
full tensor (all-reduce, broadcast, reduce), the gathered tensor (all-gather), the
unreduced input (reduce-scatter), one rank's chunk (scatter/gather).
"""
import pickle
import warnings
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from course_utils.runtime import compat
from course_utils.theory.comm import collective_bytes, comm_volume
from course_utils.runtime.ledger import CommLedger, CommRecord, ddp_comm_hook
from course_utils.runtime.launch import launch

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PATCHED = [(dist, "all_reduce"), (c10d, "all_reduce"), (dist, "broadcast"),
           (dist, "reduce_scatter_single"), (c10d, "all_gather_single"),
           (dist, "all_gather_into_tensor"), (dist, "barrier"), (dist, "_broadcast_coalesced"),
           (funcol, "all_reduce"), (funcol, "all_gather_single")]


def _originals():
    return {(m.__name__, n): getattr(m, n) for m, n in PATCHED if hasattr(m, n)}


def test_functions_are_patched_inside_and_restored_after():
    before = _originals()
    with CommLedger():
        inside = _originals()
        assert all(hasattr(f, "__course_ledger_original__") for f in inside.values())
        assert dist.all_reduce is c10d.all_reduce      # one wrapper, both namespaces
    assert _originals() == before


def test_restored_after_an_exception_and_when_nested():
    before = _originals()
    outer, inner = CommLedger(), CommLedger()
    with pytest.raises(KeyError):
        with outer:
            with inner:
                assert outer.active and inner.active
                raise KeyError("boom")
    assert not outer.active and not inner.active
    assert _originals() == before
    with outer:                     # non-LIFO exits also restore once the last one leaves
        inner.__enter__()
        outer.__exit__(None, None, None)
        assert hasattr(dist.all_reduce, "__course_ledger_original__")
        inner.__exit__(None, None, None)
    assert _originals() == before


def test_a_ledger_cannot_be_entered_twice_at_once():
    ledger = CommLedger()
    with ledger:
        with pytest.raises(RuntimeError, match="already recording"):
            ledger.__enter__()
    assert _originals()[("torch.distributed.distributed_c10d", "all_reduce")] is dist.all_reduce


def _nesting_and_pause():
    N = dist.get_world_size()
    with CommLedger() as outer:
        dist.all_reduce(torch.ones(10))                          # 40 B: both see it? no, inner not yet
        with CommLedger() as inner:
            dist.all_reduce(torch.ones(5))                       # 20 B: outer and inner
            with inner.pause():
                dist.all_reduce(torch.ones(100))                 # outer only
            with outer.pause(), inner.pause():
                dist.all_reduce(torch.ones(1000))                # nobody
        dist.barrier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with CommLedger() as deprecated:                         # calls all_gather_single inside
            dist.all_gather_into_tensor(torch.empty(4 * N), torch.ones(4))
    return outer.message_bytes(), inner.message_bytes(), outer.counts(), deprecated.records


def test_nested_ledgers_both_record_and_pause_excludes():
    out = launch(_nesting_and_pause, 2, quiet=True)
    outer_m, inner_m, outer_c, deprecated = out[0]
    assert outer_m["all_reduce"] == 40 + 20 + 400 and outer_c["all_reduce"] == 3
    assert outer_c["barrier"] == 1
    assert inner_m == {"all_reduce": 20, "reduce_scatter": 0, "all_gather": 0}
    # recorded once, as the function the caller called
    assert [(r.op, r.function, r.message_bytes) for r in deprecated] == [
        ("all_gather", "all_gather_into_tensor", 32)]


def _ring_ops(sizes):
    N, r = dist.get_world_size(), dist.get_rank()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # compat: no deprecation warning
        with CommLedger() as ledger:
            for n in sizes:
                t = torch.full((n,), float(r + 1))
                dist.all_reduce(t)
                out = torch.empty(n * N)
                compat.all_gather_into_tensor(out, torch.full((n,), float(r)))
                shard = torch.empty(n)
                compat.reduce_scatter_tensor(shard, torch.ones(n * N))
                work = compat.all_gather_into_tensor(out, torch.ones(n), async_op=True)
                work.wait()
    return ledger, t, out, shard


@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_ops_send_what_the_ring_model_says(world_size):
    sizes = [1, 7, 10]
    out = launch(_ring_ops, world_size, sizes, quiet=True)
    N = world_size
    for ledger in out:
        ledger, t, gathered, shard = ledger
        assert torch.equal(t, torch.full((10,), N * (N + 1) / 2))
        assert torch.equal(shard, torch.full((10,), float(N)))
        M = sum(sizes) * 4
        assert ledger.message_bytes() == {"all_reduce": M, "reduce_scatter": N * M, "all_gather": 2 * N * M}
        assert ledger.counts() == {"all_reduce": 3, "reduce_scatter": 3, "all_gather": 6}
        exact = ledger.totals(exact=True)
        assert exact == {"all_reduce": Fraction(2 * (N - 1) * M, N),
                         "reduce_scatter": Fraction((N - 1) * M),
                         "all_gather": Fraction(2 * (N - 1) * M)}
        for rec in ledger.records:
            assert rec.world_size == N and rec.sent_bytes == pytest.approx(
                collective_bytes(rec.op, rec.message_bytes, N))
        assert [r.async_op for r in ledger.records].count(True) == 3
        assert {r.function for r in ledger.records if r.op != "all_reduce"} == (
            {"all_gather_single", "reduce_scatter_single"} if compat.HAS_SINGLE_NAMES
            else {"all_gather_into_tensor", "reduce_scatter_tensor"})


def _other_ops():
    N, r = dist.get_world_size(), dist.get_rank()
    with CommLedger() as ledger:
        dist.broadcast(torch.ones(10), src=1)                                     # M = 40
        dist.reduce(torch.ones(10), dst=2)                                        # M = 40
        dist.scatter(torch.empty(3), [torch.ones(3)] * N if r == 0 else None, src=0)  # chunk 12
        dist.gather(torch.ones(3), [torch.empty(3) for _ in range(N)] if r == 0 else None, dst=0)
        dist.all_to_all_single(torch.empty(2 * N), torch.ones(2 * N))             # M = 8N
        if r == 0:
            dist.send(torch.ones(4), dst=1)
        elif r == 1:
            dist.recv(torch.empty(4), src=0)
        dist.barrier()
    return ledger.totals(), ledger.message_bytes()


def test_other_ops_follow_the_documented_convention():
    out = launch(_other_ops, 3, quiet=True)
    sent = [o[0] for o in out]
    # broadcast from 1 along the ring 1 -> 2 -> 0: rank 0 (just before the root) forwards nothing
    assert [s["broadcast"] for s in sent] == [0, 40, 40]
    assert [s["reduce"] for s in sent] == [40, 40, 0]            # everyone but the root
    assert [s["scatter"] for s in sent] == [24, 0, 0]             # root: (N-1) chunks of 12
    assert [s["gather"] for s in sent] == [0, 12, 12]
    assert [s["all_to_all"] for s in sent] == [16, 16, 16]        # 24 minus the 8 it keeps
    assert [s.get("send", 0) for s in sent] == [16, 0, 0] and [s.get("recv", 0) for s in sent] == [0, 0, 0]
    assert "send" not in sent[2] and "recv" in sent[1]              # ops appear once seen
    assert all(s["barrier"] == 0 for s in sent)
    assert out[1][1]["recv"] == 16 and out[1][1]["scatter"] == 12
    assert sum(s["broadcast"] for s in sent) == 2 * 40            # mean (N-1)/N·M per rank


def _toy_fsdp(steps=1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))  # dim 0: 7, 3
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(dist.get_rank()))
    with CommLedger() as ledger:
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return ledger.records, ledger.totals()


def _padded_numel(shapes, N):
    """FSDP2 shards dim 0 into N equal pieces, padding it to a multiple of N."""
    total = 0
    for shape in shapes:
        rows = -(-shape[0] // N) * N
        total += rows * (torch.Size(shape).numel() // shape[0])
    return total


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp2_all_gathers_and_reduce_scatters_are_recorded(world_size):
    N = world_size
    out = launch(_toy_fsdp, N, quiet=True)
    records, totals = out[0]
    layer0 = _padded_numel([(7, 5), (7,)], N) * 4          # bytes of the gathered flat buffer
    layer2 = _padded_numel([(3, 7), (3,)], N) * 4
    assert N == 2 and (layer0, layer2) == (192, 128) or N == 3 and (layer0, layer2) == (216, 96)
    fns = ({"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single"}
           if compat.HAS_SINGLE_NAMES else     # torch < 2.13 spells them the old way
           {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"})
    # forward gathers layer 0 then 2; backward re-gathers 2 then 0 (both resharded after
    # forward) and reduce-scatters 2 then 0; no other collective
    assert [(r.op, r.message_bytes) for r in records] == [
        ("all_gather", layer0), ("all_gather", layer2), ("all_gather", layer2), ("all_gather", layer0),
        ("reduce_scatter", layer2), ("reduce_scatter", layer0)]
    assert all(r.function == fns[r.op] and r.world_size == N for r in records)
    padded = (layer0 + layer2) // 4                        # 80 (N=2), 78 (N=3); unpadded 66
    expected = comm_volume(padded, world_size=N, stage=3, bytes_per_elem=4)
    assert totals["all_gather"] == pytest.approx(expected["all_gather"], rel=1e-12)
    assert totals["reduce_scatter"] == pytest.approx(expected["reduce_scatter"], rel=1e-12)
    if N == 2:
        assert totals == {k: expected[k] for k in ("all_reduce", "reduce_scatter", "all_gather")}
    assert [o[1] for o in out] == [totals] * N


def _dtensor_full_tensor():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    with CommLedger() as ledger:
        full = t.full_tensor()
    return ledger.records, full


def test_dtensor_collectives_are_recorded():
    records, full = launch(_dtensor_full_tensor, 2, quiet=True)[0]
    assert torch.equal(full, torch.arange(8.0))
    assert [(r.op, r.message_bytes, r.sent_bytes, r.async_op) for r in records] == [
        ("all_gather", 32, 16, True)]
    assert records[0].function in ("funcol.all_gather_single", "funcol.all_gather_tensor")


def _ddp_grads(with_hook: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    ddp = DistributedDataParallel(model, bucket_cap_mb=60 / 2**20)   # 60-byte buckets
    if with_hook:
        CommLedger.attach_ddp(ddp)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(dist.get_rank()))
    ledgers = []
    for _ in range(2):      # iteration 1: one bucket; then DDP rebuilds them in backward order
        model.zero_grad()
        with CommLedger() as ledger:
            ddp(x).pow(2).sum().backward()
        ledgers.append(ledger.records)
    return [p.grad for p in model.parameters()], ledgers


def test_ddp_hook_records_buckets_and_keeps_ddp_results():
    plain = launch(_ddp_grads, 2, False, quiet=True)
    hooked = launch(_ddp_grads, 2, True, quiet=True)
    assert plain[0][1] == [[], []]                # DDP's C++ all-reduce is invisible...
    for r in range(2):                            # ... the hook sees it and changes nothing
        for a, b in zip(plain[r][0], hooked[r][0]):
            assert torch.equal(a, b)
    first, second = hooked[0][1]
    numel = 6 * 5 + 5 + 5 * 3 + 3
    # torch DDP puts every parameter in one bucket for the first iteration, then rebuilds
    # the buckets (here 60-byte caps) in the order backward produced the gradients
    assert [r.message_bytes for r in first] == [numel * 4]
    assert sum(r.message_bytes for r in second) == numel * 4 and len(second) > 1
    assert all(r.op == "all_reduce" and r.async_op for r in first + second)
    assert all(r.function == "all_reduce (DDP comm hook)" for r in first + second)
    assert CommLedger.ddp_hook is ddp_comm_hook
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        CommLedger.attach_ddp(nn.Linear(2, 2))


def _ledger_with(records):
    ledger = CommLedger()
    ledger.records.extend(records)
    return ledger


def _rec(op, m, n, sent=None, seconds=0.001):
    if sent is None:
        sent = collective_bytes(op, m, n)
    return CommRecord(op=op, function=op, message_bytes=m, sent_bytes=sent, world_size=n, rank=0,
                      seconds=seconds)


def test_totals_counts_table_compare_pickle_and_reset():
    ledger = _ledger_with([_rec("all_reduce", 400, 4), _rec("all_reduce", 100, 4),
                           _rec("all_gather", 300, 3), _rec("broadcast", 40, 4, sent=40)])
    assert ledger.totals() == {"all_reduce": 750, "reduce_scatter": 0, "all_gather": 200,
                               "broadcast": 40}
    assert list(ledger.counts()) == ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
    assert ledger.counts()["all_reduce"] == 2 and ledger.message_bytes()["all_reduce"] == 500
    table = ledger.table()
    assert "all_reduce" in table and "750" in table and table.splitlines()[-1].startswith("total")
    same = ledger.compare({"all_reduce": 750, "reduce_scatter": 0, "all_gather": 200,
                           "broadcast": 40, "total": 990})
    assert same.count(" ok") == 5 and "DIFFERS" not in same
    wrong = ledger.compare({"all_reduce": 700})
    assert "DIFFERS" in wrong and "50" in wrong and "all_gather" in wrong   # unexpected op listed
    copy = pickle.loads(pickle.dumps(ledger))
    assert copy.summary() == ledger.summary() and not copy.active
    assert pickle.loads(pickle.dumps(ledger.summary())) == ledger.summary()
    ledger.reset()
    assert len(ledger) == 0 and ledger.totals() == {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    with pytest.raises(TypeError, match="dict"):
        ledger.compare([1, 2])


def test_totals_are_exact_for_three_ranks():
    psi = 129_350                                     # not divisible by 3
    ledger = _ledger_with([_rec("all_reduce", 4 * psi, 3) for _ in range(5)])
    assert ledger.totals(exact=True)["all_reduce"] == Fraction(2 * 2 * 4 * psi * 5, 3)
    expected = comm_volume(psi, world_size=3, stage=0, bytes_per_elem=4)["all_reduce"] * 5
    assert ledger.totals()["all_reduce"] == pytest.approx(expected, rel=1e-15)
    assert "ok" in ledger.compare({"all_reduce": expected})


def test_plot_returns_a_figure():
    from matplotlib.figure import Figure

    ledger = _ledger_with([_rec("all_reduce", 400, 4)])
    fig = ledger.plot(expected=comm_volume(100, world_size=4, stage=0, bytes_per_elem=4))
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].patches) == 2 * 3          # measured and expected, per ring op
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [600, 0, 0, 600, 0, 0]
    assert len(ledger.plot().axes[0].patches) == 3
