"""Window definitions: `Hop`, `Tumble`, `Lifetime` and `Session` (inert; arithmetic lives in
`features.kernel.panes`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from features.errors import DefinitionError
from features.spec.durations import Duration, format_duration, parse_duration


@dataclass(frozen=True, init=False)
class Window:
    """A window ending at every multiple of `every`; `size` is None for Lifetime and Session (unbounded), `gap`
    set only for Session."""

    size_s: int | None
    every_s: int
    gap_s: int | None = None

    @property
    def is_lifetime(self) -> bool:
        return self.size_s is None and self.gap_s is None

    @property
    def is_session(self) -> bool:
        return self.gap_s is not None

    @property
    def panes(self) -> int | None:
        """How many panes of length `every` one window spans (None for Lifetime)."""
        return None if self.size_s is None else self.size_s // self.every_s

    def describe(self) -> str:
        if self.gap_s is not None:
            return f"Session({format_duration(self.gap_s)!r}, every={format_duration(self.every_s)!r})"
        if self.size_s is None:
            return f"Lifetime(every={format_duration(self.every_s)!r})"
        return f"Hop({format_duration(self.size_s)!r}, every={format_duration(self.every_s)!r})"


def _multiple_of_every(value_s: int, every_s: int, window: str, field: str) -> int:
    """`value_s`, which must be a whole multiple of `every_s` (a Hop's size, a Session's gap)."""
    if value_s % every_s:
        every, near = format_duration(every_s), format_duration(every_s * max(1, value_s // every_s))
        raise DefinitionError(
            f"{window}.{field}",
            f"{format_duration(value_s)} is not a whole multiple of every={every}",
            f'choose a {field} that is a multiple of {every}, e.g. {window}("{near}", every="{every}")',
        )
    return value_s


@dataclass(frozen=True, init=False)
class Hop(Window):
    """Windows of length `size` ending at every multiple of `every` (epoch-aligned, UTC)."""

    size_s: int = field()
    every_s: int = field()

    def __init__(self, size: Duration, every: Duration) -> None:
        size_s = parse_duration(size, "Hop.size")
        every_s = parse_duration(every, "Hop.every")
        size_s = _multiple_of_every(size_s, every_s, "Hop", "size")
        object.__setattr__(self, "size_s", size_s)
        object.__setattr__(self, "every_s", every_s)

    def __repr__(self) -> str:
        return self.describe()


def Tumble(size: Duration) -> Hop:  # noqa: N802 - reads as a constructor in definitions
    """Non-overlapping windows: `Hop(size, every=size)`."""
    return Hop(size, every=size)


@dataclass(frozen=True, init=False)
class Lifetime(Window):
    """Everything since the beginning of the data, refreshed at every multiple of `every`."""

    size_s: None = field()
    every_s: int = field()

    def __init__(self, every: Duration) -> None:
        object.__setattr__(self, "size_s", None)
        object.__setattr__(self, "every_s", parse_duration(every, "Lifetime.every"))

    def __repr__(self) -> str:
        return self.describe()


@dataclass(frozen=True, init=False)
class Session(Window):
    """The key's current session: its events (after `where`) split wherever two consecutive ones are `gap` or
    more apart; the value at each multiple of `every` aggregates the last run if it is still open there (its
    last event less than `gap` before), else the empty value (docs/semantics.md, Sessions)."""

    size_s: None = field()
    every_s: int = field()
    gap_s: int = field()

    def __init__(self, gap: Duration, every: Duration = "1m") -> None:
        gap_s = parse_duration(gap, "Session.gap")
        every_s = parse_duration(every, "Session.every")
        gap_s = _multiple_of_every(gap_s, every_s, "Session", "gap")
        object.__setattr__(self, "size_s", None)
        object.__setattr__(self, "every_s", every_s)
        object.__setattr__(self, "gap_s", gap_s)

    def __repr__(self) -> str:
        return self.describe()
