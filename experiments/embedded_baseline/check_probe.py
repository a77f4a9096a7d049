"""Does a model's residual stream tell whether the side to move is in check? A linear probe
(logistic regression, classes weighted to balance) on the residual stream at the prompt's
last token, after the embeddings and after each block, fit on P prompts of the train split
and scored on the held-out split's. Two controls: a random-weight model of the same shape
(what a probe reads from characters alone), and a property a model must decode from the
FEN to name legal moves at all, whether a piece stands on e4 (the probe can find what
the model computes).

    python experiments/embedded_baseline/check_probe.py [MODEL ...] [--train N] [--test N]

MODEL: `shipped` (the default), `random`, or a model directory in the embedded layout.
Prints, per model and layer, the test AUC and balanced accuracy with ~95% intervals
(bootstrap over the test positions, 1000 draws, seed 0).
"""

from __future__ import annotations

import argparse

import chess
import torch
import torch.nn.functional as F


@torch.no_grad()
def residuals(model, ids: list[list[int]], batch: int = 256) -> torch.Tensor:
    """[N, n_layer + 1, n_embd]: the residual stream at each prompt's last token, after the
    embeddings and after each block (rookworld.gpt2's forward, prompts left-padded)."""
    out = []
    for start in range(0, len(ids), batch):
        rows = ids[start:start + batch]
        width = max(map(len, rows))
        input_ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        states = model(input_ids, attention_mask=mask, return_residuals=True).residuals
        out.append(torch.stack([x[:, -1] for x in states], dim=1))
    return torch.cat(out)


def fit(x: torch.Tensor, y: torch.Tensor, steps: int = 500, l2: float = 1e-3) -> torch.nn.Linear:
    """Logistic regression on standardised features, positives weighted to balance."""
    probe = torch.nn.Linear(x.shape[1], 1)
    opt = torch.optim.LBFGS(probe.parameters(), max_iter=steps, line_search_fn="strong_wolfe")
    pos_weight = (y == 0).sum() / (y == 1).sum().clamp(min=1)

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(probe(x)[:, 0], y, pos_weight=pos_weight)
        loss = loss + l2 * probe.weight.square().sum()
        loss.backward()
        return loss
    opt.step(closure)
    return probe


def auc(score: torch.Tensor, y: torch.Tensor) -> float:
    """Probability that a random positive scores above a random negative (ties count half)."""
    pos, neg = score[y == 1], score[y == 0]
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).float().mean() + 0.5 * (diff == 0).float().mean())


def balanced_accuracy(score: torch.Tensor, y: torch.Tensor) -> float:
    pred = score > 0
    return float(0.5 * (pred[y == 1].float().mean() + (~pred[y == 0]).float().mean()))


def interval(metric, score: torch.Tensor, y: torch.Tensor, draws: int = 1000) -> float:
    """Half the width of the bootstrap's central 95% over the test positions."""
    gen = torch.Generator().manual_seed(0)
    values = []
    for _ in range(draws):
        idx = torch.randint(len(y), (len(y),), generator=gen)
        if 0 < y[idx].sum() < len(idx):
            values.append(metric(score[idx], y[idx]))
    lo, hi = torch.tensor(values).quantile(torch.tensor([0.025, 0.975])).tolist()
    return (hi - lo) / 2


LABELS = {"in check": lambda board: board.is_check(),
          "a piece on e4": lambda board: board.piece_at(chess.E4) is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=["shipped", "random"])
    parser.add_argument("--train", type=int, default=4000, help="train-split P prompts")
    parser.add_argument("--test", type=int, default=1000, help="held-out P prompts")
    args = parser.parse_args()

    from rookworld import runtime
    from rookworld.config import compose
    from rookworld.data.load import read_samples
    from rookworld.policy import build_random, load_embedded

    runtime.setup()
    cfg = compose([])
    split = {name: [s for s in read_samples(path) if s.task == "P"][:n] for name, path, n in
             (("train", cfg.data.train, args.train), ("test", cfg.data.eval, args.test))}
    boards = {k: [chess.Board(s.truth.fen) for s in v] for k, v in split.items()}
    labels = {name: {k: torch.tensor([float(f(b)) for b in v]) for k, v in boards.items()}
              for name, f in LABELS.items()}
    for name, y in labels.items():
        print(f"{name}: train {int(y['train'].sum())} / {len(y['train'])}, "
              f"test {int(y['test'].sum())} / {len(y['test'])}")
    shipped = load_embedded()
    for name in args.models:
        if name == "random":
            cfg_s = shipped.model.config
            policy = build_random(cfg_s.n_layer, cfg_s.n_embd, cfg_s.n_head, cfg_s.n_positions)
        else:
            policy = shipped if name == "shipped" else load_embedded(name)
        policy.model.eval()
        feats = {k: residuals(policy.model, [policy.encode_prompt(s.prompt) for s in v])
                 for k, v in split.items()}
        for label, y in labels.items():
            print(f"\n{name}, {label}\n| layer | test AUC | test balanced accuracy |\n"
                  "|---|---|---|")
            for layer in range(feats["train"].shape[1]):
                tr, te = feats["train"][:, layer], feats["test"][:, layer]
                mu, sd = tr.mean(0), tr.std(0).clamp(min=1e-6)
                probe = fit((tr - mu) / sd, y["train"])
                with torch.no_grad():
                    score = probe((te - mu) / sd)[:, 0]
                print(f"| {'embeddings' if layer == 0 else f'block {layer}'} | "
                      f"{auc(score, y['test']):.3f} ± {interval(auc, score, y['test']):.3f} | "
                      f"{balanced_accuracy(score, y['test']):.3f} ± "
                      f"{interval(balanced_accuracy, score, y['test']):.3f} |")


if __name__ == "__main__":
    main()
