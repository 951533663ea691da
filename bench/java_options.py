"""What `FEATURES_JAVA_OPTIONS="-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"` (Java's first compiler
only, in a code cache as large as the default's: the first compiler's own 48 MB fill within half a minute of
Spark, and Java then stops compiling) does to a local session: the figures docs/operations.md quotes, and the
reason the tests set it.

    python bench/java_options.py [--repeats 3] [--events 2000000] [--small-events 3000]

(a) a cold `features backfill` (a fresh process, MLflow tracking on) of the demo repo's two groups over 3,000
    events, and (b) of one 24h/5m count over 2,000,000 events (bench/startup.py's nightly repo), each with the
    option and without it, paired and alternating; (c) five backfills of (b)'s repo in one process, the median of
    the last three, a process with the option and one without. Medians; the ratio is with / without.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from features.demo import generate_transactions, write_events
from features.pipelines.registration import apply

sys.path.insert(0, str(Path(__file__).resolve().parent))
import startup
from results import load, update_section

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(__file__).resolve().parent / "work" / "java_options"
OPTION = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
START = datetime(2026, 1, 1, tzinfo=UTC)
WARM = """import statistics, sys, time
from datetime import datetime
from features.engine.session import get_spark
from features.pipelines.backfill import backfill
from features.repo import Repo

root, start, end = sys.argv[1], datetime.fromisoformat(sys.argv[2]), datetime.fromisoformat(sys.argv[3])
spark = get_spark()
walls = []
for _ in range(5):
    began = time.perf_counter()
    backfill(Repo.load(root), start, end, spark=spark, progress=False, track=False)
    walls.append(time.perf_counter() - began)
print(statistics.median(walls[2:]))
"""


def demo_repo(events: int) -> Path:
    root = WORK / "small"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ROOT / "feature_repo", root, ignore=shutil.ignore_patterns("data", ".features", "__pycache__"))
    write_events(generate_transactions(events, 20, START, 2, seed=5), root / "data" / "transactions", n_files=3)
    apply(str(root))
    return root


def timed(option: str, *args: str) -> float:
    """Wall seconds of a fresh `python *args` process (the backfill's own figure for warm.py); a command's repo
    starts without an offline table each time, as in bench/startup.py."""
    if "--repo" in args:
        startup.reset(Path(args[args.index("--repo") + 1]))
    env = startup.bench_env()
    env["FEATURES_JAVA_OPTIONS"] = option
    began = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=WORK, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - began if args[0] != "warm.py" else float(done.stdout.split()[-1])


def paired(repeats: int, *args: str) -> tuple[list[float], list[float]]:
    """Walls with the option and without it, paired, the order alternating."""
    on, off = [], []
    for i in range(repeats):
        for option in (OPTION, "") if i % 2 == 0 else ("", OPTION):
            (on if option else off).append(timed(option, *args))
    return on, off


def row(what: str, on: list[float], off: list[float]) -> str:
    a, b = statistics.median(on), statistics.median(off)
    listed = " / ".join(f"{w:.1f}" for w in on), " / ".join(f"{w:.1f}" for w in off)
    return f"| {what} | {a:.1f} ({listed[0]}) | {b:.1f} ({listed[1]}) | {a / b:.2f}x |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--small-events", type=int, default=3_000)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "warm.py").write_text(WARM)
    began = load()
    small = demo_repo(args.small_events)
    big = startup.make_repo(WORK / "big", args.events, 10_000, START, 3, startup.NIGHTLY)
    end = (START + timedelta(days=3)).isoformat()
    small_end = (START + timedelta(days=2)).isoformat()
    cli = ("-m", "features.cli", "backfill", "--start", START.isoformat())
    timed("", *cli, "--end", end, "--repo", str(big))  # the first run makes the JVM class archive
    lines = [
        f"Run on {datetime.now(UTC):%Y-%m-%d}; {began} at the start.",
        "",
        f"`python bench/java_options.py --repeats {args.repeats}`: local Spark on 2 cores, each command a fresh "
        f"process; `FEATURES_JAVA_OPTIONS={OPTION}` against no option, paired and alternating, medians (every run "
        "listed).",
        "",
        f"| run | with `{OPTION}` s | without s | with / without |",
        "|---|---|---|---|",
        row(
            f"(a) `features backfill`, cold, demo repo (2 groups), {args.small_events:,} events",
            *paired(args.repeats, *cli, "--end", small_end, "--repo", str(small)),
        ),
        row(
            f"(b) `features backfill`, cold, one 24h/5m count, {args.events:,} events",
            *paired(args.repeats, *cli, "--end", end, "--repo", str(big)),
        ),
        row(
            "(c) (b)'s backfill in one process: the median of backfills 3-5 of five",
            *paired(args.repeats, "warm.py", str(big), START.isoformat(), end),
        ),
        "",
        f"{load()} at the end.",
    ]
    body = "\n".join(lines)
    print(body)
    update_section("JVM options (bench/java_options.py)", body)


if __name__ == "__main__":
    main()
