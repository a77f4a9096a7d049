"""rookworld.optim: schedule values by hand, AdamWSpec validation, fp32 master weights,
gradient clipping, LR back-off, exact resume of optimiser + scheduler, and FusedAdamW
against torch's fused AdamW."""

import copy
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import rookworld.optim
from rookworld.optim import (
    AdamWSpec,
    Constant,
    Cosine,
    FusedAdamW,
    Linear,
    cosine_schedule,
    linear_ratio,
    load_schedule_state,
    scale_lr,
    warmup_ratio,
)

CONF = Path(__file__).resolve().parents[1] / "conf" / "optim"


def test_warmup_ratio_hand():
    # (step + 1) / (warmup_steps + 1) with warmup_steps = 4: .2, .4, .6, .8, then 1
    assert [warmup_ratio(t, 4) for t in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert warmup_ratio(0, 0) == 1.0


def test_cosine_schedule_hand():
    # no warmup, total 10, floor .1: step 0 -> 1; step 5 -> .1 + .9 * (1 + cos(pi/2)) / 2 = .55;
    # step 10 and beyond -> .1
    assert [cosine_schedule(t, 0, 10, 0.1) for t in (0, 5, 10, 20)] == pytest.approx(
        [1.0, 0.55, 0.1, 0.1])
    # warmup 2, total 12: 1/3, 2/3, then 1 at step 2; step 7 is half-way through 10 -> .55
    assert [cosine_schedule(t, 2, 12, 0.1) for t in (0, 1, 2, 7)] == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 0.55])


def test_linear_ratio_hand():
    # total 10: step 5 -> 1 - (1 - .2) * .5 = .6; floor 0: .5 then 0 at 10
    assert linear_ratio(5, 0, 10, 0.2) == pytest.approx(0.6)
    assert [linear_ratio(t, 0, 10, 0.0) for t in (0, 5, 10, 11)] == pytest.approx(
        [1.0, 0.5, 0.0, 0.0])


def test_schedule_classes_match_functions():
    assert [Constant(2)(t) for t in range(4)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    c, lin = Cosine(3, 0.1, total_steps=20), Linear(3, 0.05, total_steps=20)
    for t in range(25):
        assert c(t) == cosine_schedule(t, 3, 20, 0.1)
        assert lin(t) == linear_ratio(t, 3, 20, 0.05)
    with pytest.raises(ValueError, match="optim.schedule.total_steps"):
        Cosine(3)(0)


@pytest.mark.parametrize("make, key", [
    (lambda: AdamWSpec(lr=0.0), "optim.lr must be > 0"),
    (lambda: AdamWSpec(lr=1e-4, weight_decay=-0.1), "optim.weight_decay"),
    (lambda: AdamWSpec(lr=1e-4, betas=(1.0, 0.9)), "optim.betas"),
    (lambda: AdamWSpec(lr=1e-4, eps=0.0), "optim.eps"),
    (lambda: AdamWSpec(lr=1e-4, grad_clip=0.0), "optim.grad_clip"),
    (lambda: Cosine(warmup_steps=-1), "optim.schedule.warmup_steps"),
    (lambda: Cosine(min_ratio=1.5), "optim.schedule.min_ratio"),
    (lambda: Linear(warmup_steps=10, total_steps=5), "optim.schedule.total_steps"),
])
def test_impossible_values_rejected(make, key):
    with pytest.raises(ValueError, match=key):
        make()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))


def test_build_groups_decay_matrices_only():
    m = _model()
    opt, _ = AdamWSpec(lr=1e-3, weight_decay=0.1).build(m.parameters(), 10)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and {p.dim() for p in decay["params"]} == {2}
    assert no_decay["weight_decay"] == 0.0 and {p.dim() for p in no_decay["params"]} == {1}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))


def test_build_refuses_bf16_params():
    with pytest.raises(ValueError, match="fp32 master weights"):
        AdamWSpec(lr=1e-4).build(_model().bfloat16().parameters(), 10)


def test_small_lr_step_changes_every_fp32_param():
    # lr 1e-6: Adam moves each weight by ~1e-6, far below bf16's resolution near 1 (2^-7)
    # but above fp32's (2^-23): on fp32 master weights every parameter changes
    m = _model()
    before = [p.detach().clone() for p in m.parameters()]
    opt, sched = AdamWSpec(lr=1e-6).build(m.parameters(), 10)
    m(torch.randn(5, 3)).pow(2).mean().backward()
    opt.step()
    sched.step()
    for b, p in zip(before, m.parameters(), strict=True):
        assert not torch.equal(b, p.detach())


def test_lr_follows_schedule_through_lambda_lr():
    m = _model()
    spec = AdamWSpec(lr=1e-3, schedule=Cosine(warmup_steps=2, min_ratio=0.1))
    opt, sched = spec.build(m.parameters(), 12)
    for t in range(14):
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * cosine_schedule(t, 2, 12, 0.1))
        opt.step()
        sched.step()


def test_clip_gradients_returns_pre_clip_norm():
    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([3.0, 4.0])
    assert AdamWSpec(lr=1e-3, grad_clip=None).clip_gradients([w]).item() == pytest.approx(5.0)
    assert torch.equal(w.grad, torch.tensor([3.0, 4.0]))  # no clipping
    assert AdamWSpec(lr=1e-3, grad_clip=1.0).clip_gradients([w]).item() == pytest.approx(5.0)
    assert w.grad.norm().item() == pytest.approx(1.0, abs=1e-5)  # clipped to 1
    w.grad = torch.tensor([math.nan, 1.0])
    assert math.isnan(AdamWSpec(lr=1e-3).clip_gradients([w]).item())


def _train(m, opt, sched, steps, seed):
    g = torch.Generator().manual_seed(seed)
    lrs = []
    for _ in range(steps):
        opt.zero_grad()
        m(torch.randn(5, 3, generator=g)).pow(2).mean().backward()
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_resume_equals_uninterrupted():
    spec = AdamWSpec(lr=1e-2, weight_decay=0.1, schedule=Cosine(warmup_steps=2, min_ratio=0.1))
    m1 = _model()
    o1, s1 = spec.build(m1.parameters(), 8)
    lrs = _train(m1, o1, s1, 3, seed=1) + _train(m1, o1, s1, 3, seed=2)

    m2 = _model()
    o2, s2 = spec.build(m2.parameters(), 8)
    first = _train(m2, o2, s2, 3, seed=1)
    ckpt = {"model": m2.state_dict(), "opt": o2.state_dict(), "sched": s2.state_dict()}
    m3 = _model()
    o3, s3 = spec.build(m3.parameters(), 8)
    m3.load_state_dict(ckpt["model"])
    o3.load_state_dict(ckpt["opt"])
    s3.load_state_dict(ckpt["sched"])
    assert first + _train(m3, o3, s3, 3, seed=2) == lrs
    for a, b in zip(m1.parameters(), m3.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fused_adamw_steps_and_saves_as_torchs_fused_adamw(monkeypatch):
    """The same weights to the bit over a decaying schedule, with a parameter that has no
    gradient at first; each state_dict loads into the other and both go on alike."""
    spec = AdamWSpec(lr=1e-2, weight_decay=0.1, schedule=Cosine(warmup_steps=2, min_ratio=0.1))
    ours, torchs = _model(), _model()
    o1, s1 = spec.build(ours.parameters(), 8)
    monkeypatch.setattr(rookworld.optim, "FusedAdamW", torch.optim.AdamW)  # build's groups
    o2, s2 = spec.build(torchs.parameters(), 8)
    assert type(o1) is FusedAdamW and type(o2) is torch.optim.AdamW and o2.defaults["fused"]
    for m in (ours, torchs):
        m[2].bias.requires_grad_(False)  # no gradient: no state, no step
    _train(ours, o1, s1, 2, seed=1)
    _train(torchs, o2, s2, 2, seed=1)
    for m in (ours, torchs):
        m[2].bias.requires_grad_(True)
    assert _train(ours, o1, s1, 3, seed=2) == _train(torchs, o2, s2, 3, seed=2)
    for a, b in zip(ours.parameters(), torchs.parameters(), strict=True):
        assert torch.equal(a, b)
    assert str(o1.state_dict()) == str(o2.state_dict())
    state1, state2 = copy.deepcopy(o1.state_dict()), copy.deepcopy(o2.state_dict())
    o1.load_state_dict(state2)  # a copy: load_state_dict keeps the tensors it is given
    o2.load_state_dict(state1)
    _train(ours, o1, s1, 2, seed=3)
    _train(torchs, o2, s2, 2, seed=3)
    for a, b in zip(ours.parameters(), torchs.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fused_adamw_resumes_an_unfused_state(monkeypatch):
    """A state saved by torch's unfused AdamW (`ROOKWORLD_FUSED_ADAMW=0`) loads in the
    fused layout (a float32 step on the parameter's device) and goes on as torch's unfused
    AdamW does, up to rounding."""
    spec = AdamWSpec(lr=1e-2, weight_decay=0.1, schedule=Cosine(warmup_steps=2, min_ratio=0.1))
    monkeypatch.setenv("ROOKWORLD_FUSED_ADAMW", "0")
    theirs = _model()
    o1, s1 = spec.build(theirs.parameters(), 8)
    monkeypatch.delenv("ROOKWORLD_FUSED_ADAMW")
    assert type(o1) is torch.optim.AdamW and not o1.defaults["fused"]
    _train(theirs, o1, s1, 2, seed=1)
    ours = copy.deepcopy(theirs)
    o2, s2 = spec.build(ours.parameters(), 8)
    o2.load_state_dict(copy.deepcopy(o1.state_dict()))
    s2.load_state_dict(s1.state_dict())
    assert type(o2) is FusedAdamW and all(g["fused"] for g in o2.param_groups)
    for p in ours.parameters():
        step = o2.state[p]["step"]
        assert step.dtype == torch.float32 and step.device == p.device and step.item() == 2
    assert _train(ours, o2, s2, 3, seed=2) == _train(theirs, o1, s1, 3, seed=2)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_adamw_leaves_a_grad_scalers_skip_to_the_scaler():
    """With a GradScaler and a non-finite gradient the step is skipped (the scaler unscales
    and checks before stepping)."""
    m = _model()
    opt, _ = AdamWSpec(lr=1e-2).build(m.parameters(), 8)
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in m.parameters()]
    scaler.scale(m(torch.full((5, 3), math.inf)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(b, p) for b, p in zip(before, m.parameters(), strict=True))


def test_scale_lr_backs_off_and_survives_resume():
    m = _model()
    opt, sched = AdamWSpec(lr=1e-3, schedule=Linear(min_ratio=0.0)).build(m.parameters(), 10)
    _train(m, opt, sched, 2, seed=0)  # now at step 2: lr = 1e-3 * .8
    scale_lr(sched, 0.5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.4e-3)
    _, sched2 = AdamWSpec(lr=1e-3, schedule=Linear(min_ratio=0.0)).build(_model().parameters(), 10)
    sched2.load_state_dict(sched.state_dict())
    opt.step()
    sched.step()  # step 3: 0.5e-3 * .7
    assert opt.param_groups[0]["lr"] == pytest.approx(0.35e-3)
    assert sched2.base_lrs == [0.5e-3, 0.5e-3]


@pytest.mark.parametrize("name, schedule", [("adamw", Constant), ("adamw_cosine", Cosine)])
def test_optim_yaml_instantiates_and_builds(name, schedule):
    yaml = OmegaConf.load(CONF / f"{name}.yaml")
    spec = instantiate(yaml, _execution_whitelist_=["rookworld.*"])
    assert isinstance(spec, AdamWSpec) and isinstance(spec.schedule, schedule)
    assert spec.lr == yaml.lr and spec.betas == tuple(yaml.betas)
    opt, sched = spec.build(_model().parameters(), 100)
    assert opt.param_groups[0]["lr"] == pytest.approx(
        yaml.lr * replace(spec.schedule, total_steps=100)(0))


def test_a_resume_with_more_steps_runs_the_longer_schedule():
    """A 10-step cosine schedule saved at step 6 and resumed by a 40-step run follows the
    40-step schedule from step 6 on (not the saved one's floor), keeping the saved peak lr
    that the NaN guard's back-off scaled."""
    spec = AdamWSpec(lr=1e-3, schedule=Cosine(warmup_steps=2, min_ratio=0.1))
    m = _model()
    opt, sched = spec.build(m.parameters(), 10)
    _train(m, opt, sched, 6, seed=0)
    scale_lr(sched, 0.5)
    opt2, sched2 = spec.build(m.parameters(), 40)
    opt2.load_state_dict(opt.state_dict())
    load_schedule_state(sched2, sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5e-3 * cosine_schedule(6, 2, 40, 0.1))
    lrs = _train(m, opt2, sched2, 6, seed=1)  # steps 7 .. 12 of the 40-step schedule
    assert lrs == pytest.approx([0.5e-3 * cosine_schedule(t, 2, 40, 0.1) for t in range(7, 13)])
    assert lrs[-1] > 0.5e-3 * 0.5  # the 10-step schedule would sit at its floor, 0.05e-3
