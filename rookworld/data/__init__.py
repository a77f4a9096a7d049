"""Data: the generator (`python -m rookworld.data.generate`), loaders that validate
every row, and FEN-hash splits. The bundled data lives in rookworld/assets/data."""

from pathlib import Path

from .loaders import LoadResult, load_lines, load_samples
from .splits import position_key, split_of, split_samples
from .validate import DEFECTS, FIXABLE, DefectReport

BUNDLED = Path(__file__).resolve().parents[1] / "assets" / "data"

__all__ = ["BUNDLED", "DEFECTS", "FIXABLE", "DefectReport", "LoadResult", "load_lines",
           "load_samples", "position_key", "split_of", "split_samples"]
