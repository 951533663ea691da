"""`features status`: where each group stands, gathered from what the jobs left behind (nothing is computed).

Per group: its health in one place (`Health`: the newest event in the source, the last backfill, whether a stream is
alive from its checkpoint's marker, its last committed micro-batch, the lag), the days a backfill completed
(features.stores.manifest), the stale days and the days still to compute
that `features backfill --since-last` would do, with why (features.pipelines.schedule_plan's own plan of it), the
days whose latest backfill set source records aside, the offline table's newest version and its files (the version
`training_set(..., as_of_version=)` reads; a date holding many files waits for compaction), the stream's emitted
watermark and how far it is behind the newest
event landed in the source (when the group has a stream checkpoint), and the group's last runs in MLflow (when
the tracking store has any).

    report = status(Repo.load("feature_repo"))
    for line in report.lines():
        print(line)
    json.dumps(jsonable(report))

Spark is not started: `--since-last` is planned only for groups with a completed day (for the others it would
start Spark to find the source's first day, and every day is still to compute anyway).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from features.errors import ConfigError
from features.pipelines.stream import handoff
from features.repo import Repo
from features.spec import FeatureGroup
from features.stores.manifest import SetAside, now_utc, read_manifest, set_aside_by_day

RUNS_SHOWN = 5  # the last runs reported per group


@dataclass(frozen=True)
class RunInfo:
    """One MLflow run that used the group."""

    run_id: str
    kind: str  # backfill | stream | verify | monitor
    status: str  # RUNNING | FINISHED | FAILED | KILLED
    start: datetime
    seconds: float | None  # None while it runs


@dataclass(frozen=True)
class StreamInfo:
    """Where the group's stream stands, from its checkpoint."""

    checkpoint: str
    watermark: datetime | None  # every offline row up to it is final; None before the first batch with one
    last_batch_at: datetime | None  # when the last micro-batch committed: how fresh the stream is
    newest_event: datetime | None  # the newest event time in the source (Parquet sources only)
    lag_seconds: float | None  # newest_event - watermark
    streamed_by: str | None = None  # the process streaming it now (features.pipelines.stream.handoff), if one is
    last_batch: int | None = None  # the last committed micro-batch
    stuck_since: str | None = None  # since when the process streaming it has had its Spark jobs not moving


@dataclass(frozen=True)
class Health:
    """How fresh a group's data is, in one place; each None where not known."""

    last_event: datetime | None  # the newest event time in the source (Parquet sources)
    last_backfill: datetime | None  # when a backfill last completed a day
    stream: str  # NO_STREAM (no checkpoint), ALIVE, STUCK (alive, its Spark jobs not moving) or STOPPED
    last_batch: int | None  # the stream's last committed micro-batch, and when it committed
    last_batch_at: datetime | None
    # How far the final offline rows are behind the newest event: the stream's watermark, else the end of the last
    # day a backfill completed
    lag_seconds: float | None
    stuck_since: str | None = None


NO_STREAM, ALIVE, STUCK, STOPPED = "none", "alive", "stuck", "stopped"


@dataclass(frozen=True)
class TableInfo:
    version: int  # the offline table's newest version (its last commit)
    dates: int
    files: int
    most_files: int  # the most files one date partition holds (features.stores.compaction keeps it small)


@dataclass
class GroupStatus:
    group: str
    completed: int = 0
    first: date | None = None
    last: date | None = None
    stale: dict[date, str] = field(default_factory=dict)  # completed days --since-last would recompute, and why
    # days not completed that --since-last would compute, as (first, last) ranges of consecutive days
    to_compute: list[tuple[date, date]] = field(default_factory=list)
    set_aside: dict[date, SetAside] = field(default_factory=dict)
    newest_event: datetime | None = None  # the newest event time in the source (None: none, or not a Parquet one)
    last_complete: date | None = None  # the last day whose data is in (features.pipelines.completeness)
    waiting: str | None = None  # why the next day is not complete yet, when the data (not the clock) holds it back
    table: TableInfo | None = None
    stream: StreamInfo | None = None
    runs: list[RunInfo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    health: Health | None = None


@dataclass
class Status:
    repo: str
    now: datetime
    groups: list[GroupStatus]
    tracking: str  # where runs were looked for, or why not

    def lines(self) -> list[str]:
        return status_lines(self)


def status(
    repo: Repo,
    groups: list[str] | None = None,
    *,
    now: datetime | None = None,
    checkpoint_root: str | None = None,
    runs: int = RUNS_SHOWN,
) -> Status:
    """The status of the named groups (all by default); reads manifests, checkpoints, the source's Parquet
    footers and the tracking store, writes nothing (but MLflow's experiment when a store exists without it)."""
    now = (now or now_utc()).astimezone(UTC)
    selected = repo.select(groups)
    found_runs, tracking = _runs(repo, selected, runs)
    out = []
    for group in selected:
        gs = _group_status(repo, group, now)
        gs.stream = _stream_info(repo, group, checkpoint_root)
        if gs.stream is not None and gs.health is not None:
            gs.health = _stream_health(gs.health, gs.stream)
        gs.runs = found_runs.get(group.name, [])
        out.append(gs)
    return Status(str(repo.root), now, out, tracking)


def _group_status(repo: Repo, group: FeatureGroup, now: datetime) -> GroupStatus:
    from features.pipelines.completeness import data_horizon
    from features.pipelines.schedule_plan import NEW, Request, plan

    table = repo.offline_path(group)
    manifest = read_manifest(table, group.name)
    completed = manifest.completed()
    gs = GroupStatus(group.name, len(completed), *((completed[0], completed[-1]) if completed else (None, None)))
    gs.set_aside = set_aside_by_day(table, group.name)
    gs.table = _table_info(table)
    horizon = data_horizon(repo, group, now, scan=False)
    gs.newest_event, gs.last_complete = horizon.newest_event, horizon.last_day
    last_backfill = max((p.completed_at for p in manifest.partitions.values()), default=None)
    gs.health = Health(gs.newest_event, last_backfill, NO_STREAM, None, None, _backfill_lag(gs.newest_event, gs.last))
    gs.waiting = horizon.waiting() if horizon.behind_clock else None
    if not completed:
        upto = "" if horizon.last_day is None else f" up to {horizon.last_day.isoformat()}"
        gs.notes.append(
            f"no day completed yet: `features backfill --since-last` computes every day from the source's first{upto}"
        )
        return gs
    [planned] = plan(repo, Request(since_last=True), [group.name], now=now, scan=False).groups
    gs.stale = {day: why for day, why in planned.todo.items() if why != NEW}
    gs.to_compute = day_ranges([day for day, why in planned.todo.items() if why == NEW])
    return gs


def _table_info(table: str) -> TableInfo | None:
    from features.stores.offline import current_version, files_per_date

    version = current_version(table)
    if version is None:
        return None
    files = files_per_date(table)
    return TableInfo(version, len(files), sum(files.values()), max(files.values(), default=0))


def day_ranges(days: list[date]) -> list[tuple[date, date]]:
    """Sorted days as (first, last) ranges of consecutive days."""
    out: list[tuple[date, date]] = []
    for day in sorted(days):
        if out and (day - out[-1][1]).days == 1:
            out[-1] = (out[-1][0], day)
        else:
            out.append((day, day))
    return out


def _stream_info(repo: Repo, group: FeatureGroup, checkpoint_root: str | None) -> StreamInfo | None:
    from features.engine.query_log import last_commit
    from features.pipelines.completeness import newest_event
    from features.pipelines.stream.batch_progress import emitted_watermark

    query = Path(repo.checkpoint_path(group, checkpoint_root)) / "query"
    if not query.is_dir():
        return None
    watermark = emitted_watermark(query)
    last, _ = last_commit(query)
    last_at = None if last is None else datetime.fromtimestamp((query / "commits" / str(last)).stat().st_mtime, UTC)
    newest = newest_event(repo, group)
    lag = None if newest is None or watermark is None else max(0.0, (newest - watermark).total_seconds())
    running = handoff.holder(query.parent, include_self=True)
    if running is None:
        return StreamInfo(str(query.parent), watermark, last_at, newest, lag, last_batch=last)
    stuck = running.stuck[0] if running.stuck else None
    return StreamInfo(str(query.parent), watermark, last_at, newest, lag, running.describe(), last, stuck)


def _backfill_lag(newest_event: datetime | None, last_completed: date | None) -> float | None:
    """How far the end of the last day a backfill completed is behind the newest event."""
    if newest_event is None or last_completed is None:
        return None
    final = datetime(last_completed.year, last_completed.month, last_completed.day, tzinfo=UTC) + timedelta(days=1)
    return max(0.0, (newest_event - final).total_seconds())


def _stream_health(health: Health, s: StreamInfo) -> Health:
    """The health of a group with a stream: its lag is the stream's, its state from the checkpoint's marker."""
    state = STOPPED if s.streamed_by is None else STUCK if s.stuck_since else ALIVE
    return replace(
        health,
        stream=state,
        last_batch=s.last_batch,
        last_batch_at=s.last_batch_at,
        lag_seconds=s.lag_seconds,
        stuck_since=s.stuck_since,
    )


def _runs(repo: Repo, groups: list[FeatureGroup], limit: int) -> tuple[dict[str, list[RunInfo]], str]:
    """The last runs per group, and where they were looked for; the repo's own store is only read if it exists
    (status does not create it). `limit` 0: none are read (MLflow is not imported)."""
    from features.ml import tracking

    if limit < 1:
        return {}, "not read"
    uri = tracking.tracking_uri(repo)
    if uri == tracking.default_uri(repo) and not (repo.root / tracking.STORE_FILE).is_file():
        return {}, f"no runs recorded yet ({repo.root / tracking.STORE_FILE} does not exist)"
    out: dict[str, list[RunInfo]] = {}
    try:
        for group in groups:
            frame = tracking.find_runs(repo, group=group.name)
            out[group.name] = [_run_info(row) for row in frame.head(limit).to_dict("records")]
    except ConfigError as exc:  # the store is down or unreadable: status still reports the rest
        return {}, f"runs not read: {exc}"
    return out, uri


def _run_info(row: Mapping[str, Any]) -> RunInfo:
    start = row["start_time"].to_pydatetime()
    end = row.get("end_time")
    seconds = None if end is None or _missing(end) else (end.to_pydatetime() - start).total_seconds()
    return RunInfo(str(row["run_id"]), str(row.get("tags.features.kind") or "-"), str(row["status"]), start, seconds)


def _missing(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


# ---------------------------------------------------------------------------------------------------------
# Output


def status_lines(report: Status) -> list[str]:
    """A compact table per group: one line of days, then stream and runs when there are any."""
    from features.pipelines.days import days_from, spans

    lines = []
    for g in report.groups:
        days = f"{g.completed} days completed ({g.first} .. {g.last})" if g.completed else "no day completed"
        lines.append(f"{g.group}: {days}")
        if g.stale:
            by_reason: dict[str, list[date]] = {}
            for day, why in g.stale.items():
                by_reason.setdefault(why, []).append(day)
            for why, stale_days in by_reason.items():
                lines.append(f"  stale      {spans(stale_days)} ({why})")
        if g.to_compute:
            days = [d for first, last in g.to_compute for d in days_from(first, last)]
            lines.append(f"  to compute {spans(days)} (not computed yet)")
        if g.health is not None:
            lines.append(f"  health     {', '.join(f'{label} {value}' for label, value, _ in health_items(g.health))}")
        if g.waiting:
            lines.append(f"  waiting    {g.waiting.removeprefix('waiting for data: ')}")
        if g.set_aside:
            total = sum(s.total_events for s in g.set_aside.values())
            lines.append(f"  set aside  {total:,} events on {spans(g.set_aside)} (`features retention` lists them)")
        if g.table is not None:
            t = g.table
            lines.append(
                f"  table      version {t.version}, {t.dates} dates in {t.files} files (at most {t.most_files} a date)"
            )
        if g.stream is not None:
            lines.append(f"  stream     {_stream_line(g.stream)}")
        for run in g.runs:
            took = "running" if run.seconds is None else f"{run.seconds:.1f}s"
            lines.append(f"  run        {run.kind:<8} {run.status:<8} {run.start:%Y-%m-%d %H:%M:%S} UTC  {took}")
        lines += [f"  note       {note}" for note in g.notes]
    if not report.groups:
        lines.append("no feature groups defined")
    lines.append(f"runs: {report.tracking}")
    return lines


def _stream_line(s: StreamInfo) -> str:
    wm = f"{s.watermark:%Y-%m-%d %H:%M:%S} UTC" if s.watermark else "none yet"
    return f"watermark {wm}" + (
        f"; streamed now by {s.streamed_by}" if s.streamed_by else "; no process streams it now"
    )


def health_items(h: Health) -> list[tuple[str, str, bool]]:
    """The health as (label, value, alarm) items: `features status`'s health line and the report's table."""
    items = [
        ("last event", _moment(h.last_event, "not known (read from a Parquet source's files only)"), False),
        ("last backfill", _moment(h.last_backfill, "none yet"), False),
    ]
    if h.stream != NO_STREAM:
        state = {ALIVE: "alive", STUCK: f"stuck since {h.stuck_since}", STOPPED: "stopped (no process streams it)"}
        items.append(("stream", state[h.stream], h.stream == STUCK))
        batch = "none yet" if h.last_batch is None else f"{h.last_batch} at {_moment(h.last_batch_at, '?')}"
        items.append(("last batch", batch, False))
    if h.lag_seconds is not None:
        items.append(("lag", f"{h.lag_seconds:,.0f}s behind the newest event", False))
    return items


def _moment(value: datetime | None, missing: str) -> str:
    return missing if value is None else f"{value:%Y-%m-%d %H:%M:%S} UTC"


def jsonable(value: Any) -> Any:
    """Plain JSON data of dataclasses, dates, times, paths, enums, mappings and sequences (others as str)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.repr and not f.name.startswith("_")
        }
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if value is None or isinstance(value, bool | int | str):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return jsonable(value.item())
    return str(value)


def _key(key: Any) -> str:
    if isinstance(key, tuple):
        return ".".join(str(jsonable(k)) for k in key)
    return str(jsonable(key))
