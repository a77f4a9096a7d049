"""The engine on a tiny model: every parameter moves, losses are finite, dropout is off; the
tests not about the fast path run on both backends (`backend`)."""

import math

import pytest
import torch

from rookworld.config import compose
from rookworld.rewards.base import Reward, Scored
from rookworld.train import build_engine, build_parts


class LengthReward(Reward):
    """Varies within every group (for mechanics tests only): longer is better."""

    range = (0.0, 1.0)

    def __call__(self, sample, completion):
        return Scored(min(len(completion), 24) / 24, {"len": float(len(completion))})


@pytest.fixture
def engine_and_pools(tiny_overrides, backend):
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + backend + ["sampler.temperature=1.5", "optim.lr=1e-2",
                                              "kl=fixed"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    assert engine.backend.name == cfg.backend
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    return cfg, parts, engine, pools


def test_every_trainable_parameter_changes_and_losses_are_finite(engine_and_pools):
    cfg, parts, engine, pools = engine_and_pools
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    batch = engine.rollout(parts.task_mix.draw(pools, 4, 0, 0), 0)
    assert batch.rewards.std() > 0
    m = engine.update(batch, 0)
    for k in ("loss/policy", "loss/total", "loss/kl", "optim/grad_norm", "policy/entropy"):
        assert math.isfinite(m[k]), k
    unchanged = [n for n, p in engine.model.named_parameters()
                 if torch.equal(p.detach(), before[n]) and not n.endswith("wpe.weight")]
    assert unchanged == []
    # position rows beyond the longest sequence get no gradient; the used ones move
    used = batch.rollout.prompt_ids.shape[1] + batch.rollout.completion_ids.shape[1]
    wpe = dict(engine.model.named_parameters())["transformer.wpe.weight"]
    assert not torch.equal(wpe[:used], before["transformer.wpe.weight"][:used])


def test_reference_is_frozen_and_agrees_with_policy_at_step_zero(engine_and_pools):
    cfg, parts, engine, pools = engine_and_pools
    assert all(not p.requires_grad for p in engine.ref.parameters())
    assert not engine.model.training and not engine.ref.training
    batch = engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0)
    # at step 0 the reference and the sampling policy give the same log-probs
    assert torch.allclose(batch.ref_logprobs, batch.rollout.logprobs, atol=1e-5)
    m = engine.update(batch, 0)
    assert abs(m["kl/k3"]) < 1e-6 and abs(m["policy/ratio_mean"] - 1) < 1e-5


def test_clip_stats_cover_every_iteration_not_only_the_first(tiny_overrides, backend):
    """With num_iterations > 1 the ratio moves after the first update: the logged ratio and
    clip fractions are the mean over the iterations (iteration 0 alone always reads 1 / 0)."""
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + backend + ["sampler.temperature=1.5", "optim.lr=5e-2",
                                              "algorithm.num_iterations=3"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    m = engine.update(engine.rollout(parts.task_mix.draw(pools, 4, 0, 0), 0), 0)
    assert m["policy/ratio_max"] > 1.0 + 1e-3
    assert m["policy/clip_frac_low"] + m["policy/clip_frac_high"] > 0


def _two_steps(overrides: list[str], keep, with_engine: bool = False) -> list:
    """Two seeded steps of a tiny engine (4 prompts each); keep(batch, metrics) per step
    (keep(batch, metrics, engine) with_engine)."""
    from rookworld.data.load import read_samples

    cfg = compose(overrides + ["sampler.temperature=1.5", "kl=fixed"])
    parts = build_parts(cfg)
    torch.manual_seed(cfg.seed)
    engine = build_engine(cfg, parts, LengthReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    out = []
    for step in range(2):
        batch = engine.rollout(parts.task_mix.draw(pools, 4, step, 0), step)
        m = engine.update(batch, step)
        out.append(keep(batch, m, engine) if with_engine else keep(batch, m))
    return out


def test_release_memory_changes_memory_not_results(tiny_overrides, backend, monkeypatch):
    """release_memory=true trims the heap after each rollout and update (glibc) and
    nothing else: the same seed gives the same samples and metrics."""
    from rookworld import engine as engine_mod

    calls = []
    monkeypatch.setattr(engine_mod, "release_freed_memory", lambda: calls.append(1))
    runs = []
    for release in (False, True):
        runs.append(_two_steps(tiny_overrides + backend
                               + [f"release_memory={str(release).lower()}"],
                               lambda batch, m: (batch.rollout.completion_ids.tolist(),
                                                 m["loss/total"], m["kl/k3"])))
        assert bool(calls) == release  # the trim runs only when asked for
    assert runs[0] == runs[1]


@pytest.mark.parametrize("args, rows", [
    # n, G, prompt width, completion width, vocab, token budget
    ((32, 8, 59, 64, 96, 1024), 8),      # one group (8 x 64 + 59 = 571 tokens) per chunk
    ((32, 8, 59, 64, 96, 2048), 16),     # three groups fit; 24 + 8 evened out to 16 + 16
    ((32, 8, 59, 64, 96, 10 ** 6), 32),  # everything fits: the whole batch
    ((64, 8, 59, 144, 96, 1024), 5),     # one group is over budget: rows of 203 tokens
    ((64, 8, 59, 144, 96, 100), 1),      # not even one row fits: one row
    ((16, 8, 59, 160, 50257, 10 ** 6), 2),  # full GPT-2 vocabulary: logits cap at 64 MiB
    ((12, 4, 10, 10, 96, 100), 8),       # three groups of 50 tokens, two per chunk: 8 + 4
    ((40, 8, 59, 64, 96, 2048), 24),     # five groups, three per chunk: 24 + 16
])
def test_micro_batch_rows(args, rows):
    from rookworld.batch import micro_batch_rows
    assert micro_batch_rows(*args) == rows


def test_micro_batch_rows_keeps_every_chunk_within_its_budgets():
    from hypothesis import given
    from hypothesis import strategies as st

    from rookworld.batch import micro_batch_rows

    @given(st.integers(1, 16), st.integers(1, 12), st.integers(1, 200), st.integers(1, 200),
           st.integers(2, 60000), st.integers(1, 5000))
    def check(groups, g, p, t, v, tokens):
        n = groups * g
        rows = micro_batch_rows(n, g, p, t, v, tokens)
        assert 1 <= rows <= n
        # a chunk runs each of its distinct prompts once and every row's completion
        chunk_tokens = rows * t + p * -(-rows // g)
        assert chunk_tokens <= tokens or rows == 1
        assert rows * t * v <= 1 << 24 or rows == 1
        if (g * t + p) * groups <= tokens and n * t * v <= 1 << 24:
            assert rows == n  # everything fits: one chunk

    check()


def test_auto_micro_batch_changes_memory_not_results(tiny_overrides):
    """micro_batch=auto chunks the update by whole groups (the reference pass runs whole):
    the same samples, losses and gradient norm as the whole batch at once, to float32
    rounding."""
    runs = [_two_steps(tiny_overrides + [f"micro_batch={micro}", "micro_batch_tokens=64"],
                       lambda batch, m: (batch.rollout.completion_ids.tolist(),
                                         batch.ref_logprobs, m["loss/total"], m["kl/k3"],
                                         m["optim/grad_norm"], m["optim/micro_batches"]))
            for micro in ("0", "auto")]
    for whole, auto in zip(*runs):
        assert whole[0] == auto[0]
        assert torch.allclose(whole[1], auto[1], atol=1e-5)
        for a, b in zip(whole[2:5], auto[2:5]):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-6)
        assert whole[5] == 1 and auto[5] > 1


def test_recompute_activations_changes_memory_not_results(tiny_overrides):
    """Layer norms and GELUs recomputed in backward: the same samples, and losses and
    gradient norms to float rounding."""
    keep = lambda batch, m: (batch.rollout.completion_ids.tolist(),  # noqa: E731
                             m["loss/total"], m["optim/grad_norm"], m["kl/k3"])
    runs = [_two_steps(tiny_overrides + [f"recompute_activations={r}"], keep)
            for r in ("false", "true")]
    for a, b in zip(*runs):
        assert a[0] == b[0]
        assert a[1:] == pytest.approx(b[1:], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("extra", [
    [],  # GRPO defaults: both tasks (two tapes), the whole batch in one chunk
    ["micro_batch=3", "algorithm.entropy_coef=0.01", "zero_variance=drop"],  # chunks split groups
    ["algorithm=dapo", "algorithm.num_iterations=2", "algorithm.kl_estimator=full",
     "micro_batch_tokens=64"],  # a second iteration runs the forward (the policy moved)
])
def test_rollout_tape_changes_speed_not_results(tiny_overrides, extra):
    """The update differentiating the rollout's kept forward (rollout_tape_mib) gives the
    same losses, KL, entropy and gradient norm as running the policy's forward again, to
    float rounding, and the same parameters after two steps."""
    def keep(batch, m, engine):
        params = sum(float(p.detach().double().abs().sum()) for p in engine.model.parameters())
        return (batch.rollout.completion_ids.tolist(), m["optim/rollout_forward_reused"],
                [m[k] for k in ("loss/total", "optim/grad_norm", "kl/k3", "policy/entropy")],
                params)
    runs = [_two_steps(tiny_overrides + extra + [f"rollout_tape_mib={mib}"], keep, True)
            for mib in ("512", "0")]
    for taped, plain in zip(*runs):
        assert taped[0] == plain[0]
        assert (taped[1], plain[1]) == (1.0, 0.0)
        assert taped[2] == pytest.approx(plain[2], rel=1e-4, abs=1e-6)
        assert taped[3] == pytest.approx(plain[3], rel=1e-6)


def test_rollout_tape_only_within_its_budget(tiny_overrides):
    """A tape over rollout_tape_mib is not kept: the update runs the forward."""
    got = _two_steps(tiny_overrides + ["rollout_tape_mib=1", "model.n_embd=256",
                                       "model.n_layer=4", "model.n_head=4"],
                     lambda batch, m: m["optim/rollout_forward_reused"])
    assert got == [0.0, 0.0]


def test_update_mmap_threshold_auto_goes_by_model_size():
    from rookworld.runtime import AUTO_MMAP_KIB, AUTO_MMAP_MIN_PARAMS, update_mmap_threshold

    assert update_mmap_threshold("auto", AUTO_MMAP_MIN_PARAMS - 1) == 0
    assert update_mmap_threshold("auto", AUTO_MMAP_MIN_PARAMS) == AUTO_MMAP_KIB == 1024
    assert update_mmap_threshold(0, 10**9) == 0 and update_mmap_threshold(256, 1) == 256
    for bad in (-1, True, "1024", 1.5):
        with pytest.raises(ValueError, match="mmap_threshold_kib"):
            update_mmap_threshold(bad, 1)


def _mapped(kib: int = 1024, count: int = 200) -> int | None:
    """How many of `count` kib-KiB mallocs glibc serves from their own mappings now (None
    without glibc's mallinfo2): how the process-wide mmap threshold shows. Free heap memory
    serves the first ones whatever the threshold, so it asks for more than the heap keeps."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        info = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                                                    "hblkhd", "usmblks", "fsmblks",
                                                    "uordblks", "fordblks", "keepcost")]

    info.restype, libc.malloc.restype = Mallinfo2, ctypes.c_void_p
    before = info().hblks
    blocks = [libc.malloc(kib * 1024) for _ in range(count)]
    mapped = info().hblks - before
    for b in blocks:
        libc.free(ctypes.c_void_p(b))
    return mapped


@pytest.mark.parametrize("setting, during", [("auto", False), (512, True)])
# by the test
@pytest.mark.filterwarnings(r"ignore:Seems like `optimizer.step\(\)` has been overridden")
def test_the_update_maps_big_blocks_only_under_its_threshold(tiny_overrides, monkeypatch,
                                                              setting, during):
    """mmap_threshold_kib=512: 1 MiB blocks get their own mappings inside the update and
    come from the heap again after it (the rollout's 32 MiB); auto on a small model keeps
    them on the heap throughout. Also when the update raises."""
    if _mapped() is None:
        pytest.skip("glibc's mallinfo2 is needed to see the threshold")
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + ["kl=fixed", f"mmap_threshold_kib={setting}"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    seen = []
    real_step = engine.optimizer.step

    def step_and_look(*a, **k):
        seen.append(_mapped() > 0)
        return real_step(*a, **k)

    monkeypatch.setattr(engine.optimizer, "step", step_and_look)
    engine.update(engine.rollout(parts.task_mix.draw(pools, 2, 0, 0), 0), 0)
    assert seen == [during] and _mapped() == 0
    monkeypatch.setattr(engine.optimizer, "step", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine.update(engine.rollout(parts.task_mix.draw(pools, 2, 1, 0), 1), 1)
    assert _mapped() == 0


def test_mmap_threshold_is_set_through_glibc_or_not_at_all():
    """In a child process: the setting is process-wide (glibc's moving threshold stays off
    after it)."""
    import platform
    import subprocess
    import sys

    code = ("from rookworld.runtime import set_mmap_threshold as s; "
            "print(s(0), s(1024))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", str(platform.libc_ver()[0] == "glibc")]


@pytest.mark.parametrize("setting, kept", [("auto", True), (0, False), (512, False)])
def test_auto_keeps_freed_heap_for_small_models(tiny_overrides, monkeypatch, setting, kept):
    """Under auto a model below AUTO_MMAP_MIN_PARAMS keeps freed heap memory for reuse;
    an explicit setting leaves that alone."""
    from rookworld import runtime

    calls = []
    monkeypatch.setattr(runtime, "keep_freed_heap", lambda: calls.append(1))
    _two_steps(tiny_overrides + [f"mmap_threshold_kib={setting}"], lambda batch, m: None)
    assert bool(calls) == kept
    assert runtime.describe()["allocator"]["update_mmap_kib"] == (0 if kept else setting)


def test_keep_freed_heap_goes_through_glibc():
    import platform
    import subprocess
    import sys

    code = "from rookworld.runtime import keep_freed_heap as k; print(k())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(platform.libc_ver()[0] == "glibc")]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "full", "full_reverse",
                                       "full_symmetric"])
def test_the_loss_with_extreme_logits_at_pads_stays_finite(estimator):
    """Positions outside the loss mask (pads) get logits 1000x as large, so the policy's
    log-probs there lie thousands of nats from the reference's: grpo.compute_loss must
    still give finite metrics and finite gradients for each KL estimator."""
    from rookworld.grpo import PolicyLoss, compute_loss, token_logprobs

    gen = torch.Generator().manual_seed(0)
    n, t, v = 4, 9, 11
    ids = torch.randint(0, v, (n, t), generator=gen)
    mask = torch.ones(n, t)
    mask[:, -4:] = 0  # the last positions of every row are padding
    ref_logits = torch.randn(n, t, v, generator=gen)
    raw = torch.randn(n, t, v, generator=gen, requires_grad=True)
    logits = torch.where(mask.bool()[..., None], raw, raw * 1000.0)
    old = token_logprobs(logits, ids).detach() * mask
    ref_lp = token_logprobs(ref_logits, ids) * mask
    loss, m = compute_loss(logits, ids, old, torch.linspace(-1, 1, n), mask, ref_lp, ref_logits,
                           loss=PolicyLoss(), beta=0.1, kl_estimator=estimator)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(raw.grad).all()
    assert all(math.isfinite(float(x)) for k, x in m.items() if k.startswith(("loss/", "kl/")))
    if estimator.startswith("full"):  # every direction logged, for the guard to watch
        assert {"kl/full_forward", "kl/full_reverse", "kl/full_symmetric"} <= set(m)


def test_auto_micro_batch_tokens_follow_model_size():
    from rookworld.engine_settings import micro_batch_tokens

    assert micro_batch_tokens("auto", 3_300_000) == 4096  # the embedded model
    assert micro_batch_tokens("auto", 124_000_000) == 1024  # GPT-2 small
    assert micro_batch_tokens(512, 3_300_000) == 512
    for bad in (0, "all", True):
        with pytest.raises(ValueError, match="micro_batch_tokens"):
            micro_batch_tokens(bad, 3_300_000)


def test_engine_settings_are_checked_and_default_to_the_yaml_values():
    from rookworld.engine_settings import EngineSettings, ReferenceSettings

    for bad in ({"micro_batch": -1}, {"micro_batch": "all"}, {"micro_batch_tokens": 0}):
        with pytest.raises(ValueError, match="micro_batch"):
            EngineSettings(num_generations=2, steps=3, **bad)
    with pytest.raises(ValueError, match="reference.sync_alpha"):
        ReferenceSettings(sync_alpha=0)
    # the Python defaults (docs/python_api.md) are conf/train.yaml's
    assert EngineSettings.from_config(compose([])) == EngineSettings()


def test_no_reference_is_loaded_when_neither_the_kl_term_nor_the_guard_reads_one(
        tiny_overrides):
    for extra, loaded in ((["kl=none", "guard.kl=null"], False), (["kl=none"], True), ([], True)):
        cfg = compose(tiny_overrides + extra)
        engine = build_engine(cfg, build_parts(cfg), LengthReward())
        assert (engine.ref is not None) == loaded, extra


def test_token_mean_metrics_do_not_depend_on_the_update_chunks(tiny_overrides):
    """The KL estimates, clip fractions and mean ratio are token means whatever the loss's
    agg_mode: chunks of rows of different lengths combine them by their share of tokens, so
    one row a chunk reads what the whole batch at once does (the KL guard and the adaptive
    KL controller read them)."""
    keys = ("kl/k1", "kl/k3", "kl/value", "policy/ratio_mean", "policy/clip_frac_low",
            "policy/clip_frac_high")
    runs = [_two_steps(tiny_overrides + [f"micro_batch={micro}", "optim.lr=5e-2",
                                         "algorithm.num_iterations=2"],
                       lambda batch, m: (batch.loss_mask.sum(-1).tolist(),
                                         [m[k] for k in keys]))
            for micro in ("0", "1")]
    (lengths, whole), (_, rows) = runs[0][1], runs[1][1]
    assert len(set(lengths)) > 1  # rows of different lengths: row and token shares differ
    assert whole[0] > 1e-3  # the first update moved the policy off the reference
    assert rows == pytest.approx(whole, rel=1e-4, abs=1e-6)


def test_a_critics_value_metrics_cover_every_iteration_and_kl_coef_is_the_runs(
        tiny_overrides):
    """With num_iterations > 1 the value clip fraction is the mean over the iterations (the
    first alone always reads 0: the critic has not moved); under kl_penalty=reward the
    logged coefficient is the one the rewards pay and kl/value is k1, the estimator they
    pay."""
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + ["algorithm=ppo", "algorithm.num_iterations=4",
                                    "algorithm.critic.lr=5e-2", "algorithm.critic.warmup_steps=0",
                                    "algorithm.critic.kl_penalty=reward", "kl=fixed",
                                    "kl.beta=0.5", "sampler.temperature=1.5"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, LengthReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    m = engine.update(engine.rollout(parts.task_mix.draw(pools, 4, 0, 0), 0), 0)
    assert m["value/clip_frac"] > 0
    assert m["kl/coef"] == 0.5
    assert m["kl/value"] == m["kl/k1"]


class TiedReward(Reward):
    """The same score for every completion: every group ties."""

    range = (0.0, 1.0)

    def __call__(self, sample, completion):
        return Scored(0.5, {})


def test_a_step_whose_every_group_is_dropped_leaves_the_weights_and_logs_no_kl(
        tiny_overrides):
    """zero_variance=drop with every group silent: no optimiser step (AdamW would still move
    the weights by decay), the schedule goes on, and no KL or policy metric reads 0 as if
    it were measured."""
    from rookworld.data.load import read_samples

    cfg = compose(tiny_overrides + ["zero_variance=drop", "kl=fixed", "optim.lr=1e-2"])
    parts = build_parts(cfg)
    engine = build_engine(cfg, parts, TiedReward())
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in "PA"}
    before = [p.detach().clone() for p in engine.model.parameters()]
    batch = engine.rollout(parts.task_mix.draw(pools, 4, 0, 0), 0)
    assert batch.metrics["groups/dropped_share"] == 1.0
    m = engine.update(batch, 0)
    assert m["optim/empty_batch"] == 1.0
    assert not any(k.startswith(("kl/k", "policy/")) or k == "kl/value" for k in m)
    assert all(torch.equal(a, p) for a, p in zip(before, engine.model.parameters()))


def test_a_step_without_an_update_leaves_the_nan_guards_count():
    """A step whose every group was dropped tried no update: a run of non-finite updates on
    either side of it still counts as consecutive."""
    from rookworld.guards import NaNGuard

    guard = NaNGuard(max_consecutive=1)
    assert guard.check({"guard/nan_skipped": 1}) is None
    assert guard.check({"optim/empty_batch": 1.0}) is None
    assert "2 non-finite updates in a row" in guard.check({"guard/nan_skipped": 1})
