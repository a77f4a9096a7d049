"""Per-move credit for P completions (`algorithm.credit=moves`).

GRPO gives every token of a completion its sequence's advantage, so an illegal move in a
list of five legal ones is pushed up with them. With move credit, the characters of each
listed move and of the `B:` move get the group-normalised advantage of their own legality:
slot j (the j-th listed move, or the best move) of a group's rows is compared with slot j
of the group's other rows that have one, as the run's advantage compares a group's rewards
(its `within`: GRPO's group std by default, RLOO's leave-one-out, a clip, a warm-up).
Every other token (fields, evals, padding) keeps the sequence advantage, and so do rows of
other tasks and P rows without the three fields throughout.

A legal `B:` move can also carry its engine quality (`algorithm.move_quality` > 0): its
slot's value is 1 + move_quality x `labelled_quality`, the move's loss against the engine's
best read from the sample's own labels, so that among legal best moves the better ones are
pushed up. Without it the sequence reward's engine parts never reach the `B:` move's
characters, which move credit gives to legality alone. `algorithm.listed_quality` does the
same for each legal listed move (1 + listed_quality x its `labelled_quality`), so that the
candidate list keeps to the engine's moves, which the reward's top5 part cannot reach under
move credit either. With `algorithm.distinct_moves` a listed move that repeats an earlier
one of its list is valued as an illegal move (0): otherwise a list of one safe move written
five times earns five legal slots, and training learns to repeat.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

import torch
from torch import Tensor

from .chess_tasks import PolicyTruth
from .chess_tasks.policy import MAX_MOVES, field_starts
from .grpo import GroupAdvantage
from .rewards.parts import legal_moves

MAX_LOSS = 3.0  # pawns of loss at which a labelled move's quality reaches 0 (reward=engine's)


def labelled_quality(truth: PolicyTruth, move: str, max_loss: float = MAX_LOSS) -> float:
    """1 - min(loss, max_loss) / max_loss for a move among the sample's labelled engine
    moves, where loss = the highest labelled eval - the move's (pawns, side to move's
    view); 0 for any other move (its loss is at least the last labelled move's, unknown).

    >>> t = PolicyTruth("8/8/8/8/8/8/4k3/K7 w - - 0 1", ("a1b1", "a1a2"), (0.5, -1.0), "a1b1")
    >>> labelled_quality(t, "a1b1"), labelled_quality(t, "a1a2"), labelled_quality(t, "a1b2")
    (1.0, 0.5, 0.0)
    """
    if move not in truth.moves or not truth.evals:
        return 0.0
    loss = max(truth.evals) - truth.evals[truth.moves.index(move)]
    return 1.0 - min(max(loss, 0.0), max_loss) / max_loss


def move_spans(completion: str) -> list[tuple[str, int, int, str]]:
    """(slot, start, end, move text) of each listed move ("M0", "M1", ...) and of the best
    move ("B") in a P completion, as character offsets; [] without the M:/E:/B: fields.

    >>> move_spans(" M: e2e4 zz  E: 0.1 0.2  B: e2e4")
    [('M0', 4, 8, 'e2e4'), ('M1', 9, 11, 'zz'), ('B', 28, 32, 'e2e4')]
    """
    at = field_starts(completion)
    if at is None:
        return []
    m, e, b = at
    spans = [(f"M{j}", *span) for j, span in enumerate(_words(completion, m + 2, e))]
    best = _words(completion, b + 2, len(completion))
    return spans + ([("B", *best[0])] if best else [])


def _words(text: str, start: int, end: int) -> list[tuple[int, int, str]]:
    """(start, end, word) of the whitespace-separated words of text[start:end]."""
    return [(start + w.start(), start + w.end(), w.group())
            for w in re.finditer(r"\S+", text[start:end])]


def token_ends(tokenizer, ids: list[int], lengths: dict[int, int] | None = None) -> list[int]:
    """Character offset where each token's text ends in the decoded completion; lengths:
    a cache of each token's decoded length. A token that decodes alone to whole characters
    has the same length in any text; one that holds part of a character (byte-level BPE
    splits a non-ASCII character over tokens, each decoding to U+FFFD alone) does not, so
    a completion holding one is measured by decoding its prefixes."""
    lengths = {} if lengths is None else lengths
    ends, n = [], 0
    for i in ids:
        if i not in lengths:
            piece = tokenizer.decode([i], skip_special_tokens=False)
            lengths[i] = -1 if "\ufffd" in piece else len(piece)
        if lengths[i] < 0:
            return [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=False))
                    for k in range(len(ids))]
        n += lengths[i]
        ends.append(n)
    return ends


GRPO = GroupAdvantage(min_std=1e-4)  # the default comparison: (value - mean) / max(std, 1e-4)


def move_advantages(seq_adv: Tensor, fens: list[str | None], texts: list[str],
                    ends: list[list[int]], group: int, width: int,
                    compare: Callable[[Tensor], Tensor] = GRPO.within,
                    bonus: Callable[[int, str, str], float] | None = None,
                    distinct: bool = False) -> Tensor:
    """[N] sequence advantages -> [N, width] token advantages with move credit.

    fens: the P row's position (None for rows of other tasks, which keep seq_adv);
    ends: each row's `token_ends`. A slot's value is its move's legality (0 or 1), and for
    slot s of row i, when its move m is legal, 1 + bonus(i, s, m); a listed move past the
    fifth (the list is then malformed) is worth 0, and so, with distinct, is one that
    repeats an earlier one of its row's list; its advantage is
    compare(the values of the rows of its group that have that slot): by default
    (value - mean) / max(std, 1e-4), 0 when they all agree; the run's advantage's own
    `within` in training. A slot only one row of its group has keeps that row's sequence
    advantage."""
    out = seq_adv.float()[:, None].repeat(1, width)
    for g in range(0, len(texts), group):
        slots: dict[str, list[tuple[int, int, int, float]]] = {}
        for i in range(g, g + group):
            if fens[i] is None:
                continue
            legal, listed = legal_moves(fens[i]), set()
            for slot, a, b, move in move_spans(texts[i]):
                value = float(move in legal)
                if slot != "B":
                    if (distinct and move in listed) or int(slot[1:]) >= MAX_MOVES:
                        value = 0.0  # a repeat (with distinct), or past the list's five
                    listed.add(move)
                if value and bonus is not None:
                    value += bonus(i, slot, move)
                slots.setdefault(slot, []).append((i, a, b, value))
        for rows in (r for r in slots.values() if len(r) > 1):  # alone: nothing to compare
            adv = compare(torch.tensor([r[3] for r in rows]))
            for (i, a, b, _), v in zip(rows, adv.tolist()):
                # the tokens that hold characters a .. b-1
                out[i, bisect.bisect_right(ends[i], a):bisect.bisect_left(ends[i], b) + 1] = v
    return out


class MoveCredit:
    """Move credit for the rollouts of one tokenizer (`algorithm.credit=moves`); it keeps
    each token's decoded length (`token_ends`' cache) across steps. move_quality: weight of
    a legal `B:` move's `labelled_quality` in its slot's value; listed_quality: that of a
    legal listed move's (0 = legality alone); distinct: a repeated listed move is worth 0;
    advantage: the run's advantage (`algorithm.advantage`), whose `within(values, step)`
    compares a group's slots as it compares rewards (its scale, baseline, clip and
    warm-up); by default GRPO's group std."""

    def __init__(self, tokenizer, move_quality: float = 0.0, listed_quality: float = 0.0,
                 distinct: bool = False, advantage=GRPO):
        self.tokenizer, self.lengths, self.advantage = tokenizer, {}, advantage
        self.move_quality, self.listed_quality = float(move_quality), float(listed_quality)
        self.distinct = bool(distinct)

    def bonus(self, truth: PolicyTruth, slot: str, move: str) -> float:
        """The quality part of a legal move's slot value: its weight x `labelled_quality`."""
        weight = self.move_quality if slot == "B" else self.listed_quality
        return weight * labelled_quality(truth, move) if weight else 0.0

    def __call__(self, seq_adv: Tensor, rows, texts: list[str], rollout, group: int,
                 step: int = 0) -> Tensor:
        """A rollout's [N] sequence advantages -> [N, T] with move credit, on their device
        (rows: its samples, one per completion; texts: the decoded completions; step: the
        training step, for an advantage's warm-up)."""
        fens = [s.truth.fen if s.task == "P" else None for s in rows]
        ends = [token_ends(self.tokenizer, ids[:int(n)], self.lengths) if fen else []
                for ids, n, fen in zip(rollout.completion_ids.tolist(),
                                       rollout.completion_mask.sum(-1).tolist(), fens)]
        bonus = (lambda i, slot, move: self.bonus(rows[i].truth, slot, move)) \
            if self.move_quality or self.listed_quality else None
        return move_advantages(seq_adv.cpu(), fens, texts, ends, group,
                               rollout.completion_ids.shape[1],
                               compare=lambda values: self.advantage.within(values, step),
                               bonus=bonus, distinct=self.distinct).to(seq_adv.device)
