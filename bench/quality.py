"""Validation cost: the same batch of about 500k feature rows, processed with and without validation.

    python bench/quality.py [--events 700000] [--users 5000] [--repeats 3]

The streaming engine does not exist yet, so a micro-batch is what it will do per trigger, done by the batch
backfill: read the events, compute the change points of one range, write the offline table and the online
store. Both variants run the product's `backfill_group` on the same data in the same session, alternating,
after a warm-up; the only difference is `validate=True/False`. Required: with / without <= 1.20.

Also printed, for scale: the validation time that run reported, and the same derived suite evaluated entirely
by Great Expectations on the same persisted rows (`mode="full"`, what the one-pass screen avoids).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from features.backfill import BackfillResult, backfill_group
from features.cli import apply
from features.demo import generate_transactions, write_events
from features.engine.session import get_spark
from features.quality import derived_checks, validate_batch
from features.repo import Repo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import update_section

WORK = Path(__file__).resolve().parent / "work" / "quality"
REPO = WORK / "repo"
START = datetime(2026, 1, 1, tzinfo=UTC)
REQUIRED = 1.20

# One group with every kind of derived check: counts, a distinct count, sums, an average with the min and
# max of the same window, a percentile, a lifetime count.
DEFINITIONS = """
from pathlib import Path

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg, to_feast

HERE = Path(__file__).resolve().parent
user = Entity("user", join_keys=["user_id"])
transactions = EventSource("transactions", path="events", timestamp="event_ts")
user_activity = FeatureGroup(
    "user_activity",
    user,
    transactions,
    [
        Feature("failed_count_24h", agg.count(), Hop("24h", every="5m"), where="status = 'FAILED'"),
        Feature("amount_sum_1h", agg.sum("amount"), Hop("1h", every="5m")),
        Feature("amount_avg_1h", agg.avg("amount"), Hop("1h", every="5m")),
        Feature("amount_min_1h", agg.min("amount"), Hop("1h", every="5m")),
        Feature("amount_max_1h", agg.max("amount"), Hop("1h", every="5m")),
        Feature("amount_p90_1h", agg.approx_percentile("amount", 0.9), Hop("1h", every="5m")),
        Feature("merchants_24h", agg.approx_count_distinct("merchant_id"), Hop("24h", every="1h")),
        Feature("txn_count_lifetime", agg.count(), Lifetime(every="1h")),
    ],
)
user_entity, user_activity_source, user_activity_view = to_feast(user_activity, repo_root=HERE)
"""


def make_repo(args: argparse.Namespace) -> Repo:
    shutil.rmtree(WORK, ignore_errors=True)
    (REPO / "events").mkdir(parents=True)
    frame = generate_transactions(args.events, args.users, START, args.days, seed=11)
    write_events(frame, REPO / "events", n_files=4)
    (REPO / "feature_store.yaml").write_text(
        "project: bench_quality\nprovider: local\nregistry: data/registry.db\n"
        "online_store:\n  type: sqlite\n  path: data/online_store.db\noffline_store:\n  type: duckdb\n"
        "entity_key_serialization_version: 3\n"
    )
    (REPO / "bench_groups.py").write_text(DEFINITIONS)
    apply(str(REPO))
    return Repo.load(REPO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=700_000)
    parser.add_argument("--users", type=int, default=5_000)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    spark = get_spark("bench-quality")
    repo = make_repo(args)
    group = repo.groups["user_activity"]
    # The batch: change points of the last day (the days before it are history its windows read).
    start, end = START + timedelta(days=args.days - 1), START + timedelta(days=args.days)

    def run(validate: bool) -> BackfillResult:
        return backfill_group(spark, repo, group, start, end, progress=False, validate=validate)

    run(True)  # warm-up: JIT, file caches, Great Expectations' imports and Data Context
    times: dict[bool, list[float]] = {True: [], False: []}
    reports = []
    for i in range(args.repeats):
        for validate in (False, True) if i % 2 == 0 else (True, False):
            result = run(validate)
            times[validate].append(result.seconds)
            if validate:
                assert result.validation is not None and result.validation.success, result.summary()
                reports.append(result.validation)
    rows = reports[0].rows
    without, with_ = statistics.median(times[False]), statistics.median(times[True])
    validation_s = statistics.median(r.seconds for r in reports)

    # For scale: the same suite evaluated entirely by Great Expectations on the same rows, persisted.
    from features.offline import read_table

    table = read_table(spark, repo.offline_path(group))
    assert table is not None
    persisted = table.drop("date").persist()
    persisted.count()
    began = time.perf_counter()
    full = validate_batch(group, persisted, range_start=start, mode="full")
    full_s = time.perf_counter() - began
    persisted.unpersist()

    ratio = with_ / without
    lines = [
        f"`python bench/quality.py`: a batch of {rows:,} feature rows (change points of one day, "
        f"{len(group.features)} features, {len(derived_checks(group))} derived expectations), computed from "
        f"{args.events:,} generated events of {args.users:,} users and written to the offline table and the "
        f"SQLite online store by `backfill_group`, with and without validation; local Spark on "
        f"{spark.sparkContext.defaultParallelism} cores; median of {args.repeats} alternating runs each, after "
        "a warm-up.",
        "",
        "| run | seconds (median) | runs |",
        "|---|---|---|",
        f"| batch without validation | {without:.2f} | {', '.join(f'{t:.1f}' for t in times[False])} |",
        f"| batch with validation | {with_:.2f} | {', '.join(f'{t:.1f}' for t in times[True])} |",
        f"| validation alone, as reported (one-pass screen) | {validation_s:.2f} | |",
        f"| the whole suite in Great Expectations (`mode=\"full\"`, for scale) | {full_s:.2f} | |",
        "",
        "| ratio | value | required |",
        "|---|---|---|",
        f"| batch with validation / without | {ratio:.3f}x | <= {REQUIRED:.2f}x |",
        f"| validation alone / batch without | {validation_s / without:.3f} | |",
        f"| Great Expectations alone / batch without | {full_s / without:.3f} | |",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("Validation cost", body)
    ok = ratio <= REQUIRED and full.success
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
