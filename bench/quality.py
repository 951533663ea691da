"""Validation and statistics cost: the same batch of about 500k feature rows, processed with and without them.

    python bench/quality.py [--events 820000] [--users 5000] [--repeats 5]

The batch is a backfill's: read the events, compute the change points of one range, write the offline table and
the online store. Three variants run the product's `backfill_group` on the same data in the same session, in
rounds whose order rotates, after a warm-up; the only differences are `validate` and `statistics` (the per-feature,
per-day statistics features.stores.statistics records). Required, medians of the rounds' ratios: validation alone /
neither <= 1.20; validation and statistics / neither <= 1.30.

Also printed, for scale: the validation time each run reported, and, on the rows written, the one-pass screen
alone and the same suite evaluated entirely by Great Expectations (`mode="full"`, what the screen avoids).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession

from features.demo import generate_transactions, write_events
from features.engine.session import get_spark
from features.pipelines.backfill import BackfillResult, backfill_group
from features.pipelines.options import BackfillOptions
from features.pipelines.registration import apply
from features.quality import derived_checks, validate_batch
from features.quality.profiling import profile_rows
from features.repo import Repo

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import write_feature_store_yaml
from results import update_section

START = datetime(2026, 1, 1, tzinfo=UTC)
REQUIRED = 1.20
REQUIRED_WITH_STATISTICS = 1.30
NEITHER, VALIDATION, BOTH = "neither", "validation", "validation + statistics"
VARIANTS = {NEITHER: (False, False), VALIDATION: (True, False), BOTH: (True, True)}

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


def make_repo(args: argparse.Namespace, work: Path) -> Repo:
    """A Feast repo in `work` (a fresh temporary folder: other benchmarks clear bench/work)."""
    root = work / "repo"
    (root / "events").mkdir(parents=True)
    frame = generate_transactions(args.events, args.users, START, args.days, seed=11)
    write_events(frame, root / "events", n_files=4)
    write_feature_store_yaml(root, "bench_quality")
    (root / "bench_groups.py").write_text(DEFINITIONS)
    apply(str(root))
    return Repo.load(root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=820_000)
    parser.add_argument("--users", type=int, default=5_000)
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    spark = get_spark("bench-quality")
    work = Path(tempfile.mkdtemp(prefix="features-bench-quality-"))
    try:
        return measure(args, spark, make_repo(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, spark: SparkSession, repo: Repo) -> int:
    group = repo.groups["user_activity"]
    # The batch: change points of the last day (the days before it are history its windows read).
    start, end = START + timedelta(days=args.days - 1), START + timedelta(days=args.days)

    def run(variant: str) -> BackfillResult:
        validate, stats = VARIANTS[variant]
        options = BackfillOptions(progress=False, validate=validate, statistics=stats)
        return backfill_group(spark, repo, group, start, end, options)

    # Warm-up of every variant (their Spark plans differ: the write computes the rows, or reads them cached): JIT,
    # file caches, Great Expectations' imports and Data Context, the Python workers of the statistics.
    for variant in VARIANTS:
        run(variant)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    reports = []
    names = list(VARIANTS)
    for i in range(args.repeats):
        for variant in names[i % 3 :] + names[: i % 3]:
            result = run(variant)
            times[variant].append(result.seconds)
            if variant != NEITHER:
                assert result.validation is not None and result.validation.success, result.summary()
                reports.append(result.validation)
    rows = reports[0].rows
    ratios = [w / wo for w, wo in zip(times[VALIDATION], times[NEITHER], strict=True)]
    both_ratios = [w / wo for w, wo in zip(times[BOTH], times[NEITHER], strict=True)]
    without, with_ = statistics.median(times[NEITHER]), statistics.median(times[VALIDATION])
    with_both = statistics.median(times[BOTH])
    validation_s = statistics.median(r.seconds for r in reports)

    # For scale, on the rows of the table just written (read from Parquet, as the backfill's staged rows are):
    # the one-pass screen alone, and the same suite evaluated entirely by Great Expectations.
    from features.stores.offline import read_table

    table = read_table(spark, repo.offline_path(group))
    assert table is not None
    batch = table.drop("date")
    scale = {}
    for mode in ("auto", "full"):
        best = float("inf")
        for _ in range(2):
            began = time.perf_counter()
            report = validate_batch(group, batch, range_start=start, mode=mode)
            best = min(best, time.perf_counter() - began)
            assert report.success, report.summary()
        scale[mode] = best
    best = float("inf")
    for _ in range(2):  # the statistics' pass, which the batch runs beside its offline commit
        began = time.perf_counter()
        profile_rows(group, batch)
        best = min(best, time.perf_counter() - began)
    scale["statistics"] = best

    ratio, both_ratio = statistics.median(ratios), statistics.median(both_ratios)
    lines = [
        f"`python bench/quality.py`: a batch of {rows:,} feature rows (change points of one day, "
        f"{len(group.features)} features, {len(derived_checks(group))} derived expectations), computed from "
        f"{args.events:,} generated events of {args.users:,} users and written to the offline table and the "
        f"SQLite online store by `backfill_group`: without validation or statistics, with validation, with both; "
        f"{args.repeats} rounds of the three (the order rotating) after a warm-up run of each; local Spark on "
        f"{spark.sparkContext.defaultParallelism} cores. "
        "Times are medians; all runs are listed.",
        "",
        "| run | seconds (median) | runs |",
        "|---|---|---|",
        f"| batch without validation or statistics | {without:.2f} | {', '.join(f'{t:.1f}' for t in times[NEITHER])} |",
        f"| batch with validation | {with_:.2f} | {', '.join(f'{t:.1f}' for t in times[VALIDATION])} |",
        f"| batch with validation and statistics | {with_both:.2f} | {', '.join(f'{t:.1f}' for t in times[BOTH])} |",
        f"| validation inside the batch, as reported | {validation_s:.2f} | |",
        f"| the statistics' pass alone on the written rows (`profile_rows`, best of 2) | {scale['statistics']:.2f} | |",
        f'| one-pass screen on the written rows (`mode="auto"`, best of 2) | {scale["auto"]:.2f} | |',
        f'| the suite in Great Expectations on the same rows (`mode="full"`, best of 2) | {scale["full"]:.2f} | |',
        "",
        "| ratio | value | required |",
        "|---|---|---|",
        f"| batch with validation / without either, median of the rounds ({', '.join(f'{r:.2f}' for r in ratios)}) "
        f"| {ratio:.3f}x | <= {REQUIRED:.2f}x |",
        f"| batch with validation and statistics / without either ({', '.join(f'{r:.2f}' for r in both_ratios)}) "
        f"| {both_ratio:.3f}x | <= {REQUIRED_WITH_STATISTICS:.2f}x |",
        f"| validation as reported / batch without | {validation_s / without:.3f} | |",
        f"| Great Expectations alone (`full`) / batch without | {scale['full'] / without:.3f} | |",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("Validation cost", body)
    return 0 if ratio <= REQUIRED and both_ratio <= REQUIRED_WITH_STATISTICS else 1


if __name__ == "__main__":
    sys.exit(main())
