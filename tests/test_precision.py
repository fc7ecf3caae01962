"""course_utils.harness.precision: the three recipes hold exactly memory.model_states' bytes."""
import dataclasses

import pytest
import torch

from course_utils.theory.config import COURSE_CONFIG
from course_utils.theory.memory import RECIPES, model_states
from course_utils.harness.model import SyntheticData, build_model, num_params
from course_utils.harness.experiments import state_bytes
from course_utils.harness.precision import MasterWeightsAdamW, make_training, memtracker_bytes, train_step

PSI = 129_350           # COURSE_CONFIG.num_params()
TENSORS = 68            # parameter tensors of the course model (the tied embedding once)
STEP_BYTES = 4          # AdamW's state["step"]: one fp32 scalar tensor per parameter tensor
BATCH = SyntheticData(global_batch=8).batch(0)


def one_step(recipe, model=None):
    model, opt = make_training(model or build_model(), recipe)
    train_step(model, opt, *BATCH, zero_grad=False)
    return model, opt


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_one_step_holds_exactly_model_states_plus_step_counters(recipe):
    model, opt = one_step(recipe)
    got, want = state_bytes(model, opt, detail=True), model_states(PSI, recipe=recipe)
    assert got["params"] == want.params
    assert got["grads"] == want.grads
    assert got["optimizer"] == want.optimizer + TENSORS * STEP_BYTES == want.optimizer + 272
    detail = got["optimizer_detail"]
    assert detail["step"] == 272 and detail["exp_avg"] == detail["exp_avg_sq"] == 4 * PSI
    assert detail.get("master", 0) == (0 if recipe in ("fp32", "torch-amp") else 4 * PSI)
    assert len(opt.state) == TENSORS
    assert all(s["step"].dtype == torch.float32 and s["step"].dim() == 0 for s in opt.state.values())


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_frozen_parameter_gets_no_grad_and_no_optimizer_state(recipe):
    model = build_model()
    model.pos_emb.weight.requires_grad_(False)          # 32 x 50 = 1,600 parameters
    before = model.pos_emb.weight.detach().clone()
    model, opt = one_step(recipe, model)
    trainable = PSI - 1_600
    got = state_bytes(model, opt)
    assert got["params"] == model_states(PSI, recipe=recipe).params
    assert got["grads"] == model_states(trainable, recipe=recipe).grads
    assert got["optimizer"] == model_states(trainable, recipe=recipe).optimizer + (TENSORS - 1) * STEP_BYTES
    frozen = model.pos_emb.weight
    assert frozen.grad is None and not hasattr(frozen, "main_grad")
    assert torch.equal(frozen.float(), before.to(frozen.dtype).float())


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_tied_weight_counted_once_untied_twice(recipe):
    tied_model, tied_opt = one_step(recipe)
    assert tied_model.tok_emb.weight.grad is not None or hasattr(tied_model.tok_emb.weight, "main_grad")
    untied_cfg = dataclasses.replace(COURSE_CONFIG, tied_embeddings=False)
    untied_model, untied_opt = one_step(recipe, build_model(untied_cfg))
    psi_untied = num_params(untied_model)
    assert psi_untied == PSI + 101 * 50
    tied, untied = state_bytes(tied_model, tied_opt), state_bytes(untied_model, untied_opt)
    bp, bg, bo = RECIPES[recipe]
    assert untied["params"] - tied["params"] == bp * 101 * 50
    assert untied["grads"] - tied["grads"] == bg * 101 * 50
    assert untied["optimizer"] == model_states(psi_untied, recipe=recipe).optimizer + (TENSORS + 1) * STEP_BYTES


def test_dtypes_of_each_recipe():
    fp32, _ = one_step("fp32")
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    for recipe in ("mixed", "mixed-fp32-grads"):
        model, opt = one_step(recipe)
        assert isinstance(opt, MasterWeightsAdamW)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert {m.dtype for m in opt.masters} == {torch.float32}
        assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(opt.params, opt.masters))
    model, _ = one_step("mixed-fp32-grads")
    assert all(p.grad is None and p.main_grad.dtype == torch.float32 for p in model.parameters())
    amp, opt = one_step("torch-amp")              # torch's layout: fp32 params are the master
    assert type(opt) is torch.optim.AdamW and {p.dtype for p in amp.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in amp.parameters()} == {torch.float32}
    seen = []
    amp.blocks[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    amp(*SyntheticData(global_batch=4, seed=0).batch(0))
    assert seen == [torch.bfloat16]                # computed in bf16 under autocast


def test_masters_are_copied_before_rounding():
    reference = build_model()
    _, opt = make_training(build_model(), "mixed")
    assert all(torch.equal(m, p) for m, p in zip(opt.masters, reference.parameters()))


def losses(recipe, steps=5):
    model, opt = make_training(build_model(), recipe, lr=3e-3)
    data = SyntheticData(global_batch=8)
    return [train_step(model, opt, *data.batch(step)) for step in range(steps)]


def test_mixed_recipes_train_like_fp32():
    ref = losses("fp32")
    assert ref[-1] < ref[0] - 0.2
    for recipe in ("mixed", "mixed-fp32-grads"):
        assert losses(recipe) == pytest.approx(ref, abs=0.05), recipe


def test_main_grad_accumulates_and_zero_grad_keeps_it_allocated():
    model, opt = make_training(build_model(), "mixed-fp32-grads")
    model(*BATCH).backward()
    once = [p.main_grad.clone() for p in model.parameters()]
    model(*BATCH).backward()
    assert all(torch.equal(p.main_grad, 2 * g) for p, g in zip(model.parameters(), once))
    held = state_bytes(model, opt)["grads"]
    opt.zero_grad()
    assert all(not p.main_grad.any() for p in model.parameters())
    assert state_bytes(model, opt)["grads"] == held == 4 * PSI


def test_zero_grad_frees_bf16_grads():
    model, opt = one_step("mixed")
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert state_bytes(model, opt)["grads"] == 0


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_memtracker_agrees_where_it_can_see(recipe):
    model, opt = make_training(build_model(), recipe)
    seen = memtracker_bytes(model, opt, lambda: train_step(model, opt, *BATCH, zero_grad=False))
    now, ours = seen["current"], state_bytes(model, opt, detail=True)
    master = ours["optimizer_detail"].get("master", 0)
    assert now["Parameter"] == ours["params"]
    assert now["Optstate"] == ours["optimizer"] - master        # exp_avg + exp_avg_sq + step
    if recipe == "mixed-fp32-grads":
        assert now["Gradient"] == 0                               # bf16 grads freed by the hook
        assert now["Other"] == master + ours["grads"]             # masters + main_grad
    else:
        assert now["Gradient"] == ours["grads"]
        assert now["Other"] == master
    assert seen["peak"]["Total"] >= now["Total"] > 0


def test_state_dict_round_trip():
    model, opt = one_step("mixed")
    saved = {k: v for k, v in opt.state_dict().items()}
    saved["masters"] = [m.clone() for m in saved["masters"]]
    other_model, other = make_training(build_model(seed=1), "mixed")
    other.load_state_dict(saved)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other_model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(opt.masters, other.masters))


@pytest.mark.parametrize("call, exc, words", [
    (lambda: make_training(build_model(), "bf16"), ValueError, "unknown recipe"),
    (lambda: make_training("model", "fp32"), TypeError, "nn.Module"),
    (lambda: make_training(build_model(), "fp32", lr=0), ValueError, "lr must be > 0"),
    (lambda: make_training(build_model(), "fp32", lr="1e-3"), TypeError, "lr must be a number"),
    (lambda: make_training(build_model(), "fp32", weight_decay=-1), ValueError, "weight_decay must be >= 0"),
    (lambda: make_training(build_model(), "fp32", betas=(0.9,)), ValueError, "betas must be two numbers"),
    (lambda: make_training(build_model().requires_grad_(False), "mixed"), ValueError, "no trainable"),
    (lambda: make_training(make_training(build_model(), "mixed-fp32-grads")[0], "mixed"), ValueError,
     "build a fresh model"),
    (lambda: state_bytes(build_model(), "adam"), TypeError, "optimizer must be"),
    (lambda: state_bytes(build_model(device="meta"), torch.optim.AdamW([torch.zeros(1)])), ValueError,
     "meta device"),
    (lambda: memtracker_bytes(*make_training(build_model(), "fp32"), None), TypeError, "run_step must be"),
])
def test_bad_arguments_get_clear_errors(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
