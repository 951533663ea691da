"""The kernel's reduction of every aggregation kind (docs/definitions.md, Aggregations): one entry per
`features.spec.AggKind`, which says everything else about it."""

from __future__ import annotations

from features.kernel.moments import Moments
from features.kernel.partials import (
    BoundedDistinct,
    ByTime,
    Count,
    CountDistinct,
    Extreme,
    HashedDistinct,
    Kind,
    LatestTime,
    Quantiles,
    Sum,
)
from features.kernel.ranked import Counts, DistinctValues, TimeK, ValueK
from features.kernel.sessions import SessionBounds
from features.spec import AggKind

KINDS: dict[AggKind, Kind] = {
    AggKind.COUNT: Count(),
    AggKind.SUM: Sum(average=False),
    AggKind.AVG: Sum(average=True),
    AggKind.MIN: Extreme(smallest=True),
    AggKind.MAX: Extreme(smallest=False),
    AggKind.STDDEV: Moments(2, "stddev"),
    AggKind.VARIANCE: Moments(2, "variance"),
    AggKind.SKEW: Moments(3, "skew"),
    AggKind.KURTOSIS: Moments(4, "kurtosis"),
    AggKind.FIRST: ByTime(earliest=True),
    AggKind.LAST: ByTime(earliest=False),
    AggKind.FIRST_K: TimeK(earliest=True),
    AggKind.LAST_K: TimeK(earliest=False),
    AggKind.TOP_K: ValueK(largest=True),
    AggKind.BOTTOM_K: ValueK(largest=False),
    AggKind.APPROX_COUNT_DISTINCT: HashedDistinct(),
    AggKind.APPROX_PERCENTILE: Quantiles(),
    AggKind.COUNT_DISTINCT: CountDistinct(),
    AggKind.BOUNDED_COUNT_DISTINCT: BoundedDistinct(),
    AggKind.HISTOGRAM: Counts(top=False),
    AggKind.TOP_FREQUENT: Counts(top=True),
    AggKind.SESSION_DURATION: SessionBounds(duration=True),
    AggKind.SESSION_START: SessionBounds(duration=False),
    AggKind.LAST_EVENT_TIME: LatestTime(),
    AggKind.DISTINCT_VALUES: DistinctValues(),
}
