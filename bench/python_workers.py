"""What the local session's Python workers (features.engine.worker_daemon: the worker daemon and the
`features-spark-python` interpreter import PySpark from its package, not from the zip Spark puts first on its
workers' path) do to a command's cold start: the figure docs/operations.md quotes.

    python bench/python_workers.py [--repeats 5] [--events 3000]

Each command a fresh process on the demo repo's two groups over `--events` events: (a) `features stream
--available-now` from an empty checkpoint, (b) `features backfill`; each with the package's workers and with
PySpark's own (`FEATURES_PYTHON_DAEMON=pyspark.daemon PYSPARK_PYTHON=<this interpreter>`), paired and alternating:
wall seconds, and the CPU seconds
the machine spent during it (the steadier figure on a shared machine). Medians; the ratio is ours / PySpark's.
The tests' Java options (docs/operations.md, local sessions) are not set: a user's command runs without them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import startup
from java_options import demo_repo
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work" / "python_workers"
START = datetime(2026, 1, 1, tzinfo=UTC)
OURS, PYSPARKS = "ours", "PySpark's"
SETTINGS = {OURS: {}, PYSPARKS: {"FEATURES_PYTHON_DAEMON": "pyspark.daemon", "PYSPARK_PYTHON": sys.executable}}


def timed(workers: str, root: Path, *args: str) -> tuple[float, float]:
    """Wall seconds of a fresh `features ...` process on `root` (whose earlier runs' tables and checkpoints are
    forgotten first), and the CPU seconds the machine spent meanwhile."""
    startup.reset(root)
    shutil.rmtree(root / "data" / "checkpoints", ignore_errors=True)
    cpu_before = _machine_cpu()
    command = ("-m", "features.cli", *args, "--repo", str(root), "--no-tracking")
    wall, _ = startup.timed_process(*command, cwd=WORK, env=SETTINGS[workers])
    return wall, _machine_cpu() - cpu_before


def _machine_cpu() -> float:
    """CPU seconds this machine has spent busy so far (/proc/stat): a command's JVM and Python workers are not
    processes it waits for, so its own accounting leaves them out."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    busy = sum(ticks[:7]) - idle  # user to softirq: not steal (another guest's), and guest is within user
    return busy / os.sysconf("SC_CLK_TCK")


def row(what: str, repeats: int, root: Path, *args: str) -> str:
    runs: dict[str, list[tuple[float, float]]] = {OURS: [], PYSPARKS: []}
    for i in range(repeats):
        for workers in (OURS, PYSPARKS) if i % 2 == 0 else (PYSPARKS, OURS):
            runs[workers].append(timed(workers, root, *args))
    cells = []
    for figure in (0, 1):  # wall, then CPU
        medians = [statistics.median(r[figure] for r in runs[d]) for d in (OURS, PYSPARKS)]
        listed = [" / ".join(f"{r[figure]:.1f}" for r in runs[d]) for d in (OURS, PYSPARKS)]
        cells += [f"{m:.1f} ({runs_listed})" for m, runs_listed in zip(medians, listed, strict=True)]
        cells.append(f"{medians[0] / medians[1]:.2f}x")
    return f"| {what} | {' | '.join(cells)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--events", type=int, default=3_000)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    began = load()
    root = demo_repo(args.events)
    end = (START + timedelta(days=2)).isoformat()
    backfill = ("backfill", "--start", START.isoformat(), "--end", end)
    timed(OURS, root, *backfill)  # the first run makes the JVM class archive
    lines = [
        f"Run on {datetime.now(UTC):%Y-%m-%d}; {began} at the start.",
        "",
        f"`python bench/python_workers.py --repeats {args.repeats} --events {args.events}`: local Spark on 2 cores, "
        "each command a fresh process (MLflow tracking off) on the demo repo's two groups; the local session's Python "
        "workers (the daemon `features.engine.worker_daemon` and the interpreter `features-spark-python`) against "
        "PySpark's own (`pyspark.daemon`, this interpreter), paired and alternating, medians (every run "
        "listed); CPU seconds are the machine's (/proc/stat) during the command: its JVM and Python workers included.",
        "",
        "| run | wall s, ours | wall s, PySpark's | ours / PySpark's | CPU s, ours | CPU s, PySpark's "
        "| ours / PySpark's |",
        "|---|---|---|---|---|---|---|",
        row(
            f"(a) `features stream --available-now`, cold, {args.events:,} events",
            args.repeats,
            root,
            "stream",
            "--available-now",
        ),
        row(f"(b) `features backfill`, cold, {args.events:,} events", args.repeats, root, *backfill),
        "",
        f"{load()} at the end.",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("Python workers (bench/python_workers.py)", body)


if __name__ == "__main__":
    main()
