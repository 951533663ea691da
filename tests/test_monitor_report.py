"""The monitoring report (features.pipelines.monitor_report drawn by features.plots) and the health of a group in
`features status` (features.pipelines.status), without Spark.

The statistics are recorded as a backfill records them (features.kernel.profile of feature rows per day,
features.stores.statistics.record_backfill), from generated feature rows: 6 days of 1,000 rows, amount_avg's mean
moved by one standard deviation from day 4 (SHIFT_DAY) on, every other feature unchanged. The report in a real
browser: tests/test_statistics.py (on a real backfill's statistics).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import build_feast_repo

from features import Entity, EventSource, Feature, FeatureGroup, Tumble, agg
from features.cli import main
from features.demo import write_events
from features.kernel.profile import QUANTILES, profile_days
from features.pipelines.monitor_report import monitor_report
from features.pipelines.status import status
from features.pipelines.stream import handoff
from features.plots import OTHER, FeatureSeries, GroupSeries, HealthItem, ReportPage
from features.repo import Repo
from features.spec import WINDOW_END
from features.stores.manifest import update
from features.stores.statistics import GroupDay, record_backfill, statistics_table

GROUP = FeatureGroup(
    "shop",
    Entity("customer", join_keys=["customer_id"]),
    EventSource("orders", path="data/orders", timestamp="event_ts"),
    [
        Feature("amount_avg", agg.avg("amount"), Tumble("1h")),
        Feature("status_last", agg.last("status"), Tumble("1h")),
        Feature("kind_hist", agg.histogram("kind"), Tumble("1h")),
        Feature("kinds_last3", agg.last_k("kind", 3), Tumble("1h")),
    ],
)
START = datetime(2026, 5, 1, tzinfo=UTC)
DAYS, ROWS, SHIFT_DAY = 6, 1000, 4
REFERENCE = {"reference_start": "2026-05-01", "reference_end": "2026-05-04"}  # days 0-2; judged: days 3-5


def feature_rows(seed: int = 11) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = DAYS * ROWS
    day = np.repeat(np.arange(DAYS), ROWS)
    ends = [START + timedelta(days=int(d), seconds=int(s)) for d, s in zip(day, rng.uniform(0, 86_399, n), strict=True)]
    kinds = rng.choice(["web", "app", "pos"], (n, 3))
    return pa.table(
        {
            WINDOW_END: pa.array(ends, pa.timestamp("us", "UTC")),
            "amount_avg": rng.normal(20.0, 4.0, n) + np.where(day >= SHIFT_DAY, 4.0, 0.0),
            "status_last": pa.array(
                [None if i % 10 == 0 else s for i, s in enumerate(rng.choice(["ok", "declined", "refund"], n))]
            ),
            "kind_hist": pa.array([[(k, 1) for k in set(row)] for row in kinds], pa.map_(pa.string(), pa.int64())),
            "kinds_last3": pa.array([list(row[: 1 + i % 3]) for i, row in enumerate(kinds)], pa.list_(pa.string())),
        }
    )


def recorded_repo(root: Path) -> tuple[Repo, pa.Table]:
    repo = Repo.load(build_feast_repo(root, [GROUP], apply=False))
    rows = feature_rows()
    profiles = profile_days(rows, WINDOW_END, [f.name for f in GROUP.features])
    first = (START.date() - date(1970, 1, 1)).days
    counts = {first + d: GroupDay(events_in=3 * ROWS, rows_out=ROWS, set_aside=d % 2) for d in range(DAYS)}
    record_backfill(statistics_table(repo.root, GROUP.name), profiles, counts, START, START + timedelta(days=DAYS))
    return repo, rows


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Repo, pa.Table]:
    return recorded_repo(tmp_path_factory.mktemp("report") / "repo")


class Sections(HTMLParser):
    """Each feature's section of a report: its attributes, and per picture (data-plot) the marks drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.features: dict[str, dict[str, str | None]] = {}
        self.marks: dict[str, dict[str, int]] = {}
        self.links: list[str] = []
        self.health: list[str] = []
        self._feature: str | None = None
        self._plot: str | None = None
        self._in_health = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.links += [v for k, v in attrs if k in ("href", "src") and v is not None]
        if tag == "section" and "fx-feature" in (found.get("class") or ""):
            self._feature = found["data-feature"] or ""
            self.features[self._feature], self.marks[self._feature] = found, {}
        elif tag == "svg" and self._feature is not None:
            self._plot = found["data-plot"] or ""
            self.marks[self._feature][self._plot] = 0
        elif "fx-mark" in (found.get("class") or "") and self._feature is not None and self._plot is not None:
            self.marks[self._feature][self._plot] += 1
        elif tag == "table" and found.get("class") == "fx-health":
            self._in_health = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._feature = None
        elif tag == "table":
            self._in_health = False

    def handle_data(self, data: str) -> None:
        if self._in_health and data.strip():
            self.health.append(data.strip())


def parsed(html: str) -> Sections:
    sections = Sections()
    sections.feed(html)
    return sections


def test_the_report_draws_every_feature_and_marks_the_drifted_one_from_its_day(recorded) -> None:
    repo, _ = recorded
    page = monitor_report(repo, **REFERENCE)
    found = parsed(page.document())
    assert set(found.features) == {f.name for f in GROUP.features}
    for name, marks in found.marks.items():  # every picture of every feature draws something
        assert set(marks) == {"distribution", "nulls", "drift"} and min(marks.values()) > 0, (name, marks)
    drifted = {name for name, attrs in found.features.items() if attrs["data-drifted"] == "true"}
    assert drifted == {"amount_avg"}
    [series] = [f for f in page.groups[0].features if f.name == "amount_avg"]
    assert series.drifted_from == START.date() + timedelta(days=SHIFT_DAY)
    assert "drifted from 2026-05-05" in page.document()
    kinds = {name: attrs["data-kind"] for name, attrs in found.features.items()}
    assert kinds == {"amount_avg": "numeric", "status_last": "categorical", "kind_hist": "map", "kinds_last3": "list"}
    document = page.document()
    assert "<circle" in document and not re.findall(
        r"<circle[^>]*>(?!<title>)", document
    )  # every point says its values
    # Nothing is fetched: the only links are to the report's own sections
    assert found.links and all(link.startswith("#") for link in found.links), found.links
    assert "last event" in found.health and "last backfill" in found.health
    # A notebook shows the same report (its style and script inside one element)
    assert page._repr_html_() in page.document() and page._repr_html_().startswith('<div class="fx-report">')


def test_the_pictures_hold_the_days_statistics(recorded) -> None:
    """The bands are the quantiles of each day's rows (within the sketch's 1%), the shares each value's share of
    the day's non-null rows, the null share the day's; the group's counts are the recorded ones."""
    repo, rows = recorded
    page = monitor_report(repo, **REFERENCE)
    [group] = page.groups
    frame = rows.to_pandas()
    frame["day"] = frame[WINDOW_END].dt.date
    by_name = {f.name: f for f in group.features}
    assert group.days == tuple(START.date() + timedelta(days=d) for d in range(DAYS))
    for i, (day, values) in enumerate(frame.groupby("day")):
        amounts = values["amount_avg"].to_numpy()
        expected = [np.quantile(amounts, q, method="inverted_cdf") for q in QUANTILES]
        assert by_name["amount_avg"].quantiles[i] == pytest.approx(expected, rel=0.01), day
        statuses = values["status_last"]
        assert by_name["status_last"].null_share[i] == pytest.approx(statuses.isna().mean())
        shares = dict((value, s[i]) for value, s in by_name["status_last"].shares)
        assert OTHER not in shares and sum(shares.values()) == pytest.approx(1.0)
        for value, share in statuses.dropna().value_counts(normalize=True).items():
            assert shares[value] == pytest.approx(share), (day, value)
        sizes = values["kinds_last3"].map(len).to_numpy()
        median = np.quantile(sizes, 0.5, method="inverted_cdf")
        assert by_name["kinds_last3"].quantiles[i][2] == pytest.approx(median, rel=0.01), day
    volume = dict(group.volume)
    assert volume["rows out"] == (ROWS,) * DAYS and volume["set aside"] == tuple(d % 2 for d in range(DAYS))
    assert "late" not in volume  # a backfill counts no late events


def test_monitor_writes_the_report_and_logs_it_with_its_run(recorded, tmp_path: Path, capsys) -> None:
    from mlflow import MlflowClient

    from features.ml.tracking import find_runs, tracking_uri

    repo, _ = recorded
    target = tmp_path / "out" / "monitor.html"
    args = ["--reference-start", "2026-05-01", "--reference-end", "2026-05-04", "--report", str(target)]
    assert main(["monitor", "--repo", str(repo.root), *args, "--json"]) == 1
    said = json.loads(capsys.readouterr().out)
    assert said["report"] == str(target) and target.read_text().startswith("<!DOCTYPE html>")
    [run] = find_runs(repo, kind="monitor").to_dict("records")
    assert run["status"] == "FINISHED" and run["metrics.shop.drifted_features"] == 1
    assert run["params.reference_start"] == "2026-05-01"
    client = MlflowClient(tracking_uri=tracking_uri(repo))
    logged = Path(client.download_artifacts(run["run_id"], "monitor", str(tmp_path / "artifacts")))
    assert (logged / "report.html").read_text() == target.read_text()
    assert json.loads((logged / "drift.json").read_text())["days"] == ["2026-05-04", "2026-05-07"]


def test_a_report_path_that_cannot_be_a_file_is_refused_first(recorded, tmp_path: Path, capsys) -> None:
    repo, _ = recorded
    base = ["monitor", "--repo", str(repo.root), "--no-tracking", "--reference-start", "2026-05-01"]
    assert main([*base, "--reference-end", "2026-05-04", "--report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--report: {tmp_path} is a folder" in err and f"--report {tmp_path / 'report.html'}" in err
    (tmp_path / "taken").write_text("")
    assert main([*base, "--reference-end", "2026-05-04", "--report", str(tmp_path / "taken" / "r.html")]) == 2
    assert f"--report: {tmp_path / 'taken'} is a file" in capsys.readouterr().err


def test_monitor_without_tracking_records_no_run(tmp_path: Path, capsys) -> None:
    repo, _ = recorded_repo(tmp_path / "repo")
    args = ["--reference-start", "2026-05-01", "--reference-end", "2026-05-04", "--no-tracking"]
    assert main(["monitor", "--repo", str(repo.root), *args]) == 1
    assert "drift found: shop.amount_avg from 2026-05-05" in capsys.readouterr().out
    assert not (repo.root / "data" / "mlflow.db").exists()


# ---------------------------------------------------------------------------------------------------------
# Health in `features status`


def test_health_says_the_last_event_backfill_and_whether_the_stream_is_alive(tmp_path: Path, capsys) -> None:
    repo = Repo.load(build_feast_repo(tmp_path / "repo", [GROUP], apply=False))
    events = {"customer_id": ["c1", "c2"], "event_ts": [START, START + timedelta(days=1, hours=6)]}
    write_events(
        pd.DataFrame({**events, "amount": [1.0, 2.0], "status": ["ok", "ok"], "kind": ["web", "app"]}),
        repo.source_path(GROUP),
        n_files=1,
    )
    done = datetime(2026, 5, 3, 8, 0, tzinfo=UTC)
    with update(repo.offline_path(GROUP), GROUP.name) as manifest:
        manifest.record(START.date(), "h", {}, 10, completed_at=done)
    [g] = status(repo, runs=0).groups
    assert g.health is not None
    assert (g.health.last_event, g.health.last_backfill, g.health.stream) == (events["event_ts"][1], done, "none")
    assert g.health.lag_seconds == 6 * 3600  # the newest event, 6 hours past the end of the last completed day
    text = "\n".join(status(repo, runs=0).lines())
    assert (
        "  health     last event 2026-05-02 06:00:00 UTC, last backfill 2026-05-03 08:00:00 UTC, "
        "lag 21,600s behind the newest event"
    ) in text

    checkpoint = Path(repo.checkpoint_path(GROUP))
    (checkpoint / "query").mkdir(parents=True)  # a stream that has not committed a micro-batch yet
    handoff.hold(checkpoint, live=True)
    try:
        [g] = status(repo, runs=0).groups
        assert g.health is not None and (g.health.stream, g.health.last_batch) == ("alive", None)
        handoff.note_stuck(checkpoint, ("2026-05-03 09:00:00 UTC", "stage 7"))
        assert main(["status", "--repo", str(repo.root), "--json"]) == 0
        [said] = json.loads(capsys.readouterr().out)["groups"]
        assert said["health"]["stream"] == "stuck" and said["health"]["stuck_since"] == "2026-05-03 09:00:00 UTC"
        assert main(["status", "--repo", str(repo.root)]) == 0
        assert "stream stuck since 2026-05-03 09:00:00 UTC, last batch none yet" in capsys.readouterr().out
    finally:
        handoff.release(checkpoint)
    [g] = status(repo, runs=0).groups
    assert g.health is not None and g.health.stream == "stopped"


def test_the_pictures_of_sparse_or_missing_days_and_odd_names() -> None:
    """A feature without statistics says so; a gap between days breaks the bands and lines (nothing is drawn across
    it); names are text, never markup."""
    day = START.date()
    gap = (day, day + timedelta(days=1), day + timedelta(days=3))
    band = (1.0, 2.0, 3.0, 4.0, 5.0)
    features = (
        FeatureSeries("<b>&new", "numeric", (), ()),
        FeatureSeries("gappy", "numeric", gap, (0.0, 0.5, 0.1), (band, band, band)),
    )
    health = (HealthItem("stream", "stuck since 2026-05-01 10:00:00 UTC", alarm=True),)
    group = GroupSeries("g<1>", gap, (("rows out", (5, None, 7)),), health, features)
    document = ReportPage("t", (), (day, day + timedelta(days=1)), (group,)).document()
    found = parsed(document)
    assert set(found.features) == {"<b>&new", "gappy"} and "<b>&new" not in document
    assert found.marks["<b>&new"] == {"distribution": 0, "nulls": 0, "drift": 0}
    assert document.count(">no data<") == 3 + 1  # and gappy's drift: no day judged
    gappy = document.split('data-feature="gappy"')[1]
    assert gappy.count("<polygon") == 2 * 2  # both bands over the first two days, both over the last alone
    assert "<td class=fx-alarm>stuck since 2026-05-01 10:00:00 UTC</td>" in document
