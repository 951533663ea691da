"""The monitoring report (docs/monitoring.md, "The report"): what `features monitor --report FILE` writes, and what a
notebook shows with one call,

    monitor_report(load_repo("feature_repo"), reference_start="2026-01-01", reference_end="2026-01-15")

Its data comes from the statistics table (features.stores.statistics: each feature's quantiles, null share and
category counts per day; each group's counts per day), from `features monitor`'s drift (features.pipelines.monitor)
and from `features status`'s health (features.pipelines.status); features.plots draws it. `log_monitor_run` records
a monitor run in MLflow with the report beside its findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError
from features.kernel.profile import CATEGORICAL, NUMERIC, QUANTILES, FeatureProfile
from features.pipelines.monitor import MonitorReport, day_of_date, monitor
from features.pipelines.status import health_items, status
from features.plots import OTHER, DriftPoint, FeatureSeries, GroupSeries, HealthItem, ReportPage
from features.spec import DEFAULT_DRIFT
from features.stores.statistics import DayStatistics, read_statistics, statistics_table, to_date

if TYPE_CHECKING:
    from features.repo import Repo
    from features.spec import FeatureGroup

VALUES_SHOWN = 7  # a string feature's most frequent values drawn one by one; the others as one
REPORT_ARTIFACT = "monitor/report.html"
DRIFT_ARTIFACT = "monitor/drift.json"


def monitor_report(
    repo: Repo, groups: Sequence[str] | None = None, *, checkpoint_root: str | None = None, **drift: Any
) -> ReportPage:
    """The report of the groups (all by default): `drift` takes `monitor`'s arguments (reference_start=...,
    reference_end=..., or reference_model=...; start, end, psi, js, min_rows). A notebook displays what it returns;
    `.document()` is the HTML file `features monitor --report` writes."""
    return report_page(repo, monitor(repo, groups, **drift), groups, checkpoint_root=checkpoint_root)


def report_page(
    repo: Repo,
    drift: MonitorReport,
    groups: Sequence[str] | None = None,
    *,
    checkpoint_root: str | None = None,
    now: datetime | None = None,
) -> ReportPage:
    """The report of `drift` (what `monitor` found for the same groups), with the days from the reference's first
    to the last judged."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    selected = repo.select(list(groups or []))
    health = {
        g.group: g.health
        for g in status(repo, [g.name for g in selected], now=now, runs=0, checkpoint_root=checkpoint_root).groups
    }
    first, end = day_of_date(drift.reference[0]), day_of_date(drift.days[1])
    series = []
    for group in selected:
        table = read_statistics(statistics_table(repo.root, group.name), first, end - 1)
        items = health_items(h) if (h := health.get(group.name)) is not None else []
        series.append(_group_series(group, table, drift, tuple(HealthItem(*item) for item in items)))
    last_ref, last_day = drift.reference[1] - timedelta(days=1), drift.days[1] - timedelta(days=1)
    lines = (
        f"Reference {drift.reference[0]} .. {last_ref} ({drift.reference_from}), shaded; "
        f"days judged {drift.days[0]} .. {last_day}, on the {drift.compared}.",
        f"Made {now:%Y-%m-%d %H:%M:%S} UTC from the statistics in {repo.root}.",
    )
    return ReportPage(f"Feature monitoring: {repo.project or repo.root.name}", lines, drift.reference, tuple(series))


def _group_series(
    group: FeatureGroup, table: DayStatistics, drift: MonitorReport, health: tuple[HealthItem, ...]
) -> GroupSeries:
    days = table.days()
    counts = [table.counts.get(d) for d in days]
    volume = []
    for name in ("events_in", "rows_out", "set_aside", "late"):
        values = tuple(None if c is None else getattr(c, name) for c in counts)
        if any(v is not None for v in values):  # `late`: streams only
            volume.append((name.replace("_", " "), values))
    thresholds = group.drift or DEFAULT_DRIFT
    features = []
    for feature in group.features:
        found = [d for d in drift.drift if d.group == group.name and d.feature == feature.name]
        points = tuple(DriftPoint(d.date, d.psi, d.js, d.drifted) for d in found)
        psi, js = (found[0].psi_threshold, found[0].js_threshold) if found else (thresholds.psi, thresholds.js)
        profiles = [(to_date(d), p) for d in days if (p := table.profiles.get((d, feature.name))) is not None]
        features.append(_feature_series(feature.name, profiles, points, psi, js))
    return GroupSeries(group.name, tuple(to_date(d) for d in days), tuple(volume), health, tuple(features))


def _feature_series(
    name: str, profiles: list[tuple[date, FeatureProfile]], drift: tuple[DriftPoint, ...], psi: float, js: float
) -> FeatureSeries:
    kind = profiles[0][1].kind if profiles else NUMERIC  # no statistics: its pictures say "no data"
    days = tuple(d for d, _ in profiles)
    nulls = tuple(p.null_share for _, p in profiles)
    if kind == CATEGORICAL:
        return FeatureSeries(
            name, kind, days, nulls, shares=_shares(profiles), drift=drift, psi_threshold=psi, js_threshold=js
        )
    quantiles = tuple(_quantiles(p) for _, p in profiles)
    return FeatureSeries(name, kind, days, nulls, quantiles, drift=drift, psi_threshold=psi, js_threshold=js)


def _quantiles(p: FeatureProfile) -> tuple[float, float, float, float, float] | None:
    found = [p.quantile(q) for q in QUANTILES]
    if any(v is None for v in found):
        return None
    low, q1, median, q3, high = (float(v) for v in found if v is not None)
    return low, q1, median, q3, high


def _shares(profiles: list[tuple[date, FeatureProfile]]) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """The most frequent values' (over all the days) share of each day's counted values, then the others'."""
    totals: dict[str, int] = {}
    for _, p in profiles:
        for value, n in p.categories.items():
            totals[value] = totals.get(value, 0) + n
    shown = sorted(totals, key=lambda v: (-totals[v], v))[:VALUES_SHOWN]
    per_day = [max(sum(p.categories.values()) + p.other, 1) for _, p in profiles]
    out = [(v, tuple(p.categories.get(v, 0) / n for (_, p), n in zip(profiles, per_day, strict=True))) for v in shown]
    rest = tuple(max(0.0, 1 - sum(shares[i] for _, shares in out)) for i in range(len(profiles)))
    if any(r > 1e-12 for r in rest):
        out.append((OTHER, rest))
    return tuple(out)


def report_path(path: str | Path) -> Path:
    """Where `--report` writes: a file, in a folder that exists or can be made; ConfigError otherwise, before any
    work."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(
            f"--report: {target} is a folder; give the file to write, e.g. --report {target / 'report.html'}"
        )
    blocking = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"--report: {blocking} is a file, so {target} cannot be written there; give another path")
    return target


def write_report(document: str, path: Path) -> None:
    """The report's HTML file at `path` (its folder made), written whole."""
    from features.atomic import write_whole

    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, document)


def log_monitor_run(repo: Repo, drift: MonitorReport, groups: Sequence[str] | None, report: str | None) -> str:
    """A `monitor` run in MLflow: the reference and days judged (params), per group the number of features that
    drifted (metric `<group>.drifted_features`), the findings (artifact monitor/drift.json) and the report
    (monitor/report.html: the document `report`, when one was made). Returns the run id."""
    from features.ml import tracking
    from features.pipelines.status import jsonable

    selected = repo.select(list(groups or []))
    params = {
        "reference_start": drift.reference[0],
        "reference_end": drift.reference[1],
        "reference_from": drift.reference_from,
        "start": drift.days[0],
        "end": drift.days[1],
    }
    with tracking.start_run(repo, "monitor", selected, params) as run:
        for group in selected:
            drifted = {d.feature for d in drift.drifted if d.group == group.name}
            run.log_metrics({"drifted_features": len(drifted)}, group=group.name)
        run.log_dict(jsonable(drift), DRIFT_ARTIFACT)
        if report is not None:
            run.client.log_text(run.run_id, report, REPORT_ARTIFACT)
    return run.run_id
