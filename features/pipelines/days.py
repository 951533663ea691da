"""Days and times of the incremental backfills: UTC midnights, complete days, and days written as short ranges."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta

from features.spec import FeatureGroup

DAY = timedelta(days=1)


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


def days_from(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def last_complete_day(group: FeatureGroup, now: datetime) -> date:
    """The last day that ended at least one watermark ago: the stream accepts no more events for it."""
    return (now.astimezone(UTC) - timedelta(seconds=group.source.watermark_s)).date() - DAY


def spans(days: Iterable[date]) -> str:
    """Days as compact ranges: 2026-01-01..2026-01-03, 2026-01-07."""
    ordered = sorted(set(days))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] - ordered[j] == DAY:
            j += 1
        first, last = ordered[i].isoformat(), ordered[j].isoformat()
        parts.append(first if i == j else f"{first}..{last}")
        i = j + 1
    return ", ".join(parts)
