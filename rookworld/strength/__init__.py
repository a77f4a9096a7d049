"""Playing strength, measured as chess players measure it: Lichess puzzles, games against
a random mover, Stockfish at its weakest and the model itself, and centipawn loss
(`suite.StrengthSuite`; `python -m rookworld.evaluate suite=strength`)."""

from .suite import StrengthSuite, SuiteSettings, common_changes, settings_from

__all__ = ["StrengthSuite", "SuiteSettings", "common_changes", "settings_from"]
