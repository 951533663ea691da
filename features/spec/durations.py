"""Durations: strings like "90s", "5m", "24h", "7d", or `timedelta`, held as whole seconds."""

from __future__ import annotations

import re
from datetime import timedelta

from features.errors import DefinitionError

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")

Duration = str | timedelta


def parse_duration(value: object, field: str) -> int:
    """Return `value` as a positive whole number of seconds, or raise naming `field`."""
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
        if micros <= 0 or micros % 1_000_000:
            raise DefinitionError(
                field,
                f"{value!r} is not a positive whole number of seconds",
                'use a positive duration in whole seconds, e.g. timedelta(minutes=5) or "5m"',
            )
        return micros // 1_000_000
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise DefinitionError(
                field,
                f"cannot read the duration {value!r}",
                'write a whole number and one unit of s, m, h, d, e.g. "90s", "5m", "24h", "7d"',
            )
        seconds = int(match.group(1)) * UNIT_SECONDS[match.group(2)]
        if seconds <= 0:
            raise DefinitionError(field, f"{value!r} is zero", "use a positive duration")
        return seconds
    raise DefinitionError(
        field,
        f"expected a duration string or timedelta, got {type(value).__name__}",
        'write e.g. "5m" or timedelta(minutes=5)',
    )


def format_duration(seconds: int) -> str:
    """The shortest exact string for `seconds`, e.g. 86400 -> "1d", 5400 -> "90m"."""
    for unit in ("d", "h", "m"):
        if seconds % UNIT_SECONDS[unit] == 0:
            return f"{seconds // UNIT_SECONDS[unit]}{unit}"
    return f"{seconds}s"
