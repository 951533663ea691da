"""Statistics recorded as backfills and streams write (features.stores.statistics), checked against a brute-force
computation over the offline table, and drift found by `features monitor` (features.pipelines.monitor) on
generated data with shifts injected from one day on.

The data: 60 users, about 4 events an hour each, for 5 days. From day 3 (SHIFT_DAY) on, x moves up by one standard
deviation of its hourly average, category "a" of cat falls from half of the events to a fifth, and y is null for
every event of 30% of the users (their hourly average of y is then null). z, kind and the counts never change.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from features import Entity, EventSource, Feature, FeatureGroup, Tumble, agg
from features.cli import main
from features.pipelines.backfill import backfill
from features.repo import Repo
from features.spec import WINDOW_END
from features.stores import offline
from features.stores.statistics import (
    GROUP_ROW,
    compact_stream_days,
    read_rows,
    read_statistics,
    statistics_table,
    to_date,
)

USER = Entity("user", join_keys=["user_id"])
SOURCE = EventSource("events", path="data/events", timestamp="event_ts")
GROUP = FeatureGroup(
    "monitored",
    USER,
    SOURCE,
    [
        Feature("x_avg", agg.avg("x"), Tumble("1h")),
        Feature("y_avg", agg.avg("y"), Tumble("1h")),
        Feature("z_avg", agg.avg("z"), Tumble("1h")),
        Feature("n_1h", agg.count(), Tumble("1h")),
        Feature("cat_last", agg.last("cat"), Tumble("1h")),
        Feature("kind_hist", agg.histogram("kind"), Tumble("1h")),
        Feature("kinds_last3", agg.last_k("kind", 3), Tumble("1h")),
    ],
)
START = datetime(2026, 3, 1, tzinfo=UTC)
DAYS = 5
SHIFT_DAY = 3  # 2026-03-04
SHIFTED = {"x_avg", "cat_last", "y_avg"}


def events(seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    users = [f"u{i:03d}" for i in range(60)]
    rows = []
    for i, user in enumerate(users):
        n = rng.poisson(4 * 24 * DAYS)
        offsets = np.sort(rng.uniform(0, DAYS * 86_400, n))
        rows.append(pd.DataFrame({"user_id": user, "offset": offsets, "null_y": i % 10 < 3}))
    frame = pd.concat(rows, ignore_index=True)
    n = len(frame)
    shifted = frame["offset"].to_numpy() >= SHIFT_DAY * 86_400
    frame["event_ts"] = START + pd.to_timedelta(frame["offset"], unit="s")
    frame["x"] = rng.normal(10.0, 2.0, n) + np.where(shifted, 1.0, 0.0)  # hourly average's sd: 2 / sqrt(4)
    y = rng.normal(50.0, 5.0, n)
    frame["y"] = np.where(shifted & frame["null_y"].to_numpy(), np.nan, y)
    frame["z"] = rng.normal(0.0, 1.0, n)
    before = rng.choice(["a", "b", "c"], n, p=[0.5, 0.3, 0.2])
    after = rng.choice(["a", "b", "c"], n, p=[0.2, 0.5, 0.3])
    frame["cat"] = np.where(shifted, after, before)
    frame["kind"] = rng.choice(["web", "app", "pos", "atm"], n, p=[0.4, 0.3, 0.2, 0.1])
    frame["event_ts"] = frame["event_ts"].dt.floor("us")
    return frame.drop(columns=["offset", "null_y"]).sort_values("event_ts").reset_index(drop=True)


@pytest.fixture(scope="module")
def monitored(spark, feast_repo_factory, tmp_path_factory) -> Repo:
    root = feast_repo_factory(tmp_path_factory.mktemp("statistics") / "repo", [GROUP], events())
    repo = Repo.load(root)
    backfill(repo, START, START + timedelta(days=DAYS), spark=spark, progress=False, track=False, online=False)
    return repo


def table_rows(repo: Repo) -> pd.DataFrame:
    frame = offline.read_pandas(repo.offline_path(GROUP))
    frame["day"] = pd.to_datetime(frame[WINDOW_END], utc=True).dt.date
    return frame


def brute_force(values: pd.Series) -> dict[str, object]:
    """A feature's statistics of one day computed from its values as the documentation defines them."""
    as_list = values.map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    first = next((v for v in as_list if v is not None), None)
    if isinstance(first, dict | list | np.ndarray):
        sizes = as_list.map(lambda v: 0 if v is None else len(v))
        present = sizes > 0
        numbers = sizes[present].astype(float).to_numpy()
    elif isinstance(first, str):
        present = as_list.notna()
        numbers = None
    else:
        present = as_list.notna()
        numbers = as_list[present].astype(float).to_numpy()
    out: dict[str, object] = {"rows": len(values), "nulls": int((~present).sum())}
    if numbers is not None and len(numbers):
        out.update(
            n=len(numbers),
            mean=float(numbers.mean()),
            std=float(numbers.std(ddof=1)) if len(numbers) > 1 else None,
            min=float(numbers.min()),
            max=float(numbers.max()),
        )
        out["quantiles"] = {q: float(np.quantile(numbers, q, method="inverted_cdf")) for q in (0.05, 0.5, 0.95)}
    if isinstance(first, dict):
        out["distinct"] = len({k for v in as_list if v for k in v})
        out["categories"] = pd.Series([k for v in as_list if v for k in v]).value_counts().to_dict()
    elif isinstance(first, list | np.ndarray):
        out["distinct"] = len({x for v in as_list if v is not None for x in v})
    elif isinstance(first, str):
        out["distinct"] = int(as_list[present].nunique())
        out["categories"] = as_list[present].value_counts().to_dict()
    else:
        out["distinct"] = int(np.unique(numbers).size) if numbers is not None else 0
    return out


def assert_statistics_of_the_table(repo: Repo) -> None:
    rows = table_rows(repo)
    recorded = read_statistics(statistics_table(repo.root, GROUP.name))
    assert {to_date(d) for d in recorded.days()} == set(rows["day"])
    for (day, name), profile in recorded.profiles.items():
        values = rows.loc[rows["day"] == to_date(day), name]
        expected = brute_force(values)
        where = f"{name} on {to_date(day)}"
        assert profile.rows == expected["rows"], where
        assert profile.nulls == expected["nulls"], where
        if "n" in expected:
            assert profile.n == expected["n"], where
            assert profile.mean == pytest.approx(expected["mean"], rel=1e-9, abs=1e-9), where
            if expected["std"] is not None:
                assert profile.std == pytest.approx(expected["std"], rel=1e-6), where
            assert (profile.low, profile.high) == (expected["min"], expected["max"]), where
            for q, value in expected["quantiles"].items():  # the sketch's stated error: 1% of the value
                assert profile.quantile(q) == pytest.approx(value, rel=0.01, abs=1e-12), f"{where}, q={q}"
        # HyperLogLog with 2^11 registers: about 2.3% standard error (exact for few values, by linear counting)
        assert profile.distinct() == pytest.approx(expected["distinct"], rel=0.07, abs=0.5), where
        if "categories" in expected:
            assert profile.categories == expected["categories"], where
    counts = recorded.counts
    per_day = rows.groupby("day").size()
    for day, n in per_day.items():
        assert counts[(day - date(1970, 1, 1)).days].rows_out == n


def test_recorded_statistics_equal_a_brute_force_computation_over_the_table(monitored) -> None:
    assert_statistics_of_the_table(monitored)
    recorded = read_statistics(statistics_table(monitored.root, GROUP.name))
    source = events()
    per_day = source.groupby(source["event_ts"].dt.date).size()
    for day, n in per_day.items():
        assert recorded.counts[(day - date(1970, 1, 1)).days].events_in == n
        assert recorded.counts[(day - date(1970, 1, 1)).days].set_aside == 0


def test_a_backfill_of_a_day_replaces_its_statistics(spark, monitored) -> None:
    table = statistics_table(monitored.root, GROUP.name)
    before = read_rows(table).num_rows
    day = START + timedelta(days=2)
    backfill(monitored, day, day + timedelta(days=1), spark=spark, progress=False, track=False, online=False)
    assert read_rows(table).num_rows == before  # the day's rows replaced, not added to
    assert_statistics_of_the_table(monitored)


@pytest.mark.parametrize("collected", [True, False], ids=["from the commit's rows", "by a pass of Spark"])
def test_both_ways_of_profiling_a_backfill_record_the_same(spark, monitored, monkeypatch, collected) -> None:
    """A local commit hands its collected rows to the statistics; a commit by Spark's writer collects none, and a
    pass of Spark's workers over the cached rows profiles them instead."""
    from features.quality import profiling
    from features.stores import driver_writes

    def fail(*args, **kwargs):
        raise AssertionError("profiled by a pass of Spark, not from the rows the commit collected")

    if collected:
        monkeypatch.setattr(profiling, "profile_rows", fail)
    else:
        monkeypatch.setattr(driver_writes, "_offer", lambda arrow: None)
    day = START + timedelta(days=1)
    backfill(monitored, day, day + timedelta(days=1), spark=spark, progress=False, track=False, online=False)
    assert_statistics_of_the_table(monitored)


# ---------------------------------------------------------------------------------------------------------
# Drift


def monitor(repo: Repo, capsys, *args: str) -> tuple[int, dict]:
    code = main(["monitor", "--repo", str(repo.root), "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def test_monitor_flags_exactly_the_shifted_features_from_the_day_of_the_shift(monitored, capsys) -> None:
    code, report = monitor(
        monitored, capsys, "--reference-start", "2026-03-01", "--reference-end", "2026-03-03", "--start", "2026-03-03"
    )
    assert code == 1
    flagged = {(d["feature"], d["date"]) for d in report["drift"] if d["drifted"]}
    shift = START.date() + timedelta(days=SHIFT_DAY)
    days = [str(shift + timedelta(days=i)) for i in range(DAYS - SHIFT_DAY)]
    assert flagged == {(f, d) for f in SHIFTED for d in days}
    judged = {(d["feature"], d["date"]) for d in report["drift"]}
    assert ("z_avg", "2026-03-03") in judged and ("kind_hist", "2026-03-05") in judged


def test_monitor_before_the_shift_finds_nothing(monitored, capsys) -> None:
    code, report = monitor(
        monitored,
        capsys,
        "--reference-start",
        "2026-03-01",
        "--reference-end",
        "2026-03-02",
        "--start",
        "2026-03-02",
        "--end",
        "2026-03-04",
    )
    assert code == 0, report
    assert report["drift"] and not any(d["drifted"] for d in report["drift"])


def test_monitor_usage_errors_exit_2(monitored, capsys) -> None:
    assert main(["monitor", "--repo", str(monitored.root), "--start", "2026-03-03"]) == 2
    assert "--reference-start" in capsys.readouterr().err
    args = ["--reference-start", "2026-03-03", "--reference-end", "2026-03-01"]
    assert main(["monitor", "--repo", str(monitored.root), *args]) == 2
    assert "--reference-end" in capsys.readouterr().err
    args = ["--reference-start", "2026-02-01", "--reference-end", "2026-02-03"]
    assert main(["monitor", "--repo", str(monitored.root), *args]) == 2
    assert "no statistics" in capsys.readouterr().err
    assert main(["monitor", "--repo", str(monitored.root), "--psi", "-1", *args]) == 2
    assert "--psi" in capsys.readouterr().err


def test_monitor_text_names_the_drifted_features(monitored, capsys) -> None:
    args = ["--reference-start", "2026-03-01", "--reference-end", "2026-03-03", "--start", "2026-03-04"]
    assert main(["monitor", "--repo", str(monitored.root), *args]) == 1
    out = capsys.readouterr().out
    assert "x_avg" in out and "DRIFT" in out and "z_avg" in out


def test_thresholds_come_from_the_definitions_and_flags_override_them(monitored) -> None:
    from dataclasses import replace

    from features import Drift
    from features.pipelines.monitor import monitor as run_monitor

    repo = Repo(monitored.root, monitored.config, {GROUP.name: replace(GROUP, drift=Drift(psi=50.0, js=0.99))})
    days = {"reference_start": "2026-03-01", "reference_end": "2026-03-03"}
    report = run_monitor(repo, **days)
    assert report.drift and not report.drifted
    assert {d.feature for d in run_monitor(repo, **days, psi=0.2).drifted} == SHIFTED
    assert {(d.psi_threshold, d.js_threshold) for d in report.drift} == {(50.0, 0.99)}


def test_the_reference_of_a_model_is_the_days_its_training_set_covered(monitored, capsys) -> None:
    import mlflow

    from features.ml.tracking import training_run

    with training_run(monitored, "train") as run:
        mlflow.set_tags(
            {
                "features.training.start": "2026-03-01T03:00:00+00:00",
                "features.training.end": "2026-03-02T22:00:00+00:00",
            }
        )
    code, report = monitor(monitored, capsys, "--reference-model", f"runs:/{run.info.run_id}")
    assert code == 1
    assert report["reference"] == ["2026-03-01", "2026-03-03"]
    assert {d["feature"] for d in report["drift"] if d["drifted"]} == SHIFTED
    assert main(["monitor", "--repo", str(monitored.root), "--reference-model", "runs:/0123456789abcdef"]) == 2
    assert "--reference-model" in capsys.readouterr().err


def test_the_group_rows_of_the_table(monitored) -> None:
    rows = read_rows(statistics_table(monitored.root, GROUP.name)).to_pandas()
    group_rows = rows[rows["feature"] == GROUP_ROW]
    assert set(group_rows["kind"]) == {"group"}
    assert len(group_rows) == DAYS


def test_a_stream_records_each_micro_batch_and_reads_merge_them(spark, feast_repo_factory, tmp_path) -> None:
    from features.pipelines.stream import stream

    all_events = events()
    few = all_events[all_events["event_ts"] < pd.Timestamp("2026-03-02 12:00", tz="UTC")]
    root = feast_repo_factory(tmp_path / "repo", [GROUP], few, n_files=4)
    repo = Repo.load(root)
    stream(repo, available_now=True, max_files_per_trigger=1, progress=False, tracking=False).await_termination()
    written = read_rows(statistics_table(repo.root, GROUP.name)).to_pandas()
    assert set(written["writer"]) == {"stream"}
    assert written["batch"].nunique() > 1 and written.groupby(["date", "feature"]).size().max() > 1
    assert_statistics_of_the_table(repo)
    recorded = read_statistics(statistics_table(repo.root, GROUP.name))
    assert sum(c.events_in for c in recorded.counts.values()) == len(few)
    # The stream's days merged into one row per (day, feature) read as the micro-batches' rows did.
    table = statistics_table(repo.root, GROUP.name)
    assert compact_stream_days(table, before=30_000) == len(written) - written.groupby(["date", "feature"]).ngroups
    compacted = read_rows(table).to_pandas()
    assert compacted.groupby(["date", "feature"]).size().max() == 1
    assert_statistics_of_the_table(repo)
    assert compact_stream_days(table, before=30_000) == 0


@pytest.mark.parametrize(
    ("args", "named", "fix"),
    [
        (["--reference-start", "2026-03-01"], "--reference-start and --reference-end", "--reference-end 2026-01-08"),
        (["--reference-start", "1 March", "--reference-end", "2026-03-02"], "--reference-start", "YYYY-MM-DD"),
        (["--reference-start", "2026-03-01", "--reference-end", "2026-03-01"], "--reference-end", "for one day"),
        (
            [
                "--reference-start",
                "2026-03-01",
                "--reference-end",
                "2026-03-02",
                "--start",
                "2026-03-04",
                "--end",
                "2026-03-03",
            ],
            "--end",
            "for one day",
        ),
        (["--reference-model", "m", "--reference-start", "2026-03-01"], "--reference-model", "keep one of them"),
        (["--reference-start", "2026-03-01", "--reference-end", "2026-03-02", "--js", "0"], "--js", "--js 0.1"),
        (["--reference-start", "2026-03-01", "--reference-end", "2026-03-02", "--min-rows", "0"], "--min-rows", "100"),
        (["--reference-start", "2026-03-01", "--reference-end", "2026-03-02", "--group", "nope"], "nope", ""),
    ],
)
def test_each_usage_error_names_the_flag_and_the_fix(monitored, capsys, args, named, fix) -> None:
    assert main(["monitor", "--repo", str(monitored.root), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err and fix in err, err


# ---------------------------------------------------------------------------------------------------------
# The report, in a browser

# Run first in the page (before its own script): the errors of every later script are kept.
CATCH_ERRORS = (
    "<script>window.fxErrors = []; addEventListener('error', e => fxErrors.push(String(e.message)));</script>"
)
# Run last, once the page has loaded: each feature's pictures and the size of the marks they drew, then which
# features the page's filter leaves shown for a name and for "drifted only"; written into the DOM as JSON.
MEASURE = """<script>addEventListener('load', () => {
  const size = e => { const b = e.getBoundingClientRect(); return [b.width, b.height]; };
  const features = {};
  for (const s of document.querySelectorAll('section.fx-feature')) {
    features[s.dataset.feature] = {drifted: s.dataset.drifted, plots: Object.fromEntries(
      [...s.querySelectorAll('svg.fx-plot')].map(p => [p.dataset.plot, {svg: size(p),
        marks: [...p.querySelectorAll('.fx-mark')].map(size)}]))};
  }
  const shown = () => [...document.querySelectorAll('section.fx-feature')].filter(s => !s.hidden)
    .map(s => s.dataset.feature).sort();
  const filter = document.querySelector('.fx-filter'), only = document.querySelector('.fx-only-drifted');
  filter.value = 'AVG'; filter.dispatchEvent(new Event('input'));
  const named = shown();
  filter.value = ''; filter.dispatchEvent(new Event('input'));
  only.checked = true; only.dispatchEvent(new Event('change'));
  const drifted = shown();
  const out = document.createElement('pre');
  out.id = 'fx-measured';
  out.textContent = JSON.stringify({features, named, drifted, errors: fxErrors});
  document.body.appendChild(out);
});</script>"""


def test_the_report_renders_every_feature_in_a_browser(monitored, tmp_path) -> None:
    """`features monitor --report` on the shifted data, opened in headless Chromium: every feature's three pictures
    drew marks of non-zero size, the shifted features are the ones marked drifted, the page's filter works and no
    script failed."""
    import html
    import re

    from chromium import chromium, render

    browser = chromium()
    report = tmp_path / "report.html"
    args = ["--reference-start", "2026-03-01", "--reference-end", "2026-03-03", "--no-tracking"]
    assert main(["monitor", "--repo", str(monitored.root), *args, "--report", str(report)]) == 1
    page = report.read_text()
    assert page.count("<head>") == 1 and "</body>" in page
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + CATCH_ERRORS).replace("</body>", MEASURE + "</body>"))
    dom = render(browser, probed.as_uri(), tmp_path / "chromium-profile")
    found = re.search(r'<pre id="fx-measured">(.*?)</pre>', dom, re.DOTALL)
    assert found is not None, dom[-3000:]
    measured = json.loads(html.unescape(found.group(1)))
    assert measured["errors"] == []
    features = measured["features"]
    assert set(features) == {f.name for f in GROUP.features}
    for name, seen in features.items():
        assert set(seen["plots"]) == {"distribution", "nulls", "drift"}, name
        for plot, drawn in seen["plots"].items():
            assert min(drawn["svg"]) > 0, (name, plot)
            assert any(w > 0 and h > 0 for w, h in drawn["marks"]), (name, plot, drawn["marks"][:5])
    assert {name for name, seen in features.items() if seen["drifted"] == "true"} == SHIFTED
    assert measured["named"] == ["x_avg", "y_avg", "z_avg"]
    assert measured["drifted"] == sorted(SHIFTED)
