"""Choosing P positions and A moves from played games, spread over game phases."""

from __future__ import annotations

import random
from collections import defaultdict

import chess

from rookworld.chess_tasks import env_sample, policy_sample

from .positions import (
    Position,
    drawing_moves,
    illegal_move,
    mating_moves,
    seventyfive_move,
)


def stratified(cands: list, n: int, shares: dict, rng: random.Random, make=lambda c: c) -> list:
    """Up to n items `make(c)` (None = skip c), a share of n per phase, shortfalls
    filled from the other phases. cands have `.phase`."""
    by_phase = defaultdict(list)
    for c in cands:
        by_phase[c.phase].append(c)
    out, rest = [], []
    for phase, share in shares.items():
        pool = by_phase.get(phase, [])
        rng.shuffle(pool)
        quota, used = round(n * share), 0
        for c in pool:
            if quota <= 0:
                break
            used += 1
            if (x := make(c)) is not None:
                out.append(x)
                quota -= 1
        rest += pool[used:]
    rng.shuffle(rest)
    for c in rest:
        if len(out) >= n:
            break
        if (x := make(c)) is not None:
            out.append(x)
    return out[:n]


def policy_samples(positions: list[Position], labels: dict, seed: int) -> list:
    out = []
    for p in positions:
        a = labels[p.fen]
        if not a.moves:
            continue
        order = list(range(len(a.moves)))
        # docs/formats.md: the order carries no rank
        random.Random(f"{seed}:{p.fen}").shuffle(order)
        out.append(policy_sample(p.fen, [a.moves[i] for i in order], [a.evals[i] for i in order],
                                 source=a.label, meta={"phase": p.phase, "game": p.game,
                                                       "ply": p.ply}))
    return out


def _choice(items: list, rng: random.Random):
    return rng.choice(items) if items else None


def _env(p: Position, move: str | None, fen: str | None = None, kind: str = ""):
    """An A sample for `move` at p (None when there is no such move)."""
    if move is None:
        return None
    return env_sample(fen or p.fen, move, p.history + (move,),
                      meta={"phase": p.phase, "game": p.game, "ply": p.ply, "kind": kind})


def env_samples(positions: list[Position], n: int, kinds: dict, shares: dict,
                rng: random.Random) -> list:
    """n A samples, `kinds` the share of each kind (see positions.py); kinds that
    find too few moves leave their place to "played"."""
    positions = [p for p in positions if p.played]  # the game goes on: a legal move exists
    played = list({(p.key, p.played): p for p in positions}.values())
    ends = [p for p in positions if p.phase == "endgame"]
    makers = {
        "played": (played, lambda p: _env(p, p.played, kind="played")),
        "illegal": (positions, lambda p: _env(p, illegal_move(_board(p), rng), kind="illegal")),
        "mate": (positions, lambda p: _env(p, _choice(mating_moves(_board(p)), rng),
                                           kind="mate")),
        "draw": (ends, lambda p: _env(p, _choice(drawing_moves(_board(p)), rng), kind="draw")),
        "seventyfive": (ends, _seventyfive),
    }
    if unknown := set(kinds) - set(makers):
        raise ValueError(f"a_kinds: unknown kind(s) {sorted(unknown)}; known: {sorted(makers)}")
    out, seen = [], set()

    def unique(make):  # the same prompt never twice, whatever kinds produced it
        def made(p):
            s = make(p)
            if s is None or s.prompt in seen:
                return None
            seen.add(s.prompt)
            return s
        return made

    for kind in sorted(kinds, key=lambda k: k == "played"):  # "played" last: fills shortfalls
        cands, make = makers[kind]
        want = n - len(out) if kind == "played" else round(n * kinds[kind])
        out += stratified(cands, want, shares, rng, unique(make))
    return out


def _seventyfive(p: Position):
    found = seventyfive_move(_board(p))
    return _env(p, found[1], found[0], kind="seventyfive") if found else None


def _board(p: Position) -> chess.Board:
    return chess.Board(p.fen)
