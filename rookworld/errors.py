"""The error a wrong setting raises, shared by the configuration and the run-directory code,
the integer check the settings classes share, and the refusal to write over what the package
ships."""

from __future__ import annotations

from pathlib import Path

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


def check_not_shipped(target: str | None, shipped: Path, replace_shipped: bool, key: str) -> None:
    """ConfigError when `target` (the value of config key `key`) names the shipped directory
    `shipped` and replace_shipped is not true: a run would overwrite what every default
    command of the project starts from."""
    if target and Path(target).expanduser().resolve() == shipped.resolve() \
            and replace_shipped is not True:
        raise ConfigError(f"{key}={target} is shipped with the package, and this run would "
                          "replace it; write elsewhere, or pass replace_shipped=true to "
                          "replace it on purpose")
