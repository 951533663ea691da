"""Online benchmark: this project's online writers against Feast's own write path, and read latency.

    python bench/online.py [--rows 100000] [--requests 5000] [--rounds 2] [--redis HOST:PORT] [--no-results]

Measured in one run on one machine, on the same data, so the ratios compare like with like:
  * Write throughput, --rows rows x 8 features (ints, floats, some nulls), into SQLite and into Redis:
    Feast's `FeatureStore.write_to_online_store` against `features.stores.online`'s writer, each into a store of its
    own, first empty (load), then again with a newer window end (update of every key).
    Required: writer >= 3x Feast on SQLite, >= 10x on Redis. On Redis also against Feast's raw
    `online_write_batch`, timed without its proto conversion.
  * Read latency, p50/p99, 1 and 50 entities, through the SDK (`get_online_features(...).to_dict()`) and over
    HTTP (`features serve`, one kept-alive connection, as a service would call it), SQLite and Redis.
    Required on Redis for one entity: SDK p99 <= 1 ms, HTTP p99 <= 3 ms over --requests requests without
    worker-recycling stalls. Also over HTTP: `feast serve` with its default settings, the named baseline.
Stores are created for the run (temporary repos; on Redis, Feast projects of their own, deleted afterwards).
The results replace the "Online writes and reads" section of bench/RESULTS.md (bench/results.py keeps the others).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg, to_feast
from features.stores.online import online_writer

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import redis_online, write_feature_store_yaml
from results import RESULTS, update_section  # bench/results.py, beside this file

TITLE = "Online writes and reads"
SECTION = f"## {TITLE}"
T0 = pd.Timestamp("2026-01-01 00:05", tz="UTC")
T1 = pd.Timestamp("2026-01-01 00:10", tz="UTC")
HOP = Hop("1h", every="5m")
SOURCE = EventSource(
    "transactions",
    path="data/transactions",
    timestamp="event_ts",
    schema={"user_id": "string", "amount": "double", "merchant_id": "string", "event_ts": "timestamp"},
)
GROUP = FeatureGroup(
    name="user_transactions",
    entity=Entity("user", join_keys=["user_id"]),
    source=SOURCE,
    features=[
        Feature("txn_count_1h", agg.count(), window=HOP),
        Feature("amount_sum_1h", agg.sum("amount"), window=HOP),
        Feature("amount_max_1h", agg.max("amount"), window=HOP),
        Feature("amount_avg_1h", agg.avg("amount"), window=HOP),
        Feature("amount_std_1h", agg.stddev("amount"), window=HOP),
        Feature("merchants_1h", agg.approx_count_distinct("merchant_id"), window=HOP),
        Feature("amount_p90_1h", agg.approx_percentile("amount", 0.9), window=HOP),
        Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="5m")),
    ],
)
TYPES = GROUP.output_types(SOURCE.schema)
REFS = [f"{GROUP.name}:{f.name}" for f in GROUP.features]
STALL_MS = 50.0


# ---------------------------------------------------------------------------------------------------------
# Set-up


@dataclass
class Redis:
    host: str
    port: int
    process: subprocess.Popen | None = None
    workdir: str = ""

    @property
    def connection_string(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self):
        from redis import Redis as Client

        return Client(host=self.host, port=self.port, socket_timeout=30)

    def version(self) -> str:
        return str(self.client().info("server").get("redis_version", "?"))

    def server_pid(self) -> int | None:
        """The server's process id, if it runs on this machine (for its CPU time)."""
        if self.host not in ("127.0.0.1", "localhost"):
            return None
        return int(self.client().info("server")["process_id"])

    def delete_project(self, project: str) -> None:
        client = self.client()
        keys = list(client.scan_iter(match=b"*" + project.encode(), count=5000))
        for start in range(0, len(keys), 5000):
            client.delete(*keys[start : start + 5000])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _answers(host: str, port: int) -> bool:
    from redis import Redis as Client
    from redis.exceptions import RedisError

    try:
        return bool(Client(host=host, port=port, socket_connect_timeout=1).ping())
    except RedisError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_redis(address: str | None) -> Redis:
    """The Redis at `address`, else FEATURES_TEST_REDIS, else 127.0.0.1:6379, else a redis-server started here."""
    address = address or os.environ.get("FEATURES_TEST_REDIS") or "127.0.0.1:6379"
    host, _, port = address.removeprefix("redis://").partition("/")[0].rpartition(":")
    if _answers(host or "127.0.0.1", int(port or 6379)):
        return Redis(host or "127.0.0.1", int(port or 6379))
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit(
            f"error: no Redis answers at {address} and there is no redis-server to start (apt-get install redis-server)"
        )
    port_n, workdir = _free_port(), tempfile.mkdtemp(prefix="features-bench-redis-")
    command = [binary, "--port", str(port_n), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen([*command, "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if _answers("127.0.0.1", port_n):
            return Redis("127.0.0.1", port_n, process, workdir)
        time.sleep(0.05)
    process.terminate()
    sys.exit(f"error: {binary} did not start on 127.0.0.1:{port_n}")


def make_repo(root: Path, kind: str, redis: Redis) -> Path:
    """An applied Feast repo for GROUP on `kind` ("sqlite" or "redis"), with a Feast project of its own."""
    from feast import FeatureStore

    root.mkdir(parents=True)
    online = None if kind == "sqlite" else redis_online(redis.connection_string)
    write_feature_store_yaml(root, f"bench_{uuid.uuid4().hex[:8]}", online)
    FeatureStore(repo_path=str(root)).apply(list(to_feast(GROUP, repo_root=root)))
    return root


def change_points(n: int, window_end: pd.Timestamp, seed: int = 7) -> pd.DataFrame:
    """n keys' latest rows, keys in random order (as Spark partitions hand them over), ~5% empty windows."""
    rng = np.random.default_rng(seed)
    users = np.array([f"u{i:07d}" for i in range(n)], dtype=object)
    rng.shuffle(users)
    counts = rng.poisson(4, n).astype("int64")
    empty = counts == 0

    def floats(scale: float) -> np.ndarray:
        values = np.round(rng.gamma(2.0, scale, n), 2)
        values[empty] = np.nan
        return values

    frame = pd.DataFrame({"user_id": users, "window_end": window_end, "txn_count_1h": counts})
    frame["amount_sum_1h"] = np.where(empty, 0.0, floats(40.0) * counts)
    frame["amount_max_1h"] = floats(60.0)
    frame["amount_avg_1h"] = floats(30.0)
    frame["amount_std_1h"] = np.where(counts < 2, np.nan, floats(10.0))
    frame["merchants_1h"] = np.minimum(counts, rng.poisson(2, n)).astype("int64")
    frame["amount_p90_1h"] = floats(50.0)
    frame["txn_count_lifetime"] = counts + rng.poisson(50, n)
    return frame


# ---------------------------------------------------------------------------------------------------------
# Writes


@dataclass
class WriteResult:
    store: str
    phase: str  # "load" (empty store) or "update" (every key again, newer window end)
    seconds: dict[str, float] = field(default_factory=dict)  # writer name -> seconds of its best run
    cpu: dict[str, float] = field(default_factory=dict)  # writer name -> CPU seconds of that run


def timed(fn: Callable[[], Any], server_pid: int | None = None) -> tuple[float, float]:
    """Wall seconds, and CPU seconds used by this process plus the Redis server (if it runs on this machine)."""
    gc.collect()
    began, began_cpu, began_server = time.perf_counter(), time.process_time(), process_cpu(server_pid)
    fn()
    wall, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    return wall, cpu + process_cpu(server_pid) - began_server


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of a process of this machine (0 if unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_writes(work: Path, redis: Redis, n_rows: int, rounds: int) -> tuple[list[WriteResult], list[str], list[str]]:
    """Write timings (the best of `rounds` rounds, each into new stores, the order of the writers alternating),
    the read-back checks, and the Feast projects used (on Redis: to delete at the end)."""
    from feast import FeatureStore

    load, update = change_points(n_rows, T0), change_points(n_rows, T1, seed=8)
    best: dict[tuple[str, str], WriteResult] = {}
    checks, projects = [], []
    for round_ in range(rounds):
        for kind in ("sqlite", "redis"):
            names = ["feast", "ours", *(["feast_raw"] if kind == "redis" else [])]
            stores = {
                n: FeatureStore(repo_path=str(make_repo(work / f"r{round_}-{n}-{kind}", kind, redis))) for n in names
            }
            projects += [store.project for store in stores.values()]
            writer = online_writer(stores["ours"], GROUP, TYPES)
            for phase, frame in (("load", load), ("update", update)):
                raw = stores.get("feast_raw")
                jobs = {
                    "feast": partial(stores["feast"].write_to_online_store, GROUP.name, frame),
                    "ours": partial(writer.write, frame),
                }
                if round_ % 2:
                    jobs = dict(reversed(jobs.items()))
                if raw is not None:  # Feast's own proto conversion, done before the clock starts
                    provider, view = raw._get_provider(), raw.get_feature_view(GROUP.name)
                    rows = provider._prep_rows_to_write_for_ingestion(feature_view=view, df=frame)
                    jobs["feast_raw"] = partial(provider.online_write_batch, raw.config, view, rows, None)
                result = best.setdefault((kind, phase), WriteResult(kind, phase))
                pid = redis.server_pid() if kind == "redis" else None
                for name, job in jobs.items():
                    print(f"  round {round_ + 1}, {kind} {phase}: {name} ...", flush=True)
                    wall, cpu = timed(job, pid)
                    if wall < result.seconds.get(name, float("inf")):
                        result.seconds[name], result.cpu[name] = wall, cpu
                jobs.clear()
            if round_ == 0:
                checks.append(same_values(kind, stores["feast"], stores["ours"], update))
            writer.close()
    return list(best.values()), checks, projects


def same_values(kind: str, feast_store: Any, ours_store: Any, frame: pd.DataFrame, n: int = 500) -> str:
    """Both stores answer the same values for a sample of keys (the writer's output is Feast's format)."""
    rows = [{"user_id": u} for u in frame["user_id"].sample(n, random_state=1)]
    theirs = feast_store.get_online_features(features=REFS, entity_rows=rows).to_dict(include_event_timestamps=True)
    ours = ours_store.get_online_features(features=REFS, entity_rows=rows).to_dict(include_event_timestamps=True)
    if theirs != ours:
        raise SystemExit(f"error: {kind}: values written by the writer differ from Feast's own writes")
    return f"{kind}: {n} sampled keys read back identical (values and event times) from both stores"


# ---------------------------------------------------------------------------------------------------------
# Reads


@dataclass
class Latency:
    name: str
    store: str
    entities: int
    millis: np.ndarray
    cpu_millis: np.ndarray | None = None
    resets: int = 0  # requests that met a closed connection and were sent again

    def p(self, q: float) -> float:
        return float(np.percentile(self.millis, q))

    @property
    def stalls(self) -> int:
        return int((self.millis > STALL_MS).sum())


def key_batches(keys: np.ndarray, n_requests: int, entities: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [keys[rng.integers(0, len(keys), entities)].tolist() for _ in range(n_requests)]


def sdk_latency(store: Any, kind: str, keys: np.ndarray, entities: int, n: int, warmup: int) -> Latency:
    batches = key_batches(keys, n + warmup, entities, seed=entities)
    wall, cpu = [], []
    for i, batch in enumerate(batches):
        rows = [{"user_id": k} for k in batch]
        began, began_cpu = time.perf_counter_ns(), time.thread_time_ns()
        store.get_online_features(features=REFS, entity_rows=rows).to_dict()
        if i >= warmup:
            wall.append(time.perf_counter_ns() - began)
            cpu.append(time.thread_time_ns() - began_cpu)
    return Latency("SDK get_online_features", kind, entities, np.array(wall) / 1e6, np.array(cpu) / 1e6)


@contextmanager
def server(command: list[str], port: int, log: Path) -> Iterator[None]:
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise SystemExit(f"error: {' '.join(command)} exited: {log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"error: {' '.join(command)} did not answer within 180s") from None
                time.sleep(0.25)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def http_latency(name: str, kind: str, port: int, keys: np.ndarray, entities: int, n: int, warmup: int) -> Latency:
    """Requests on one kept-alive connection, as a service's HTTP client would send them. When the server
    closes the connection (a recycled worker), the client reconnects and sends the request again, and that
    request's time includes both attempts; such requests are counted as resets."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    wall, resets = [], 0
    for i, batch in enumerate(key_batches(keys, n + warmup, entities, seed=100 + entities)):
        body = json.dumps({"features": REFS, "entities": {"user_id": batch}})
        began = time.perf_counter_ns()
        for attempt in (1, 2):
            try:
                conn.request("POST", "/get-online-features", body, headers)
                response = conn.getresponse()
                answer = json.loads(response.read())
                break
            except (ConnectionError, http.client.RemoteDisconnected):
                conn.close()
                if attempt == 2:
                    raise
                resets += i >= warmup
        elapsed = time.perf_counter_ns() - began
        if response.status != 200 or len(answer["results"][0]["values"]) != entities:
            raise SystemExit(f"error: {name} answered {response.status}: {str(answer)[:300]}")
        if i >= warmup:
            wall.append(elapsed)
    conn.close()
    return Latency(name, kind, entities, np.array(wall) / 1e6, resets=resets)


def bench_reads(args: argparse.Namespace, work: Path, keys: np.ndarray) -> list[Latency]:
    from feast import FeatureStore

    out: list[Latency] = []
    n1, n50, warmup = args.requests, max(200, args.requests // 5), 200
    for kind in ("sqlite", "redis"):
        root = work / f"r0-ours-{kind}"
        store = FeatureStore(repo_path=str(root))
        for entities, n in ((1, n1), (50, n50)):
            print(f"  {kind}: SDK, {entities} entities x {n} ...", flush=True)
            out.append(sdk_latency(store, kind, keys, entities, n, warmup))
        port = _free_port()
        command = [sys.executable, "-m", "features.cli", "serve", "--repo", str(root), "--port", str(port)]
        with server(command, port, work / f"serve-{kind}.log"):
            for entities, n in ((1, n1), (50, n50)):
                print(f"  {kind}: HTTP features serve, {entities} entities x {n} ...", flush=True)
                out.append(http_latency("HTTP features serve", kind, port, keys, entities, n, warmup))
    root, port = work / "r0-ours-redis", _free_port()
    command = [sys.executable, "-m", "feast.cli.cli", "-c", str(root), "serve", "--port", str(port)]
    with server(command, port, work / "feast-serve.log"):
        print(f"  redis: HTTP feast serve (defaults), 1 entity x {n1} ...", flush=True)
        out.append(http_latency("HTTP feast serve, defaults", "redis", port, keys, 1, n1, warmup))
    return out


# ---------------------------------------------------------------------------------------------------------
# Report


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs ({platform.machine()}), load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"(1/5/15 min)"
    )


def report(args, writes: list[WriteResult], checks: list[str], reads: list[Latency], redis: Redis, before: str) -> str:
    import feast

    rows = args.rows
    lines = [
        SECTION,
        "",
        f"`python bench/online.py --rows {rows} --requests {args.requests} --rounds {args.rounds}`, "
        f"run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"Python {platform.python_version()}, Feast {feast.__version__}, redis-server {redis.version()} on "
        f"127.0.0.1, SQLite {sqlite3.sqlite_version}. Machine: {before} at the start; {machine()} at the end.",
        "",
        f"### Write throughput ({rows:,} rows x {len(GROUP.features)} features, one process)",
        "",
        "Each writer writes into a store of its own: first empty (load), then every key again with a newer",
        f"window end (update). Rows per second, the best of {args.rounds} rounds (new stores each round);",
        "ratio = writer / Feast `write_to_online_store`. CPU: seconds of CPU the run used, in this process and",
        "(Redis) in redis-server: the work each way needs, whatever else the machine was doing.",
        "",
        "| store | phase | Feast `write_to_online_store` | Feast `online_write_batch` (protos prebuilt) "
        "| `features` writer | ratio | CPU s, Feast / writer | CPU ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w in writes:
        raw = f"{rows / w.seconds['feast_raw']:,.0f}" if "feast_raw" in w.seconds else "-"
        ratio, cpu_ratio = w.seconds["feast"] / w.seconds["ours"], w.cpu["feast"] / w.cpu["ours"]
        lines.append(
            f"| {w.store} | {w.phase} | {rows / w.seconds['feast']:,.0f} | {raw} | {rows / w.seconds['ours']:,.0f} | "
            f"{ratio:.1f}x | {w.cpu['feast']:.2f} / {w.cpu['ours']:.2f} | {cpu_ratio:.1f}x |"
        )
    lines += ["", *(f"- {c}" for c in checks), ""]
    lines += [
        "### Read latency (ms per request)",
        "",
        "SDK: `FeatureStore.get_online_features(all 8 features, keys).to_dict()` in this process. HTTP:",
        "`POST /get-online-features` on one kept-alive connection, JSON parsed, to `features serve` (workers never",
        "recycled) or to `feast serve` with its defaults (`max_requests` 1000).",
        f"Stalls: requests over {STALL_MS:.0f} ms. Resets: requests that found their connection closed by the",
        "server (a recycled worker) and were sent again on a new one (their time includes both attempts).",
        "",
        "| path | store | entities | requests | p50 | p99 | max | stalls | resets | CPU p99 (SDK: this process) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reads:
        cpu = f"{np.percentile(r.cpu_millis, 99):.2f}" if r.cpu_millis is not None else "-"
        lines.append(
            f"| {r.name} | {r.store} | {r.entities} | {len(r.millis):,} | {r.p(50):.2f} | {r.p(99):.2f} | "
            f"{r.millis.max():.1f} | {r.stalls} | {r.resets} | {cpu} |"
        )
    lines += ["", "### Requirements", ""]
    by = {(w.store, w.phase): w for w in writes}
    for store, need in (("redis", 10), ("sqlite", 3)):
        for phase in ("load", "update"):
            ratio = by[store, phase].seconds["feast"] / by[store, phase].seconds["ours"]
            lines.append(
                f"- {store} {phase}: writer {ratio:.1f}x Feast (required >= {need}x): {_verdict(ratio >= need)}"
            )
    find = {(r.name, r.store, r.entities): r for r in reads}
    sdk, http_ = find["SDK get_online_features", "redis", 1], find["HTTP features serve", "redis", 1]
    lines.append(f"- Redis, 1 entity, SDK p99 {sdk.p(99):.2f} ms (required <= 1 ms): {_verdict(sdk.p(99) <= 1)}")
    lines.append(
        f"- Redis, 1 entity, HTTP p99 {http_.p(99):.2f} ms over {len(http_.millis):,} requests, {http_.stalls} stalls "
        f"and {http_.resets} resets (required <= 3 ms, no stalls): "
        f"{_verdict(http_.p(99) <= 3 and http_.stalls == 0 and http_.resets == 0)}"
    )
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    if busy:
        lines += [
            "",
            "The machine was shared with other work during the run (load average above the CPU count): latency",
            "tails include waits for a CPU. The SDK's own CPU time per request (last column) does not.",
        ]
    return "\n".join(lines) + "\n"


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows (keys) written (default 100000)")
    parser.add_argument("--requests", type=int, default=5_000, help="read requests per 1-entity case (default 5000)")
    parser.add_argument("--rounds", type=int, default=2, help="write rounds; the best of each is kept (default 2)")
    parser.add_argument(
        "--redis", default=None, help="Redis host:port (default: FEATURES_TEST_REDIS or 127.0.0.1:6379)"
    )
    parser.add_argument("--no-results", action="store_true", help=f"print only; do not update {RESULTS.name}")
    args = parser.parse_args()
    before = machine()
    redis = find_redis(args.redis)
    work = Path(tempfile.mkdtemp(prefix="features-bench-online-"))
    projects: list[str] = []
    try:
        print("writes:", flush=True)
        writes, checks, projects = bench_writes(work, redis, args.rows, args.rounds)
        print("reads:", flush=True)
        keys = change_points(args.rows, T1, seed=8)["user_id"].to_numpy()
        reads = bench_reads(args, work, keys)
        section = report(args, writes, checks, reads, redis, before)
    finally:
        for project in projects:
            redis.delete_project(project)
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(section)
    if not args.no_results:
        update_section(TITLE, section.split("\n", 2)[2])  # without the "## title" line
        print(f"(written to {RESULTS})")


if __name__ == "__main__":
    main()
