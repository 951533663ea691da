"""The newcomer's path, from an empty folder: the README's definitions as they are printed (no Feast exports),
events written with plain pandas (`to_parquet`, nanosecond timestamps), a stray file that is not Parquet, then
`features apply` and `features backfill` as commands, and the values read back through Feast's own API,
against the brute-force reference of docs/semantics.md. (The apply runs the command's `main` in this process, its
check of the `where`s in the tests' session: the backfill is the command in a process of its own.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from reference import reference_frame
from test_cli import EXAMPLE_REPO, run

from features.cli import main
from features.repo import Repo
from features.stores import offline

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_definitions() -> str:
    """The first Python block of the README's "Defining features" section, verbatim."""
    section = README.read_text().split("## Defining features", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README lost its definitions example"
    return match.group(1)


def pandas_events(n: int = 240, seed: int = 7) -> pd.DataFrame:
    """Transactions as a newcomer builds them in pandas: datetime64[ns] times with sub-microsecond digits."""
    rng = np.random.default_rng(seed)
    start = pd.Timestamp("2026-01-01", tz="UTC")
    offsets = np.sort(rng.integers(0, 86_400 * 10**9, n))
    amounts = rng.gamma(2.0, 30.0, n).round(2)
    amounts[5] = np.nan  # a NaN is a null (docs/semantics.md, Nulls)
    return pd.DataFrame(
        {
            "txn_id": [f"t{i}" for i in range(n)],
            "user_id": rng.choice([f"u{i}" for i in range(6)], n),
            "merchant_id": rng.choice([f"m{i}" for i in range(9)], n),
            "amount": amounts,
            "status": rng.choice(["OK", "OK", "OK", "FAILED"], n),
            "event_ts": start + pd.to_timedelta(offsets, unit="ns"),
        }
    )


@pytest.mark.slow
@pytest.mark.spark
def test_newcomer_path_from_an_empty_folder(spark, tmp_path: Path, capsys, monkeypatch):
    root = tmp_path / "my_features"
    root.mkdir()
    shutil.copy(EXAMPLE_REPO / "feature_store.yaml", root / "feature_store.yaml")
    (root / "definitions.py").write_text(readme_definitions())
    events = pandas_events()
    assert events["event_ts"].dtype == "datetime64[ns, UTC]"
    landing = root / "data" / "transactions"
    landing.mkdir(parents=True)
    events.iloc[:100].to_parquet(landing / "part-1.parquet")  # tz-aware nanoseconds
    naive = events.iloc[100:].assign(event_ts=events["event_ts"].iloc[100:].dt.tz_localize(None))
    naive.to_parquet(landing / "part-2.parquet")  # naive nanoseconds (taken as UTC)
    events.iloc[:0].to_parquet(landing / "part-0-empty.parquet")  # 0 rows: its string columns typed null
    (landing / "notes.parquet").write_text("not parquet: a stray file in the landing folder\n")

    monkeypatch.chdir(tmp_path)
    status = main(["apply", "--repo", str(root)])
    applied = capsys.readouterr()
    assert status == 0, applied.out + applied.err
    assert "user_transactions" in applied.out

    done = run(
        "backfill", "--repo", str(root), "--start", "2026-01-01", "--end", "2026-01-02", "--no-tracking", cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"user_transactions: {len(events):,} events in" in done.stdout, done.stdout
    assert "1 unreadable_file" in done.stdout, done.stdout

    # The stray file is set aside with its reason; every good record was used (see the count above).
    quarantined = pd.read_parquet(next((root / "data" / "quarantine" / "user_transactions" / "records").iterdir()))
    assert len(quarantined) == 1, quarantined
    assert quarantined["source_file"].iloc[0].endswith("notes.parquet")
    assert quarantined["reason"].iloc[0].startswith("unreadable_file: "), quarantined["reason"].iloc[0]
    assert "not a Parquet file" in quarantined["reason"].iloc[0], quarantined["reason"].iloc[0]

    # Values through Feast, to the microsecond, against the reference.
    group = Repo.load(root).groups["user_transactions"]
    times = pd.date_range("2026-01-01 00:07", "2026-01-01 23:59", periods=9, tz="UTC")
    keys = sorted(events["user_id"].unique())
    lookups = [((k,), t) for k in keys for t in times]
    lookups.append(((events["user_id"].iloc[50],), events["event_ts"].iloc[50].ceil("us")))  # right at an event
    expected = reference_frame(events, group, lookups)
    entity_df = expected[["user_id"]].copy()
    entity_df["event_timestamp"] = expected["t"].to_numpy()
    from feast import FeatureStore

    refs = [f"user_transactions:{f.name}" for f in group.features]
    got = FeatureStore(repo_path=str(root)).get_historical_features(entity_df=entity_df, features=refs).to_df()
    got = got.sort_values(["user_id", "event_timestamp"]).reset_index(drop=True)
    expected = expected.sort_values(["user_id", "t"]).reset_index(drop=True)
    assert_values_are_the_reference(group, got, expected)


def assert_values_are_the_reference(group, got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """`got`'s values are the reference's, row for row, a null only where the reference has one. A row whose
    features are all null is Feast's "no row at or before the lookup time": every window was empty then, so it
    stands for 0 (counts, sums) and null (the rest)."""
    assert len(got) == len(expected)
    problems = []
    for i in range(len(expected)):
        no_row = all(pd.isna(got.loc[i, f.name]) for f in group.features)
        for feature in group.features:
            want, have = expected.loc[i, feature.name], got.loc[i, feature.name]
            if no_row:
                have = 0 if feature.aggregation.kind.empty_is_zero else None
            if pd.isna(want) or pd.isna(have):
                same = pd.isna(want) and pd.isna(have)
            else:
                same = bool(np.isclose(float(have), float(want), rtol=1e-9, atol=0))
            if not same:
                where = f"{expected.loc[i, 'user_id']} at {expected.loc[i, 't']}"
                problems.append(f"{feature.name} {where}: got {have!r}, want {want!r}")
    assert not problems, "\n".join(problems[:10])


# --- each case in-process, on the shared session ------------------------------------------------------------


def _group(source_path: Path, *, fmt: str = "parquet", schema: dict[str, str] | None = None):
    from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg

    source = EventSource(  # min_timestamp=None: a test event is stamped before 1970, to check the reads' unit
        name="events",
        path=str(source_path),
        format=fmt,
        timestamp="event_ts",
        watermark="10m",
        schema=schema,
        min_timestamp=None,
    )
    return FeatureGroup(
        name="g",
        entity=Entity("user", join_keys=["user_id"]),
        source=source,
        features=[
            Feature("n_1h", agg.count(), window=Hop("1h", every="5m")),
            Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
            Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        ],
    )


def _frame(users: list[str], amounts: list[float], stamps: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"user_id": users, "amount": amounts, "event_ts": pd.to_datetime(stamps, utc=True)})


SCHEMA = {"user_id": "string", "amount": "double", "event_ts": "timestamp"}


@pytest.mark.spark
@pytest.mark.parametrize(
    "declared, remote", [(False, False), (True, False), (True, True)], ids=["inferred", "declared", "remote"]
)
def test_every_readable_file_is_read_and_each_bad_one_set_aside(
    spark, tmp_path: Path, declared: bool, remote: bool, monkeypatch: pytest.MonkeyPatch
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from features.engine import files as files_module
    from features.engine.schema import nanosecond_read
    from features.engine.source import read_source

    if remote:  # files the driver cannot open, as on an object store: found by one read of every column
        monkeypatch.setattr(files_module, "_local_path", lambda uri: None)

    folder = tmp_path / "events"
    folder.mkdir()
    ns = _frame(["a", "b"], [1.0, 2.0], ["2026-01-01 00:00:00.123456789", "1969-12-31 23:59:59.999999999"])
    ns.to_parquet(folder / "1-aware.parquet")
    naive = _frame(["c"], [3.0], ["2026-01-01 01:00:00.000001999"])
    naive.assign(event_ts=naive["event_ts"].dt.tz_localize(None)).to_parquet(folder / "2-naive.parquet")
    micros = pa.table({"user_id": ["d"], "amount": [4.0], "event_ts": pa.array([1_767_229_200_000_007], pa.int64())})
    micros = micros.set_column(2, "event_ts", micros["event_ts"].cast(pa.timestamp("us", tz="UTC")))
    pq.write_table(micros, folder / "3-micros.parquet")  # Spark's and pyarrow's own unit
    _frame([], [], []).astype({"user_id": object}).to_parquet(folder / "0-empty.parquet")  # user_id typed null
    (folder / "4-stray.parquet").write_text("not parquet\n")
    wrong = pd.DataFrame({"user_id": ["e"], "amount": ["12.5"], "event_ts": ns["event_ts"].iloc[:1]})
    wrong.to_parquet(folder / "5-amount-as-text.parquet")
    no_rows = pa.table({"user_id": pa.array([], pa.string()), "amount": pa.array([], pa.string())})
    pq.write_table(no_rows.append_column("event_ts", pa.array([], pa.timestamp("us"))), folder / "6-no-rows.parquet")

    source = read_source(spark, _group(folder, schema=SCHEMA if declared else None), str(folder))
    got = source.events.selectExpr("user_id", "unix_micros(event_ts) AS us").toPandas().sort_values("user_id")
    rejected = {Path(r["source_file"]).name: r["reason"] for r in source.rejected.collect()}
    if remote and nanosecond_read(spark) == "long":
        # Spark 4.2 reads nanoseconds as integers, converted by the unit in each footer, which cannot be opened
        # here: those files are set aside with Spark's reason, not read with a wrong unit (docs/quality.md).
        for name in ("1-aware.parquet", "2-naive.parquet"):
            assert rejected.pop(name).startswith("unreadable_file: "), name
        assert got.to_dict("list") == {"user_id": ["d"], "us": [1_767_229_200_000_007]}
    else:
        assert got.to_dict("list") == {
            "user_id": ["a", "b", "c", "d"],  # every good record of every readable file, to the microsecond
            "us": [1_767_225_600_123_456, -1, 1_767_229_200_000_001, 1_767_229_200_000_007],
        }
    assert "not a Parquet file" in rejected.pop("4-stray.parquet")
    # The schema (declared, or the files' own) holds for every file: one whose amount is text does not fit it.
    reason = rejected.pop("5-amount-as-text.parquet")
    if remote:  # footers the driver cannot open: Spark's own read decides, and says why
        assert reason.startswith("unreadable_file: ") and "[amount]" in reason and "BINARY" in reason, reason
    else:  # set aside whole by its footer, before Spark reads it
        assert reason.startswith("nonconforming_file: "), reason
        assert "column 'amount' is string where the source schema has float64" in reason, reason
    assert rejected == {}


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_nan_is_null_and_an_infinite_value_is_quarantined(spark, tmp_path: Path, fmt: str):
    from features.engine.source import read_source

    folder = tmp_path / "events"
    folder.mkdir()
    if fmt == "json":
        (folder / "events.json").write_text(
            '{"user_id": "a", "amount": NaN, "event_ts": "2026-01-01T00:00:00Z"}\n'
            '{"user_id": "a", "amount": 2.0, "event_ts": "2026-01-01T00:01:00Z"}\n'
            '{"user_id": "b", "amount": Infinity, "event_ts": "2026-01-01T00:02:00Z"}\n'
            '{"user_id": "c", "amount": -Infinity, "event_ts": "2026-01-01T00:03:00Z"}\n'
        )
    else:
        frame = _frame(["a", "a", "b", "c"], [np.nan, 2.0, np.inf, -np.inf], ["2026-01-01"] * 4)
        frame.to_parquet(folder / "events.parquet")
    source = read_source(spark, _group(folder, fmt=fmt, schema=SCHEMA), str(folder))
    good = source.events.select("user_id", "amount").toPandas().sort_values("amount", na_position="first")
    assert good["user_id"].tolist() == ["a", "a"]
    assert good["amount"].isna().tolist() == [True, False]  # the NaN is a null, not a value
    rejected = sorted((r["reason"], r["user_id"]) for r in source.rejected.collect())
    assert rejected == [("infinite_value: amount", "b"), ("infinite_value: amount", "c")]


@pytest.mark.spark
def test_a_where_spark_cannot_resolve_fails_at_apply(spark, tmp_path: Path, capfd):
    from features import Feature, agg
    from features.errors import SchemaError
    from features.pipelines.registration import check_wheres

    folder = tmp_path / "repo" / "events"
    folder.mkdir(parents=True)
    _frame(["a"], [1.0], ["2026-01-01"]).to_parquet(folder / "events.parquet")
    group = _group(folder)
    bad = Feature("big_1h", agg.count(), window=group.features[0].window, where="amout > 100")
    group = type(group)(name=group.name, entity=group.entity, source=group.source, features=[*group.features, bad])
    repo = Repo(root=tmp_path / "repo", config={"project": "p"}, groups={group.name: group})
    with pytest.raises(SchemaError, match=r"Feature\('big_1h'\)\.where: Spark cannot use 'amout > 100'.*amount"):
        check_wheres(repo)
    assert "Traceback" not in capfd.readouterr().err  # no PySpark error log with a Java trace ahead of it


@pytest.mark.spark
def test_a_where_spark_accepted_is_not_checked_again_until_it_or_the_schema_changes(spark, tmp_path: Path):
    """`features apply` needs no JVM when every `where` passed before against the same schema; a changed `where`
    or source schema is checked again, and a column the group reads that the source lacks still fails."""
    from features import Feature, agg
    from features.errors import SchemaError
    from features.pipelines.registration import WHERE_CHECKS, check_wheres

    folder = tmp_path / "repo" / "events"
    folder.mkdir(parents=True)
    _frame(["a"], [1.0], ["2026-01-01"]).to_parquet(folder / "events.parquet")

    def repo_with(where: str, schema: dict[str, str] = SCHEMA, column: str = "amount") -> Repo:
        base = _group(folder, schema=schema)
        big = Feature("big_1h", agg.max(column), window=base.features[0].window, where=where)
        group = replace(base, features=[*base.features, big])
        return Repo(root=tmp_path / "repo", config={"project": "p"}, groups={group.name: group})

    starts: list[str] = []

    def session():
        starts.append("spark")
        return spark

    check_wheres(repo_with("amount > 100"), session)
    assert starts == ["spark"] and (tmp_path / "repo" / WHERE_CHECKS).exists()
    check_wheres(repo_with("amount > 100"), session)
    assert starts == ["spark"]  # the same expression over the same schema: no Spark
    check_wheres(repo_with("amount > 200"), session)
    assert starts == ["spark"] * 2  # a new expression
    check_wheres(repo_with("amount > 200", {**SCHEMA, "country": "string"}), session)
    assert starts == ["spark"] * 3  # a new source schema
    with pytest.raises(SchemaError, match=r"column 'amout' is not in source 'events'"):
        check_wheres(repo_with("amount > 200", column="amout"), session)
    with pytest.raises(SchemaError, match=r"Feature\('big_1h'\)\.where: Spark cannot use 'amout > 200'"):
        check_wheres(repo_with("amout > 200"), session)
    (tmp_path / "repo" / WHERE_CHECKS).write_text("not json")
    check_wheres(repo_with("amount > 100"), session)  # an unreadable record: checked again, recorded again
    assert starts == ["spark"] * 5
    check_wheres(repo_with("amount > 100"), session)
    assert starts == ["spark"] * 5


def test_whether_apply_needs_spark_is_decided_from_recorded_schemas_and_a_stale_record_means_yes(tmp_path: Path):
    """Before `features apply` records the schemas again it reads no source file, and a record made for another
    path (the source moved) asks for Spark instead of failing the apply that will record it again."""
    from dataclasses import replace as replaced

    from features.pipelines.registration import WHERE_CHECKS, _all_checked, _where_keys
    from features.repo import write_schema_record
    from features.spec import DType

    base = _group(tmp_path / "events")  # no declared schema, no files: only a record can tell the schema
    group = replace(base, features=[replaced(base.features[0], where="amount > 100"), *base.features[1:]])
    repo = Repo(root=tmp_path, config={"project": "p"}, groups={group.name: group})
    columns = {"user_id": DType.STRING, "amount": DType.FLOAT64, "event_ts": DType.TIMESTAMP}
    assert not _all_checked(repo)  # no record: Spark is needed
    (tmp_path / WHERE_CHECKS).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / WHERE_CHECKS).write_text(json.dumps({"checked": _where_keys(group, columns)}))
    write_schema_record(tmp_path, group.source, columns, files=1)
    assert _all_checked(repo)
    write_schema_record(tmp_path, _group(tmp_path / "moved").source, columns, files=1)
    assert not _all_checked(repo)  # the record is for another path: no ConfigError here, a check again


def test_silencing_spark_error_logs_leaves_later_spark_errors_intact() -> None:
    # A fresh process: whichever of quiet_spark_errors and PySpark creates the loggers first, PySpark's later
    # `logger.exception(..., errorClass=...)` must still work (a plain Logger made every later error a TypeError).
    code = (
        "from features.engine.schema import quiet_spark_errors\n"
        "from pyspark.logger import PySparkLogger\n"
        "with quiet_spark_errors():\n"
        "    pass\n"
        "for name in ('SQLQueryContextLogger', 'DataFrameQueryContextLogger'):\n"
        "    PySparkLogger.getLogger(name).exception('boom', errorClass='X', fragment='f')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.spark
def test_a_stream_reads_pandas_files_and_sets_unreadable_ones_aside(spark, feast_repo_factory, tmp_path: Path):
    """The stream reads what the backfill reads (pandas' nanosecond files, aware and naive, an empty file) to the
    same change points, and sets a stray file aside once, with its reason, while the good files stream on."""
    import features
    from features.pipelines.stream import stream

    root = tmp_path / "repo"
    landing = root / "data" / "transactions"
    landing.mkdir(parents=True)
    events = pandas_events()
    events.iloc[:120].to_parquet(landing / "part-1.parquet")
    (landing / "part-2-stray.parquet").write_text("not parquet: a stray file in the landing folder\n")
    naive = events.iloc[120:].assign(event_ts=events["event_ts"].iloc[120:].dt.tz_localize(None))
    naive.to_parquet(landing / "part-3.parquet")
    events.iloc[:0].to_parquet(landing / "part-4-empty.parquet")
    group = _group(Path("data/transactions"))
    feast_repo_factory(root, [group])
    repo = Repo.load(root)

    for _ in range(2):  # a restart finds the stray file again: still one record of it
        run = stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False)
        run.await_termination()
    [progress] = run.progress()
    records = sorted((root / "data" / "quarantine" / "g" / "records").glob("file-*"))
    assert len(records) == 1, records
    [record] = pd.read_parquet(records[0]).to_dict("records")
    assert record["source_file"].endswith("part-2-stray.parquet")
    assert record["reason"].startswith("unreadable_file: ") and "not a Parquet file" in record["reason"], record

    watermark = pd.Timestamp(progress.watermark)
    got = offline.read_pandas(repo.offline_path(group))
    got["window_end"] = pd.to_datetime(got["window_end"], utc=True).astype("datetime64[us, UTC]")
    want = features.preview(group, events, "2026-01-01", watermark.isoformat(), spark=spark)
    want["window_end"] = pd.to_datetime(want["window_end"], utc=True).astype("datetime64[us, UTC]")
    keys = ["user_id", "window_end"]
    got, want = (f.sort_values(keys, ignore_index=True) for f in (got, want))
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False, rtol=1e-9)
    sample = got.iloc[::5].reset_index(drop=True)
    lookups = [((k,), t) for k, t in zip(sample["user_id"], sample["window_end"], strict=True)]
    assert_values_are_the_reference(group, sample, reference_frame(events, group, lookups))


@pytest.mark.spark
def test_a_stream_of_microsecond_files_reads_them_once_and_names_a_later_nanosecond_file(
    spark, feast_repo_factory, tmp_path: Path
):
    """On a Spark without nanosecond types, a stream that starts on microsecond files reads each file once (no
    second read as integers); a pandas file landing later is set aside with the reason and the fix; a restart keeps
    to the checkpoint's choice, and `--reset` with a nanosecond file in the folder reads those too."""
    from features.engine.schema import nanosecond_read
    from features.pipelines.stream import stream

    root = tmp_path / "repo"
    landing = root / "data" / "transactions"
    landing.mkdir(parents=True)
    events = pandas_events()
    events.iloc[:100].to_parquet(landing / "part-1.parquet", coerce_timestamps="us", allow_truncated_timestamps=True)
    group = _group(Path("data/transactions"))
    feast_repo_factory(root, [group])
    repo = Repo.load(root)
    run = stream(repo, available_now=True, progress=False, tracking=False)
    run.await_termination()
    if nanosecond_read(spark) != "long":
        pytest.skip("this Spark reads nanoseconds as a type of its own: every file is read by one read only")
    query = next(iter(run.queries.values()))
    # One read of the file, not two; and the file's one row in the listing of the read of null-typed files.
    assert sum(p["numInputRows"] for p in query.recentProgress) == 100 + 1

    events.iloc[100:150].to_parquet(landing / "part-2.parquet")  # pandas' own nanoseconds
    stream(repo, available_now=True, progress=False, tracking=False).await_termination()
    [record] = [
        r
        for f in (root / "data" / "quarantine" / "g" / "records").glob("file-*")
        for r in pd.read_parquet(f).to_dict("records")
    ]
    assert record["source_file"].endswith("part-2.parquet")
    assert "nanosecond timestamps" in record["reason"] and 'coerce_timestamps="us"' in record["reason"], record
    assert "`features stream --reset`" in record["reason"] and "restart the stream" not in record["reason"]

    [first] = (root / "data" / "quarantine" / "g" / "records").glob("file-*")
    written = {p: p.stat().st_mtime_ns for p in first.rglob("*")}
    events.iloc[150:].to_parquet(landing / "part-3.parquet")
    restarted = stream(repo, available_now=True, progress=False, tracking=False)
    restarted.await_termination()
    records = list((root / "data" / "quarantine" / "g" / "records").glob("file-*"))
    assert len(records) == 2  # part-3 set aside too: the checkpoint's query reads microseconds alone, and keeps to it
    # The restart set aside part-3 alone: part-2's record is neither counted again nor rewritten.
    assert restarted.progress()[0].bad_records_total == 1
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*")} == written
    again = stream(repo, available_now=True, reset=True, progress=False, tracking=False)
    again.await_termination()
    assert again.status()["events"].sum() == len(events)  # every file, both kinds


def test_a_batch_in_which_no_bucket_ran_says_its_state_is_not_read_yet() -> None:
    """A batch whose only file was set aside runs no bucket: its line says the state is not read yet, not that it
    holds no panes (it is intact)."""
    from features.pipelines.stream.batch_progress import StreamProgress

    assert ", state not read yet, " in StreamProgress("g", batch_id=0).line()
    assert ", state 0 panes, " in StreamProgress("g", batch_id=1, state_rows=0).line()
    assert ", state 1,234 panes, " in StreamProgress("g", batch_id=2, state_rows=1234).line()
