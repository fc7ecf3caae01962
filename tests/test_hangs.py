"""course_utils.labs.hangs: every broken scenario is caught within its timeout (a hang by the
launcher's timeout, a crash or an error at once), the diagnosis names the rank, the
collective and the line from the stacks and messages, every fixed version completes with
the right result, TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprint check is captured, and the
exercise checker grades right and wrong fixes.

What gloo does (torch 2.13, measured here): a collective some rank never calls hangs;
opposite orders of collectives of different sizes abort the rank that receives more
bytes than it expects (SIGABRT), of different ops hang, of the same op and size finish
with wrong numbers; torch DDP refuses parameters of different shapes with an error,
FSDP2 and a hand-written flat all-reduce abort in their first collective over them.
"""
import re

import pytest
import torch

from course_utils.runtime import compat
from course_utils.labs import hangs
from course_utils.course.exercises import Verdict

pytestmark = pytest.mark.usefixtures("no_leftover_children")

TIMEOUT = hangs.DEFAULT_TIMEOUT_S


def _caught_in_time(o):
    """Outcomes, not speed: a hang is what the launcher's timeout killed (so not before it);
    a crash, an error or a wrong result ended the launch by itself: no timeout fired."""
    if o.kind == "hang":
        assert o.elapsed_s >= o.timeout_s and o.ranks
    elif o.kind in ("crash", "error"):
        assert o.failed_rank is not None
    else:
        assert o.kind == "wrong result"


def _deterministic(report: str):
    assert not re.search(r"0x[0-9a-f]{4,}|/tmp/|pid|port|\d+\.\d+ s\b", report)


def test_skipped_collective_hangs_and_the_stacks_name_the_fault():
    d = hangs.diagnose("skipped_collective", timeout_s=TIMEOUT)
    (o,) = d.outcomes
    assert o.kind == "hang"
    _caught_in_time(o)
    assert o.ranks[0].collective == "all_reduce"
    assert (o.ranks[0].function, o.ranks[0].code) == ("skipped_collective", "dist.all_reduce(loss)")
    assert o.ranks[1].collective == "barrier" and o.ranks[1].function is None
    assert "rank 0 waits in all_reduce at `dist.all_reduce(loss)`, a collective that rank(s) [1] " \
           "never call" in d.report
    _deterministic(d.report)


def test_uneven_batches_hang_in_ddp_backward():
    (o,) = hangs.diagnose("uneven_batches").outcomes
    assert o.kind == "hang"
    _caught_in_time(o)
    assert (o.ranks[0].collective, o.ranks[0].code) == ("backward", "loss.backward()")
    assert o.ranks[1].function is None                    # rank 1 left the loop
    assert o.outputs == {0: "4 batches\n", 1: "3 batches\n"}


def test_shape_mismatch_error_with_ddp_crash_with_fsdp_and_flat_all_reduce():
    d = hangs.diagnose("shape_mismatch")
    ddp, fsdp2, flat = d.outcomes
    for o in d.outcomes:
        _caught_in_time(o)
    assert (ddp.variant, ddp.kind, ddp.failed_rank) == ("torch-ddp", "error", 1)
    assert "sizes [101, 60] appears not to match sizes of the same param in process 0" in ddp.message
    assert ddp.ranks[1].collective == "_verify_param_shape_across_processes"
    assert ddp.ranks[1].via == "wrap()"
    assert (fsdp2.variant, fsdp2.kind, fsdp2.failed_rank) == ("torch-fsdp", "crash", 0)
    assert fsdp2.message.startswith("SIGABRT") and "Received data size doesn't match expected size" \
        in fsdp2.message
    assert (fsdp2.ranks[0].collective, fsdp2.ranks[0].code) == (compat.ALL_GATHER_NAME, "loss = model(x, y)")
    assert (flat.variant, flat.kind) == ("all_reduce", "crash")
    assert (flat.ranks[0].collective, flat.ranks[0].function) == ("all_reduce", "_average_gradients")
    assert f"rank 0 failed in {compat.ALL_GATHER_NAME} at `loss = model(x, y)`" in d.report
    _deterministic(d.report)


def test_collective_order_crashes_gives_wrong_numbers_or_hangs():
    d = hangs.diagnose("collective_order")
    sizes, same, ops = d.outcomes
    for o in d.outcomes:
        _caught_in_time(o)
    assert (sizes.kind, sizes.failed_rank, sizes.ranks[0].collective) == ("crash", 0, "all_reduce")
    assert "8 vs 4" in sizes.message      # 8 floats of stats arrive where rank 0 expects 1
    # same sizes: each rank's first all-reduce meets the other's first: loss (1) + stats (20) on
    # rank 0, stats (20) + loss (1) on rank 1; then stats (10) + loss (2), loss (2) + stats (10)
    assert same.kind == "wrong result" and len(same.wrong) == 2
    assert [r.tolist() for r in same.results] == [[1 + 20, 10 + 2], [2 + 10, 20 + 1]]
    assert ops.kind == "hang"
    assert {r: s.collective for r, s in ops.ranks.items()} == {0: "all_reduce", 1: "broadcast"}
    assert "the ranks wait in different collectives" in d.report
    again = hangs.diagnose("collective_order", "sizes")
    assert again.report == hangs.diagnose("collective_order", "sizes").report   # stable text


def test_detail_mode_turns_mismatches_into_descriptive_errors():
    msg = hangs.detail_message("collective_order", "sizes")
    lines = msg.splitlines()
    assert lines[0].startswith("Detected mismatch between collectives on ranks. Rank 0 is running "
                               "collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, "
                               "TensorShape=[1], TensorDtypes=Float)")
    assert "OpType=ALLREDUCE, TensorShape=[8]" in lines[1]
    assert lines[2].endswith("shapes: 1 vs 8")
    assert "TensorOptions" not in msg and "0x" not in msg
    assert msg == hangs.detail_message("collective_order", "sizes")
    # a hang becomes an error at once; the closing barrier's fingerprint prints as REDUCE
    o = hangs.run_broken("skipped_collective", detail=True)
    assert o.kind == "error" and o.failed_rank == 0          # not a hang: no timeout fired
    assert "OpType=ALLREDUCE" in o.message and "Op type: ALLREDUCE vs REDUCE" in o.message
    # equal fingerprints (same op, shape, dtype) swapped: DETAIL sees nothing
    assert hangs.detail_message("collective_order", "same_sizes") == ""


@pytest.mark.parametrize("name", list(hangs.SCENARIOS))
def test_fixed_versions_complete_with_the_right_result(name):
    fixed = hangs.run_fixed(name)
    assert fixed.passed, fixed.report
    spec = hangs.SCENARIOS[name]
    assert set(fixed.results) == set(spec.variants or (None,))
    assert "completed; every rank right" in fixed.report
    if name == "skipped_collective":
        assert fixed.results[None] == [1.5, 1.5]
    if name == "uneven_batches":      # 3 ranks: 4, 3 and 2 batches, two steps
        assert hangs.run_fixed(name, world_size=3).passed


def test_check_hang_fix_grades_fixes():
    assert isinstance(hangs.check_hang_fix("collective_order", hangs.collective_order_fixed), Verdict)
    assert hangs.check_hang_fix("collective_order", hangs.collective_order_fixed)
    assert not hangs.check_hang_fix("collective_order", hangs.collective_order)   # crashes: reported
    assert not hangs.check_hang_fix("skipped_collective", _off_by_one)
    assert not hangs.check_hang_fix("skipped_collective", "not a function")


def _off_by_one():
    import torch
    import torch.distributed as dist

    t = torch.tensor(float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return t.item() / (dist.get_world_size() + 1)


def test_check_skipped_collective_wants_the_print_on_rank_0_only(capsys):
    """Exercise 08.1: the right mean on every rank is not enough, only rank 0 prints it."""
    from course_utils.course.exercises import check_skipped_collective

    assert check_skipped_collective(hangs.skipped_collective_fixed)
    assert "right: every rank returned 1.5" in capsys.readouterr().out
    assert not check_skipped_collective(_prints_on_every_rank)
    assert "rank 1: printed 'mean loss 1.500': only rank 0 prints" in capsys.readouterr().out
    assert not check_skipped_collective(_prints_nothing)
    assert "rank 0: printed nothing" in capsys.readouterr().out


def _prints_on_every_rank():
    import torch
    import torch.distributed as dist

    loss = torch.tensor(float(dist.get_rank() + 1))
    dist.all_reduce(loss)
    loss /= dist.get_world_size()
    print(f"mean loss {loss.item():.3f}")        # planted: every rank prints
    return loss.item()


def _prints_nothing():
    import torch
    import torch.distributed as dist

    loss = torch.tensor(float(dist.get_rank() + 1))
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()


def test_argument_checks_and_cleaning():
    with pytest.raises(ValueError, match="unknown scenario"):
        hangs.diagnose("deadlock")
    with pytest.raises(TypeError):
        hangs.run_broken(3)
    with pytest.raises(ValueError, match="variants"):
        hangs.run_broken("collective_order", "backwards")
    with pytest.raises(ValueError, match="no variant"):
        hangs.run_broken("skipped_collective", "sizes")
    with pytest.raises(ValueError, match="timeout_s"):
        hangs.run_broken("skipped_collective", timeout_s=0)
    with pytest.raises(ValueError, match="world_size"):
        hangs.run_fixed("skipped_collective", world_size=8)
    raw = ("[enforce fail at /a/b/pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. at 0x7f3a "
           "TensorShape=[1], TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), "
           "x.Collectives differ in the following aspects:   Op type: ALLREDUCEvs REDUCE")
    assert hangs.clean_message(raw) == ("op.preamble.length <= op.nbytes. 8 vs 4. at 0x... "
                                        "TensorShape=[1]), x. Collectives differ in the following "
                                        "aspects: Op type: ALLREDUCE vs REDUCE")


def _uneven_fix():
    import torch
    import torch.distributed as dist

    batches = hangs.rank_batches(dist.get_rank())
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    return hangs.ddp_steps(batches[:int(steps)])


def _uneven_first_batch_only():   # no hang, but fewer steps than the ranks could all take
    import torch.distributed as dist

    return hangs.ddp_steps(hangs.rank_batches(dist.get_rank())[:1])


def test_check_hang_fix_uneven_batches_with_the_public_helpers():
    assert hangs.check_hang_fix("uneven_batches", _uneven_fix)
    assert not hangs.check_hang_fix("uneven_batches", _uneven_first_batch_only)


@pytest.mark.parametrize("name, seq", [("skipped_collective", 1), ("uneven_batches", 9)])
def test_the_flight_recorder_names_the_first_collective_the_ranks_disagree_on(name, seq, caplog):
    """Torch's Flight Recorder on gloo ranks (TORCH_FR_BUFFER_SIZE), each rank's trace written by the
    lab's watchdog once a collective stalls: rank 0 waits in an all-reduce, rank 1 in the launcher's
    closing barrier, at the same sequence number. On torch >= 2.13 torch's own analyzer (torchfrtrace)
    reads the same dumps and names the same collective and rank 1 as the culprit."""
    import logging
    import os
    import pickle
    import tempfile
    dumps = hangs.flight_recorder_dumps(name)
    found = hangs.first_mismatch(dumps)
    assert found is not None and found[0] == seq, found
    assert found[1][0][0] == "all_reduce" and found[1][1][0] == "barrier", found
    assert hangs.first_mismatch([dumps[0], dumps[0]]) is None
    report = hangs.flight_recorder(name)
    assert f"the ranks disagree at collective #{seq}: rank 0 all_reduce, rank 1 barrier" in report, report
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13):
        return                      # torch 2.10's analyzer accepts NCCL traces only
    from torch.distributed.flight_recorder.fr_trace import main as torchfrtrace
    with tempfile.TemporaryDirectory() as folder:
        for rank, d in enumerate(dumps):
            # gloo's dump names the default group '' in pg_config, its entries '0': the analyzer matches them
            d = dict(d, pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}})
            with open(os.path.join(folder, f"rank_{rank}"), "wb") as f:
                pickle.dump(d, f)
        with caplog.at_level(logging.INFO, logger="Flight Recorder"):     # the analyzer reports by logging
            torchfrtrace([folder])
    said = caplog.text
    assert f"Collective sequence number: {seq} has errors" in said and "Culprit rank 1" in said, said
    assert "'all_reduce' does not match found collective type: 'barrier'" in said, said
