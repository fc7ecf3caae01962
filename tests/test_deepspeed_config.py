"""DeepSpeed configs from planner choices, their FSDP2 equivalents run for real, the validator,
and (DeepSpeed being installed) DeepSpeed's own parser and estimators as a cross-check."""
import ast

import pytest
import torch

from course_utils.harness.experiments import GLOBAL_BATCH, run, train
from course_utils.harness.model import SyntheticData, build_model
from course_utils.labs import deepspeed_config as D
from course_utils.runtime.launch import launch, rank_device
from course_utils.theory.config import COURSE_CONFIG, preset
from course_utils.theory.memory import GB
from course_utils.theory.planner import Choice, plan, recommend
from course_utils.course.exercises import CAPSTONE_SCENARIOS
from course_utils.course.exercises.nb08 import reference_plan

pytestmark = pytest.mark.usefixtures("no_leftover_children")

CLUSTER = dict(gpu_mem_gb=80, gpus_per_node=8, nodes=2, intra_bw_gbps=450, inter_bw_gbps=50,
               seq_len=4096, global_batch=256)


@pytest.fixture(scope="module")
def rows():
    return plan("llama-2-13b", **CLUSTER)


# ------------------------------------------------------------------ configs

def test_every_choice_gives_a_valid_config(rows):
    assert len(rows) == 22
    for r in rows:
        cfg = D.deepspeed_config(r)
        summary = D.validate_deepspeed_config(cfg, world_size=16)
        zero = cfg["zero_optimization"]
        assert zero["stage"] == r.stage
        assert cfg["train_batch_size"] == 256 == r.micro_batch * r.grad_accum * 16
        assert ("offload_optimizer" in zero) == (r.choice.offload != "none")
        assert ("offload_param" in zero) == (r.choice.offload == "optimizer+params")
        assert ("zero_hpz_partition_size" in zero) == (r.strategy == "HSDP")
        assert ("activation_checkpointing" in cfg) == r.choice.recomputes
        assert summary.startswith(f"valid: stage {r.stage}") and "256 = " in summary


def test_bucket_sizes_follow_the_hidden_size(rows):
    h = preset("llama-2-13b").config.hidden
    z3 = D.deepspeed_config(rows.row("ZeRO-3"))["zero_optimization"]
    assert z3["reduce_bucket_size"] == h * h and z3["stage3_prefetch_bucket_size"] == int(0.9 * h * h)
    assert z3["stage3_param_persistence_threshold"] == 10 * h and z3["overlap_comm"] and z3["contiguous_gradients"]
    z1 = D.deepspeed_config(Choice("ZeRO-1"), world_size=4, micro_batch=2, grad_accum=1)["zero_optimization"]
    assert z1["reduce_bucket_size"] == z1["allgather_bucket_size"] == D.DEFAULT_BUCKET_ELEMS
    assert not any(k.startswith("stage3_") for k in z1)


def test_every_stage3_key_is_explained_and_the_defaults_are_deepspeeds(rows):
    from course_utils.theory.planner import DS_MAX_REUSE_DISTANCE, DS_PERSISTENCE_THRESHOLD
    z3 = D.deepspeed_config(rows.row("ZeRO-3"))["zero_optimization"]
    assert {k for k in z3 if k.startswith("stage3_")} | {"sub_group_size"} == set(D.STAGE3_KEYS)
    assert set(D.STAGE3_KEYS) <= D._ZERO_KEYS and "1e9" in D.STAGE3_KEYS["stage3_max_reuse_distance"]
    assert all("zero_to_fp32" in k or "zero.Init" in k or "16bit" in k for k in D.FSDP2_COUNTERPARTS)
    assert any("to_empty" in v for v in D.FSDP2_COUNTERPARTS.values())
    assert any("full_state_dict=True" in v for v in D.FSDP2_COUNTERPARTS.values())
    zero = pytest.importorskip("deepspeed.runtime.zero.config").DeepSpeedZeroConfig()
    assert (zero.param_persistence_threshold, zero.max_reuse_distance) == (DS_PERSISTENCE_THRESHOLD,
                                                                           DS_MAX_REUSE_DISTANCE)


def test_zero_infinity_on_nvme_and_precisions():
    cfg = D.deepspeed_config(("ZeRO-3", "optimizer+params"), world_size=8, micro_batch=1, grad_accum=4,
                             offload_device="nvme", nvme_path="/local_nvme", precision="fp16")
    zero = cfg["zero_optimization"]
    assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "nvme"
    assert zero["offload_param"]["nvme_path"] == "/local_nvme" and "aio" in cfg
    assert cfg["fp16"]["loss_scale"] == 0 and "bf16" not in cfg and cfg["train_batch_size"] == 32
    assert "valid: stage 3, optimizer -> nvme, params -> nvme, fp16, 32 = 1 x 4 x 8 GPUs" == \
        D.validate_deepspeed_config(cfg, world_size=8)
    seed = D.deepspeed_config("ZeRO-1", world_size=8, micro_batch=21, grad_accum=1, recipe="mixed-fp32-grads")
    assert seed["data_types"] == {"grad_accum_dtype": "fp32"} and seed["train_batch_size"] == 168
    assert "bf16" not in D.deepspeed_config("DDP", world_size=2, micro_batch=1, grad_accum=1, recipe="fp32")


def test_batch_arithmetic_fills_the_missing_one():
    c = Choice("ZeRO-2")
    assert D.deepspeed_config(c, world_size=8, train_batch_size=64, micro_batch=2)["gradient_accumulation_steps"] == 4
    assert D.deepspeed_config(c, world_size=8, train_batch_size=64, grad_accum=2)["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(ValueError, match="must equal micro_batch x grad_accum x GPUs"):
        D.deepspeed_config(c, world_size=8, train_batch_size=64, micro_batch=2, grad_accum=2)
    with pytest.raises(ValueError, match="not a multiple"):
        D.deepspeed_config(c, world_size=8, train_batch_size=60, micro_batch=2)
    with pytest.raises(ValueError, match="at least two"):
        D.deepspeed_config(c, world_size=8, micro_batch=2)
    with pytest.raises(ValueError, match="world_size"):
        D.deepspeed_config(c, micro_batch=2, grad_accum=1)
    with pytest.raises(ValueError, match="nvme_path"):
        D.deepspeed_config(("ZeRO-2", "optimizer"), world_size=2, micro_batch=1, grad_accum=1, offload_device="nvme")
    with pytest.raises(ValueError, match="HSDP needs gpus_per_node"):
        D.deepspeed_config("HSDP", world_size=16, micro_batch=1, grad_accum=1)
    with pytest.raises(ValueError, match="precision"):
        D.deepspeed_config(c, world_size=8, micro_batch=1, grad_accum=1, precision="fp8")


def _good():
    return D.deepspeed_config(("ZeRO-3", "optimizer"), world_size=4, micro_batch=2, grad_accum=2, hidden=64)


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c["zero_optimization"].update(stage=2), "only applies to stage 3"),
    (lambda c: (c["zero_optimization"].update(stage=2), [c["zero_optimization"].pop(k) for k in list(
        c["zero_optimization"]) if k.startswith("stage3_") or k == "sub_group_size"],
                c["zero_optimization"].update(offload_param={"device": "cpu"})), "offload_param needs stage 3"),
    (lambda c: c["zero_optimization"].update(stage=0, offload_optimizer={"device": "cpu"}) or [
        c["zero_optimization"].pop(k) for k in list(c["zero_optimization"]) if k.startswith("stage3_")
        or k == "sub_group_size"], "offload_optimizer needs stage 1, 2 or 3"),
    (lambda c: c["zero_optimization"].update(offload_optimizer={"device": "nvme"}), "needs nvme_path"),
    (lambda c: c["zero_optimization"].update(offload_optimizer={"device": "cpu", "nvme_path": "/x"}),
     "only used with device 'nvme'"),
    (lambda c: c["zero_optimization"].update(offload_optimizer={"device": "gpu"}), "'none', 'cpu' or 'nvme'"),
    (lambda c: c.update(train_batch_size=12), "must equal micro x accumulation x GPUs"),
    (lambda c: c.update(zero_optimisation={}), "unknown top-level key 'zero_optimisation'"),
    (lambda c: c["zero_optimization"].update(mics_shard_size=8), "MiCS"),
    (lambda c: c.update(fp16={"enabled": True}), "both enabled"),
    (lambda c: c["zero_optimization"].update(stage=4), "0, 1, 2 or 3"),
    (lambda c: c["zero_optimization"].update(overlap_comm="yes"), "True or False"),
    (lambda c: c["zero_optimization"].update(reduce_bucket_size=-1), "an int >= 0"),
    (lambda c: c.update(train_micro_batch_size_per_gpu=0), "an int >= 1"),
    (lambda c: c["zero_optimization"].update(zero_hpz_partition_size=3), "must divide"),
])
def test_validator_rejects_with_a_message(mutate, match):
    cfg = _good()
    assert D.validate_deepspeed_config(cfg, world_size=4)
    mutate(cfg)
    with pytest.raises(ValueError, match=match):
        D.validate_deepspeed_config(cfg, world_size=4)


def test_validator_types_and_world_size_free_check():
    with pytest.raises(TypeError, match="is a dict"):
        D.validate_deepspeed_config('{"train_batch_size": 8}')
    cfg = _good()
    assert "16 = 2 x 2 x 4 GPUs" in D.validate_deepspeed_config(cfg)     # dp inferred
    cfg["train_batch_size"] = 18
    with pytest.raises(ValueError, match="no whole number of GPUs"):
        D.validate_deepspeed_config(cfg)


# -------------------------------------------------------------------- FSDP2

def test_fsdp2_mapping(rows):
    z3 = D.fsdp2_equivalent(rows.row(("ZeRO-3", "optimizer+params", True)))
    assert z3.api == "fully_shard" and z3.kwargs["reshard_after_forward"] is True and z3.exact
    assert z3.kwargs["offload_policy"].pin_memory is True         # code for a GPU node: pinned host memory
    assert D.fsdp2_equivalent("ZeRO-3", device_type="cpu").kwargs.get("offload_policy") is None
    cpu = D.fsdp2_equivalent(("ZeRO-3", "optimizer+params", False), device_type="cpu")
    assert cpu.kwargs["offload_policy"].pin_memory is False and "pin_memory=False" in cpu.code
    assert z3.kwargs["mp_policy"].param_dtype == torch.bfloat16      # compute in bf16,
    assert z3.kwargs["mp_policy"].reduce_dtype == torch.float32      # sum gradients in fp32
    assert any("reduce_dtype=float32" in n for n in z3.notes)
    z2 = D.fsdp2_equivalent("ZeRO-2", recipe="mixed-fp32-grads")
    assert z2.kwargs["reshard_after_forward"] is False and z2.kwargs["mp_policy"].reduce_dtype == torch.float32
    hs = D.fsdp2_equivalent(rows.row("HSDP"))
    assert hs.mesh_shape == (2, 8) and hs.mesh_dim_names == ("replicate", "shard") and not hs.exact
    assert "init_device_mesh('cuda', (2, 8)" in hs.code and "zero_hpz_partition_size" in " ".join(hs.notes)
    z1 = D.fsdp2_equivalent("ZeRO-1")
    assert z1.api == "DistributedDataParallel + ZeroRedundancyOptimizer" and not z1.exact
    assert "4 + 4 + 8/N bytes per parameter (DeepSpeed: 2 + 2 + 12/N)" in " ".join(z1.notes)
    assert "(DeepSpeed: the same)" in " ".join(D.fsdp2_equivalent("ZeRO-1", precision="fp32").notes)
    assert D.fsdp2_equivalent("DDP").api == "DistributedDataParallel"
    opt_only = D.fsdp2_equivalent(("ZeRO-2", "optimizer"))
    assert not opt_only.exact and any("no optimizer-only offload" in n for n in opt_only.notes)
    for r in rows:
        ast.parse(D.fsdp2_equivalent(r).code)
    with pytest.raises(ValueError, match="HSDP needs gpus_per_node"):
        D.fsdp2_equivalent("HSDP")


def _train_snippets(codes, steps):
    """On each rank, per snippet: the course GPT, wrapped by the snippet, trained; the losses."""
    out = []
    for code in codes:
        ns = {"model": build_model(COURSE_CONFIG, seed=0, device=rank_device())}
        exec(code, ns)  # noqa: S102 - running the generated snippet is the point
        data = SyntheticData(COURSE_CONFIG, global_batch=GLOBAL_BATCH, seed=0)
        out.append([loss for _, loss, _ in train(ns["model"], ns["optimizer"], data, steps, device=rank_device())])
    return out


def _run_equivalent(choices, *, steps=2, precision="fp32"):
    """fsdp2_equivalent's code per choice trained on 2 gloo ranks (HSDP: 2 "nodes" of 1), max relative
    difference of its losses from one process's."""
    eqs = [D.fsdp2_equivalent(c, gpus_per_node=1, nodes=2, precision=precision, device_type="cpu")
           for c in choices]
    per_rank = launch(_train_snippets, 2, [e.code for e in eqs], steps, quiet=True, timeout_s=120,
                      backend="gloo")
    single = run("single", 1, steps=steps, quiet=True)[0].losses
    return [{"choice": e.choice.label(), "code": e.code, "losses": losses,
             "max_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses, single))}
            for e, losses in zip(eqs, per_rank[0])]


def test_generated_fsdp2_code_trains_for_real_on_two_ranks():
    exact = _run_equivalent(["ZeRO-3", "HSDP", "ZeRO-1", ("ZeRO-2", "none", "selective")])
    assert [r["choice"] for r in exact] == ["ZeRO-3", "HSDP", "ZeRO-1", "ZeRO-2 + selective recompute (attention core)"]
    assert "nothing to wrap" in exact[3]["code"] and "checkpoint_wrapper" not in exact[3]["code"]
    for r in exact:                          # fp32: the single-process losses
        assert r["max_rel_diff"] < 1e-5, r
    assert "init_device_mesh('cpu', (2, 1)" in exact[1]["code"]
    (mixed,) = _run_equivalent([("ZeRO-3", "optimizer+params", True)], precision="bf16")
    assert "CPUOffloadPolicy(pin_memory=False)" in mixed["code"] and "checkpoint_wrapper" in mixed["code"]
    assert mixed["max_rel_diff"] < 2e-2 and mixed["losses"][1] < mixed["losses"][0]


def test_selective_recompute_maps_to_the_same_section_around_the_attention_core():
    """DeepSpeed's activation checkpointing recomputes what the model wraps: "full" wraps every
    block, "selective" each attention core; the config section is the same."""
    kw = dict(world_size=8, micro_batch=1, grad_accum=1)
    sel, full, none = (D.deepspeed_config(("ZeRO-2", "none", rc), **kw) for rc in ("selective", "full", "none"))
    assert sel == full and "activation_checkpointing" in sel and "activation_checkpointing" not in none
    fs = D.fsdp2_equivalent(("ZeRO-1", "none", "selective"))
    assert "checkpoint_wrapper" not in fs.code and any("recompute='torchtitan'" in n for n in fs.notes)
    ast.parse(fs.code)


def test_torch_plan_rows_map_to_torch_and_to_deepspeed_with_its_own_layout():
    t = plan("llama-2-7b", framework="torch", **dict(CLUSTER, nodes=1, global_batch=64))
    row = t.row("ZeRO-3")
    with pytest.raises(ValueError, match="torch's layout"):
        D.deepspeed_config(row)
    assert D.fsdp2_equivalent(row).kwargs["mp_policy"].reduce_dtype == torch.float32
    assert D.deepspeed_config(row, recipe="mixed")["zero_optimization"]["stage"] == 3   # DeepSpeed's own layout


# ------------------------------------------------------ DeepSpeed itself

@pytest.fixture(scope="module")
def ds():
    return pytest.importorskip("deepspeed")


def test_deepspeed_parses_every_generated_config(ds, rows, monkeypatch):
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    # DeepSpeedConfig reads the world size from torch.distributed; give it the plan's 16 GPUs
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 16)
    for r in rows:
        cfg = D.deepspeed_config(r)
        zero = DeepSpeedZeroConfig(**cfg["zero_optimization"])
        assert int(zero.stage) == r.stage
        parsed = ds_config.DeepSpeedConfig(cfg)
        assert parsed.train_batch_size == 256 and parsed.zero_optimization_stage == r.stage
        assert parsed.gradient_accumulation_steps == r.grad_accum
        if r.choice.offload_params:
            assert parsed.zero_config.offload_param.device == "cpu"
    nvme = D.deepspeed_config(("ZeRO-3", "optimizer+params"), world_size=16, micro_batch=1, grad_accum=1,
                              offload_device="nvme", nvme_path="/local_nvme")
    parsed = ds_config.DeepSpeedConfig(nvme).zero_config
    assert parsed.offload_param.device == parsed.offload_optimizer.device == "nvme"
    # DeepSpeed is laxer than our validator: it accepts offload_param at stage 2 (and ignores it)
    lax = {"stage": 2, "offload_param": {"device": "cpu"}}
    assert DeepSpeedZeroConfig(**lax).offload_param.device == "cpu"
    with pytest.raises(ValueError, match="offload_param needs stage 3"):
        D.validate_deepspeed_config({"train_batch_size": 16, "zero_optimization": lax})


def test_deepspeed_estimators_agree_with_the_planner(ds):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cfg = preset("llama-2-13b").config
    psi, largest = cfg.num_params(), cfg.largest_layer_params()
    rows = plan(cfg, recipe="mixed-fp32-grads", persistence_threshold=0, **CLUSTER)  # its estimator shards every tensor
    n = 16
    _, gpu = estimate_zero2_model_states_mem_needs(psi, 8, 2, cpu_offload=False)
    assert gpu == int(rows.row("ZeRO-2").states + 2 * psi / n)     # + DeepSpeed's fp16 grad shard
    _, gpu = estimate_zero2_model_states_mem_needs(psi, 8, 2, cpu_offload=True)
    assert gpu == rows.row(("ZeRO-2", "optimizer")).states
    _, gpu, four_l = estimate_zero3_model_states_mem_needs(psi, largest, 8, 2, cpu_offload=False,
                                                           cpu_offload_params=False)
    assert four_l == 4 * largest and gpu == four_l + int(rows.row("ZeRO-3").states)
    _, gpu, _ = estimate_zero3_model_states_mem_needs(psi, largest, 8, 2, cpu_offload=True,
                                                      cpu_offload_params=False)
    assert gpu == four_l + int(rows.row(("ZeRO-3", "optimizer")).states)
    _, gpu, _ = estimate_zero3_model_states_mem_needs(psi, largest, 8, 2)
    assert gpu == four_l and rows.row(("ZeRO-3", "optimizer+params")).states == 0
    # the planner's ZeRO-3 buffers hold that gathered layer (and the prefetched one)
    assert rows.row("ZeRO-3").buffers > four_l


def test_capstone_answers_become_valid_deepspeed_configs():
    for sc in CAPSTONE_SCENARIOS:
        best = recommend(reference_plan(sc)).row
        cfg = D.deepspeed_config(best)
        D.validate_deepspeed_config(cfg, world_size=best.world_size)
        assert cfg["train_batch_size"] == sc.global_batch
        assert best.total <= sc.gpu_mem_gb * GB


def _deepspeed_zero3_on_ranks(settings, rank=0, world_size=1):
    """DeepSpeed's ZeRO-3 on the course GPT, per (threshold, reuse distance): all-gathered elements in a
    steady-state step (the third: the first records the trace), parameters held whole after forward
    and after the step."""
    import deepspeed
    import deepspeed.comm.comm as dcomm
    from course_utils.harness.model import GPT
    D.init_deepspeed_on_gloo()
    gathered, real, results = [], dcomm.cdb.all_gather_into_tensor, []

    def counting(*a, **k):
        gathered.append((a[0] if a else next(iter(k.values()))).numel())
        return real(*a, **k)
    dcomm.cdb.all_gather_into_tensor = counting
    x = torch.randint(0, COURSE_CONFIG.vocab, (2, COURSE_CONFIG.seq), generator=torch.Generator().manual_seed(0))
    for threshold, reuse in settings:
        torch.manual_seed(0)
        model = GPT(COURSE_CONFIG)
        zero = {"stage": 3, "stage3_param_persistence_threshold": threshold, "stage3_max_reuse_distance": reuse,
                "stage3_prefetch_bucket_size": 0}      # no prefetch: it also keeps what it fetched ahead
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                          config={"train_batch_size": 2 * world_size, "zero_optimization": zero,
                                                  "zero_allow_untested_optimizer": True})
        for _ in range(3):
            gathered.clear()
            loss = engine(x, x)
            held = sum(p.data.numel() for p in engine.module.parameters())
            engine.backward(loss)
            engine.step()
        results.append({"gathered": sum(gathered), "held_after_forward": held,
                        "held_after_step": sum(p.data.numel() for p in engine.module.parameters()),
                        "persistent": sum(p.ds_persist for p in engine.module.parameters())})
    return results


def test_deepspeed_zero3_gathers_and_holds_what_the_planner_models(ds):
    """DeepSpeed itself on 2 gloo ranks: every course-GPT tensor is under the default persistence
    threshold (gathered once, after the step); with threshold 0 the default reuse distance keeps
    every parameter gathered into backward (Ψ per step), reuse distance 0 gathers twice (2Ψ). On 3
    ranks each tensor is gathered padded to a multiple of 3 (5050 -> 5052): 129,444 for 129,350."""
    import math
    from course_utils.theory.planner import deepspeed_zero3_terms
    psi, settings = COURSE_CONFIG.num_params(), [(100_000, 10**9), (0, 10**9), (0, 0)]
    for n in (2, 3):
        padded = sum(math.ceil(e / n) * n for e in COURSE_CONFIG.param_numels())   # each case: all or none
        for rank in launch(_deepspeed_zero3_on_ranks, n, settings, quiet=True, timeout_s=300):
            for (threshold, reuse), r in zip(settings, rank):
                count, p, kept = deepspeed_zero3_terms(COURSE_CONFIG, threshold, reuse)
                assert r["persistent"] == count and r["gathered"] * psi == (2 * (psi - p) - kept + p) * padded, r
                assert (r["held_after_forward"], r["held_after_step"]) == (kept + p, p)


def test_torchtitan_sac_code_trains_on_two_ranks_and_deepspeed_refuses_it():
    """recompute='torchtitan': checkpoint_wrapper with torchtitan's op-level policy on every block, before
    fully_shard; its losses are one process's. A DeepSpeed config has no op-level SAC: a clear error."""
    (r,) = _run_equivalent([("ZeRO-3", "none", "torchtitan")])
    assert "create_selective_checkpoint_contexts" in r["code"] and "% 2 == 0" in r["code"]
    assert r["max_rel_diff"] < 1e-5, r
    with pytest.raises(ValueError, match="op-level selective checkpointing"):
        D.deepspeed_config(("ZeRO-3", "none", "torchtitan"), world_size=8, micro_batch=1, grad_accum=1)
    assert any("deepspeed_config refuses" in n for n in D.fsdp2_equivalent(("ZeRO-1", "none", "torchtitan")).notes)


def _deepspeed_zero12_on_ranks(rank=0, world_size=1):
    """DeepSpeed's ZeRO-1 and ZeRO-2 on the course GPT, per (stage, use_multi_rank_bucket_allreduce): the
    collectives of the second step, as the ledger records them: (function, message bytes, ring bytes sent)."""
    import contextlib
    import io
    import deepspeed
    from course_utils.harness.model import GPT
    from course_utils.runtime.ledger import CommLedger
    D.init_deepspeed_on_gloo()
    x = torch.randint(0, COURSE_CONFIG.vocab, (2, COURSE_CONFIG.seq), generator=torch.Generator().manual_seed(0))
    out = {}
    for stage in (1, 2):
        for allreduce in (True, False):
            torch.manual_seed(0)
            model = GPT(COURSE_CONFIG)
            with contextlib.redirect_stdout(io.StringIO()):
                engine, *_ = deepspeed.initialize(
                    model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                    config={"train_batch_size": 2 * world_size, "zero_allow_untested_optimizer": True,
                            "zero_optimization": {"stage": stage, "use_multi_rank_bucket_allreduce": allreduce}})
                for _ in range(2):
                    with CommLedger() as ledger:
                        engine.backward(engine(x, x))
                        engine.step()
            out[stage, allreduce] = [(r.function, r.message_bytes, r.sent_bytes) for r in ledger.records]
    return out


def test_deepspeed_zero1_and_zero2_all_reduce_the_gradients_by_default(ds):
    """DeepSpeed 0.19's use_multi_rank_bucket_allreduce (default True): one all-reduce of the whole fp32
    gradient, then the parameters' all-gather: 1.5x DDP's ring bytes, as the planner models its ZeRO-1/2.
    False: one dist.reduce per owner (a reduce-scatter's bytes), 1x. Never a reduce_scatter. Plus a 4-byte
    all-reduce of the gradient norm."""
    from course_utils.theory.comm import comm_volume
    psi = COURSE_CONFIG.num_params()
    for n in (2, 3):
        ddp = comm_volume(psi, world_size=n, stage=0, bytes_per_elem=4)["all_reduce"]
        for rank in launch(_deepspeed_zero12_on_ranks, n, quiet=True, timeout_s=300):
            for (stage, allreduce), calls in rank.items():
                big = [(f, m) for f, m, _ in calls if m > 4]
                sent = sum(s for _, m, s in calls if m > 4)
                assert not any("reduce_scatter" in f for f, _ in big), calls
                gathers = [m for f, m in big if f.startswith("all_gather")]
                assert len(gathers) == 1 and 4 * psi <= gathers[0] <= 4 * (psi + 4 * n), calls   # DeepSpeed pads to align
                if allreduce:
                    assert [m for f, m in big if f == "all_reduce"] == [4 * psi], calls
                    assert sent == pytest.approx(1.5 * ddp, rel=1e-4), (stage, n, sent / ddp)
                else:
                    reduces = [m for f, m in big if f == "reduce"]
                    assert len(reduces) == n and sum(reduces) == 4 * psi and "all_reduce" not in dict(big), calls
                    assert sent == pytest.approx(ddp, rel=1e-4), (stage, n, sent / ddp)
