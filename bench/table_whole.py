"""The offline table as Delta Lake against the Parquet folders it replaced, in whole processes: the nightly job
(`features backfill`) and a bounded stream (`features stream --available-now`) of this checkout, each against the
same command of the last commit whose offline table was Parquet folders, in the same run (docs/table-format.md).

`python bench/table_whole.py [--events 200000] [--users 2000] [--repeats 3] [--baseline REF]`

Each side gets a copy of the demo repo (`feature_repo/`: both example groups, mixed aggregations and window
shapes) with the same generated events over 3 days, applied by its own code, and runs as a scheduler runs it: a
fresh process (cold JVM, imports, MLflow tracking on, the SQLite online store written), after one unmeasured run
that makes its JVM class archive. Before each run the offline table, checkpoints and quarantine are removed, so
both sides do the same work. Runs alternate A B A B; the figure is the median of `--repeats` pairs, and the ratio
is the baseline's median over this checkout's (>= 0.9 required: the Delta table costs at most a tenth).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from results import load, update_section  # noqa: E402 - bench/ on the path first

BASELINE = "5218fdd^"  # the commit before the offline table became a Delta table
START = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 3
COMMANDS = {
    "nightly backfill": ["backfill", "--start", "2026-01-01", "--end", "2026-01-04"],
    "stream, available now": ["stream", "--available-now"],
}


def short(ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextmanager
def two_sides(baseline: str, prefix: str) -> Iterator[tuple[Path, dict[str, Path]]]:
    """A scratch folder and the code of each side: this checkout (Delta), and a work tree of `baseline` (its code
    only; the environment is this one's), removed afterwards."""
    print(f"{load()} at the start; this checkout {short('HEAD')} against {short(baseline)}", flush=True)
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        work = Path(scratch)
        tree = work / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), baseline],
            check=True,
            capture_output=True,
        )
        try:
            yield work, {"Delta (this checkout)": ROOT, f"Parquet ({short(baseline)})": tree}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def make_repo(code: Path, into: Path, events: int, users: int) -> Path:
    """The demo repo with generated events, applied by the code at `code`."""
    shutil.copytree(ROOT / "feature_repo", into, ignore=shutil.ignore_patterns("data", "__pycache__"))
    script = (
        "import sys\n"
        "from datetime import datetime, UTC\n"
        "from features.demo import generate_transactions, write_events\n"
        f"frame = generate_transactions({events}, {users}, datetime(2026, 1, 1, tzinfo=UTC), {DAYS}, seed=7)\n"
        f"write_events(frame, {str(into / 'data' / 'transactions')!r}, n_files=12)\n"
    )
    run_python(code, ["-c", script], into)
    run_python(code, ["-m", "features.cli", "apply", "--repo", str(into)], into)
    return into


def run_python(code: Path, args: list[str], cwd: Path, archive: Path | None = None) -> tuple[float, str]:
    """Python with `args` on the code at `code`, in a fresh process: its wall seconds and its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYSPARK_"))}
    env["PYTHONPATH"] = str(code)
    if archive is not None:
        env["FEATURES_JVM_ARCHIVE"] = str(archive)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} in {code} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall, done.stdout


def fresh(repo: Path) -> None:
    for name in ("offline", "checkpoints", "quarantine", "late"):
        shutil.rmtree(repo / "data" / name, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="the git ref of the Parquet-table code")
    args = parser.parse_args()
    began = datetime.now(UTC)
    with two_sides(args.baseline, "bench-table-whole-") as (work, sides):
        repos = {
            name: make_repo(code, work / f"repo{i}", args.events, args.users)
            for i, (name, code) in enumerate(sides.items())
        }
        results = {}
        for title, command in COMMANDS.items():
            walls: dict[str, list[float]] = {name: [] for name in sides}
            for attempt in range(args.repeats + 1):  # the first pair warms up (makes the class archives)
                for i, (name, code) in enumerate(sides.items()):
                    fresh(repos[name])
                    wall, _ = run_python(
                        code,
                        ["-m", "features.cli", *command, "--repo", str(repos[name])],
                        repos[name],
                        archive=work / f"jvm{i}",
                    )
                    if attempt:
                        walls[name].append(wall)
                    print(f"{title}: {name} {wall:.1f} s{'' if attempt else ' (warm-up)'}", flush=True)
            results[title] = walls
    delta, parquet = list(sides)
    lines = [
        f"Run on {began:%Y-%m-%d} at commit {short('HEAD')}; {load()} at the end.",
        "",
        f"`python bench/table_whole.py --events {args.events} --users {args.users} --repeats {args.repeats}`: the "
        "demo repo's two groups over 3 days of generated events, each command a fresh process (MLflow tracking, "
        f"SQLite online store), this checkout against {short(args.baseline)} (the last commit with Parquet folders), "
        "alternating, "
        "medians (every run listed).",
        "",
        "| command | Delta s | Parquet s | Parquet / Delta |",
        "|---|---|---|---|",
    ]
    for title, walls in results.items():
        d, p = statistics.median(walls[delta]), statistics.median(walls[parquet])
        runs = f"{' / '.join(f'{w:.1f}' for w in walls[delta])} vs {' / '.join(f'{w:.1f}' for w in walls[parquet])}"
        lines.append(f"| {title} ({runs}) | {d:.1f} | {p:.1f} | **{p / d:.2f}x** |")
    text = "\n".join(lines)
    print(text)
    update_section("Offline table format, whole processes (bench/table_whole.py)", text)


if __name__ == "__main__":
    main()
