"""The TRL arm of the learning study: TRL's GRPOTrainer on the embedded model, with the
prompts, reward, sampling and optimiser settings of rookworld's default run, for a
wall-clock budget of training time, evaluated greedily on the held-out split.

    .venv/bin/python experiments/learning/trl_arm.py --seed 0 --minutes 6 --out DIR

Needs the `bench` extra (trl==1.16.0). What it shares with `python -m rookworld.train`:
the shipped model, the composed default config (task mix, prompts per step, group size,
temperature, max completion length, beta, learning rate, gradient clip), the prompt draws
of every step (`task_mix.draw(pools, n, step, seed)`), the reward, and the evaluator. The
fix TRL needs: its log-prob pass gives left-padded GPT-2 batches no `position_ids`, so
positions would count the padding (~9 nats per sequence off); `derive_positions` derives
them from the attention mask whenever none are passed, in cached decoding steps too (the
wrapper hides `position_ids` from generate, which then passes none: without them there,
sampling would run a model other than the one trained; tests/test_study_arms.py checks it).

Writes DIR/curve.jsonl: one row per evaluation (`step`, `train_minutes`, and the eval/*
metrics with their standard errors), the same schema as rookworld.pretrain's curve,
DIR/trl_log.jsonl: TRL's own metrics of every step (reward, kl, entropy, clip ratios), and
DIR/model: the trained model in the hub layout (`python -m rookworld.evaluate
model.path=DIR/model` measures it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def derive_positions(model) -> None:
    """Wraps a transformers GPT-2's forward so that a call without `position_ids` gets them
    from the attention mask (`gpt2.positions_from_mask`), its last positions for a cached
    step."""
    from rookworld.gpt2 import positions_from_mask

    forward = model.forward

    def with_positions(*args, **kw):
        ids, mask = kw.get("input_ids"), kw.get("attention_mask")
        if kw.get("position_ids") is None and ids is not None and mask is not None:
            pos = positions_from_mask(mask)
            kw["position_ids"] = pos[:, -ids.shape[1]:]
        return forward(*args, **kw)

    model.forward = with_positions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, required=True, help="training-time budget")
    ap.add_argument("--eval-every", type=int, default=25, help="steps between evaluations")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*", help="rookworld.train overrides (key=value)")
    a = ap.parse_args()

    from datasets import Dataset
    from transformers import GPT2LMHeadModel, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rookworld.config import compose, instantiate, prompts_per_step
    from rookworld.data.load import read_samples
    from rookworld.held_out import Evaluator
    from rookworld.policy import EMBEDDED_DIR, load_embedded, save_policy

    cfg = compose([f"seed={a.seed}", *a.overrides])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train = read_samples(cfg.data.train)
    pools = {t: [s for s in train if s.task == t] for t in ("P", "A")}
    mix, reward = instantiate(cfg.task_mix), instantiate(cfg.reward)
    n_prompts, g = prompts_per_step(cfg), cfg.num_generations
    max_steps = 100_000  # the wall-clock budget ends the run
    draws = [s for step in range(2_000) for s in mix.draw(pools, n_prompts, step, cfg.seed)]
    by_prompt = {s.prompt: s for s in draws}
    settings = instantiate(cfg.sampler)
    evaluator = Evaluator(read_samples(cfg.data.eval), settings,
                          max_per_task=cfg.data.eval_per_task)
    policy = load_embedded()  # the evaluator's container; TRL trains transformers' class
    s = settings["P"]
    max_len = max(x.max_new_tokens for x in settings.values())

    def reward_fn(prompts, completions, **kwargs):
        return [reward(by_prompt[p], c).score for p, c in zip(prompts, completions)]

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_arm_"), use_cpu=True, bf16=False, fp16=False,
        seed=a.seed, max_steps=max_steps, per_device_train_batch_size=n_prompts * g,
        num_generations=g, max_completion_length=max_len, temperature=s.temperature,
        top_k=s.top_k, top_p=s.top_p, beta=cfg.kl.beta, learning_rate=cfg.optim.lr,
        lr_scheduler_type="constant", max_grad_norm=cfg.optim.grad_clip, warmup_steps=0,
        weight_decay=cfg.optim.weight_decay, adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1], num_iterations=cfg.algorithm.num_iterations,
        loss_type="grpo", scale_rewards="group", disable_dropout=True, shuffle_dataset=False,
        gradient_checkpointing=False, report_to=[], logging_steps=1, save_strategy="no",
        dataloader_num_workers=0, model_init_kwargs={"dtype": "float32"}, disable_tqdm=True)
    trainer = GRPOTrainer(model=str(EMBEDDED_DIR), reward_funcs=reward_fn, args=args,
                          train_dataset=Dataset.from_dict({"prompt": [x.prompt for x in draws]}),
                          processing_class=policy.tokenizer)

    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if isinstance(model, GPT2LMHeadModel):
            derive_positions(model)

    curve = (out / "curve.jsonl").open("a")

    def evaluate(step: int, train_s: float) -> None:
        policy.model.load_weights({k: v.detach().clone() for k, v in
                                   trainer.model.state_dict().items()}, where="TRL model")
        metrics = evaluator(policy, reward)[0]
        curve.write(json.dumps({"step": step, "train_minutes": train_s / 60, **metrics}) + "\n")
        curve.flush()
        print(f"[trl arm] step {step}: {train_s / 60:.2f} training min, "
              f"P best_legal {metrics['eval/P/best_legal']:.3f}", flush=True)

    class Budget(TrainerCallback):
        """Times each step, evaluates every eval_every steps (outside the budget), and
        stops when the training time reaches the budget."""

        t0, train_s = 0.0, 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.train_s += time.perf_counter() - self.t0
            done = self.train_s >= a.minutes * 60
            if done or state.global_step % a.eval_every == 0:
                evaluate(state.global_step, self.train_s)
            if done:
                control.should_training_stop = True

    class Log(TrainerCallback):
        """TRL's logged metrics of each step, one JSON row each."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            with (out / "trl_log.jsonl").open("a") as f:
                f.write(json.dumps({"step": state.global_step, **(logs or {})}) + "\n")

    evaluate(0, 0.0)
    trainer.add_callback(Budget())
    trainer.add_callback(Log())
    torch.manual_seed(a.seed)
    trainer.train()
    curve.close()
    save_policy(policy, out / "model")  # the last evaluation's weights: the trained model


if __name__ == "__main__":
    main()
