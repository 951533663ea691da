"""What request-time features cost (issue 67): the same requests and training sets with and without the five of
the example repo (feature_repo/fraud.py: this amount against the user's 24h average and maximum, seconds since the
card's last transaction, whether the merchant is new for the user in 30 days, this hour's attempts against the
usual rate: four vectorized, one row function).

`python bench/request_time.py [--labels 1000000] [--requests 2000] [--skip-spark] [--skip-online]`

On a demo-sized repo (feature_repo/fraud.py, generated transactions over 3 days, `user_transactions` and
`card_activity` backfilled into both stores). "Without" asks for the six stored features the five read; "with"
asks for the same and the five:
  * HTTP: `features serve` with one worker, 1 and 100 (user, card) keys per request, the five through
    `request_features` and their fields in `request`;
  * SDK: Feast's `FeatureStore.get_online_features(...).to_dict()` in this process, the five as the on-demand
    feature views `features apply` registers (their fields and the request time in the entity rows); for "with",
    how much of it is Feast's on-demand step and how much the five views' calls into this package within it;
  rounds of "without" and "with" alternate, so that both see the same machine; p50 and p99 over all requests of
  each, timed from the request sent (its rows and body made before) to its answer read; and the five functions
  alone, on inputs already typed (what no implementation can take out);
  * Spark: `training_set` of `--labels` Spark label rows (read from Parquet), the six stored features, with and
    without the five (computed in Spark's Python workers), consumed by Spark's noop sink; runs alternate, the
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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

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
GROUPS = ["user_transactions", "card_activity"]
REQUIRED = 1.3
NAMES = ["amount_vs_avg_24h", "amount_vs_max_24h", "seconds_since_card_txn", "merchant_new_30d", "attempts_vs_usual_1h"]
STORED = [
    "user_transactions:amount_avg_24h",
    "user_transactions:amount_max_24h",
    "user_transactions:merchants_30d",
    "user_transactions:attempts_1h",
    "user_transactions:attempts_30d",
    "card_activity:last_txn_at",
]
ROUNDS = 20


def setup(labels: int, spark_too: bool) -> pd.DataFrame:
    """The repo, applied and backfilled; the (user, card, merchant) triples of its events."""
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
    apply(str(REPO))
    spark = get_spark("bench-request-time")
    backfill(Repo.load(REPO), START, START + timedelta(days=DAYS), GROUPS, spark=spark, progress=False, track=False)
    keys = events[["user_id", "card_id", "merchant_id"]].drop_duplicates().reset_index(drop=True)
    if spark_too:
        write_labels(spark, labels, keys)
    return keys


def write_labels(spark, rows: int, keys: pd.DataFrame) -> None:
    """As bench/training.py writes them: keys by a hash of the row number, a time over the days, an amount."""
    from pyspark.sql import functions as F

    span_us = DAYS * 86_400 * 1_000_000
    start_us = int(START.timestamp() * 1_000_000)
    ids = spark.createDataFrame(keys.reset_index().rename(columns={"index": "idx"}))
    base = spark.range(rows, numPartitions=max(2, rows // 1_000_000)).select(
        F.col("id"),
        F.pmod(F.xxhash64("id", F.lit(1)), F.lit(len(keys))).alias("idx"),
        F.timestamp_micros(F.lit(start_us) + F.pmod(F.xxhash64("id", F.lit(2)), F.lit(span_us))).alias(
            "event_timestamp"
        ),
        (F.pmod(F.xxhash64("id", F.lit(3)), F.lit(10_000)) / 100).alias("amount"),
    )
    labels = base.join(F.broadcast(ids), "idx").orderBy("id")
    labels.select("user_id", "card_id", "merchant_id", "event_timestamp", "amount").write.mode("overwrite").parquet(
        str(WORK / "labels")
    )


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
                frame = training_set(labels, STORED, REPO, log_lineage=False, **asked)
            frame.write.format("noop").mode("overwrite").save()
            best[kind] = min(best[kind], time.perf_counter() - started)
            print(f"spark {kind}: {time.perf_counter() - started:.2f} s", flush=True)
    return best


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alternating(requests: int, prepared: Callable[[str], Callable[[], object]]) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of the requests `prepared(kind)` makes for "without" and "with", in alternating rounds (two
    of warm-up); each request is built before its clock starts (the client's pandas work is no request's time)."""
    times: dict[str, list[float]] = {"without": [], "with": []}
    for r in range(ROUNDS + 2):
        for kind in ("without", "with"):
            for _ in range(requests // ROUNDS):
                ask = prepared(kind)
                started = time.perf_counter()
                ask()
                if r >= 2:
                    times[kind].append(time.perf_counter() - started)
    return {k: (float(np.percentile(v, 50)) * 1e3, float(np.percentile(v, 99)) * 1e3) for k, v in times.items()}


def picks(keys: pd.DataFrame, count: int, rng: np.random.Generator) -> pd.DataFrame:
    """`count` (user, card, merchant) triples and an amount each: one request's rows."""
    rows = keys.iloc[rng.integers(len(keys), size=count)].reset_index(drop=True)
    return rows.assign(amount=np.round(rng.gamma(2.0, 30.0, size=count), 2))


def bench_http(keys: pd.DataFrame, requests: int, count: int) -> dict[str, tuple[float, float]]:
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

        def prepared(kind: str) -> Callable[[], None]:
            rows = picks(keys, count, rng)
            body: dict[str, object] = {
                "features": STORED,
                "entities": {"user_id": rows["user_id"].tolist(), "card_id": rows["card_id"].tolist()},
            }
            if kind == "with":
                fields = {"amount": rows["amount"].tolist(), "merchant_id": rows["merchant_id"].tolist()}
                body |= {"request_features": NAMES, "request": fields}
            payload = json.dumps(body)

            def ask() -> None:
                connection.request("POST", "/get-online-features", payload, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                if response.status != 200:
                    raise RuntimeError(answer[:500])

            return ask

        return alternating(requests, prepared)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def bench_sdk(keys: pd.DataFrame, requests: int, count: int) -> dict[str, tuple[float, float]]:
    """Also, for "with", the p50 (ms) of Feast's on-demand step (its answer to Python values, each view called,
    its values to protobuf) and of the five views' calls into this package within it ("step", "views")."""
    import feast.utils
    from feast import FeatureStore

    import features.stores.feast_request as feast_request

    store = FeatureStore(repo_path=str(REPO))
    rng = np.random.default_rng(6)
    on_demand = [f"{name}:{name}" for name in NAMES]
    spent = {"step": [0.0], "views": [0.0]}
    timing(feast.utils, "_augment_response_with_on_demand_transforms", spent["step"])
    timing(feast_request, "feast_request_values", spent["views"])  # what the views' registered source calls
    split: dict[str, list[float]] = {"step": [], "views": []}

    def prepared(kind: str) -> Callable[[], object]:
        rows = picks(keys, count, rng)
        if kind == "with":
            entity_rows = rows.assign(request_time=datetime.now(UTC)).to_dict("records")

            def ask() -> None:
                spent["step"][0] = spent["views"][0] = 0.0
                store.get_online_features(features=[*STORED, *on_demand], entity_rows=entity_rows).to_dict()
                for name, total in spent.items():
                    split[name].append(total[0])

            return ask
        entity_rows = rows[["user_id", "card_id"]].to_dict("records")
        return lambda: store.get_online_features(features=STORED, entity_rows=entity_rows).to_dict()

    measured = alternating(requests, prepared)
    return measured | {name: (float(np.percentile(v, 50)) * 1e3, 0.0) for name, v in split.items()}


def timing(module: object, name: str, spent: list[float]) -> None:
    """`module.name` wrapped to add the seconds each call takes to spent[0]."""
    function = getattr(module, name)

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    setattr(module, name, timed)


def functions_alone(count: int, repeats: int = 2000) -> float:
    """p50 (ms) of the five functions alone on `count` rows of inputs already typed: the cost of the user's code."""
    from features.kernel.request_time import plain_values
    from features.repo import Repo

    features = [Repo.load(REPO).request_features[name] for name in NAMES]
    index = pd.RangeIndex(count)

    def at(text: str) -> pd.Series:
        return pd.Series(pd.Timestamp(text, tz="UTC"), index=index).astype("datetime64[us, UTC]")

    typed = {
        "amount": pd.Series(np.full(count, 42.0), index=index),
        "merchant_id": pd.Series(["m00001"] * count, index=index, dtype=object),
        "request_time": pd.Series(pd.Timestamp("2026-01-03 12:00", tz="UTC"), index=index).astype(
            "datetime64[us, UTC]"
        ),
        "amount_avg_24h": pd.Series(np.full(count, 30.0), index=index),
        "amount_max_24h": pd.Series(np.full(count, 80.0), index=index),
        "merchants_30d": pd.Series([["m00001", "m00002"]] * count, index=index, dtype=object),
        "attempts_1h": pd.Series(np.full(count, 2), index=index),
        "attempts_30d": pd.Series(np.full(count, 60), index=index),
        "last_txn_at": at("2026-01-03 11:00"),
    }
    spent = []
    for _ in range(repeats):
        started = time.perf_counter()
        for feature in features:
            given = {name: typed[name] for name in feature.parameters}
            if feature.row:
                lists = {name: plain_values(column) for name, column in given.items()}
                [feature.function(**{n: v[i] for n, v in lists.items()}) for i in range(count)]
            else:
                feature.function(**given)
        spent.append(time.perf_counter() - started)
    return float(np.percentile(spent, 50)) * 1e3


def report(path: str, count: int, requests: int, measured: dict[str, tuple[float, float]]) -> bool:
    ratio = measured["with"][1] / measured["without"][1]
    print(
        f"{path}, {count} key{'s' if count > 1 else ''}, {requests:,} requests each: without p50 "
        f"{measured['without'][0]:.2f} ms p99 {measured['without'][1]:.2f} ms; with the 5 request-time features "
        f"p50 {measured['with'][0]:.2f} ms p99 {measured['with'][1]:.2f} ms; p99 ratio {ratio:.2f} "
        f"(required <= {REQUIRED}); the 5 functions alone p50 {functions_alone(count):.2f} ms"
        + (
            f"; Feast's on-demand step p50 {measured['step'][0]:.2f} ms, the 5 views' calls into features within "
            f"it p50 {measured['views'][0]:.2f} ms"
            if "step" in measured
            else ""
        ),
        flush=True,
    )
    return ratio <= REQUIRED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--skip-online", action="store_true")
    args = parser.parse_args()
    keys = setup(args.labels, not args.skip_spark)
    ok = True
    if not args.skip_online:
        for count in (1, 100):
            requests = args.requests if count == 1 else max(ROUNDS, args.requests // 10)
            ok &= report("HTTP features serve", count, requests, bench_http(keys, requests, count))
            ok &= report("SDK get_online_features", count, requests, bench_sdk(keys, requests, count))
    if not args.skip_spark:
        spark = bench_spark(args.runs)
        ratio = spark["with"] / spark["without"]
        ok &= ratio <= REQUIRED
        print(
            f"spark training set, {args.labels:,} label rows: without {spark['without']:.1f} s, with the 5 "
            f"request-time features {spark['with']:.1f} s; ratio {ratio:.2f} (required <= {REQUIRED})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
