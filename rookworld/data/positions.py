"""From played games to candidate P positions and A moves, with their game phase.

A candidates are of five kinds: "played" (the game's move), "illegal" (a
legal-looking UCI string that is illegal there), "mate" (a mating move),
"draw" (a move that draws on the board: stalemate, insufficient material,
75-move rule) and
"seventyfive" (a quiet move from an endgame position whose half-move clock is
set to 149, so the move draws by the 75-move rule).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import chess

from .splits import position_key

HISTORY_LEN = 10
_VALUES = {chess.KNIGHT: 3, chess.BISHOP: 3, chess.ROOK: 5, chess.QUEEN: 9}


def game_phase(board: chess.Board, endgame_material: int = 20, opening_moves: int = 10) -> str:
    """"endgame" when both sides' non-pawn material (N=B=3, R=5, Q=9) is at most
    `endgame_material`, else "opening" up to move `opening_moves`, else "middlegame"."""
    material = sum(v * len(board.pieces(p, c)) for p, v in _VALUES.items() for c in chess.COLORS)
    if material <= endgame_material:
        return "endgame"
    return "opening" if board.fullmove_number <= opening_moves else "middlegame"


@dataclass(frozen=True)
class Position:
    """The position before ply `ply` of game `game`; `history` = the moves before it
    (up to HISTORY_LEN - 1, oldest first); `played` = the move the game played
    there ("" after the last move)."""

    fen: str
    phase: str
    game: int
    ply: int
    history: tuple[str, ...]
    played: str

    @property
    def key(self) -> str:
        return position_key(self.fen)


def game_positions(index: int, moves: list[str]) -> list[Position]:
    """Every position of a game, the final one included."""
    board, out = chess.Board(), []
    for ply in range(len(moves) + 1):
        played = moves[ply] if ply < len(moves) else ""
        hist = tuple(moves[max(0, ply - HISTORY_LEN + 1):ply])
        out.append(Position(board.fen(), game_phase(board), index, ply, hist, played))
        if played:
            board.push_uci(played)
    return out


def illegal_move(board: chess.Board, rng: random.Random) -> str | None:
    """A UCI string that looks like a move but is illegal in `board`: a pseudo-legal
    move into check, an opponent's move, or an own piece sent to a square it
    cannot reach."""
    pseudo = [m for m in board.pseudo_legal_moves if not board.is_legal(m)]
    flipped = board.copy(stack=False)
    flipped.turn = not board.turn
    theirs = [m for m in flipped.legal_moves if not board.is_legal(m)]
    own = [s for s in chess.SQUARES if board.color_at(s) == board.turn]
    wild = []
    for _ in range(8):
        mv = chess.Move(rng.choice(own), rng.choice(chess.SQUARES))
        if mv.from_square != mv.to_square and not board.is_legal(mv):
            wild.append(mv)
    pools = [p for p in (pseudo, theirs, wild) if p]
    return rng.choice(rng.choice(pools)).uci() if pools else None


def mating_moves(board: chess.Board) -> list[str]:
    """Legal moves that give checkmate."""
    out = []
    for mv in board.legal_moves:
        if board.gives_check(mv):
            board.push(mv)
            if board.is_checkmate():
                out.append(mv.uci())
            board.pop()
    return out


def drawing_moves(board: chess.Board) -> list[str]:
    """Legal moves after which the game is drawn on the board alone (stalemate,
    insufficient material, 75-move rule)."""
    out = []
    for mv in board.legal_moves:
        board.push(mv)
        if board.is_game_over() and not board.is_checkmate():
            out.append(mv.uci())
        board.pop()
    return out


def seventyfive_move(board: chess.Board) -> tuple[str, str] | None:
    """(FEN with half-move clock 149, a quiet legal move that then draws by the
    75-move rule), or None when no quiet non-mating move exists."""
    parts = board.fen().split()
    fen = " ".join(parts[:4] + ["149", parts[5]])
    b = chess.Board(fen)
    for mv in b.legal_moves:
        if b.is_capture(mv) or b.piece_type_at(mv.from_square) == chess.PAWN:
            continue
        b.push(mv)
        draw = b.is_seventyfive_moves() and not b.is_checkmate()
        b.pop()
        if draw:
            return fen, mv.uci()
    return None
