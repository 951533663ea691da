"""A source schema that holds over time: fixed by the definitions (declared, or inferred by `features apply` from
all the files and recorded in the repo), never by which file sorts first; a file that does not conform to it (a
column the group reads missing, or of a type that does not convert without loss) is set aside whole, one record
per file naming the file, the column, the type found and the fix; the backfill's summary line counts the files and
events set aside, and the table's manifest keeps the counts per day.

The two drifts reproduced, each through a backfill and through the stream:
(a) a stray 1-row file whose keys are text, sorting first by name, beside two good files of integer keys;
(b) a file in which `amount` is named `amt`.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg
from features.errors import ConfigError
from features.repo import Repo
from features.spec import DType
from features.stores import offline

DAY = "2026-01-01"


def _group(path: str = "data/transactions", *, where: str | None = None) -> FeatureGroup:
    return FeatureGroup(
        name="user_spend",
        entity=Entity("user", join_keys=["user_id"]),
        source=EventSource("transactions", path=path, timestamp="event_ts", watermark="10m"),
        features=[
            Feature("n_1h", agg.count(), window=Hop("1h", every="5m"), where=where),
            Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
            Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
        ],
    )


def _events(users: list, amounts: list[float], minutes: list[int], amount: str = "amount") -> pd.DataFrame:
    stamps = pd.Timestamp(DAY, tz="UTC") + pd.to_timedelta(minutes, unit="min")
    return pd.DataFrame({"user_id": users, amount: amounts, "event_ts": stamps})


GOOD_A = [
    _events([1, 2, 1], [10.0, 20.0, 30.0], [10, 20, 40]),
    _events([2, 3, 3], [40.0, 50.0, 60.0], [70, 80, 200]),
]
# The drifted files' events are hours after the good ones: were they read, they would move the watermark.
STRAY_A = _events(["7"], [5.0], [900])  # its keys are text: one row
GOOD_B = _events([1, 2, 1, 2], [10.0, 20.0, 30.0, 40.0], [10, 20, 40, 90])
RENAMED_B = _events([1, 2], [100.0, 200.0], [500, 600], amount="amt")


def _land_a(folder: Path) -> pd.DataFrame:
    """Drift (a): the stray file sorts first by name. Returns the good events."""
    folder.mkdir(parents=True, exist_ok=True)
    STRAY_A.to_parquet(folder / "0-stray.parquet")
    for i, frame in enumerate(GOOD_A, start=1):
        frame.to_parquet(folder / f"{i}-good.parquet")
    return pd.concat(GOOD_A, ignore_index=True)


def _land_b(folder: Path) -> pd.DataFrame:
    """Drift (b): a file in which `amount` is named `amt`. Returns the good events."""
    folder.mkdir(parents=True, exist_ok=True)
    GOOD_B.to_parquet(folder / "1-good.parquet")
    RENAMED_B.to_parquet(folder / "2-renamed.parquet")
    return GOOD_B


# --- inference from all the files (no Spark) -----------------------------------------------------------------


@pytest.mark.parametrize("stray_name", ["0-stray.parquet", "9-stray.parquet"])
def test_the_inferred_type_is_the_one_most_rows_fit_whatever_the_file_order(tmp_path: Path, stray_name: str):
    from features.parquet_schema import infer_parquet, infer_parquet_schema

    folder = tmp_path / "events"
    _land_a(folder)
    (folder / "0-stray.parquet").rename(folder / stray_name)
    inferred = infer_parquet_schema(str(folder), "EventSource('transactions')")
    assert inferred is not None and inferred.files == 3
    assert inferred.columns == {"user_id": DType.INT64, "amount": DType.FLOAT64, "event_ts": DType.TIMESTAMP}
    assert infer_parquet(str(folder), "x") == inferred.columns
    [conflict] = inferred.conflicts
    assert (conflict.column, conflict.recorded, conflict.fitting_files, conflict.fitting_rows) == (
        "user_id",
        DType.INT64,
        2,
        6,
    )
    assert [(m.file, m.type, m.rows) for m in conflict.misfits] == [(stray_name, "string", 1)]
    assert conflict.describe("EventSource('transactions')") == (
        "EventSource('transactions'): column 'user_id' has conflicting types across files: int64 in 2 files "
        f"(6 rows), string in 1 file (1 row: {stray_name}). Recorded int64 (the type most rows fit); every read "
        "sets the other files aside whole as nonconforming. Fix: rewrite those files with 'user_id' as int64, "
        "or declare the type you mean with schema= on the EventSource"
    )


def test_integers_that_fit_float64_exactly_widen_to_it_without_a_conflict(tmp_path: Path):
    from features.parquet_schema import infer_parquet_schema

    folder = tmp_path / "events"
    folder.mkdir()
    pq.write_table(pa.table({"amount": pa.array([1, 2, 3], pa.int32())}), folder / "a.parquet")
    pq.write_table(pa.table({"amount": pa.array([1.5], pa.float64())}), folder / "b.parquet")
    pq.write_table(pa.table({"amount": pa.array([None, None], pa.null())}), folder / "c.parquet")
    inferred = infer_parquet_schema(str(folder), "x")
    assert inferred is not None and inferred.columns == {"amount": DType.FLOAT64} and inferred.conflicts == ()


def test_a_column_some_files_lack_is_named_with_them(tmp_path: Path):
    from features.parquet_schema import infer_parquet_schema

    folder = tmp_path / "events"
    _land_b(folder)
    inferred = infer_parquet_schema(str(folder), "x")
    assert inferred is not None and inferred.missing == {"amount": ("2-renamed.parquet",), "amt": ("1-good.parquet",)}
    assert inferred.missing_note("EventSource('transactions')", "amount") == (
        "EventSource('transactions'): column 'amount' is missing from 1 file of 2 (2-renamed.parquet); every read "
        "sets them aside whole as nonconforming, as a group reads 'amount'. Fix: write 'amount' into those files, "
        "or move them out of the source folder"
    )
    assert inferred.missing_note("x", "user_id") is None


@pytest.mark.parametrize(
    "found, want, problem",
    [
        (pa.int32(), DType.FLOAT64, None),
        (pa.uint32(), DType.INT64, None),
        (pa.float32(), DType.FLOAT64, None),
        (pa.null(), DType.STRING, None),
        (pa.dictionary(pa.int32(), pa.string()), DType.STRING, None),
        (pa.large_string(), DType.STRING, None),
        (pa.timestamp("ns", tz="UTC"), DType.TIMESTAMP, None),
        (
            pa.int64(),
            DType.FLOAT64,
            "int64 converts to float64 exactly only below 2^53, so a 64-bit integer column is not read as float64",
        ),
        (
            pa.uint32(),
            DType.FLOAT64,
            "Spark's Parquet reader converts uint32 to float64 wrongly (values from 2^31 on come out negative)",
        ),
        (pa.uint64(), DType.INT64, "uint64 values above 2^63-1 do not fit int64"),
        (pa.string(), DType.INT64, "string does not convert to int64 without loss"),
        (pa.float64(), DType.INT64, "double does not convert to int64 without loss"),
        (pa.date32(), DType.TIMESTAMP, "date32[day] does not convert to timestamp without loss"),
    ],
)
def test_which_types_convert_without_loss(found: pa.DataType, want: DType, problem: str | None):
    from features.parquet_schema import conversion_problem

    assert conversion_problem(found, want) == problem


def test_a_file_conforms_when_every_column_the_group_reads_is_there_and_fits():
    from features.engine.files import nonconformity

    expected = {"event_ts": DType.TIMESTAMP, "user_id": DType.INT64, "amount": DType.FLOAT64}
    fits = pa.schema(
        [("User_ID", pa.int32()), ("amount", pa.float64()), ("event_ts", pa.timestamp("ns")), ("x", pa.string())]
    )
    assert nonconformity(fits, expected) is None  # names matched as Spark does, ignoring case; extra columns fine

    renamed = pa.schema([("user_id", pa.int64()), ("amt", pa.float64()), ("event_ts", pa.timestamp("us"))])
    misfit = nonconformity(renamed, expected)
    assert misfit is not None and (misfit.column, misfit.found) == ("amount", None)
    assert misfit.reason("/data/2-renamed.parquet") == (
        "nonconforming_file: /data/2-renamed.parquet: column 'amount' missing (found columns: amt, event_ts, "
        "user_id); fix: write 'amount' (float64) into the file, or move the file out of the source folder, then "
        "backfill its days again with --force"
    )
    texts = pa.schema([("user_id", pa.string()), ("amount", pa.float64()), ("event_ts", pa.timestamp("us"))])
    misfit = nonconformity(texts, expected)
    assert misfit is not None and (misfit.column, misfit.found) == ("user_id", "string")
    assert misfit.reason("/data/0-stray.parquet") == (
        "nonconforming_file: /data/0-stray.parquet: column 'user_id' is string where the source schema has int64 "
        "(string does not convert to int64 without loss); fix: rewrite the file with 'user_id' as int64, or move it "
        "out of the source folder (if int64 is not the type you mean, declare schema= on the EventSource), then "
        "backfill its days again with --force"
    )


@pytest.mark.parametrize(
    ("column", "native"),
    [
        (pa.array([1], pa.timestamp("us", tz="UTC")), True),
        (pa.array([1], pa.timestamp("ms", tz="UTC")), True),
        (pa.array([1], pa.timestamp("ns", tz="UTC")), False),  # nanoseconds: Spark's own read decides
        (pa.array([1], pa.timestamp("us")), False),  # no time zone: probed
    ],
)
def test_a_layout_spark_reads_as_it_is_needs_no_probe_read(tmp_path: Path, column: pa.Array, native: bool):
    """Files whose read columns Spark reads without a conversion are readable without a Spark job (which the
    check would otherwise run on one file of the layout); others are left to that read."""
    from pyspark.sql import types as T

    from features.engine.files import FileCheck, _footer

    schema = T.StructType(
        [
            T.StructField("user_id", T.LongType()),
            T.StructField("amount", T.DoubleType()),
            T.StructField("status", T.StringType()),
            T.StructField("event_ts", T.TimestampType()),
        ]
    )
    check = FileCheck(None, schema)  # type: ignore[arg-type]  # no session: a probe would fail
    table = pa.table(
        {"user_id": [1], "amount": [1.0], "status": ["x"], "event_ts": column, "extra": pa.array([1], pa.uint8())}
    )
    pq.write_table(table, tmp_path / "events.parquet")
    assert check._native(_footer(str(tmp_path / "events.parquet"))) is native
    narrow = table.set_column(0, "user_id", pa.array([1], pa.int32()))  # widened by Spark, or not: probed
    pq.write_table(narrow, tmp_path / "narrow.parquet")
    assert check._native(_footer(str(tmp_path / "narrow.parquet"))) is False
    if native:  # the check itself: the file is readable, and no read was made (there is no session to make one)
        assert check.unreadable([(tmp_path / "events.parquet").as_uri()]) == []


def test_the_columns_a_group_reads_include_those_its_wheres_name():
    from features.engine.schema import read_columns

    group = _group(where="`Status` = 'amt' AND merchant_id > 3")
    columns = ["user_id", "amount", "amt", "status", "merchant_id", "event_ts", "txn_id"]
    assert read_columns(group, columns) == ["event_ts", "user_id", "amount", "status", "merchant_id"]


def test_a_file_s_events_per_day(tmp_path: Path):
    from features.engine.files import file_days

    frame = _events([1, 2, 3], [1.0, 2.0, 3.0], [0, 1439, 1440])
    frame.to_parquet(tmp_path / "a.parquet")  # nanoseconds
    assert file_days(f"file://{tmp_path / 'a.parquet'}", "event_ts") == {date(2026, 1, 1): 2, date(2026, 1, 2): 1}
    assert file_days(str(tmp_path / "a.parquet"), "no_such_column") is None
    (tmp_path / "b.parquet").write_text("not parquet")
    assert file_days(str(tmp_path / "b.parquet"), "event_ts") is None


# --- the record in the repo (no Spark) ----------------------------------------------------------------------


def _repo(root: Path, group: FeatureGroup) -> Repo:
    root.mkdir(parents=True, exist_ok=True)
    return Repo(root=root, config={"project": "p"}, groups={group.name: group})


def test_apply_records_the_schema_and_warns_of_conflicts_naming_the_files(tmp_path: Path):
    from features.pipelines.registration import record_source_schemas
    from features.repo import recorded_schema, schema_record_path
    from features.stores.feast_objects import source_schema

    group = _group()
    repo = _repo(tmp_path / "repo", group)
    _land_a(tmp_path / "repo" / "data" / "transactions")
    [warning] = record_source_schemas(repo)
    assert "column 'user_id' has conflicting types" in warning and "0-stray.parquet" in warning, warning
    record = json.loads(schema_record_path(repo.root, "transactions").read_text())
    assert record["columns"] == {"user_id": "int64", "amount": "float64", "event_ts": "timestamp"}
    assert record["inferred_from_files"] == 3 and record["path"] == "data/transactions"
    stray = {"file": "0-stray.parquet", "type": "string", "rows": 1}
    assert record["conflicts"] == [{"column": "user_id", "recorded": "int64", "set_aside": [stray]}]
    # Later files do not move it: the record holds until the next apply.
    _events(["8", "9"] * 5, [1.0] * 10, list(range(10))).to_parquet(tmp_path / "repo/data/transactions/3-text.parquet")
    assert source_schema(group, repo.root)["user_id"] is DType.INT64
    assert recorded_schema(group.source, repo.source_path(group)) == {
        "user_id": DType.INT64,
        "amount": DType.FLOAT64,
        "event_ts": DType.TIMESTAMP,
    }


def test_a_missing_column_the_group_reads_is_a_warning_at_apply(tmp_path: Path):
    from features.pipelines.registration import record_source_schemas

    repo = _repo(tmp_path / "repo", _group())
    _land_b(tmp_path / "repo" / "data" / "transactions")
    assert record_source_schemas(repo) == [
        "EventSource('transactions'): column 'amount' is missing from 1 file of 2 (2-renamed.parquet); every read "
        "sets them aside whole as nonconforming, as a group reads 'amount'. Fix: write 'amount' into those files, "
        "or move them out of the source folder"
    ]


def test_a_record_that_cannot_be_used_says_to_apply_again(tmp_path: Path):
    from features.pipelines.registration import record_source_schemas
    from features.repo import read_schema_record, schema_record_path

    group = _group()
    repo = _repo(tmp_path / "repo", group)
    _land_b(tmp_path / "repo" / "data" / "transactions")
    record_source_schemas(repo)
    moved = _group("data/moved").source
    with pytest.raises(ConfigError) as raised:
        read_schema_record(repo.root, moved)
    assert str(raised.value) == (
        f"{schema_record_path(repo.root, 'transactions')}: the schema of EventSource('transactions') was recorded "
        "for path 'data/transactions', and the source now reads 'data/moved'. Fix: run `features apply --repo "
        f"{repo.root}` to infer the schema from the files and record it again"
    )
    schema_record_path(repo.root, "transactions").write_text('{"format": 1, "columns": {"user_id": "int"}}')
    with pytest.raises(ConfigError) as raised:
        read_schema_record(repo.root, group.source)
    assert str(raised.value) == (
        f"{schema_record_path(repo.root, 'transactions')}: not a readable schema record (ValueError: 'int' is not a "
        f"valid DType). Fix: run `features apply --repo {repo.root}` to infer the schema from the files and record "
        "it again"
    )


# --- what a backfill reports and records (no Spark) ---------------------------------------------------------


def test_the_summary_counts_the_files_and_events_set_aside():
    from features.engine.files import SetAsideFile
    from features.pipelines.backfill import BackfillResult

    start, end = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    stray = SetAsideFile("file:///d/0-stray.parquet", "nonconforming_file: /d/0-stray.parquet: column ...", 1)
    notes = SetAsideFile("file:///d/notes.parquet", "unreadable_file: not a Parquet file", 0)
    result = BackfillResult(
        "g",
        start,
        end,
        6,
        40,
        0,
        1.0,
        quarantined={stray.reason: 1, notes.reason: 1, "missing_key: user_id": 2},
        quarantine_path="/q",
        files_set_aside=(stray, notes),
    )
    assert result.summary() == (
        "g: 6 events in, 40 change points out for [2026-01-01T00:00:00+00:00, 2026-01-02T00:00:00+00:00), 0 keys "
        "online, 1.0s; 2 files set aside whole with 1 event (1 nonconforming_file: 0-stray.parquet; 1 "
        "unreadable_file: notes.parquet), 2 bad source records quarantined (2 missing_key: user_id) in /q"
    )
    assert result.events_set_aside == 1 and result.records_quarantined == 4


def test_the_manifest_keeps_what_each_day_set_aside(tmp_path: Path):
    from features.stores.manifest import read_manifest, set_aside_by_day, update

    with update(tmp_path, "g") as manifest:
        manifest.note_set_aside(date(2026, 1, 1), 1, 3, 2)
        manifest.note_set_aside(date(2026, 1, 2), 0, 0, 0)
    [(day, entry)] = set_aside_by_day(tmp_path, "g").items()
    assert (day, entry.files, entry.events, entry.records, entry.total_events) == (date(2026, 1, 1), 1, 3, 2, 5)
    with update(tmp_path, "g") as manifest:
        manifest.note_set_aside(date(2026, 1, 1), 0, 0, 0)  # a later backfill of the day set nothing aside
    assert set_aside_by_day(tmp_path, "g") == {} and read_manifest(tmp_path, "g").partitions == {}


# --- through a backfill and through the stream (Spark) -----------------------------------------------------


def _applied(root: Path, feast_repo_factory, land, capfd) -> tuple[Repo, pd.DataFrame, str]:
    good = land(root / "data" / "transactions")
    capfd.readouterr()
    feast_repo_factory(root, [_group()])
    return Repo.load(root), good, capfd.readouterr().err


def _offline(repo: Repo, group: FeatureGroup) -> pd.DataFrame:
    got = offline.read_pandas(repo.offline_path(group))
    got["window_end"] = pd.to_datetime(got["window_end"], utc=True).astype("datetime64[us, UTC]")
    return got.sort_values(["user_id", "window_end"], ignore_index=True)


def _expected(spark, group: FeatureGroup, good: pd.DataFrame, end: str) -> pd.DataFrame:
    import features

    want = features.preview(group, good, DAY, end, spark=spark)
    want["window_end"] = pd.to_datetime(want["window_end"], utc=True).astype("datetime64[us, UTC]")
    return want.sort_values(["user_id", "window_end"], ignore_index=True)


def _backfill_day(root: Path, spark) -> None:
    """What `features backfill --start DAY --end 2026-01-02 --no-online --no-tracking` runs, in this session."""
    from features.pipelines.schedule import execute, plan, request

    repo = Repo.load(root)
    execute(repo, plan(repo, request(start=DAY, end="2026-01-02")), spark=spark, online=False, track=False)


def _file_records(root: Path) -> list[dict]:
    folder = root / "data" / "quarantine" / "user_spend" / "records"
    frames = [pd.read_parquet(p) for p in sorted(folder.iterdir())] if folder.is_dir() else []
    return pd.concat(frames).to_dict("records") if frames else []


@pytest.mark.spark
@pytest.mark.parametrize("drift", ["a", "b"])
def test_a_backfill_sets_a_drifted_file_aside_whole_and_says_so(
    spark, feast_repo_factory, tmp_path: Path, capfd, drift: str
):
    root = tmp_path / "repo"
    repo, good, applied = _applied(root, feast_repo_factory, _land_a if drift == "a" else _land_b, capfd)
    bad_name, column, found = (
        ("0-stray.parquet", "user_id", "is string")
        if drift == "a"
        else (
            "2-renamed.parquet",
            "amount",
            "missing (found columns: amt, event_ts, user_id)",
        )
    )
    assert bad_name in applied and f"column {column!r}" in applied, applied  # apply warned, naming the file

    _backfill_day(root, spark)
    out = capfd.readouterr().out
    group = repo.groups["user_spend"]
    events = len(STRAY_A) if drift == "a" else len(RENAMED_B)
    assert f"user_spend: {len(good):,} events in" in out, out
    counted = f"{events} event{'s' if events > 1 else ''}"
    assert f"1 file set aside whole with {counted} (1 nonconforming_file: {bad_name})" in out, out

    [record] = _file_records(root)
    assert record["source_file"].endswith(bad_name)
    assert record["reason"].startswith(f"nonconforming_file: {root / 'data' / 'transactions' / bad_name}: "), record
    assert f"column {column!r} {found}" in record["reason"] and "; fix: " in record["reason"], record
    # Nothing of the file was used: the values are those of the good files alone.
    pd.testing.assert_frame_equal(_offline(repo, group), _expected(spark, group, good, "2026-01-02"), check_dtype=False)
    from features.stores.manifest import set_aside_by_day

    [(day, entry)] = set_aside_by_day(repo.offline_path(group), group.name).items()
    assert (day, entry.files, entry.events, entry.records) == (date(2026, 1, 1), 1, events, 0)


@pytest.mark.spark
@pytest.mark.parametrize("drift", ["a", "b"])
def test_the_stream_sets_a_drifted_file_aside_whole(spark, feast_repo_factory, tmp_path: Path, capfd, drift: str):
    from features.pipelines.stream import stream

    root = tmp_path / "repo"
    repo, good, _ = _applied(root, feast_repo_factory, _land_a if drift == "a" else _land_b, capfd)
    bad_name = "0-stray.parquet" if drift == "a" else "2-renamed.parquet"
    for _ in range(2):  # a restart finds the file again: still one record of it
        run = stream(repo, available_now=True, max_files_per_trigger=1, online=False, progress=False, tracking=False)
        run.await_termination()
    [record] = _file_records(root)
    assert record["source_file"].endswith(bad_name)
    assert record["reason"].startswith(f"nonconforming_file: {root / 'data' / 'transactions' / bad_name}: "), record

    group = repo.groups["user_spend"]
    [progress] = run.progress()
    watermark = pd.Timestamp(progress.watermark)
    # The newest good event less the source's 10 minutes: the drifted file's events moved nothing.
    assert watermark == good["event_ts"].max() - pd.Timedelta(minutes=10)
    want = _expected(spark, group, good, watermark.isoformat())
    pd.testing.assert_frame_equal(_offline(repo, group)[want.columns], want, check_dtype=False)


NOTED = {"user_id": "int64", "amount": "float64", "event_ts": "timestamp", "note": "string"}


def _land_nulls(folder: Path) -> pd.DataFrame:
    """A declared `note` (string) the group reads: a file of notes, one whose notes are all None (pandas writes
    the column as Arrow's null type), and one whose notes are integers. Returns the events of the first two."""
    folder.mkdir(parents=True, exist_ok=True)
    noted = _events([1, 2, 3], [10.0, 20.0, 70.0], [10, 20, 25]).assign(note=["a", None, "b"])
    blank = _events([1, 2, 3], [30.0, 40.0, 50.0], [30, 40, 50]).assign(note=[None, None, None])
    numbered = _events([3], [60.0], [60]).assign(note=[7])
    noted.to_parquet(folder / "1-noted.parquet")
    blank.to_parquet(folder / "2-blank.parquet")
    numbered.to_parquet(folder / "3-numbered.parquet")
    assert pq.read_schema(folder / "2-blank.parquet").field("note").type == pa.null()
    return pd.concat([noted, blank], ignore_index=True)


def _land_later_nulls(folder: Path) -> pd.DataFrame:
    """A file whose notes and amounts are all None: Spark's reader reads the amounts' null type as a double, not
    the notes' as a string; the file is read once all the same. Returns its events."""
    later = _events([2, 3], [0.0, 0.0], [45, 70]).assign(amount=[None, None], note=[None, None])
    later.to_parquet(folder / "4-later.parquet")
    assert pq.read_schema(folder / "4-later.parquet").field("amount").type == pa.null()
    return later


def _noted_group() -> FeatureGroup:
    source = EventSource("transactions", path="data/transactions", timestamp="event_ts", watermark="10m", schema=NOTED)
    base = _group()
    features = [*base.features, Feature("unnoted_1h", agg.count(), window=Hop("1h", every="5m"), where="note IS NULL")]
    return FeatureGroup(name=base.name, entity=base.entity, source=source, features=features)


@pytest.mark.parametrize(
    ("stamps", "micros"),
    [
        (pa.array([-1, 1_500_000_999, None], pa.timestamp("ns")), [-1, 1_500_000, None]),  # naive: UTC; floored
        (pa.array([-1, 2, None], pa.timestamp("ms", tz="Europe/Paris")), [-1_000, 2_000, None]),
        (pa.array([3, 0, None], pa.timestamp("s", tz="UTC")), [3_000_000, 0, None]),
    ],
)
def test_a_file_is_read_in_the_schema_s_arrow_types(stamps: pa.Array, micros: list):
    """What the read of a file holding a column as Arrow's null type makes of its columns: each in the schema's type
    as Spark's reader converts it (names matched ignoring case), times in microseconds truncated towards the past,
    a null-typed or missing column all nulls."""
    from features.engine.retype import retyped_columns

    table = pa.table(
        {
            "User_ID": pa.array([1, 2, None], pa.int32()),
            "amount": pa.array([1.5, None, 2.0], pa.float32()),
            "event_ts": stamps,
            "note": pa.nulls(3),
            "tag": pa.array(["x", None, "x"]).dictionary_encode(),
        }
    )
    utc = pa.timestamp("us", tz="UTC")
    fields = [
        pa.field("user_id", pa.int64()),
        pa.field("amount", pa.float64()),
        pa.field("event_ts", utc),
        pa.field("note", pa.string()),
        pa.field("tag", pa.string()),
        pa.field("flag", pa.bool_()),
    ]
    got = retyped_columns(table, fields)
    assert [c.type for c in got] == [f.type for f in fields]
    assert [c.to_pylist() for c in got[:2]] == [[1, 2, None], [1.5, None, 2.0]]
    assert got[2].cast(pa.int64()).to_pylist() == micros
    assert [c.to_pylist() for c in got[3:]] == [[None] * 3, ["x", None, "x"], [None] * 3]


def test_a_file_with_a_null_typed_column_is_read_apart_unless_it_does_not_conform(tmp_path: Path):
    """The check of landed files and the read of files holding a column as Arrow's null type decide alike: such a
    file is left to that read (nothing set aside, no Spark read), unless a column the group reads is missing, or
    a column it holds does not convert to the schema's type, read by the group or not."""
    from pyspark.sql import types as T

    from features.engine.files import FileCheck
    from features.engine.schema import READ

    types = {"user_id": T.LongType(), "amount": T.DoubleType(), "event_ts": T.TimestampType(), "note": T.StringType()}
    read = [T.StructField(c, t, True, {READ: True}) for c, t in types.items()]
    schema = T.StructType([*read, T.StructField("tag", T.StringType())])  # a column the group does not read
    blank = _events([1], [1.0], [10]).assign(note=[None], tag=["x"])
    files = {
        "blank": blank,
        "no-amount": blank.drop(columns="amount"),
        "tag-number": blank.assign(tag=[7]),  # `tag`, which the group does not read, holds an integer
    }
    for name, frame in files.items():
        frame.to_parquet(tmp_path / f"{name}.parquet")
    check = FileCheck(None, schema, nulls=True)  # type: ignore[arg-type]  # no session: a probe would fail
    bad = check.unreadable([(tmp_path / f"{name}.parquet").as_uri() for name in files])
    reasons = {Path(file).name: reason for reason, file in bad}
    assert sorted(reasons) == ["no-amount.parquet", "tag-number.parquet"], reasons
    assert "column 'amount' missing" in reasons["no-amount.parquet"]
    assert "column 'tag' is int64 where the source schema has string" in reasons["tag-number.parquet"]


@pytest.mark.spark
def test_a_stream_from_before_the_read_of_null_typed_columns_names_the_fix(spark, tmp_path: Path):
    """A stream whose checkpoint started without the read of such files sets one aside, saying how to read it."""
    from features.engine.files import NULLS_LATE, FileCheck
    from features.engine.schema import spark_schema

    _events([1], [1.0], [10]).assign(note=[None]).to_parquet(tmp_path / "blank.parquet")
    schema = spark_schema({c: DType(t) for c, t in NOTED.items()}, NOTED)
    [(reason, _)] = FileCheck(spark, schema, nulls=False).unreadable([(tmp_path / "blank.parquet").as_uri()])
    assert reason.startswith("unreadable_file: ") and reason.endswith(f"; {NULLS_LATE}"), reason
    assert "`features stream --reset`" in NULLS_LATE


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["backfill", "stream"])
def test_a_column_of_nulls_alone_fits_its_declared_type(spark, feast_repo_factory, tmp_path: Path, capfd, engine: str):
    """pandas writes a column of None alone as Arrow's null type: a backfill and a stream read its file's events
    once (the column as nulls of the declared type), beside the other files; only a column of another type is set
    aside, with its reason. The stream reads such a file landing after a restart too, and no file twice."""
    from features.pipelines.stream import stream

    root = tmp_path / "repo"
    folder = root / "data" / "transactions"
    good = _land_nulls(folder)
    feast_repo_factory(root, [_noted_group()])
    repo = Repo.load(root)
    group = repo.groups["user_spend"]
    capfd.readouterr()
    if engine == "backfill":
        good = pd.concat([good, _land_later_nulls(folder)], ignore_index=True)
        _backfill_day(root, spark)
        out = capfd.readouterr().out
        assert f"user_spend: {len(good)} events in" in out, out
        assert "1 file set aside whole with 1 event (1 nonconforming_file: 3-numbered.parquet)" in out, out
        end = "2026-01-02"
    else:
        options = {"available_now": True, "online": False, "progress": False}
        stream(repo, tracking=False, **options).await_termination()
        good = pd.concat([good, _land_later_nulls(folder)], ignore_index=True)  # lands before a restart
        run = stream(repo, tracking=False, **options)
        run.await_termination()
        [progress] = run.progress()
        end = pd.Timestamp(progress.watermark).isoformat()
        assert not list(Path(repo.late_path(group)).rglob("*.json")), "no event is late"
    [record] = _file_records(root)  # nothing else is set aside
    assert record["source_file"].endswith("3-numbered.parquet")
    assert record["reason"].startswith("nonconforming_file: ") and "column 'note' is int64" in record["reason"], record
    want = _expected(spark, group, good, end)
    assert want["unnoted_1h"].max() == 3, want  # user 2: a None note in each file read, at 20, 40 and 45 min
    pd.testing.assert_frame_equal(_offline(repo, group)[want.columns], want, check_dtype=False)


@pytest.mark.spark
def test_a_file_landing_after_the_stream_started_is_left_out_as_it_lands(spark, feast_repo_factory, tmp_path: Path):
    """The stream decides each file as it lands, not once at its start: a renamed column arriving later is set
    aside too, and none of its events reach the state."""
    from features.pipelines.stream import stream

    root = tmp_path / "repo"
    landing = root / "data" / "transactions"
    landing.mkdir(parents=True)
    GOOD_B.to_parquet(landing / "1-good.parquet")
    feast_repo_factory(root, [_group()])
    repo = Repo.load(root)
    run = stream(repo, available_now=True, online=False, progress=False, tracking=False)
    run.await_termination()
    RENAMED_B.to_parquet(landing / "2-renamed.parquet")
    run = stream(repo, available_now=True, online=False, progress=False, tracking=False)
    run.await_termination()
    [record] = _file_records(root)
    assert record["source_file"].endswith("2-renamed.parquet") and "column 'amount' missing" in record["reason"]
    group = repo.groups["user_spend"]
    [progress] = run.progress()
    want = _expected(spark, group, GOOD_B, pd.Timestamp(progress.watermark).isoformat())
    pd.testing.assert_frame_equal(_offline(repo, group)[want.columns], want, check_dtype=False)


@pytest.mark.spark
def test_a_read_stopped_midway_says_nothing_about_the_file(spark, tmp_path: Path):
    """A stream being stopped interrupts the file check it is running: that error must not set a good file aside
    as unreadable (it did, once, in the soak). A cancelled job is a stop; a file that is not Parquet is not, even
    one whose name says "cancelled"."""
    import threading

    from features.engine.schema import interrupted

    slow = spark.range(0, 2, 1, 2).selectExpr("reflect('java.lang.Thread', 'sleep', cast(20000 as bigint)) AS s")
    threading.Timer(1.5, spark.sparkContext.cancelAllJobs).start()
    with pytest.raises(Exception) as stopped:
        slow.collect()
    assert interrupted(stopped.value), stopped.value
    notes = tmp_path / "cancelled_orders.parquet"
    notes.write_text("not parquet")
    with pytest.raises(Exception) as broken:
        spark.read.parquet(str(notes)).collect()
    assert not interrupted(broken.value), broken.value


@pytest.mark.spark
def test_the_files_of_a_read_are_listed_in_one_call_as_spark_lists_them(spark, tmp_path) -> None:
    """features.engine.files.input_files: the names Spark's `inputFiles` gives, however many, and a name holding a
    line break (which the one call's joined text cannot carry) too."""
    from features.engine.files import input_files

    folder = tmp_path / "landed"
    folder.mkdir()
    for i in range(30):
        pd.DataFrame({"a": [i]}).to_parquet(folder / f"part-{i:03d}.parquet")
    read = spark.read.schema("a long").parquet(str(folder))
    assert len(input_files(read)) == 30
    assert sorted(input_files(read)) == sorted(read.inputFiles())
    pd.DataFrame({"a": [99]}).to_parquet(folder / "two\nlines.parquet")
    read = spark.read.schema("a long").parquet(str(folder))
    assert sorted(input_files(read)) == sorted(read.inputFiles())
    assert len(input_files(read)) == 31
