"""Soak for hangs: the runs that hung before, or could, again and again; every one must end.

    python bench/no_hang.py [--rounds 3] [--days 60] [--events-per-day 100000] [--keys 2000] [--deadline-minutes 15]

Each round, in a fresh repo holding one group over daily Parquet files (`acct`, `ts`, `amount`; watermark 5m;
`n_24h` a count over Hop("24h", every="5m"), `spent_1h` a sum over Hop("1h", every="5m"), `n_ever` a Lifetime
count), every command a process of its own, as a user runs them:
1. reset over months: `features stream --available-now` over all days; the definition changed (`spent_1h`
   replaced by `biggest_6h`, a max over Hop("6h", every="15m")), `features apply`, one more day landed, then
   `features stream --reset --available-now` (the run that once never ended: its first micro-batch is every
   event of the months);
2. a backfill beside a live stream: `features stream --trigger 1s` runs while `features backfill` recomputes the
   first week on the same repo, then the stream is stopped with Ctrl-C (SIGINT);
3. a rescale handed to a running stream: `features stream --buckets 4` asks the live stream to move its state,
   then the stream is stopped.
The commands run under the watchdog's default limit (a hang ends with status 4, not never); the bench kills a
command that outlives --deadline-minutes and counts it as hung. It prints each command's time and status, and
exits 1 when any did not end, or ended with a status other than 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

ROOT = Path(__file__).resolve().parents[1]
GROUP = "accounts"
START = pd.Timestamp("2026-01-01", tz="UTC")

DEFINITIONS = """
from features import Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg

account = Entity("account", join_keys=["acct"])
events = EventSource(name="events", path="data/events", format="parquet", timestamp="ts", watermark="5m")

accounts = FeatureGroup(
    name="accounts",
    entity=account,
    source=events,
    features=[
        Feature("n_24h", agg.count(), window=Hop("24h", every="5m")),
        {second},
        Feature("n_ever", agg.count(), window=Lifetime(every="1h")),
    ],
)
"""
FIRST = 'Feature("spent_1h", agg.sum("amount"), window=Hop("1h", every="5m"))'
CHANGED = 'Feature("biggest_6h", agg.max("amount"), window=Hop("6h", every="15m"))'


@dataclass
class Run:
    round: int
    step: str
    seconds: float
    status: int | None  # None: killed at the deadline (hung)

    def line(self) -> str:
        said = "HUNG (killed)" if self.status is None else f"exit {self.status}"
        return f"| {self.round} | {self.step} | {self.seconds:.1f} | {said} |"


def features(*args: str) -> list[str]:
    return [sys.executable, "-m", "features.cli", *args]


def land_day(repo: Path, day: int, events: int, keys: int) -> None:
    rng = np.random.default_rng(day)
    start = START + pd.Timedelta(days=day)
    offsets = np.sort(rng.integers(0, 86_400_000_000, events))
    frame = pd.DataFrame(
        {
            "acct": np.char.add("a", rng.integers(0, keys, events).astype(str)),
            "ts": (start + pd.to_timedelta(offsets, unit="us")).astype("datetime64[us, UTC]"),
            "amount": np.round(rng.gamma(2.0, 30.0, events), 2),
        }
    )
    folder = repo / "data" / "events"
    folder.mkdir(parents=True, exist_ok=True)
    hidden = folder / f".day-{day:03d}.parquet"
    frame.to_parquet(hidden, index=False)
    os.replace(hidden, folder / f"day-{day:03d}.parquet")


def make_repo(work: Path, days: int, events: int, keys: int) -> Path:
    repo = work / "repo"
    shutil.rmtree(work, ignore_errors=True)
    repo.mkdir(parents=True)
    shutil.copy(ROOT / "feature_repo" / "feature_store.yaml", repo / "feature_store.yaml")
    define(repo, FIRST)
    for day in range(days):
        land_day(repo, day, events, keys)
    return repo


def define(repo: Path, second: str) -> None:
    (repo / "accounts.py").write_text(DEFINITIONS.format(second=second).lstrip())


class Runner:
    def __init__(self, round_: int, deadline_s: float) -> None:
        self.round, self.deadline_s = round_, deadline_s
        self.runs: list[Run] = []

    def run(self, step: str, *args: str) -> Run:
        """A command to its end, or killed at the deadline."""
        began = time.monotonic()
        process = subprocess.Popen(features(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return self.wait(step, process, began)

    def wait(self, step: str, process: subprocess.Popen[str], began: float) -> Run:
        try:
            _, err = process.communicate(timeout=self.deadline_s)
            status: int | None = process.returncode
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
            status = None
        return self.record(step, time.monotonic() - began, status, err)

    def record(self, step: str, seconds: float, status: int | None, err: str) -> Run:
        run = Run(self.round, step, seconds, status)
        self.runs.append(run)
        print(run.line(), flush=True)
        if status != 0:
            print("\n".join(err.strip().splitlines()[-5:]), file=sys.stderr)
        return run

    def live_stream(self, repo: Path) -> subprocess.Popen[str]:
        args = features("stream", "--repo", str(repo), "--trigger", "1s", "--no-tracking")
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        marker = repo / "data" / "checkpoints" / GROUP / "live.json"
        deadline = time.monotonic() + self.deadline_s
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        return process

    def stop(self, step: str, process: subprocess.Popen[str], began: float) -> Run:
        """Ctrl-C, then the stream's own stop to its end."""
        process.send_signal(signal.SIGINT)
        return self.wait(step, process, began)


def one_round(round_: int, work: Path, options: argparse.Namespace) -> list[Run]:
    repo = make_repo(work, options.days, options.events_per_day, options.keys)
    runner = Runner(round_, options.deadline_minutes * 60)
    r = str(repo)
    runner.run("apply", "apply", "--repo", r)
    runner.run(
        f"stream --available-now over {options.days} days", "stream", "--repo", r, "--available-now", "--no-tracking"
    )
    define(repo, CHANGED)
    runner.run("apply (a feature replaced)", "apply", "--repo", r)
    land_day(repo, options.days, options.events_per_day, options.keys)
    reset = f"stream --reset --available-now ({options.days + 1} days in its first batch)"
    runner.run(reset, "stream", "--repo", r, "--reset", "--available-now", "--no-tracking")

    began = time.monotonic()
    live = runner.live_stream(repo)
    runner.run("backfill of the first week beside a live stream", "backfill", "--repo", r, "--start",
               f"{START:%Y-%m-%d}", "--end", f"{START + pd.Timedelta(days=7):%Y-%m-%d}", "--no-tracking")  # fmt: skip
    land_day(repo, options.days + 1, options.events_per_day // 10, options.keys)
    runner.run("a rescale handed to the live stream (--buckets 4)", "stream", "--repo", r, "--group", GROUP,
               "--buckets", "4")  # fmt: skip
    time.sleep(5)  # a batch or two on the new buckets
    runner.stop("the live stream, stopped with Ctrl-C", live, began)
    return runner.runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--events-per-day", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--deadline-minutes", type=float, default=15.0)
    parser.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    options = parser.parse_args()
    at_start = load()
    print("| round | command | s | ended |\n|---|---|---|---|", flush=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="no-hang-") as tmp:
        for round_ in range(1, options.rounds + 1):
            runs += one_round(round_, Path(tmp) / f"round-{round_}", options)
    bad = [run for run in runs if run.status != 0]
    verdict = (
        f"every one of {len(runs)} commands ended with status 0"
        if not bad
        else f"{len(bad)} of {len(runs)} commands did not end with status 0"
    )
    print(verdict)
    if not options.no_results:
        body = (
            f"Run on {pd.Timestamp.now(tz='UTC'):%Y-%m-%d}; {at_start} at the start, {load()} at the end.\n\n"
            f"`python bench/no_hang.py --rounds {options.rounds} --days {options.days} --events-per-day "
            f"{options.events_per_day} --keys {options.keys}`: {__doc__.split(chr(10) + chr(10))[2].strip()}\n\n"
            "| round | command | s | ended |\n|---|---|---|---|\n"
            + "\n".join(run.line() for run in runs)
            + f"\n\n{verdict.capitalize()} (deadline {options.deadline_minutes:g} min a command)."
        )
        update_section("No hang (bench/no_hang.py)", body)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
