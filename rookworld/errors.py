"""The error a wrong setting raises, shared by the configuration and the run-directory code,
and the integer check the settings classes share."""

from __future__ import annotations

from .redact import redact


class ConfigError(ValueError):
    """An impossible or conflicting setting; the message names the key (secrets in
    it are masked: it is printed and stored)."""

    def __init__(self, message: str):
        super().__init__(redact(str(message)))


def check_int(key: str, value, low: int, auto: bool = False) -> None:
    """ValueError unless value is an integer >= low (or "auto", when auto is allowed)."""
    if auto and value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key} must be {'auto or ' if auto else ''}an integer >= {low}, "
                         f"got {value!r}")
