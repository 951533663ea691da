"""What the served log costs a request (issue 68): `features serve` with and without `--log-served`, in one run.

`python bench/served_log.py [--requests 4000] [--keys 1]`

A SQLite repo with tests/online_repos.py's `user_transactions` (11 features of every type) filled for 10,000 keys.
Two phases, each two servers of one worker up at the same time, requests alternating between them in rounds of 50
on one kept-alive connection each, so that both see the same machine: the baseline without the log against
`--log-served` at its default sample (0.01), then against `--log-sample 1` (every request logged: the writer's
parsing and appends in the worker's own process). p50 and p99 over --requests requests each; the log's rows are
counted after the servers stopped. Required: p99 with the default sample <= 1.1x without.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))  # tests/online_repos.py, tests/feature_servers.py
from feature_servers import Server, start_server, stop_server  # noqa: E402
from online_repos import T0, USER, make_repo, writer  # noqa: E402

WORK = ROOT / "work-served-log"
KEYS = [f"u{i:05d}" for i in range(10_000)]
ROUND = 50
REQUIRED = 1.1


def setup(root: Path) -> Path:
    shutil.rmtree(root.parent, ignore_errors=True)
    make_repo(root, "sqlite", groups=(USER,))
    rng = np.random.default_rng(3)
    n = len(KEYS)
    rows = pd.DataFrame(
        {
            "user_id": KEYS,
            "window_end": T0,
            "txn_count": rng.poisson(5, n).astype("int64"),
            "amount_sum": rng.normal(100.0, 20.0, n),
            "amount_max": rng.gamma(2.0, 30.0, n),
            "merchants": rng.integers(1, 6, n).astype("int64"),
            "amount_p90": rng.normal(50.0, 5.0, n),
            "last_status": rng.choice(["OK", "FAILED"], n),
            "last_ok": rng.random(n) < 0.8,
            "last_merchants": [rng.integers(1, 9, 3).tolist() for _ in range(n)],
            "last_amounts": [rng.normal(30.0, 5.0, 3).tolist() for _ in range(n)],
            "last_statuses": [["OK", "FAILED"]] * n,
            "last_oks": [[True, False]] * n,
        }
    )
    writer(root, USER).write(rows)
    return root


def measure(servers: dict[str, Server], requests: int, keys: int) -> dict[str, np.ndarray]:
    """Milliseconds per request of each server, rounds alternating; two rounds of warm-up each."""
    features = [f"{USER.name}:{f.name}" for f in USER.features]
    rng = np.random.default_rng(11)
    connections = {name: http.client.HTTPConnection("127.0.0.1", s.port, timeout=30) for name, s in servers.items()}
    times: dict[str, list[float]] = {name: [] for name in servers}
    for r in range(requests // ROUND + 2):
        for name, conn in connections.items():
            for _ in range(ROUND):
                picked = [KEYS[int(i)] for i in rng.integers(len(KEYS), size=keys)]
                body = json.dumps({"features": features, "entities": {"user_id": picked}}).encode()
                started = time.perf_counter()
                conn.request("POST", "/get-online-features", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                answer = response.read()
                elapsed = time.perf_counter() - started
                if response.status != 200:
                    raise RuntimeError(answer[:500])
                if r >= 2:
                    times[name].append(elapsed * 1e3)
    for conn in connections.values():
        conn.close()
    return {name: np.array(values) for name, values in times.items()}


def phase(root: Path, options: list[str], requests: int, keys: int) -> tuple[dict[str, np.ndarray], int]:
    """The baseline and a server with `options`; the rows the latter logged."""
    from features.stores.served_log import read_served, served_table

    shutil.rmtree(served_table(root), ignore_errors=True)
    servers = {"without": start_server(root), "with": start_server(root, options=options)}
    try:
        times = measure(servers, requests, keys)
    finally:
        for server in servers.values():
            stop_server(server)
    logged = read_served(served_table(root))
    return times, 0 if logged is None else logged.num_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4_000)
    parser.add_argument("--keys", type=int, default=1, help="entity rows per request")
    args = parser.parse_args()
    root = setup(WORK / "repo")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"at {commit}: {args.requests:,} requests per server and phase, {args.keys} key(s) per request, 11 features")
    print("load average at the start: " + " / ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    ok = True
    phases = (("default sample 0.01", ["--log-served"]), ("sample 1", ["--log-served", "--log-sample", "1"]))
    for label, options in phases:
        times, rows = phase(root, options, args.requests, args.keys)
        p50 = {k: float(np.percentile(v, 50)) for k, v in times.items()}
        p99 = {k: float(np.percentile(v, 99)) for k, v in times.items()}
        ratio = p99["with"] / p99["without"]
        if label.startswith("default"):
            ok = ratio <= REQUIRED
        bound = f" (required <= {REQUIRED})" if label.startswith("default") else ""
        print(
            f"--log-served, {label}: without p50 {p50['without']:.2f} ms p99 {p99['without']:.2f} ms; with p50 "
            f"{p50['with']:.2f} ms p99 {p99['with']:.2f} ms; p99 ratio {ratio:.3f}{bound}; {rows:,} rows logged",
            flush=True,
        )
    print("load average at the end: " + " / ".join(f"{x:.1f}" for x in os.getloadavg()))
    shutil.rmtree(WORK, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
