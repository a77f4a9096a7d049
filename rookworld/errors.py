"""The error a wrong setting raises, shared by the configuration and the run-directory code."""

from __future__ import annotations

from .redact import redact


class ConfigError(ValueError):
    """An impossible or conflicting setting; the message names the key (secrets in
    it are masked: it is printed and stored)."""

    def __init__(self, message: str):
        super().__init__(redact(str(message)))
