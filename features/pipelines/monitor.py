"""`features monitor`: drift of each feature's daily values from a reference, measured on the recorded statistics
(features.stores.statistics) alone, with no pass over the offline table.

The reference is a range of days (or the days a logged model's training set covered, features.ml.reference),
its days' profiles merged into one per feature; each recent day's profile is compared with it
(features.kernel.drift_measures: population stability index and Jensen-Shannon distance over the reference's
bins, nulls a bin of their own). A day drifts when either measure is above its threshold: the flags', else the group's
`FeatureGroup(drift=Drift(...))`, else DEFAULT_DRIFT. Days with fewer rows than `min_rows` on either side are
listed, not judged: a handful of rows moves both measures by chance. With `served`, the days compared are those of
the values the feature server logged (features.pipelines.served_skew), profiled the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from features.errors import ConfigError
from features.kernel.drift_measures import measure_drift
from features.pipelines.served_skew import served_statistics
from features.spec import DEFAULT_DRIFT, Drift
from features.stores.statistics import DayStatistics, day_of, read_statistics, statistics_table, to_date

if TYPE_CHECKING:
    from features.repo import Repo


@dataclass(frozen=True)
class FeatureDrift:
    """One feature's drift on one day; `psi` and `js` are None when the day is not judged (see `note`)."""

    group: str
    feature: str
    date: date
    kind: str
    rows: int
    reference_rows: int
    null_share: float
    reference_null_share: float
    mean: float | None
    reference_mean: float | None
    psi: float | None
    js: float | None
    psi_threshold: float
    js_threshold: float
    drifted: bool
    note: str = ""


@dataclass(frozen=True)
class MonitorReport:
    reference: tuple[date, date]  # [first, end) of the reference days
    reference_from: str  # where the reference came from: the flags, or a model's training set
    days: tuple[date, date]  # [first, end) of the days judged
    drift: list[FeatureDrift] = field(default_factory=list)
    compared: str = "recorded statistics"  # what the days hold: the recorded statistics, or the served values

    @property
    def drifted(self) -> list[FeatureDrift]:
        return [d for d in self.drift if d.drifted]

    def lines(self) -> list[str]:
        last_ref, last_day = self.reference[1] - timedelta(days=1), self.days[1] - timedelta(days=1)
        out = [
            f"reference {self.reference[0]} .. {last_ref} ({self.reference_from}); days {self.days[0]} .. {last_day} "
            f"({self.compared})",
            f"{'group':<20} {'feature':<24} {'date':<10} {'rows':>9} {'PSI':>7} {'JS':>6} {'nulls':>6}",
        ]
        for d in self.drift:
            psi = "-" if d.psi is None else f"{d.psi:.3f}"
            js = "-" if d.js is None else f"{d.js:.3f}"
            flag = "DRIFT" if d.drifted else d.note
            out.append(
                f"{d.group:<20} {d.feature:<24} {d.date!s:<10} {d.rows:>9,} {psi:>7} {js:>6} "
                f"{d.null_share:>6.1%}  {flag}".rstrip()
            )
        if not self.drifted:
            out.append("no drift found")
            return out
        first: dict[tuple[str, str], date] = {}
        for d in self.drifted:
            first.setdefault((d.group, d.feature), d.date)
        found = ", ".join(f"{g}.{f} from {day}" for (g, f), day in first.items())
        out.append(f"drift found: {found}")
        return out


def monitor(
    repo: Repo,
    groups: Sequence[str] | None = None,
    *,
    reference_start: str | date | None = None,
    reference_end: str | date | None = None,
    reference_model: str | None = None,
    start: str | date | None = None,
    end: str | date | None = None,
    psi: float | None = None,
    js: float | None = None,
    min_rows: int | None = None,
    served: bool = False,
) -> MonitorReport:
    """Drift of the groups' features (all by default) on the days [start, end) from the reference days
    [reference_start, reference_end), or those of `reference_model`'s training set (see features.ml.reference).
    `start` defaults to the reference's end, `end` to the day after the last day with statistics. `psi`, `js`,
    `min_rows` override the groups' thresholds. `served`: the days are those of the values the feature server
    logged (`features serve --log-served`), not the recorded statistics."""
    selected = repo.select(list(groups or []))
    override = _override(psi, js, min_rows)
    if reference_model is not None:
        if reference_start is not None or reference_end is not None:
            raise ConfigError(
                "--reference-model and --reference-start/--reference-end both give the reference: keep one of them"
            )
        from features.ml.reference import training_days

        ref = training_days(repo, reference_model)
        source, flag = f"the training set of {reference_model}", "--reference-model"
    else:
        if reference_start is None or reference_end is None:
            raise ConfigError(
                "--reference-start and --reference-end: give the reference days (e.g. --reference-start 2026-01-01 "
                "--reference-end 2026-01-08, the end excluded), or --reference-model <name> for the days a logged "
                "model's training set covered"
            )
        ref = (_day(reference_start, "--reference-start"), _day(reference_end, "--reference-end"))
        source = flag = "--reference-start/--reference-end"
    _check_range(ref, "--reference-start", "--reference-end")
    tables = {g.name: read_statistics(statistics_table(repo.root, g.name)) for g in selected}
    if not any(set(range(day_of_date(ref[0]), day_of_date(ref[1]))) & set(t.days()) for t in tables.values()):
        raise ConfigError(
            f"{flag}: there are no statistics for {ref[0]} .. {ref[1] - timedelta(days=1)} "
            f"of {', '.join(tables)}; run `features backfill --repo {repo.root} --start {ref[0]} --end {ref[1]}` "
            "(statistics are recorded as backfills and streams write), or choose days that have them"
        )
    first = _day(start, "--start") if start is not None else ref[1]
    current = served_statistics(repo, selected, first) if served else tables
    last = max((d for t in current.values() for d in t.days()), default=day_of_date(ref[1]))
    days = (first, _day(end, "--end") if end else to_date(last + 1))
    _check_range(days, "--start", "--end")
    report = MonitorReport(ref, source, days, compared="served values" if served else "recorded statistics")
    for group in selected:
        thresholds = override(group.drift or DEFAULT_DRIFT)
        report.drift.extend(
            _group_drift(
                group.name,
                [f.name for f in group.features],
                tables[group.name],
                current[group.name],
                ref,
                days,
                thresholds,
            )
        )
    return report


def _group_drift(
    group: str,
    features: list[str],
    table: DayStatistics,
    current_table: DayStatistics,
    ref: tuple[date, date],
    days: tuple[date, date],
    t: Drift,
) -> list[FeatureDrift]:
    reference_days = range(day_of_date(ref[0]), day_of_date(ref[1]))
    out = []
    for name in features:
        reference = table.over(reference_days, name)
        for day in range(day_of_date(days[0]), day_of_date(days[1])):
            current = current_table.profiles.get((day, name))
            if current is None:
                continue
            base = {
                "group": group,
                "feature": name,
                "date": to_date(day),
                "kind": current.kind,
                "rows": current.rows,
                "null_share": current.null_share,
                "mean": current.mean if current.n else None,
                "psi_threshold": t.psi,
                "js_threshold": t.js,
            }
            if reference is None:
                out.append(
                    FeatureDrift(
                        **base,
                        reference_rows=0,
                        reference_null_share=0.0,
                        reference_mean=None,
                        psi=None,
                        js=None,
                        drifted=False,
                        note="no reference statistics",
                    )
                )
                continue
            ref_values = {
                "reference_rows": reference.rows,
                "reference_null_share": reference.null_share,
                "reference_mean": reference.mean if reference.n else None,
            }
            if min(current.rows, reference.rows) < t.min_rows:
                out.append(
                    FeatureDrift(
                        **base, **ref_values, psi=None, js=None, drifted=False, note=f"fewer than {t.min_rows} rows"
                    )
                )
                continue
            found = measure_drift(reference, current)
            drifted = found.psi > t.psi or found.js > t.js
            out.append(FeatureDrift(**base, **ref_values, psi=found.psi, js=found.js, drifted=drifted))
    return out


def _override(psi: float | None, js: float | None, min_rows: int | None):
    for flag, value, example in (("--psi", psi, "0.2"), ("--js", js, "0.1")):
        if value is not None and not 0 < value < math.inf:
            raise ConfigError(f"{flag}: {value} is not a positive threshold; give e.g. {flag} {example}")
    if js is not None and js > 1:
        raise ConfigError(f"--js: {js} is above 1, the largest Jensen-Shannon distance; give e.g. --js 0.1")
    if min_rows is not None and min_rows < 1:
        raise ConfigError(f"--min-rows: {min_rows} is not a positive number of rows; give e.g. --min-rows 100")

    def apply(thresholds: Drift) -> Drift:
        chosen = {k: v for k, v in (("psi", psi), ("js", js), ("min_rows", min_rows)) if v is not None}
        return replace(thresholds, **chosen)

    return apply


def _day(value: str | date, flag: str) -> date:
    if isinstance(value, datetime):
        return value.astimezone(UTC).date() if value.tzinfo else value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise ConfigError(f"{flag}: {value!r} is not a UTC day; write it as YYYY-MM-DD, e.g. 2026-01-31") from None


def _check_range(days: tuple[date, date], first: str, end: str) -> None:
    if days[1] <= days[0]:
        raise ConfigError(
            f"{end} {days[1]} is not after {first} {days[0]}: the days are [{first}, {end}), the end excluded; "
            f"give e.g. {first} {days[0]} {end} {days[0] + timedelta(days=1)} for one day"
        )


def day_of_date(day: date) -> int:
    return day_of(datetime(day.year, day.month, day.day, tzinfo=UTC))
