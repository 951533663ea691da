"""What request-time features cost (issue 67): the same requests and training sets with and without five of them.

`python bench/request_time.py [--labels 1000000] [--requests 2000] [--skip-spark] [--skip-online]`

On a demo-sized repo (feature_repo/fraud.py's definitions, generated transactions over 3 days, `user_transactions`
backfilled into both stores) with five request-time features reading its stored features (a ratio, a difference,
a flag, a row function, one of `request_time`):
  * online: `features serve` with one worker, one key per request, the group's five stored features asked
    alone and then with the five request-time features (their fields in the body); rounds of the two alternate,
    so that both see the same machine; p50 and p99 over all requests of each;
  * Spark: `training_set` of `--labels` Spark label rows (read from Parquet), the same features, with and without
    the five (computed by mapInPandas in the workers), consumed by Spark's noop sink; runs alternate, the
    fastest of each counts.
Required: each ratio (with / without) <= 1.3.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import write_feature_store_yaml  # noqa: E402

WORK = ROOT / "work-request-time"
REPO = WORK / "repo"
FRAUD = ROOT.parent / "feature_repo" / "fraud.py"
START = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 3
EVENTS = 200_000
USERS = 2_000
GROUP = "user_transactions"
REQUIRED = 1.3
NAMES = ["amount_vs_max_24h", "amount_minus_sum_1h", "many_failures", "share_of_lifetime", "hours_into_day"]
DEFINITIONS = '''
from features import RequestFeature

amount_vs_max_24h = RequestFeature(
    "amount_vs_max_24h",
    lambda amount, amount_max_24h: amount / amount_max_24h.where(amount_max_24h != 0),
    request={"amount": "double"},
    features=["user_transactions:amount_max_24h"],
    dtype="double",
)
amount_minus_sum_1h = RequestFeature(
    "amount_minus_sum_1h",
    lambda amount, amount_sum_1h: amount - amount_sum_1h,
    request={"amount": "double"},
    features=["user_transactions:amount_sum_1h"],
    dtype="double",
)
many_failures = RequestFeature(
    "many_failures",
    lambda failed_count_24h: failed_count_24h > 3,
    features=["user_transactions:failed_count_24h"],
    dtype="bool",
)
share_of_lifetime = RequestFeature(
    "share_of_lifetime",
    lambda merchants_24h, txn_count_lifetime: None if not txn_count_lifetime else merchants_24h / txn_count_lifetime,
    features=["user_transactions:merchants_24h", "user_transactions:txn_count_lifetime"],
    dtype="double",
    row=True,
)
hours_into_day = RequestFeature(
    "hours_into_day", lambda request_time: request_time.dt.hour + request_time.dt.minute / 60, dtype="double"
)
'''
STORED = ["amount_max_24h", "amount_sum_1h", "failed_count_24h", "merchants_24h", "txn_count_lifetime"]


def setup(labels: int, spark_too: bool) -> list[str]:
    from features.demo import generate_transactions, write_events
    from features.engine.session import get_spark
    from features.pipelines.backfill import backfill
    from features.pipelines.registration import apply
    from features.repo import Repo

    shutil.rmtree(WORK, ignore_errors=True)
    (REPO / "data").mkdir(parents=True)
    events = generate_transactions(EVENTS, USERS, START, DAYS, seed=17)
    write_events(events, REPO / "data" / "transactions", n_files=4)
    write_feature_store_yaml(REPO, "bench_request_time")
    shutil.copy(FRAUD, REPO / "fraud.py")
    (REPO / "request_time_defs.py").write_text(DEFINITIONS)
    apply(str(REPO))
    spark = get_spark("bench-request-time")
    backfill(Repo.load(REPO), START, START + timedelta(days=DAYS), [GROUP], spark=spark, progress=False, track=False)
    if spark_too:
        write_labels(spark, labels, sorted(events["user_id"].unique()))
    return sorted(events["user_id"].unique())


def write_labels(spark, rows: int, users: list[str]) -> None:
    """As bench/training.py writes them: a user by a hash of the row number, a time over the days, an amount."""
    from pyspark.sql import functions as F

    span_us = DAYS * 86_400 * 1_000_000
    start_us = int(START.timestamp() * 1_000_000)
    ids = spark.createDataFrame([(i, u) for i, u in enumerate(users)], "idx long, user_id string")
    base = spark.range(rows, numPartitions=max(2, rows // 1_000_000)).select(
        F.col("id"),
        F.pmod(F.xxhash64("id", F.lit(1)), F.lit(len(users))).alias("idx"),
        F.timestamp_micros(F.lit(start_us) + F.pmod(F.xxhash64("id", F.lit(2)), F.lit(span_us))).alias(
            "event_timestamp"
        ),
        (F.pmod(F.xxhash64("id", F.lit(3)), F.lit(10_000)) / 100).alias("amount"),
    )
    labels = base.join(F.broadcast(ids), "idx").orderBy("id").select("user_id", "event_timestamp", "amount")
    labels.write.mode("overwrite").parquet(str(WORK / "labels"))


def bench_spark(runs: int) -> dict[str, float]:
    import warnings

    from features.engine.session import get_spark
    from features.ml.training import training_set

    spark = get_spark("bench-request-time")
    labels = spark.read.parquet(str(WORK / "labels"))
    best = {"without": float("inf"), "with": float("inf")}
    for _ in range(runs):
        for kind in ("without", "with"):
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                asked = {"request_features": NAMES} if kind == "with" else {}
                frame = training_set(labels, [GROUP], REPO, log_lineage=False, **asked)
            frame.write.format("noop").mode("overwrite").save()
            best[kind] = min(best[kind], time.perf_counter() - started)
            print(f"spark {kind}: {time.perf_counter() - started:.2f} s", flush=True)
    return best


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_online(users: list[str], requests: int) -> dict[str, tuple[float, float]]:
    port = free_port()
    command = [sys.executable, "-m", "features.cli", "serve", "--repo", str(REPO), "--port", str(port)]
    log = (WORK / "serve.log").open("wb")
    server = subprocess.Popen([*command, "--workers", "1"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.3)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        rng = np.random.default_rng(5)
        times: dict[str, list[float]] = {"without": [], "with": []}
        features = [f"{GROUP}:{name}" for name in STORED]
        rounds = 20
        for r in range(rounds + 2):  # two rounds of warm-up: the worker loads the definitions at the first
            for kind in ("without", "with"):
                for _ in range(requests // rounds):
                    user = str(users[int(rng.integers(len(users)))])
                    body: dict[str, object] = {"features": features, "entities": {"user_id": [user]}}
                    if kind == "with":
                        body |= {"request_features": NAMES, "request": {"amount": [float(rng.gamma(2.0, 30.0))]}}
                    data = json.dumps(body).encode()
                    started = time.perf_counter()
                    connection.request("POST", "/get-online-features", data, {"Content-Type": "application/json"})
                    response = connection.getresponse()
                    answer = response.read()
                    elapsed = time.perf_counter() - started
                    if response.status != 200:
                        raise RuntimeError(answer[:500])
                    if r >= 2:
                        times[kind].append(elapsed)
        return {k: (float(np.percentile(v, 50)) * 1e3, float(np.percentile(v, 99)) * 1e3) for k, v in times.items()}
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--skip-online", action="store_true")
    args = parser.parse_args()
    users = setup(args.labels, not args.skip_spark)
    ok = True
    if not args.skip_online:
        online = bench_online(users, args.requests)
        ratio = online["with"][1] / online["without"][1]
        ok &= ratio <= REQUIRED
        print(
            f"online, 1 key, {args.requests:,} requests each: without p50 {online['without'][0]:.2f} ms p99 "
            f"{online['without'][1]:.2f} ms; with 5 request-time features p50 {online['with'][0]:.2f} ms p99 "
            f"{online['with'][1]:.2f} ms; p99 ratio {ratio:.2f} (required <= {REQUIRED})"
        )
    if not args.skip_spark:
        spark = bench_spark(args.runs)
        ratio = spark["with"] / spark["without"]
        ok &= ratio <= REQUIRED
        print(
            f"spark training set, {args.labels:,} label rows: without {spark['without']:.1f} s, with 5 request-time "
            f"features {spark['with']:.1f} s; ratio {ratio:.2f} (required <= {REQUIRED})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
