"""When a day is complete (features.pipelines.completeness; docs/operations.md, "When a day is complete"): when its
data is in, not when the clock has passed it. Files that land days late leave their days waiting instead of being
backfilled empty; `--since-last` computes them once they land, and the table then equals a backfill of the whole
source.

The rule's arithmetic and the plans need no Spark (Parquet footers say how far a source goes); one Spark test
backfills a source whose days land late, on a simulated clock, against a backfill of the full source.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from conftest import build_feast_repo
from groups import TYPED_SOURCE, USER

from features import Feature, FeatureGroup, Hop, Lifetime, agg
from features.cli import main
from features.demo import generate_transactions, write_events
from features.errors import ConfigError
from features.pipelines.completeness import DataHorizon
from features.pipelines.schedule import execute
from features.pipelines.schedule_plan import NEW, plan, request
from features.pipelines.status import status
from features.repo import Repo
from features.spec import WINDOW_END
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import read_manifest, update
from features.stores.offline import read_pandas

D1, D2, D3, D4, D5, D6 = (date(2026, 12, d) for d in range(1, 7))
NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)  # by the clock alone, every day up to D5 would be complete

GROUP = FeatureGroup(
    "acct",
    USER,
    TYPED_SOURCE,
    [
        Feature("n_24h", agg.count(), window=Hop("24h", every="1h")),
        Feature("n_ever", agg.count(), window=Lifetime(every="1h")),
    ],
)


def at(day: date, hhmm: str = "00:00") -> datetime:
    hours, minutes = map(int, hhmm.split(":"))
    return datetime(day.year, day.month, day.day, hours, minutes, tzinfo=UTC)


def horizon(*, streamed: bool = False, watermark: datetime | None = None, newest: datetime | None = None, now=NOW):
    return DataHorizon(GROUP, now, streamed, watermark, newest)


def day_of(events: pd.DataFrame, day: date) -> pd.DataFrame:
    ts = events["event_ts"]
    return events[(ts >= pd.Timestamp(at(day))) & (ts < pd.Timestamp(at(day + timedelta(days=1))))]


def land(repo: Repo, events: pd.DataFrame, index: int) -> None:
    """A day's file landing in the source folder, as an upstream export writes it."""
    write_events(events, repo.source_path(GROUP), start_index=index)


def mark_completed(repo: Repo, days: list[date]) -> datetime:
    """Record days as a backfill that read the source just now (after every file landed so far) would."""
    read_at = max((f.stat().st_mtime for f in Path(repo.source_path(GROUP)).glob("*.parquet")), default=0.0)
    read = datetime.fromtimestamp(read_at + 1, UTC)
    with update(repo.offline_path(GROUP), GROUP.name) as manifest:
        for day in days:
            manifest.record(day, definition_hash(GROUP), feature_hashes(GROUP), 10, NOW, source_read_at=read)
    return read


# ---------------------------------------------------------------------------------------------------------
# The rule


def test_a_day_is_complete_once_the_data_is_one_watermark_past_its_end() -> None:
    # A group that only backfills: the source's newest event decides.
    assert horizon(newest=at(D4, "00:09")).last_day == D2  # D3 waits for an event at D4 00:10 or later
    assert horizon(newest=at(D4, "00:10")).last_day == D3
    assert horizon(newest=None).last_day is None  # no events: nothing is complete
    # A group that streams: its watermark decides, whatever the source holds.
    assert horizon(streamed=True, watermark=at(D4), newest=at(D5, "12:00")).last_day == D3
    assert horizon(streamed=True, watermark=at(D4) - timedelta(microseconds=1)).last_day == D2
    assert horizon(streamed=True, watermark=None, newest=at(D5)).last_day is None
    # Never past the clock: an event stamped in the future proves nothing.
    assert horizon(newest=at(D6 + timedelta(days=30))).last_day == D5
    assert horizon(newest=at(D6 + timedelta(days=30)), now=at(D6, "00:09")).last_day == D4
    # What it waits for, in words.
    late = horizon(newest=datetime(2026, 12, 3, 23, 59, 30, tzinfo=UTC))
    assert late.behind_clock and late.waiting() == (
        "waiting for data: the source ends 2026-12-03 23:59 UTC; 2026-12-03 is complete once it is one watermark "
        "past the day's end"
    )
    assert "the stream's watermark is none yet; no day is complete" in horizon(streamed=True).waiting()
    assert not horizon(newest=at(D6, "08:00")).behind_clock


# ---------------------------------------------------------------------------------------------------------
# Plans and status (no Spark: the days before are completed, and the source is Parquet)


@pytest.fixture
def events() -> pd.DataFrame:
    return generate_transactions(600, 12, at(D1), 5, seed=3)[["user_id", "amount", "status", "event_ts"]]


def test_since_last_waits_for_a_day_whose_files_have_not_landed(tmp_path: Path, events, capsys) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    for i, day in enumerate([D1, D2, D3]):
        land(repo, day_of(events, day), 10 * i)
    mark_completed(repo, [D1])
    [gp] = plan(repo, request(since_last=True), now=NOW).groups
    assert gp.todo == {D2: NEW}  # not D3..D5: their data is not in
    text = "\n".join(gp.lines())
    assert "acct: waiting for data: the source ends 2026-12-03 23:" in text
    with pytest.raises(ConfigError, match=r"--date: 2026-12-04 is not complete yet for 'acct': it is complete once "):
        plan(repo, request(day="2026-12-04"), now=NOW)
    # status shows the evidence: the newest event and what the next day waits for
    report = status(repo, now=NOW)
    [acct] = report.groups
    assert acct.newest_event is not None and acct.newest_event.date() == D3 and acct.last_complete == D2
    lines = "\n".join(report.lines())
    assert "  health     last event 2026-12-03 23:" in lines and "  waiting    the source ends 2026-12-03" in lines
    # The next two days land (two days late): D3 and D4 are complete now, D5 still waits.
    land(repo, day_of(events, D4), 30)
    land(repo, day_of(events, D5), 40)
    [gp] = plan(repo, request(since_last=True), now=NOW).groups
    assert gp.todo == dict.fromkeys([D2, D3, D4], NEW)
    assert main(["backfill", "--repo", str(repo.root), "--since-last", "--dry-run"]) == 0
    assert "up to 2026-12-04 (the last complete day" in capsys.readouterr().out


def test_a_file_that_lands_after_its_day_was_computed_makes_the_day_stale(tmp_path: Path, events) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    for i, day in enumerate([D1, D2, D3, D4]):
        land(repo, day_of(events, day), 10 * i)
    read = mark_completed(repo, [D1, D2, D3])
    assert plan(repo, request(since_last=True), now=NOW).groups[0].todo == {}
    # A second export of D2 lands after the backfill read the source: D2 and, through n_ever (Lifetime), every
    # completed day after it no longer hold all their events.
    extra = day_of(events, D2).head(5).assign(event_ts=lambda f: f["event_ts"] + pd.Timedelta(minutes=1))
    land(repo, extra, 50)
    late_file = Path(repo.source_path(GROUP)) / "part-00050.parquet"
    os.utime(late_file, (read.timestamp() + 1, read.timestamp() + 1))
    [gp] = plan(repo, request(since_last=True), now=NOW).groups
    why = "source files landed after it was computed: part-00050.parquet"
    assert gp.todo == {D2: why, D3: why}
    assert f"2026-12-02..2026-12-03 ({why})" in "\n".join(gp.lines())
    # A file written before the read changes nothing.
    os.utime(late_file, (read.timestamp() - 5, read.timestamp() - 5))
    assert plan(repo, request(since_last=True), now=NOW).groups[0].todo == {}


def test_a_range_records_only_the_days_whose_data_is_in(tmp_path: Path, events) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    land(repo, day_of(events, D1), 0)
    land(repo, day_of(events, D2), 10)
    [gp] = plan(repo, request(start="2026-12-01", end="2026-12-04"), now=NOW).groups
    [run] = gp.runs
    assert run.days == (D1, D2, D3) and run.record == (D1,)
    assert "2026-12-02..2026-12-03 not recorded as completed" in "\n".join(gp.lines())


# ---------------------------------------------------------------------------------------------------------
# Spark: days that land late are computed when they land, and equal a backfill of the full source


@pytest.mark.spark
def test_days_landing_late_are_computed_when_they_land(spark, tmp_path: Path, events) -> None:
    opts = {"spark": spark, "now": NOW, "progress": False, "track": False, "online": False}
    repo = Repo.load(build_feast_repo(tmp_path / "late", [GROUP], apply=False))
    for i, day in enumerate([D1, D2, D3]):
        land(repo, day_of(events, day), 10 * i)
    execute(repo, plan(repo, request(since_last=True), now=NOW, spark=spark), **opts)
    assert read_manifest(repo.offline_path(GROUP), GROUP.name).completed() == [D1, D2]
    # D4 and D5 land two days late; the next nightly run computes D3 and D4 (D5 waits for D6's data).
    land(repo, day_of(events, D4), 30)
    land(repo, day_of(events, D5), 40)
    execute(repo, plan(repo, request(since_last=True), now=NOW, spark=spark), **opts)
    assert read_manifest(repo.offline_path(GROUP), GROUP.name).completed() == [D1, D2, D3, D4]
    # A second export of D2 lands after that: the next run recomputes D2 and the days its events change.
    extra = day_of(events, D2).head(7).assign(event_ts=lambda f: f["event_ts"] + pd.Timedelta(minutes=1))
    land(repo, extra, 50)
    again = plan(repo, request(since_last=True), now=NOW, spark=spark)
    assert set(again.groups[0].todo) == {D2, D3, D4}
    execute(repo, again, **opts)
    assert plan(repo, request(since_last=True), now=NOW, spark=spark).partitions == 0

    everything = pd.concat([events, extra], ignore_index=True)
    whole = Repo.load(build_feast_repo(tmp_path / "whole", [GROUP], everything, apply=False))
    execute(whole, plan(whole, request(start="2026-12-01", end="2026-12-05"), now=NOW, spark=spark), **opts)
    got, want = (_rows(r) for r in (repo, whole))
    pd.testing.assert_frame_equal(got, want)
    assert got[WINDOW_END].dt.date.max() == D4 and len(got) > 0


def _rows(repo: Repo) -> pd.DataFrame:
    """Each key's change points, without rows that repeat its previous values (a backfill of a range that starts
    inside a key's series writes its values at the range's first end again)."""
    table = read_pandas(repo.offline_path(GROUP))
    table[WINDOW_END] = pd.to_datetime(table[WINDOW_END], utc=True)
    values = ["n_24h", "n_ever"]
    table = table[["user_id", WINDOW_END, *values]].sort_values(["user_id", WINDOW_END], ignore_index=True)
    repeated = (table[values] == table.groupby("user_id")[values].shift(1)).all(axis=1)
    return table[~repeated].reset_index(drop=True)


@pytest.mark.spark
def test_a_stream_behind_the_clock_holds_the_backfill_to_its_watermark(spark, tmp_path: Path, events) -> None:
    """The stream read three days, then fell behind (the fourth day's files land two days late): the nightly
    backfill completes only the days behind the stream's watermark, the stream writes the late days' rows when
    they land, and the stores end equal to a backfill of the whole source."""
    from features.pipelines.stream import stream
    from features.stores.serving import online_features

    repo = Repo.load(build_feast_repo(tmp_path / "streamed", [GROUP], apply=True))
    opts = {"spark": spark, "now": NOW, "progress": False, "track": False}
    for i, day in enumerate([D1, D2, D3]):
        land(repo, day_of(events, day), 10 * i)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    first = plan(repo, request(since_last=True), now=NOW, spark=spark)
    assert list(first.groups[0].todo) == [D1, D2]  # D3 waits: the watermark is 10 minutes before its end
    assert "acct: waiting for data: the stream's watermark is 2026-12-03 23:" in first.describe()
    execute(repo, first, **opts)
    land(repo, day_of(events, D4), 30)
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    second = plan(repo, request(since_last=True), now=NOW, spark=spark)
    assert list(second.groups[0].todo) == [D3]
    execute(repo, second, **opts)

    whole = Repo.load(build_feast_repo(tmp_path / "whole", [GROUP], events, apply=False))
    execute(
        whole, plan(whole, request(start="2026-12-01", end="2026-12-05"), now=NOW, spark=spark), online=False, **opts
    )
    got, want = _rows(repo), _rows(whole)
    upto = got[WINDOW_END].max()  # the stream's rows reach its watermark on D4
    assert upto.date() == D4
    pd.testing.assert_frame_equal(got, want[want[WINDOW_END] <= upto].reset_index(drop=True))
    # Online: each key's value is never older than its newest offline row.
    keys = got[["user_id"]].drop_duplicates().reset_index(drop=True)
    online = online_features(repo, GROUP, keys, with_window_end=True)
    newest = keys.merge(got.groupby("user_id", as_index=False)[WINDOW_END].max(), on="user_id")
    assert (pd.to_datetime(online[WINDOW_END], utc=True) >= newest[WINDOW_END]).all()
