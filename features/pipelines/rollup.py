"""Per-batch metrics of a long stream, rolled up into one point per interval before they reach MLflow.

A stream at a 1 s trigger runs 86,400 micro-batches a day: one MLflow point per batch and metric would make a
week-long run's metrics 600k points per name, which the tracking server stores and every chart of the run
loads. Each metric is instead reduced over the batches of an interval (a minute by default) by what it means:

- counts of things that happened in a batch (events, rows written, late events) are summed;
- levels (state rows, batches quarantined so far) keep their last value;
- durations (batch seconds, freshness) keep their mean and, as `<name>_max`, their maximum;
- a validation's success keeps its minimum (0 when any batch of the interval failed).

Intervals are aligned to the clock (every whole minute), and a point is logged at the step of its interval's
last batch, when the next interval's first batch comes. `flush()` logs what is pending (the stream calls it
when it stops).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum


class Reduce(Enum):
    SUM = "sum"
    LAST = "last"
    MEAN_MAX = "mean_max"
    MIN = "min"


# How each metric name of a stream's batch reduces; a name not listed keeps its last value.
REDUCTIONS: dict[str, Reduce] = {
    "events": Reduce.SUM,
    "rows_out": Reduce.SUM,
    "late": Reduce.SUM,
    "records_quarantined": Reduce.SUM,
    "files_quarantined": Reduce.SUM,
    "rows": Reduce.SUM,
    "failed": Reduce.SUM,
    "compacted_files": Reduce.SUM,
    "batch_seconds": Reduce.MEAN_MAX,
    "freshness_seconds": Reduce.MEAN_MAX,
    "listing_seconds": Reduce.MEAN_MAX,
    "seconds": Reduce.MEAN_MAX,
    "success": Reduce.MIN,
}

Log = Callable[[Mapping[str, float], int, str | None], None]  # (metrics, step, group)


@dataclass
class _Series:
    reduce: Reduce
    total: float = 0.0
    count: int = 0
    last: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1
        self.last = value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def points(self, name: str) -> dict[str, float]:
        if self.reduce is Reduce.SUM:
            return {name: self.total}
        if self.reduce is Reduce.MEAN_MAX:
            return {name: self.total / self.count, f"{name}_max": self.high}
        if self.reduce is Reduce.MIN:
            return {name: self.low}
        return {name: self.last}


@dataclass
class MetricRollup:
    """Collects batches' metrics (per group prefix) and logs one point per metric and interval."""

    log: Log
    interval_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _series: dict[tuple[str | None, str], _Series] = field(default_factory=dict)
    _interval: int | None = None  # the pending points' interval: clock() // interval_s
    _step: int = 0
    points_logged: int = 0

    def add(self, metrics: Mapping[str, float | int | None], step: int, group: str | None = None) -> None:
        """One batch's metrics; the first batch of a new interval logs the previous interval's points."""
        interval = int(self.clock() // self.interval_s)
        if self._interval is not None and interval != self._interval:
            self.flush()
        self._interval = interval
        for name, value in metrics.items():
            if value is None:
                continue
            key = (group, name)
            if key not in self._series:
                self._series[key] = _Series(REDUCTIONS.get(name, Reduce.LAST))
            self._series[key].add(float(value))
        self._step = max(self._step, step)

    def flush(self) -> None:
        """Log the pending interval's points (nothing when no batch came since the last flush)."""
        by_group: dict[str | None, dict[str, float]] = {}
        for (group, name), series in self._series.items():
            by_group.setdefault(group, {}).update(series.points(name))
        for group, points in by_group.items():
            self.log(points, self._step, group)
            self.points_logged += len(points)
        self._series.clear()
        self._interval = None
