"""Incremental backfills (features.pipelines.schedule): what a schedule computes and why, resuming after a failure,
healing late events, definition changes, removed groups, and the entry points schedulers run.

Plans need no Spark (they read manifests and late-event files); the Spark tests run real backfills on small
generated data, a few Spark runs each (several days per run where the test allows it).
"""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import build_feast_repo, definitions_code
from groups import COUNT_1H, HOP, HOP_V1, SUM_1H, TYPED_SOURCE, USER

from features import Feature, FeatureGroup, Hop, Lifetime, Tumble, agg
from features.cli import build_parser, main
from features.cli_backfill import backfill_request
from features.demo import generate_transactions, write_events
from features.errors import ConfigError, ValidationFailed
from features.pipelines.days import days_from, last_complete_day, spans
from features.pipelines.schedule import execute
from features.pipelines.schedule_plan import FORCED, NEW, chunk_runs, plan, request
from features.pipelines.stale import late_event_micros, stale_days
from features.progress import PartitionProgress
from features.repo import Repo
from features.spec import WINDOW_END
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import read_manifest, update
from features.stores.offline import current_version, read_pandas, rows_by_date

ROOT = Path(__file__).resolve().parents[1]
D1, D2, D3, D4, D5 = (date(2026, 3, d) for d in range(1, 6))
NOW = datetime(2026, 3, 4, 0, 30, tzinfo=UTC)  # D3 is the last complete day (10m watermark)
FAR_AHEAD = datetime(2026, 4, 1, tzinfo=UTC)  # an event past every day the plans look at

LIFE = FeatureGroup(
    "life", USER, TYPED_SOURCE, [COUNT_1H, Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h"))]
)
DAILY = FeatureGroup("daily", USER, TYPED_SOURCE, [Feature("txn_count_1d", agg.count(), window=Tumble("1d"))])


def at(day: date, hhmm: str = "00:00") -> datetime:
    hours, minutes = map(int, hhmm.split(":"))
    return datetime(day.year, day.month, day.day, hours, minutes, tzinfo=UTC)


def us(*times: datetime) -> np.ndarray:
    return np.array([int(t.timestamp()) * 1_000_000 for t in times], dtype=np.int64)


def make_repo(root: Path, groups: Sequence[FeatureGroup], events: pd.DataFrame | None = None, **kw) -> Repo:
    return Repo.load(build_feast_repo(root, groups, events, apply=kw.pop("apply", False), **kw))


def redefine(root: Path, groups: Sequence[FeatureGroup]) -> None:
    """Replace the repo's definitions module, as a user editing it would (a new module name: sys.modules)."""
    for old in root.glob("test_definitions_*.py"):
        old.unlink()
    (root / f"test_definitions_{uuid.uuid4().hex[:12]}.py").write_text(definitions_code(groups))


def complete(repo: Repo, group: FeatureGroup, days: Sequence[date], as_group: FeatureGroup | None = None) -> None:
    """Record days as completed (with the hashes of `as_group`: an older definition of the group)."""
    computed_with = as_group or group
    with update(repo.offline_path(group), group.name) as manifest:
        for day in days:
            manifest.record(day, definition_hash(computed_with), feature_hashes(computed_with), 10, NOW)


def write_late(repo: Repo, group: FeatureGroup, batch: str, events: pd.DataFrame) -> None:
    """A late batch as the stream writes it: the source's columns under late_path/batch=<id>/."""
    write_events(events, Path(repo.late_path(group)) / f"batch={batch}")


def late_rows(times: Sequence[datetime]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": [f"u{i % 3:06d}" for i in range(len(times))],
            "amount": [100.0] * len(times),
            "status": ["OK"] * len(times),
            "event_ts": pd.to_datetime(list(times), utc=True).astype("datetime64[us, UTC]"),
        }
    )


# ---------------------------------------------------------------------------------------------------------
# Days, runs, late-event arithmetic (no repo)


def test_spans_and_runs() -> None:
    assert spans([D3, D1, D2, D5]) == "2026-03-01..2026-03-03, 2026-03-05"
    assert spans([]) == ""
    runs = chunk_runs("g", [D1, D2, D3, D5], 2)
    assert [(r.start, r.end, r.days) for r in runs] == [
        (at(D1), at(D3), (D1, D2)),
        (at(D3), at(D4), (D3,)),
        (at(D5), at(D5 + timedelta(days=1)), (D5,)),
    ]
    assert [r.days for r in chunk_runs("g", [D2, D1], 1)] == [(D1,), (D2,)]


def test_last_complete_day_waits_one_watermark() -> None:
    assert last_complete_day(HOP, at(D4, "00:09")) == D2
    assert last_complete_day(HOP, at(D4, "00:10")) == D3
    assert last_complete_day(HOP, at(D4, "23:59")) == D3


def test_late_events_stale_the_days_whose_window_ends_they_change() -> None:
    completed = [D1, D2, D3, D4]
    # Hop(1h, 5m): an event at ts changes the ends in (ts, ts + 1h05m].
    assert stale_days(HOP, us(at(D2, "22:00")), completed) == [D2]
    assert stale_days(HOP, us(at(D2, "23:30")), completed) == [D2, D3]
    # Its pane enters at midnight: the end 00:00 is in the next day's partition.
    assert stale_days(HOP, us(at(D2, "23:57")), completed) == [D3]
    assert stale_days(HOP, us(at(D2, "10:00"), at(D4, "23:30")), completed) == [D2, D4]
    # Tumble("1d"): the day after the event (enters at the next midnight) and the one after (leaves).
    assert stale_days(DAILY, us(at(D1, "10:00")), completed) == [D2, D3]
    # Lifetime: every completed day from the event's on.
    assert stale_days(LIFE, us(at(D2, "10:00")), completed) == [D2, D3, D4]
    # Before the completed days: a Lifetime window still changes them all, a 1h window none.
    assert stale_days(LIFE, us(at(date(2026, 2, 1))), completed) == completed
    assert stale_days(HOP, us(at(date(2026, 2, 1))), completed) == []
    assert stale_days(HOP, np.empty(0, dtype=np.int64), completed) == []
    assert stale_days(HOP, us(at(D2)), []) == []


def test_late_event_times_in_any_timestamp_unit_or_as_text(tmp_path: Path) -> None:
    times = [at(D2, "23:30"), at(D3, "01:02")]
    ns = pd.DataFrame({"event_ts": pd.to_datetime(times, utc=True).astype("datetime64[ns, UTC]"), "x": [1, 2]})
    for folder in "abc":
        (tmp_path / folder).mkdir()
    ns.to_parquet(tmp_path / "a" / "part-0.parquet")
    naive = pa.table({"event_ts": pa.array([t.replace(tzinfo=None) for t in times], pa.timestamp("ms"))})
    pq.write_table(naive, tmp_path / "b" / "part-0.parquet")
    pq.write_table(pa.table({"event_ts": [t.isoformat() for t in times] + [None]}), tmp_path / "c" / "p.parquet")
    pq.write_table(pa.table({"event_ts": ["1999-01-01T00:00Z"]}), tmp_path / "c" / ".hidden.parquet")
    for folder in "abc":
        assert late_event_micros(tmp_path / folder, "event_ts").tolist() == us(*times).tolist(), folder
    assert late_event_micros(tmp_path / "empty", "event_ts").size == 0


# ---------------------------------------------------------------------------------------------------------
# Plans (no Spark: the groups have completed partitions, or a --date)


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    """A repo whose source already holds an event far past the days the plans look at: the clock, not the data,
    decides which of them are complete (test_completeness.py tests the data's side)."""
    made = make_repo(tmp_path / "repo", [HOP, LIFE])
    write_events(late_rows([FAR_AHEAD]), made.source_path(HOP))
    return made


def test_since_last_computes_new_days_and_what_late_events_made_stale(repo: Repo) -> None:
    for group in (HOP, LIFE):
        complete(repo, group, [D1, D2, D3])
        write_late(repo, group, "7", late_rows([at(D2, "23:30"), at(D2, "23:31")]))
    now = at(D5, "00:30")
    the_plan = plan(repo, request(since_last=True, days_per_run=1), now=now)
    hop, life = the_plan.groups
    assert hop.todo == {D2: "late events in batch=7", D3: "late events in batch=7", D4: NEW}
    assert life.todo == hop.todo  # the events are on D2: Lifetime changes D2 and later, as the hop does here
    [(batch, seen)] = hop.new_late.items()
    assert (batch, seen.seen_at, seen.events, seen.days) == ("7", now, 2, (D2, D3)) and seen.signature
    assert [r.days for r in hop.runs] == [(D2,), (D3,), (D4,)]
    text = the_plan.describe()
    assert "backfill --since-last: 6 partitions to compute, up to 2026-03-04" in text
    assert "hop: 3 partitions to compute in 3 runs: 2026-03-02..2026-03-03 (late events in batch=7); " in text
    assert "2026-03-04 (not computed yet)" in text
    assert "hop: 1 new late batch (2 events): batch=7; making 2026-03-02..2026-03-03 stale" in text
    # Planning changes nothing; more days per run, fewer runs: by default, all consecutive days in one.
    assert read_manifest(repo.offline_path(HOP), "hop").late_batches == {}
    assert [r.days for r in plan(repo, request(since_last=True, days_per_run=2), now=now).groups[0].runs] == [
        (D2, D3),
        (D4,),
    ]
    assert [r.days for r in plan(repo, request(since_last=True), now=now).groups[0].runs] == [(D2, D3, D4)]


def test_a_late_batch_is_read_once_and_its_stale_marks_stay(repo: Repo) -> None:
    complete(repo, HOP, [D1, D2, D3])
    write_late(repo, HOP, "7", late_rows([at(D1, "10:00")]))
    write_late(repo, HOP, "8", late_rows([at(D3, "10:00")]))
    first = plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0]
    assert first.todo == {D1: "late events in batch=7", D3: "late events in batch=8"}
    with update(repo.offline_path(HOP), "hop") as manifest:  # what execute does first
        for batch in first.new_late.values():
            manifest.mark_stale(batch.days, [batch.batch])
            manifest.remember_late(batch)
    again = plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0]
    assert again.new_late == {} and again.todo == first.todo
    # The marks are in the manifest: the batch files can go. Written again (the stream's ids start over after
    # its --reset), a known id is a new batch.
    shutil.rmtree(repo.late_path(HOP))
    assert plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0].todo == first.todo
    write_late(repo, HOP, "7", late_rows([at(D2, "10:00")]))
    rewritten = plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0]
    assert rewritten.new_late["7"].days == (D2,)
    assert rewritten.todo == {**first.todo, D2: "late events in batch=7"}
    shutil.rmtree(repo.late_path(HOP))
    # A late batch for days not completed yet changes nothing: their backfill reads the events from the source.
    write_late(repo, HOP, "9", late_rows([at(D5, "10:00")]))
    third = plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0]
    assert third.new_late["9"].days == () and third.todo == first.todo
    assert "hop: 1 new late batch (1 event): batch=9; no completed partition is affected" in "\n".join(third.lines())


def test_a_date_the_stream_wrote_is_not_completed(repo: Repo) -> None:
    complete(repo, HOP, [D1, D2])
    from deltalake import write_deltalake

    appended = pa.table({"user_id": ["u1"], WINDOW_END: [at(D3, "10:00")], "txn_count_1h": [1], "date": [D3]})
    write_deltalake(repo.offline_path(HOP), appended, mode="append", partition_by=["date"])  # a stream's rows
    assert plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0].todo == {D3: NEW}


def test_date_skips_a_completed_day_unless_forced_and_heals_stale_ones(repo: Repo) -> None:
    complete(repo, HOP, [D1, D2, D3])
    with update(repo.offline_path(HOP), "hop") as manifest:
        manifest.mark_stale([D1], ["3"])
    skipped = plan(repo, request(day="2026-03-02"), ["hop"], now=NOW)
    [gp] = skipped.groups
    assert list(gp.skipped) == [D2] and gp.todo == {D1: "late events in batch=3"}
    assert "hop: 2026-03-02 was completed at 2026-03-04 00:30 UTC with the current definition; skipping it " in (
        skipped.describe()
    )
    assert "(--force recomputes it)" in skipped.describe()
    forced = plan(repo, request(day="2026-03-02", force=True), ["hop"], now=NOW).groups[0]
    assert forced.todo == {D1: "late events in batch=3", D2: FORCED} and not forced.skipped
    fresh = plan(repo, request(day="2026-03-04"), ["hop"], now=at(D5, "01:00")).groups[0]
    assert fresh.todo == {D1: "late events in batch=3", D4: NEW}


def test_definition_changes_are_named(repo: Repo) -> None:
    complete(repo, HOP, [D1, D2], as_group=HOP_V1)  # computed before amount_sum_1h was added
    complete(repo, HOP, [D3])
    [gp] = plan(repo, request(since_last=True), ["hop"], now=NOW).groups
    assert gp.todo == dict.fromkeys([D1, D2], "definition changed: added feature 'amount_sum_1h'")
    assert "2026-03-01..2026-03-02 (definition changed: added feature 'amount_sum_1h')" in "\n".join(gp.lines())
    filtered = FeatureGroup(
        "hop",
        USER,
        TYPED_SOURCE,
        [
            Feature("txn_count_1h", agg.count(), window=Hop("1h", "5m"), where="status = 'OK'"),
            SUM_1H,
            Feature("extra", agg.max("amount"), window=Hop("1h", "5m")),
        ],
    )
    complete(repo, HOP, [D3], as_group=filtered)
    gp = plan(repo, request(since_last=True), ["hop"], now=NOW).groups[0]
    assert gp.todo[D3] == "definition changed: removed feature 'extra'; changed feature 'txn_count_1h'"


def test_a_range_records_only_whole_complete_days(repo: Repo) -> None:
    complete(repo, HOP, [D1, D2], as_group=HOP_V1)
    the_plan = plan(repo, request(start="2026-03-02T12:00", end="2026-03-05"), ["hop"], now=at(D4, "00:05"))
    [gp] = the_plan.groups
    [run] = gp.runs
    assert (run.start, run.end, run.days) == (at(D2, "12:00"), at(D5), (D2, D3, D4))
    assert run.record == ()  # D2 only in part; D3 not complete at 00:05 (10m watermark); D4 not over
    notes = "\n".join(gp.lines())
    assert "2026-03-02..2026-03-04 not recorded as completed" in notes
    assert "2026-03-01..2026-03-02 stay stale (definition changed: added feature 'amount_sum_1h'); --since-last" in (
        notes
    )
    later = plan(repo, request(start="2026-03-02T12:00", end="2026-03-05"), ["hop"], now=at(D5, "00:10")).groups[0]
    assert later.runs[0].record == (D3, D4)


# ---------------------------------------------------------------------------------------------------------
# The command line: options and their errors (one line, status 2, before any Spark work)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ([], ["backfill: say what to compute", "--since-last", "--date YYYY-MM-DD", "--start ISO --end ISO"]),
        (["--date", "2026-03-01", "--since-last"], ["--date and --since-last: choose one"]),
        (["--start", "2026-03-01", "--end", "2026-03-02", "--date", "2026-03-01"], ["--start/--end and --date"]),
        (["--start", "2026-03-01", "--end", "2026-03-02", "--since-last"], ["--start/--end and --since-last"]),
        (["--start", "2026-03-01"], ["--start: given without --end", "[--start, --end)"]),
        (["--end", "2026-03-01"], ["--end: given without --start"]),
        (["--since-last", "--force"], ["--force: only with --date"]),
        (["--start", "2026-03-01", "--end", "2026-03-02", "--force"], ["--force: only with --date"]),
        (["--date", "2026-3-1"], ["--date: '2026-3-1' is not a day", "YYYY-MM-DD", "2026-01-31"]),
        (["--date", "yesterday"], ["--date: 'yesterday' is not a day"]),
        (["--since-last", "--days-per-run", "0"], ["--days-per-run: '0' is not a positive whole number"]),
        (["--since-last", "--days-per-run", "two"], ["--days-per-run: 'two'", "--days-per-run 7"]),
        (["--date", "2999-01-01"], ["--date: 2999-01-01 is not complete yet for 'hop'", "2999-01-02 00:10 UTC"]),
        (["--since-last", "--group", "nope"], ["--group: no feature group named 'nope'", "hop, life"]),
    ],
)
def test_backfill_option_errors(repo: Repo, capsys: pytest.CaptureFixture[str], args: list[str], needles) -> None:
    code = main(["backfill", "--repo", str(repo.root), *args])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not Path(repo.offline_path(HOP)).exists()


def test_a_day_given_as_a_time_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--date: 2026-03-01T06:00:00\+00:00 is a time; give the day, YYYY-MM-DD"):
        request(day=at(D1, "06:00"))


def test_an_unreadable_late_batch_is_a_data_error(repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    complete(repo, HOP, [D1])
    folder = Path(repo.late_path(HOP)) / "batch=3"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"user_id": ["u1"]}), folder / "part-0.parquet")  # no event_ts column
    assert main(["backfill", "--repo", str(repo.root), "--since-last", "--group", "hop"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {folder}: cannot read the late events' 'event_ts' column"), line
    assert "move the folder away if it is not one of its late batches" in line


def test_dry_run_prints_the_plan_and_changes_nothing(repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    complete(repo, HOP, [D1])
    write_late(repo, HOP, "7", late_rows([at(D1, "10:00")]))
    before = Path(repo.offline_path(HOP), "_manifest.json").read_text()
    assert main(["backfill", "--repo", str(repo.root), "--date", "2026-03-01", "--group", "hop", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "hop: 1 partition to compute: 2026-03-01 (late events in batch=7)" in out
    assert "dry run: nothing computed, nothing recorded" in out
    assert Path(repo.offline_path(HOP), "_manifest.json").read_text() == before


def test_progress_counts_partitions_and_rows() -> None:
    out = io.StringIO()
    with PartitionProgress(5, "backfill", enabled=True, file=out) as bar:
        bar.advance(2, 1_000)
        bar.advance(3, 234)
    assert (bar.partitions, bar.rows) == (5, 1_234)
    final = out.getvalue().split("\r")[-1]
    assert "5/5" in final and "partition" in final and "1,234 rows" in final
    quiet = PartitionProgress(5, enabled=False)
    quiet.advance(1, 10)
    assert (quiet.partitions, quiet.rows) == (1, 10)


def test_an_unapplied_repo_fails_before_any_spark_work(repo: Repo) -> None:
    complete(repo, HOP, [D1])
    the_plan = plan(repo, request(day="2026-03-01", force=True), ["hop"], now=NOW)
    with pytest.raises(ConfigError, match="features apply --repo"):
        execute(repo, the_plan, now=NOW, progress=False, track=False)
    assert read_manifest(repo.offline_path(HOP), "hop").partitions[D1].completed_at == NOW  # not recorded again


# ---------------------------------------------------------------------------------------------------------
# Removed groups: `features apply` asks for --prune


def test_apply_refuses_to_drop_a_removed_group_without_prune(tmp_path: Path, capsys) -> None:
    root = build_feast_repo(tmp_path / "repo", [HOP, LIFE])
    redefine(root, [HOP])
    capsys.readouterr()
    assert main(["apply", "--repo", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: apply: the Feast registry has feature view(s) 'life'"), err
    assert "`features apply --prune`" in err[0]
    views = {v.name for v in Repo.load(root).feature_store().list_feature_views(allow_cache=False)}
    assert views == {"hop", "life"}  # nothing was applied

    assert main(["apply", "--repo", str(root), "--prune"]) == 0
    out = capsys.readouterr().out
    assert "pruning feature view(s) 'life'" in out and str(root / "data" / "offline" / "life") in out
    views = {v.name for v in Repo.load(root).feature_store().list_feature_views(allow_cache=False)}
    assert views == {"hop"}
    assert main(["apply", "--repo", str(root)]) == 0  # nothing left to prune


# ---------------------------------------------------------------------------------------------------------
# Entry points for schedulers


def test_crontab_example_runs_valid_commands() -> None:
    entries = [
        line
        for line in (ROOT / "jobs" / "crontab.example").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#") and "=" not in line.split()[0]
    ]
    assert entries
    parser = build_parser()
    for entry in entries:
        fields = entry.split(None, 5)
        assert all(
            f.replace("*", "").replace("/", "").replace(",", "").replace("-", "").isdigit() or f == "*"
            for f in fields[:5]
        ), entry
        words = shlex.split(fields[5].split(">>")[0])
        script = next(i for i, w in enumerate(words) if w.endswith("jobs/backfill.py") or w == "backfill")
        args = words[script + 1 :]
        backfill_request(parser.parse_args(["backfill", *args]))  # checked as the command checks it


def run_job(*args: str, cwd: Path, python: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *python, str(ROOT / "jobs" / "backfill.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_job_ends_an_unexpected_error_with_one_reason_line(tmp_path: Path) -> None:
    broken = tmp_path / "repo"
    shutil.copytree(ROOT / "feature_repo", broken, ignore=shutil.ignore_patterns("data", "__pycache__"))
    # A bug's stand-in: the planner itself raises.
    (broken / "bug.py").write_text(
        "import features.pipelines.schedule\n\n\n"
        "def plan(*args, **kwargs):\n    raise RuntimeError('boom in the planner')\n\n\n"
        "features.pipelines.schedule.plan = plan\n"
    )
    result = run_job("--repo", str(broken), "--since-last", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "Traceback" in result.stderr  # kept for whoever debugs it
    last = result.stderr.strip().splitlines()[-1]
    assert last == "error: features backfill failed unexpectedly: RuntimeError: boom in the planner", last

    # Definitions that raise are the user's to fix: one line naming the file and line, a configuration error.
    (broken / "bug.py").unlink()
    (broken / "defs.py").write_text("raise RuntimeError('boom while importing the definitions')\n")
    result = run_job("--repo", str(broken), "--since-last", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {broken / 'defs.py'}, line 1: RuntimeError: boom while importing the definitions"
    )

    usage = run_job("--repo", str(tmp_path / "missing"), "--since-last", cwd=tmp_path)
    assert (
        usage.returncode == 2 and usage.stderr.strip().startswith("error: --repo") and "Traceback" not in (usage.stderr)
    )
    assert len(usage.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------------
# Spark: real backfills


def events_for(days: int = 3, n: int = 1_500, seed: int = 4) -> pd.DataFrame:
    """`days` of transactions from D1, and one event far ahead: the clock, not the data, decides which days are
    complete (none of the days computed here holds a window the far event is in)."""
    events = generate_transactions(n, 30, at(D1), days, seed=seed)
    far = events.iloc[:1].assign(event_ts=pd.Timestamp(FAR_AHEAD).as_unit("us"), txn_id="far-ahead")
    return pd.concat([events, far], ignore_index=True)


def offline(repo: Repo, group: FeatureGroup) -> pd.DataFrame:
    """The group's offline rows, each key's series without rows that repeat its previous values (a backfill
    range starting mid-series adds such no-op rows at its start)."""
    table = read_pandas(repo.offline_path(group))
    table[WINDOW_END] = pd.to_datetime(table[WINDOW_END], utc=True)
    table = table.sort_values(["user_id", WINDOW_END], ignore_index=True)
    values = [f.name for f in group.features]
    previous = table.groupby("user_id")[values].shift(1)
    same = ((table[values] == previous) | (table[values].isna() & previous.isna())).all(axis=1)
    return table[~same].reset_index(drop=True)


def footer_rows(repo: Repo, group: FeatureGroup, day: date) -> int:
    return rows_by_date(repo.offline_path(group))[day]


@pytest.mark.spark
def test_interrupted_schedule_resumes_where_it_stopped(spark, tmp_path: Path) -> None:
    import great_expectations as gx

    cap = gx.expectations.ExpectColumnValuesToBeBetween(column="amount_sum_1h", max_value=1e6)
    guarded = FeatureGroup("hop", USER, TYPED_SOURCE, [COUNT_1H, SUM_1H], expectations=[cap], on_invalid="fail")
    repo = make_repo(tmp_path / "repo", [guarded], events_for())
    # A huge amount on D2 breaks the user's spend cap: the run of D2 fails validation.
    spike = late_rows([at(D2, "12:00")]).assign(amount=1e7)
    [spike_file] = write_events(spike, repo.source_path(guarded), start_index=50)
    table = repo.offline_path(guarded)
    opts = {"spark": spark, "now": NOW, "progress": False, "track": False, "online": False}

    # The first schedule starts at the source's first day and stops at D2, which fails validation.
    first = plan(repo, request(since_last=True), now=NOW, spark=spark)
    assert first.groups[0].todo == dict.fromkeys([D1, D2, D3], NEW)
    with pytest.raises(ValidationFailed):
        execute(repo, first, **opts)
    manifest = read_manifest(table, "hop")
    assert manifest.completed() == [D1]
    assert manifest.partitions[D1].rows == footer_rows(repo, guarded, D1) > 0
    assert list(rows_by_date(table)) == [D1]
    d1_done = manifest.partitions[D1].completed_at

    # Fixed, the same command resumes with D2 (here both remaining days in one run).
    Path(spike_file).unlink()
    second = plan(repo, request(since_last=True, days_per_run=2), now=NOW, spark=spark)
    assert second.groups[0].todo == dict.fromkeys([D2, D3], NEW)
    results = execute(repo, second, **opts)
    assert [(r.start, r.end) for r in results] == [(at(D2), at(D4))]
    manifest = read_manifest(table, "hop")
    assert manifest.completed() == [D1, D2, D3] and manifest.partitions[D1].completed_at == d1_done
    assert all(manifest.partitions[d].rows == footer_rows(repo, guarded, d) for d in (D1, D2, D3))
    assert all(e.definition_hash == definition_hash(guarded) for e in manifest.partitions.values())

    # Completed days are skipped, unless forced.
    assert plan(repo, request(since_last=True), now=NOW).partitions == 0
    assert plan(repo, request(day="2026-03-02"), now=NOW).partitions == 0
    execute(repo, plan(repo, request(day="2026-03-02", force=True), now=NOW), **opts)
    forced = read_manifest(table, "hop")
    assert forced.partitions[D2].completed_at > manifest.partitions[D2].completed_at

    # A range records the whole days in it, not the part of a day it covers.
    execute(repo, plan(repo, request(start="2026-03-02T12:00", end="2026-03-04"), now=NOW), **opts)
    ranged = read_manifest(table, "hop")
    assert ranged.partitions[D2] == forced.partitions[D2]
    assert ranged.partitions[D3].completed_at > forced.partitions[D3].completed_at


@pytest.mark.spark
def test_since_last_over_many_days_is_one_pass_that_resumes_by_the_day(spark, tmp_path: Path, monkeypatch) -> None:
    import features.pipelines.backfill
    import features.pipelines.schedule

    days = [D1 + timedelta(days=k) for k in range(6)]
    now = at(days[-1] + timedelta(days=1), "00:30")
    events = events_for(days=6, n=900, seed=9)
    opts = {"spark": spark, "now": now, "progress": False, "track": False, "online": False}
    by_day = make_repo(tmp_path / "by_day", [LIFE], events)
    execute(by_day, plan(by_day, request(since_last=True, days_per_run=1), now=now, spark=spark), **opts)

    repo = make_repo(tmp_path / "repo", [LIFE], events)
    passes: list[tuple[datetime, datetime]] = []
    compute = features.pipelines.backfill.change_points
    monkeypatch.setattr(
        features.pipelines.backfill,
        "change_points",
        lambda group, events, lo, hi, **kw: passes.append((lo, hi)) or compute(group, events, lo, hi, **kw),
    )
    # The six days are one commit; the manifest records them one by one after it, and the process is killed
    # while it does: the days not recorded yet are computed again, the others not.
    record = features.pipelines.schedule.record_completed
    recorded: list[date] = []

    def killed_at_the_fourth_day(repo: Repo, group: FeatureGroup, days: list[date], read_at: datetime) -> None:
        if len(recorded) == 3:
            raise KeyboardInterrupt
        record(repo, group, days, read_at)
        recorded.extend(days)

    monkeypatch.setattr(features.pipelines.schedule, "record_completed", killed_at_the_fourth_day)
    first = plan(repo, request(since_last=True), now=now, spark=spark)
    assert [r.days for r in first.groups[0].runs] == [tuple(days)]
    with pytest.raises(KeyboardInterrupt):
        execute(repo, first, **opts)
    assert len(passes) == 1  # one computation of the six days, the source read once
    manifest = read_manifest(repo.offline_path(LIFE), "life")
    assert manifest.completed() == days[:3]

    monkeypatch.setattr(features.pipelines.schedule, "record_completed", record)
    second = plan(repo, request(since_last=True), now=now)
    assert second.groups[0].todo == dict.fromkeys(days[3:], NEW)  # the completed days are not computed again
    execute(repo, second, **opts)
    assert passes[1:] == [(micros_of(days[3]), micros_of(days[-1] + timedelta(days=1)))]
    resumed = read_manifest(repo.offline_path(LIFE), "life")
    assert resumed.completed() == days
    assert all(resumed.partitions[d] == manifest.partitions[d] for d in days[:3])
    assert all(resumed.partitions[d].rows == footer_rows(repo, LIFE, d) for d in days)
    pd.testing.assert_frame_equal(offline(repo, LIFE), offline(by_day, LIFE), check_exact=False, rtol=1e-9)


def micros_of(day: date) -> int:
    return int(at(day).timestamp()) * 1_000_000


@pytest.mark.spark
def test_late_events_heal_to_a_backfill_of_the_full_source(spark, tmp_path: Path) -> None:
    events = events_for(seed=6)
    late = late_rows([at(D1, "12:00"), at(D1, "12:03"), at(D1, "23:40"), at(D1, "23:50")])
    opts = {"spark": spark, "now": NOW, "progress": False, "track": False, "online": False}
    healed = make_repo(tmp_path / "healed", [HOP, LIFE], events)
    execute(healed, plan(healed, request(since_last=True, days_per_run=3), now=NOW, spark=spark), **opts)
    before = {g.name: offline(healed, g) for g in (HOP, LIFE)}

    # The stream got the late events: they are in the source (where it reads them) and in its late batches,
    # written by Spark as the stream does (part files, _SUCCESS and .crc side files, staged then renamed).
    write_events(late, healed.source_path(HOP), start_index=90)
    write_late(healed, LIFE, "7", late)
    staged = Path(healed.late_path(HOP)) / ".batch=7-staging"
    spark.createDataFrame(late[["user_id", "event_ts"]]).coalesce(1).write.parquet(str(staged))
    staged.rename(staged.with_name("batch=7"))
    the_plan = plan(healed, request(since_last=True, days_per_run=3), now=NOW)
    hop, life = the_plan.groups
    assert set(hop.todo) == {D1, D2} and set(life.todo) == {D1, D2, D3}  # 23:50 + 1h05m is on D2
    assert "late events in batch=7" in hop.todo[D1]
    execute(healed, the_plan, **opts)

    reference = make_repo(tmp_path / "reference", [HOP, LIFE])
    shutil.copytree(healed.source_path(HOP), reference.source_path(HOP))
    execute(reference, plan(reference, request(start="2026-03-01", end="2026-03-04"), now=NOW), **opts)
    for group in (HOP, LIFE):
        want = offline(reference, group)
        pd.testing.assert_frame_equal(offline(healed, group), want, check_exact=False, rtol=1e-9)
        assert not before[group.name].equals(want), "the late events changed nothing: the test proves nothing"
        manifest = read_manifest(healed.offline_path(group), group.name)
        assert manifest.late_batches["7"].days == tuple(sorted(the_plan.groups[group is LIFE].todo))
        assert manifest.partitions[D1].late_batches == ("7",) and manifest.partitions[D1].stale is None
    assert plan(healed, request(since_last=True), now=NOW).partitions == 0  # each batch is read once


LIFETIME_COUNT = Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h"))
MAX_2H = Feature("amount_max_2h", agg.max("amount"), window=Hop("2h", every="10m"))
GROWN_V1 = FeatureGroup("grown", USER, TYPED_SOURCE, [COUNT_1H, LIFETIME_COUNT, MAX_2H])
GROWN_V2 = FeatureGroup(  # one feature added, one widened
    "grown", USER, TYPED_SOURCE, [COUNT_1H, LIFETIME_COUNT, SUM_1H, replace(MAX_2H, window=Hop("3h", every="10m"))]
)
GROWN_V3 = FeatureGroup("grown", USER, TYPED_SOURCE, [COUNT_1H, LIFETIME_COUNT, SUM_1H])  # one removed


@pytest.mark.spark
def test_added_and_changed_features_are_computed_alone_beside_the_others(spark, tmp_path: Path) -> None:
    events = events_for(days=2, n=600)
    repo = make_repo(tmp_path / "repo", [GROWN_V1], events)
    opts = {"spark": spark, "now": NOW, "progress": False, "track": False, "online": False}
    execute(repo, plan(repo, request(since_last=True, days_per_run=3), now=NOW, spark=spark), **opts)
    assert read_manifest(repo.offline_path(GROWN_V1), "grown").completed() == [D1, D2, D3]

    redefine(repo.root, [GROWN_V2])
    repo = Repo.load(repo.root)
    by_default = plan(repo, request(since_last=True), now=NOW)
    assert [r.features for r in by_default.runs] == [None]  # by default: all, and the plan says what else it could do
    assert "--only-changed would compute only amount_max_2h, amount_sum_1h there" in by_default.describe()
    the_plan = plan(repo, request(since_last=True, days_per_run=3, only_changed=True), now=NOW)
    [run] = the_plan.runs
    assert run.features == ("amount_sum_1h", "amount_max_2h") and run.days == (D1, D2, D3)
    assert "computing only amount_sum_1h, amount_max_2h" in the_plan.describe()
    [result] = execute(repo, the_plan, **opts)
    assert result.only == ("amount_sum_1h", "amount_max_2h")

    reference = make_repo(tmp_path / "reference", [GROWN_V2], events)
    execute(reference, plan(reference, request(start="2026-03-01", end="2026-03-04"), now=NOW), **opts)
    columns = ["user_id", WINDOW_END, *(f.name for f in GROWN_V2.features)]
    got, want = offline(repo, GROWN_V2)[columns], offline(reference, GROWN_V2)[columns]
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9)
    manifest = read_manifest(repo.offline_path(GROWN_V2), "grown")
    assert {e.definition_hash for e in manifest.partitions.values()} == {definition_hash(GROWN_V2)}

    redefine(repo.root, [GROWN_V3])
    repo = Repo.load(repo.root)
    the_plan = plan(repo, request(since_last=True), now=NOW)
    assert [run.features for run in the_plan.runs] == [()]
    version = current_version(repo.offline_path(GROWN_V3))
    assert execute(repo, the_plan, **opts) == []  # nothing computed: the days are recorded as they are
    assert plan(repo, request(since_last=True), now=NOW).partitions == 0
    assert current_version(repo.offline_path(GROWN_V3)) == version
    # A range asked for again, nothing changed since: every feature is computed (the source may have changed).
    again = plan(repo, request(start="2026-03-01", end="2026-03-02"), now=NOW)
    assert [run.features for run in again.runs] == [None]
    [result] = execute(repo, again, **opts)
    assert result.only == () and result.rows_out > 0


def since_last_days(first: date, before: datetime, after: datetime) -> list[list[date]]:
    """The days a --since-last run computes from `first` on when it read the clock between `before` and `after`:
    one list, or two when the last complete day moved on meanwhile (a midnight and the watermark passed). A job
    started as a scheduler starts it has no clock of ours to take, so the test reads the clock around it."""
    ends = sorted({last_complete_day(HOP, before), last_complete_day(HOP, after)})
    return [days_from(first, end) for end in ends]


def test_since_last_days_around_midnight() -> None:
    first = D1
    assert since_last_days(first, at(D4, "12:00"), at(D4, "12:01")) == [[D1, D2, D3]]
    # Around 00:10 (midnight plus the 10m watermark): yesterday became complete during the run, or not yet.
    assert since_last_days(first, at(D4, "00:09"), at(D4, "00:11")) == [[D1, D2], [D1, D2, D3]]
    assert since_last_days(D4, at(D4, "00:09"), at(D4, "00:11")) == [[], []]


@pytest.mark.slow
def test_nightly_job_end_to_end(tmp_path: Path) -> None:
    """jobs/backfill.py as a scheduler runs it, on the real clock: a first --since-last computes every day of
    the source whose data is in, the next finds nothing to do and starts no Spark. A run whose batches pass
    imports neither Feast nor Great Expectations (seconds each, cold)."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    # Events up to just before today: yesterday waits for data one watermark past its end (today 00:10).
    events = generate_transactions(600, 20, today - timedelta(days=3), 3, seed=8)
    first_day = (today - timedelta(days=3)).date()
    repo = make_repo(tmp_path / "repo", [HOP], events, apply=True)
    options = ["--since-last", "--days-per-run", "7", "--no-tracking"]
    before = datetime.now(UTC)
    first = run_job("--repo", str(repo.root), *options, cwd=tmp_path, python=["-X", "importtime"])
    after = datetime.now(UTC)
    assert first.returncode == 0, first.stdout + first.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in first.stderr.splitlines() if line.startswith("import time")}
    assert not imported & {"feast", "great_expectations"}, "a passing nightly run imported Feast or Great Expectations"
    assert "online" in first.stdout, first.stdout
    days = read_manifest(repo.offline_path(HOP), "hop").completed()
    assert days == [first_day, first_day + timedelta(days=1)], (days, before, after)
    assert f"hop: {len(days)} partitions to compute: {spans(days)} (not computed yet)" in first.stdout
    assert f"hop: waiting for data: the source ends {(today - timedelta(days=1)):%Y-%m-%d} 23:" in first.stdout
    assert f"done: {len(days)} partitions of 1 group" in first.stdout
    before = datetime.now(UTC)
    again = run_job("--repo", str(repo.root), "--since-last", "--no-online", "--no-tracking", cwd=tmp_path)
    after = datetime.now(UTC)
    assert again.returncode == 0, again.stdout + again.stderr
    # Nothing to do: yesterday still waits for its data.
    assert "hop: up to date" in again.stdout, again.stdout
