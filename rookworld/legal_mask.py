"""Decoding the P task's B: move only along the position's legal moves.

`legal_move_constraint(policy, fens)` -> a `LegalMoveConstraint` for one batch (one FEN
per row; None leaves a row free), which `sampling.decode_tokens` applies at every step
(`sample(..., constraint=...)` on both backends). Before a row's completion reaches "B:"
the row is free (its M: and E: fields are the model's own); from there on only tokens
that keep the text after "B:" a prefix of " " + a legal UCI move are allowed, and
end-of-text only once a whole legal move is written. A position without legal moves
leaves its row free.

Tokens are matched by their text (each vocabulary id decoded alone), so a BPE token may
hold several characters, a leading space, or straddle "B:" and the move: a token that
puts "B:" into the text is allowed only when what follows "B:" in it is such a prefix.
The per-tokenizer tables (`TokenIndex`) are built once and cached; a batch builds each of
its positions' prefix trees of legal moves once, every node's allowed ids computed on first
visit. Trees are not kept between batches: building them is a small part of a masked
pass (benchmarks/README.md, on/off figures).
"""

from __future__ import annotations

import weakref

import chess
import torch
from torch import Tensor

__all__ = ["LegalMoveConstraint", "TokenIndex", "legal_move_constraint", "token_index"]

FIELD = "B:"
MOVE_CHARS = frozenset(" abcdefgh12345678qrbn")  # " " + a UCI move
MAX_MOVE_TEXT = 6  # " " + from square, to square, promotion piece


class Node:
    """A prefix tree node: children by character; terminal: a whole legal move ends here;
    ids: the vocabulary ids whose text continues the path from here along the tree (CPU
    LongTensor, computed on first use, end-of-text not included)."""

    __slots__ = ("children", "terminal", "ids")

    def __init__(self):
        self.children: dict[str, Node] = {}
        self.terminal = False
        self.ids: Tensor | None = None

    def walk(self, text: str) -> Node | None:
        node = self
        for ch in text:
            node = node.children.get(ch)
            if node is None:
                return None
        return node


class Root(Node):
    """A position's tree; banned_inside / banned_after_b: the ids of the tokens that
    would bring "B:" into the text followed by something other than a legal move's
    prefix (inside: "B:" within the token; after_b: the text ends in "B" and the token
    starts with ":")."""

    __slots__ = ("banned_inside", "banned_after_b")


class TokenIndex:
    """A tokenizer's vocabulary as the constraint reads it: texts[i] is id i's text;
    short maps each text of at most 6 move characters to its ids; inside lists (id, text
    after its first "B:") for the tokens holding "B:"; after_colon (id, text after the
    leading ":") for those starting with ":" (only pairs whose rest is not empty: an
    empty rest is a prefix of every move)."""

    def __init__(self, tokenizer):
        n = len(tokenizer)
        self.texts: list[str] = tokenizer.batch_decode(
            [[i] for i in range(n)], skip_special_tokens=False,
            clean_up_tokenization_spaces=False)
        special = set(tokenizer.all_special_ids)
        for i in special:
            self.texts[i] = ""
        self.short: dict[str, list[int]] = {}
        self.inside: list[tuple[int, str]] = []
        self.after_colon: list[tuple[int, str]] = []
        for i, text in enumerate(self.texts):
            if not text:
                continue
            if len(text) <= MAX_MOVE_TEXT and MOVE_CHARS.issuperset(text):
                self.short.setdefault(text, []).append(i)
            k = text.find(FIELD)
            if k >= 0 and text[k + 2:]:
                self.inside.append((i, text[k + 2:]))
            if text.startswith(":") and text[1:]:
                self.after_colon.append((i, text[1:]))

    def trie(self, fen: str) -> Root | None:
        """The prefix tree of " " + each legal move of `fen` (None: no legal move)."""
        try:
            board = chess.Board(fen)
        except ValueError as e:
            raise ValueError(f"legal-move constraint: not a valid FEN {fen!r}: {e}") from None
        moves = [m.uci() for m in board.legal_moves]
        root = None
        if moves:
            root = Root()
            for move in moves:
                node = root
                for ch in " " + move:
                    node = node.children.setdefault(ch, Node())
                node.terminal = True
            root.banned_inside = self._banned(root, self.inside)
            root.banned_after_b = self._banned(root, self.after_colon)
        return root

    def allowed(self, node: Node) -> Tensor:
        """The ids whose text continues `node`'s path along the tree (cached on the node)."""
        if node.ids is None:
            ids, stack = [], [(node, "")]
            while stack:
                n, path = stack.pop()
                for ch, child in n.children.items():
                    text = path + ch
                    ids += self.short.get(text, ())
                    stack.append((child, text))
            node.ids = torch.tensor(sorted(set(ids)), dtype=torch.long)
        return node.ids

    @staticmethod
    def _banned(root: Root, pairs: list[tuple[int, str]]) -> Tensor:
        return torch.tensor([i for i, rest in pairs if root.walk(rest) is None],
                            dtype=torch.long)


_INDEXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_index(tokenizer) -> TokenIndex:
    """The tokenizer's `TokenIndex`, built on first use and kept while the tokenizer lives."""
    index = _INDEXES.get(tokenizer)
    if index is None:
        index = _INDEXES[tokenizer] = TokenIndex(tokenizer)
    return index


class LegalMoveConstraint:
    """One batch's constraint (see the module): `mask` the logits of a decoding step,
    then `advance` with the tokens chosen. Rows before "B:" are tracked by their last
    character; rows in the B: field by their node of the position's tree; free and
    finished rows cost nothing."""

    def __init__(self, index: TokenIndex, fens: list[str | None], eos_id: int):
        self.index, self.eos_id = index, eos_id
        self.before: dict[int, tuple[Root, str]] = {}  # row -> (tree, last character)
        self.field: dict[int, Node] = {}  # row -> node of the text after "B:"
        trees = {fen: index.trie(fen) for fen in set(fens) if fen is not None}
        for row, fen in enumerate(fens):
            root = trees.get(fen)
            if root is not None:
                self.before[row] = (root, "")
        self.checks_before = bool(index.inside or index.after_colon)

    def mask(self, logits: Tensor) -> Tensor:
        """logits [N,V] -> the same tensor with -inf written at every token a constrained
        row may not write (in place: `sampling.decode_tokens` hands over each step's own
        logits); only the constrained rows are touched."""
        v, device = logits.shape[1], logits.device
        rows, cols = [], []
        for row, node in self.field.items():
            ids = self.index.allowed(node)
            if node.terminal:
                ids = torch.cat([ids, torch.tensor([self.eos_id])])
            rows.append(torch.full((ids.shape[0],), row, dtype=torch.long))
            cols.append(ids)
        if rows:
            r, c = self._inside(torch.cat(rows), torch.cat(cols), v, device)
            kept = logits[r, c]
            logits[torch.tensor(list(self.field), device=device)] = float("-inf")
            logits[r, c] = kept
        if v > len(self.index.texts) and self.before:  # outputs no token stands for (a
            before = torch.tensor(list(self.before), device=device)  # padded output layer)
            logits[before, len(self.index.texts):] = float("-inf")
        if self.checks_before:
            rows, cols = [], []
            for row, (root, last) in self.before.items():
                ids = root.banned_inside
                if last == "B" and root.banned_after_b.numel():
                    ids = torch.cat([ids, root.banned_after_b])
                if ids.numel():
                    rows.append(torch.full((ids.shape[0],), row, dtype=torch.long))
                    cols.append(ids)
            if rows:
                r, c = self._inside(torch.cat(rows), torch.cat(cols), v, device)
                logits[r, c] = float("-inf")
        return logits

    def _inside(self, r: Tensor, c: Tensor, v: int, device) -> tuple[Tensor, Tensor]:
        """(rows, ids) on `device`, without the ids past the logits' V (a tokenizer with
        more entries than the model has outputs)."""
        if len(self.index.texts) > v:
            r, c = r[c < v], c[c < v]
        return r.to(device), c.to(device)

    def advance(self, tokens: Tensor) -> None:
        """tokens [N]: the ids chosen at this step (end-of-text on finished rows)."""
        if not self.before and not self.field:
            return
        toks, texts, eos = tokens.tolist(), self.index.texts, self.eos_id
        for row in list(self.field):
            tok = toks[row]
            node = self.field[row].walk(texts[tok]) if tok != eos else None
            if node is None or not (node.terminal or self.index.allowed(node).numel()):
                del self.field[row]  # ended, or (a vocabulary that cannot spell on) free
            else:
                self.field[row] = node
        for row in list(self.before):
            tok = toks[row]
            if tok == eos:
                del self.before[row]
                continue
            root, last = self.before[row]
            text = last + texts[tok]
            k = text.find(FIELD)
            if k < 0:
                self.before[row] = (root, text[-1:] or last)
                continue
            del self.before[row]
            node = root.walk(text[k + 2:])
            if node is not None and (node.terminal or self.index.allowed(node).numel()):
                self.field[row] = node


def legal_move_constraint(policy, fens: list[str | None]) -> LegalMoveConstraint:
    """The constraint for a batch of P prompts of `policy`, one FEN per row (None: the
    row is free, e.g. an A prompt), for `sample(..., constraint=...)`."""
    return LegalMoveConstraint(token_index(policy.tokenizer), list(fens), policy.eos_id)
