"""course_utils.harness.checkpoint: FSDP2 checkpoints with torch.distributed.checkpoint (DCP).

* A DCP checkpoint saved by 4 "torch-fsdp" ranks loads on 2 ranks and into one plain
  process (no process group) with every parameter and every AdamW state (exp_avg,
  exp_avg_sq, step; by name) equal bit for bit. On 4 ranks no dim 0 of the course GPT
  (101, 50 or 200 rows) splits evenly except 200, and 101 rows split unevenly on 2 too.
* The full state dict is gathered on rank 0 only, equals experiments.full_parameters, and
  the file save_full writes loads into a plain build_model() with load_state_dict (on 3
  ranks of "torch-fsdp-zero2": none of 101, 50, 200 rows divides by 3).
* Stop, save, new ranks, load, continue: the losses of the uninterrupted
  experiments.run("torch-fsdp", 2) bit for bit; without the optimizer state they differ.
* Bad inputs raise FileNotFoundError / ValueError / TypeError naming what to change.
"""
import dataclasses

import pytest
import torch

from course_utils.harness import experiments
from course_utils.harness.checkpoint import (_preload, checkpoint_keys, describe_checkpoint, full_state_dict,
                                     load_full, load_sharded, optimizer_tensors,
                                     reshard_roundtrip, resume_matches, save_full, save_sharded)
from course_utils.theory.config import COURSE_CONFIG
from course_utils.harness.experiments import GLOBAL_BATCH, full_parameters, make_adamw, wrap
from course_utils.runtime.launch import launch
from course_utils.harness.model import SyntheticData, build_model

pytestmark = pytest.mark.usefixtures("no_leftover_children")

PARAMS, NUMEL = 68, 129_350                  # Parameters of the course GPT; elements
KEYS = PARAMS + 3 * PARAMS + 12              # model + (step, exp_avg, exp_avg_sq) + param_groups


def _plain_steps(model, optimizer, start, stop):
    """Train a plain model on the whole global batch of steps start..stop-1; the losses."""
    data = SyntheticData(global_batch=GLOBAL_BATCH, seed=0)
    losses = []
    for step in range(start, stop):
        loss = model(*data.shard(step, 0, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _plain(seed=0, steps=0, config=COURSE_CONFIG):
    model = build_model(config, seed=seed)
    optimizer = make_adamw(model.parameters())
    _plain_steps(model, optimizer, 0, steps)
    return model, optimizer


def _equal(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ DCP: 4 -> 2 -> 1

def test_reshard_4_to_2_to_1_bit_exact(tmp_path):
    r = reshard_roundtrip(tmp_path / "ck", save_world=4, load_worlds=(2, 1), steps=2)
    rows = r["rows"]
    assert [(x["world_size"], x["role"]) for x in rows] == [(4, "saved"), (2, "loaded"), (1, "loaded")]
    assert rows[0]["where"] == "4 ranks, gloo on CPU" and rows[1]["where"] == "2 ranks, gloo on CPU"
    assert rows[2]["where"] == "1 process, no process group"
    for x in rows:
        assert x["params_equal"] and x["optimizer_equal"] and x["full_is_full_parameters"], x
    assert r["all_equal"]
    assert len({x["param_digest"] for x in rows}) == 1
    assert len({x["optimizer_digest"] for x in rows}) == 1
    # the loaded models started from other weights and were trained: a no-op load would show
    untrained = experiments.param_digest(full_parameters(build_model(seed=0)))
    assert rows[0]["param_digest"] != untrained
    # on disk: rank 0's index and one file per saving rank, every tensor split in 4 chunks
    files = r["files"]
    assert [f["file"] for f in files] == [".metadata"] + [f"__{i}_0.distcp" for i in range(4)]
    shards = files[1:]
    assert sum(f["model_chunks"] for f in shards) == 4 * PARAMS == files[0]["model_chunks"]
    # exp_avg and exp_avg_sq sharded like the parameters; AdamW's step (a 0-d tensor every
    # rank holds) and the 12 hyperparameters written once, by one rank each
    assert sum(f["optimizer_chunks"] for f in shards) == 2 * 4 * PARAMS + PARAMS
    assert sum(f["objects"] for f in shards) == 12 == files[0]["objects"]
    assert sum(f["data_bytes"] for f in shards) == 4 * (3 * NUMEL + PARAMS)
    for f in shards:
        assert f["bytes"] == f["payload_bytes"] > f["data_bytes"] > 0
    assert len(checkpoint_keys(tmp_path / "ck")) == KEYS


# ------------------------------------------------------------------ full state dict

def _full_on_ranks(path):
    model, optimizer = wrap("torch-fsdp-zero2", build_model(), make_adamw)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    x, y = SyntheticData(global_batch=GLOBAL_BATCH, seed=0).shard(0, rank, world)
    model(x, y).backward()
    optimizer.step()
    optimizer.zero_grad()
    full = full_state_dict(model, optimizer)
    params = full_parameters(model)
    saved = save_full(model, optimizer, path)
    # and back into a fresh sharded model: every rank reads the file, keeps its shards
    model, optimizer = wrap("torch-fsdp-zero2", build_model(seed=7), make_adamw)
    loaded = load_full(model, optimizer, path)
    return full, params, saved, loaded, full_state_dict(model, optimizer)


def test_full_state_dict_on_rank0_loads_into_plain_model(tmp_path):
    path = tmp_path / "export" / "model.pt"
    _preload()                      # DCP, FSDP2, DTensor imported once, inherited by the ranks
    out = launch(_full_on_ranks, 3, str(path), quiet=True, timeout_s=120)
    full, params, saved, _, back = out[0]
    others = out[1:]
    assert all(o[0] == {} and o[2]["bytes"] == 0 and o[4] == {} for o in others)  # rank 0 only
    assert [o[3] for o in out] == [{"rank": r, "step": 1} for r in range(3)]
    assert _equal(back["model"], full["model"])
    assert _equal(optimizer_tensors(back["optimizer"]), optimizer_tensors(full["optimizer"]))
    assert saved["bytes"] == path.stat().st_size > 4 * 3 * NUMEL
    assert _equal(full["model"], params) and len(params) == PARAMS
    assert all(not hasattr(t, "to_local") and t.device.type == "cpu" for t in full["model"].values())
    # every rank's full_parameters agree with rank 0's consolidated state dict
    assert all(_equal(o[1], params) for o in others)
    # the export: a plain model, plain load_state_dict
    plain = build_model(seed=7)
    plain.load_state_dict(torch.load(path)["model"])
    assert _equal(dict(plain.named_parameters()), params)
    # ... and the optimizer state too, with load_full
    model, optimizer = _plain(seed=7)
    assert load_full(model, optimizer, path) == {"rank": 0, "step": 1}
    here = optimizer_tensors(full_state_dict(model, optimizer)["optimizer"])
    assert _equal(here, optimizer_tensors(full["optimizer"])) and len(here) == 3 * PARAMS


# ------------------------------------------------------------------ resume

def test_resume_equals_uninterrupted(tmp_path):
    r = resume_matches(tmp_path / "ck", world_size=2, steps=4, stop_at=2, other_world_size=1)
    assert r["where"] == "2 ranks, gloo on CPU"
    assert r["resumed"] == r["uninterrupted"] and r["bit_exact"] and r["params_equal"]
    assert len(set(r["uninterrupted"])) == 4                 # it trains: every loss differs
    baseline = r["uninterrupted"]                            # experiments.run's losses
    other = r["other"]
    assert other["world_size"] == 1 and other["where"] == "1 rank, gloo on CPU"
    assert other["losses"][:2] == baseline[:2]               # saved at world 2
    assert other["max_abs_diff"] == max(abs(a - b) for a, b in zip(other["losses"], baseline))
    assert other["max_abs_diff"] < 1e-5


def test_resume_needs_the_optimizer_state(tmp_path):
    """One plain process: resuming with the saved AdamW state is bit-exact; with a fresh
    AdamW (model only) the next losses differ."""
    model, optimizer = _plain()
    reference = _plain_steps(model, optimizer, 0, 4)
    model, optimizer = _plain(steps=2)
    save_sharded(model, optimizer, tmp_path / "ck")
    model, optimizer = _plain(seed=3)
    assert load_sharded(model, optimizer, tmp_path / "ck")["step"] == 2
    assert _plain_steps(model, optimizer, 2, 4) == reference[2:]
    model, optimizer = _plain(seed=3)
    assert load_sharded(model, None, tmp_path / "ck")["step"] is None
    resumed = _plain_steps(model, optimizer, 2, 4)
    assert resumed[0] == reference[2] and resumed[1] != reference[3]


# ------------------------------------------------------------------ on disk, errors

def test_describe_is_deterministic(tmp_path):
    model, optimizer = _plain(steps=1)
    rows = []
    for name in ("a", "b"):                                  # same path length
        info = save_sharded(model, optimizer, tmp_path / name)
        assert info["files"] == [".metadata", "__0_0.distcp"] and info["rank"] == 0
        rows.append(describe_checkpoint(tmp_path / name))
        assert info["bytes"] == sum(r["bytes"] for r in rows[-1])
    assert rows[0] == rows[1]
    meta, shard = rows[0]
    assert (shard["model_chunks"], shard["optimizer_chunks"], shard["objects"]) == (PARAMS, 3 * PARAMS, 12)
    assert shard["data_bytes"] == 4 * (3 * NUMEL + PARAMS)
    assert shard["bytes"] == shard["payload_bytes"]


def test_bad_inputs(tmp_path):
    model, optimizer = _plain(steps=1)
    save_sharded(model, optimizer, tmp_path / "full")
    save_sharded(model, None, tmp_path / "model_only")
    save_full(model, None, tmp_path / "model.pt")
    fresh, fresh_opt = _plain(seed=3)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_sharded(fresh, fresh_opt, tmp_path / "missing")
    assert not fresh_opt.state                               # a failed load leaves it fresh
    with pytest.raises(ValueError, match="is a file"):
        load_sharded(fresh, None, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="no optimizer state"):
        load_sharded(fresh, fresh_opt, tmp_path / "model_only")
    assert not fresh_opt.state
    with pytest.raises(ValueError, match="no optimizer state"):
        load_full(fresh, fresh_opt, tmp_path / "model.pt")
    wide, wide_opt = _plain(config=dataclasses.replace(COURSE_CONFIG, vocab=103))
    with pytest.raises(ValueError, match=r"shape mismatch for 'model\.tok_emb\.weight'.*\(101, 50\)"):
        load_sharded(wide, wide_opt, tmp_path / "full")
    with pytest.raises(ValueError, match=r"shape mismatch for 'tok_emb\.weight'"):
        load_full(wide, None, tmp_path / "model.pt")
    short, short_opt = _plain(config=dataclasses.replace(COURSE_CONFIG, layers=2))
    with pytest.raises(ValueError, match=r"keys the model here lacks, e\.g\. 'model\.blocks\.2\."):
        load_sharded(short, short_opt, tmp_path / "full")
    sgd = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="momentum_buffer"):
        load_sharded(fresh, sgd, tmp_path / "full")
    # a damaged shard: DCP's own error, re-raised as a ValueError
    (tmp_path / "full" / "__0_0.distcp").write_bytes(b"")
    with pytest.raises(ValueError, match="damaged or incomplete"):
        load_sharded(fresh, fresh_opt, tmp_path / "full")
    with pytest.raises(ValueError, match="overwrite=True"):
        save_sharded(model, optimizer, tmp_path / "model_only")
    with pytest.raises(ValueError, match="no state yet"):
        save_sharded(*_plain(), tmp_path / "new")
    with pytest.raises(ValueError, match="no state yet"):
        full_state_dict(*_plain())
    with pytest.raises(ValueError, match="is a directory"):
        save_full(model, optimizer, tmp_path)
    with pytest.raises(TypeError, match="nn.Module"):
        save_sharded("model", optimizer, tmp_path / "x")
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        save_sharded(model, "adamw", tmp_path / "x")
    with pytest.raises(TypeError, match="not parameters of the model"):
        save_sharded(fresh, optimizer, tmp_path / "x")
    with pytest.raises(TypeError, match="path"):
        load_sharded(model, optimizer, 3)
    with pytest.raises(ValueError, match="global batch"):
        reshard_roundtrip(tmp_path / "r", save_world=5)
    with pytest.raises(TypeError, match="load_worlds"):
        reshard_roundtrip(tmp_path / "r", load_worlds=2)
    with pytest.raises(ValueError, match="strategy"):
        reshard_roundtrip(tmp_path / "r", strategy="zero3")
    with pytest.raises(ValueError, match="stop_at"):
        resume_matches(tmp_path / "r", steps=2, stop_at=2)
