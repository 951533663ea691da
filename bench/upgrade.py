"""Upgrade: a running stream's group gains a feature; carried over against `--reset`, whole processes.

    python bench/upgrade.py [--days 60] [--events-per-day 50000] [--users 20000] [--rounds 2]

The demo repo's `user_transactions` (5 features, 4 window shapes) is streamed over `--days` of landed files (one
per day; set-up, not timed). Then, in each round, from a copy of that repo and its state, one feature is added
("amount_max_6h": max amount over 6 hours, sliding every 5 minutes), the next day's file lands, and the time is
taken from `features apply` to `features stream --available-now` having processed that day, both as processes of
their own, as a scheduler runs them:
  * upgrade: `features stream` continues from the checkpoint (the state carried over, the new feature built)
  * reset: `features stream --reset` replays every landed file, as it had to before
  * restart: the same two commands with the definition unchanged (the stream continues over the new day): the
    floor of any stream that continues, so reset / restart is the most an upgrade could reach on this history
Rounds alternate the three; the medians are compared, and the events the upgrade read are checked against the new
feature's lookback plus the new day. Then the same change made to a running stream (`features stream --trigger 1s`,
started a day short of the same state, that day streamed as it landed, then idle): from `features apply` until the
stream has taken it up in its own process and processed the next day, against that day's batch alone on the
unchanged definition (required: the reset >= 5x the running stream's upgrade; a scheduled restart pays a new JVM and
a cold first batch on top, see reset / restart).

The same for a rescale (`--buckets` doubled from the set-up's 4: handed to the running stream by `features stream
--buckets 8`, and as a scheduled process) and for a savepoint restored into a new checkpoint folder (`features
savepoint`, then `features stream --from-savepoint`), each against `--reset` over the same next day.

The same for backfills: the `--days` backfilled by `features backfill --since-last` (set-up), the feature added,
then `features backfill --since-last --only-changed` (computes the added feature alone, beside the table's values
of the others) against a full recompute of the group (`--since-last` on a copy without the offline table).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

from features.demo import generate_transactions, write_events
from features.ml import tracking
from features.repo import Repo

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(__file__).resolve().parent / "work-upgrade"
LIVE = WORK / "snapshot-live"  # the state a day short of the snapshot's, for the running stream's runs
GROUP = "user_transactions"
# The last landed day is today, so that the days before it are complete for `--since-last`.
TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
ADDED = '        Feature("amount_max_6h", agg.max("amount"), window=Hop("6h", every="5m")),\n'
ANCHOR = '        Feature("txn_count_lifetime", agg.count(), window=Lifetime(every="1h")),\n'
BUCKETS = 4  # the state's at set-up; the rescale doubles them
CARRIED = re.compile(r"built .* from ([\d,]+) events")
BATCH = re.compile(r"^\S+ batch \d+: ([\d,]+) events")


def _features(*args: str) -> list[str]:
    return [sys.executable, "-m", "features.cli", *args]


def _run(*args: str) -> str:
    done = subprocess.run(_features(*args), capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"features {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def _day(day: int, days: int, per_day: int, users: int):  # type: ignore[no-untyped-def]
    start = TODAY - timedelta(days=days - day)
    return generate_transactions(per_day, users, start, 1.0, seed=day, late_fraction=0.0)


def set_up(days: int, per_day: int, users: int) -> Path:
    """The demo repo with `days` of files landed, streamed and backfilled (its state, offline table and online
    store), kept as a snapshot that each run restores to the same folder (Feast's registry holds the online
    store's path: an apply in another folder would move the store's tables)."""
    shutil.rmtree(WORK, ignore_errors=True)
    repo = WORK / "repo"
    shutil.copytree(ROOT / "feature_repo", repo, ignore=shutil.ignore_patterns("data", "__pycache__"))
    source = repo / "data" / "transactions"
    for day in range(days - 1):
        write_events(_day(day, days, per_day, users), source, n_files=1, start_index=day)
    _run("apply", "--repo", str(repo))
    tracking.client_for(Repo.load(repo))  # the MLflow store a running deployment has (its first run makes it)
    first = ["--available-now", "--no-tracking", "--buckets", str(BUCKETS)]
    _run("stream", "--repo", str(repo), "--group", GROUP, *first)
    shutil.copytree(repo, LIVE)  # a day short: the live runs stream it first, as a running stream has
    write_events(_day(days - 1, days, per_day, users), source, n_files=1, start_index=days - 1)
    _run("stream", "--repo", str(repo), "--group", GROUP, "--available-now", "--no-tracking")
    _run("backfill", "--repo", str(repo), "--group", GROUP, "--since-last", "--no-tracking")
    shutil.copytree(repo, WORK / "snapshot")
    return WORK / "snapshot"


def _restored(snapshot: Path, table: bool = True, add: bool = True) -> Path:
    """The snapshot in the runs' folder, the feature added (without the offline table: for a full recompute)."""
    repo = WORK / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(snapshot, repo, ignore=None if table else shutil.ignore_patterns("offline"))
    if add:
        definitions = repo / "fraud.py"
        definitions.write_text(definitions.read_text().replace(ANCHOR, ANCHOR + ADDED))
    return repo


def rescale_round(snapshot: Path, days: int, per_day: int, users: int, buckets: int, reset: bool) -> float:
    """Seconds of `features stream --buckets N --available-now` over the next day, from the snapshot's state
    (moved to N buckets) or with `--reset` (replayed into N buckets)."""
    repo = _restored(snapshot, add=False)
    write_events(_day(days, days, per_day, users), repo / "data" / "transactions", n_files=1, start_index=days)
    began = time.perf_counter()
    command = ["stream", "--repo", str(repo), "--group", GROUP, "--available-now", "--buckets", str(buckets)]
    output = _run(*command, *(["--reset"] if reset else []))
    if not reset and "moved to their new buckets" not in output:
        raise RuntimeError(f"the rescale did not move the state:\n{output[-3000:]}")
    return time.perf_counter() - began


def savepoint_round(snapshot: Path, savepoint: Path, days: int, per_day: int, users: int, reset: bool) -> float:
    """Seconds of `features stream --available-now` over the next day in a new checkpoint folder started from the
    savepoint of the snapshot's state (`--from-savepoint`), or with `--reset` (replayed)."""
    repo = _restored(snapshot, add=False)
    write_events(_day(days, days, per_day, users), repo / "data" / "transactions", n_files=1, start_index=days)
    began = time.perf_counter()
    command = ["stream", "--repo", str(repo), "--group", GROUP, "--available-now"]
    if reset:
        output = _run(*command, "--reset")
    else:
        restored = ["--from-savepoint", str(savepoint), "--checkpoint-dir", str(repo / "data" / "restored")]
        output = _run(*command, *restored)
        if "started from the savepoint" not in output:
            raise RuntimeError(f"the stream did not start from the savepoint:\n{output[-3000:]}")
    return time.perf_counter() - began


def stream_round(snapshot: Path, days: int, per_day: int, users: int, kind: str) -> tuple[float, int, int]:
    """Seconds from apply to the next day streamed (`kind`: upgrade, reset or restart); events the stream's
    batches read; events the upgrade built the new feature from (0 for a reset or a restart)."""
    reset = kind == "reset"
    repo = _restored(snapshot, add=kind != "restart")
    write_events(_day(days, days, per_day, users), repo / "data" / "transactions", n_files=1, start_index=days)
    began = time.perf_counter()
    _run("apply", "--repo", str(repo))
    command = ["stream", "--repo", str(repo), "--group", GROUP, "--available-now"]
    output = _run(*command, *(["--reset"] if reset else []))
    seconds = time.perf_counter() - began
    streamed = sum(int(m.group(1).replace(",", "")) for m in map(BATCH.match, output.splitlines()) if m)
    built = CARRIED.search(output)
    if kind == "upgrade" and built is None:
        raise RuntimeError(f"the upgrade did not carry the state over:\n{output[-3000:]}")
    return seconds, streamed, 0 if built is None else int(built.group(1).replace(",", ""))


class LiveStream:
    """A live `features stream --trigger 1s` of the group (its own process), its output lines read as they come."""

    def __init__(self, repo: Path) -> None:
        command = _features("stream", "--repo", str(repo), "--group", GROUP, "--trigger", "1s")
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put((time.perf_counter(), line.rstrip("\n")))

    def until(self, done: Callable[[str], bool], what: str, timeout: float = 600) -> float:
        """The time of the first line `done` holds for (every line is given to it in turn)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                at, line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if done(line):
                return at
        self.stop()
        raise RuntimeError(f"the live stream never showed {what}:\n" + "\n".join(self.seen[-40:]))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()


def live_round(days: int, per_day: int, users: int, kind: str, buckets: int = 0) -> tuple[float, int, int]:
    """A live `features stream` that has been running: started on the state a day short of the snapshot's, it
    streams that day (not timed) and is idle. Timed, by `kind`: "upgrade", from `features apply` of the added
    feature to the stream having processed the next day (the running stream takes the change up in its own process;
    the day lands once it has); "rescale", the same from `features stream --buckets N` (another process, which hands
    the rescale to the running one and ends once it is done); "unchanged", from the day landing to its batch done.
    Returns the seconds, the events the timed batches read, the events the new feature was built from."""
    repo = _restored(LIVE, add=False)
    staged = WORK / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    for day in (days - 1, days):
        write_events(_day(day, days, per_day, users), staged / str(day), n_files=1, start_index=day)
    stream = LiveStream(repo)
    _land(staged / str(days - 1), repo)
    stream.until(DayStreamed(per_day), "the day before's batches")
    time.sleep(2)  # idle: no batch without new files
    began = time.perf_counter()
    if kind == "upgrade":
        definitions = repo / "fraud.py"
        definitions.write_text(definitions.read_text().replace(ANCHOR, ANCHOR + ADDED))
        _run("apply", "--repo", str(repo))
        stream.until(lambda line: CARRIED.search(line) is not None, "the change taken up")
    elif kind == "rescale":
        output = _run("stream", "--repo", str(repo), "--group", GROUP, "--buckets", str(buckets))
        if "moved to their new buckets" not in output:
            raise RuntimeError(f"the running stream did not move its state:\n{output[-3000:]}")
    _land(staged / str(days), repo)
    done = DayStreamed(per_day)
    ended = stream.until(done, "the day's batches")
    stream.stop()
    built = next((CARRIED.search(line) for line in stream.seen if CARRIED.search(line)), None)
    return ended - began, done.events, 0 if built is None else int(built.group(1).replace(",", ""))


class DayStreamed:
    """Whether the batch lines given so far add up to a day's events (`until`'s test)."""

    def __init__(self, per_day: int) -> None:
        self.per_day, self.events = per_day, 0

    def __call__(self, line: str) -> bool:
        if (m := BATCH.match(line)) is not None:
            self.events += int(m.group(1).replace(",", ""))
        return self.events >= self.per_day


def _land(staged: Path, repo: Path) -> None:
    """The staged day's file moved into the landing folder at once."""
    for file in staged.iterdir():
        os.replace(file, repo / "data" / "transactions" / file.name)


def backfill_round(snapshot: Path, alone: bool) -> float:
    """Seconds of `features apply` + `features backfill --since-last` after the feature was added: with the
    table (the added feature alone) or without it (the whole group)."""
    repo = _restored(snapshot, table=alone)
    began = time.perf_counter()
    _run("apply", "--repo", str(repo))
    output = _run(
        "backfill", "--repo", str(repo), "--group", GROUP, "--since-last", *(["--only-changed"] if alone else [])
    )
    seconds = time.perf_counter() - began
    if alone != ("computing only amount_max_6h" in output):
        raise RuntimeError(f"the backfill did not compute what it should have:\n{output[-3000:]}")
    return seconds


def _lookback_events(days: int, per_day: int, users: int) -> int:
    """The events the added feature's windows ending after the stream's watermark read (the newest event time
    less the 10m watermark, to the 5m grid, less 6h and one `every`): what an upgrade needs to read."""
    last = pd.concat([_day(days - 2, days, per_day, users), _day(days - 1, days, per_day, users)])
    watermark = last["event_ts"].max() - pd.Timedelta(minutes=10)
    since = watermark.floor("5min") - pd.Timedelta(hours=6, minutes=5)
    return int((last["event_ts"] >= since).sum())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--events-per-day", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-backfill", action="store_true", help="measure the stream's changes only")
    parser.add_argument("--no-save", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    load_before = load()
    began = time.perf_counter()
    snapshot = set_up(args.days, args.events_per_day, args.users)
    setup_s = time.perf_counter() - began
    runs: dict[str, list[tuple[float, int, int]]] = {"upgrade": [], "reset": [], "restart": []}
    for _ in range(args.rounds):
        for kind in runs:
            runs[kind].append(stream_round(snapshot, args.days, args.events_per_day, args.users, kind))
    upgrade, reset, restart = (float(np.median([r[0] for r in series])) for series in runs.values())
    built = runs["upgrade"][0][2]
    allowed = _lookback_events(args.days, args.events_per_day, args.users) + args.events_per_day
    read = built + runs["upgrade"][0][1]
    total = args.days * args.events_per_day
    lines = [
        f"{load_before} at the start, {load()} at the end.",
        "",
        f"`python bench/upgrade.py --days {args.days} --events-per-day {args.events_per_day} --users {args.users} "
        f"--rounds {args.rounds}`: `{GROUP}` streamed over {args.days} days ({total:,} events; set-up "
        f"{setup_s:.0f}s), then one feature added (max amount over 6h every 5m) and the next day landed. Each run "
        "is `features apply` then `features stream --available-now` (MLflow on), whole processes, from a copy of "
        "the same state; rounds alternate.",
        "",
        "| run | seconds (each round) | median |",
        "|---|---|---|",
        f"| upgrade (state carried over) | {', '.join(f'{r[0]:.1f}' for r in runs['upgrade'])} | {upgrade:.1f} |",
        f"| reset (replay of every file) | {', '.join(f'{r[0]:.1f}' for r in runs['reset'])} | {reset:.1f} |",
        f"| restart, definition unchanged | {', '.join(f'{r[0]:.1f}' for r in runs['restart'])} | {restart:.1f} |",
        "",
        f"- reset / upgrade: **{reset / upgrade:.1f}x** (a scheduled run pays a new JVM and a cold first batch: see "
        "reset / restart; the required 5x is the running stream's, below)",
        f"- upgrade / restart: {upgrade / restart:.2f}x (what carrying the state over and building the new feature "
        f"add to a stream that continues); reset / restart: {reset / restart:.1f}x, the most any upgrade could "
        "reach on this history",
        f"- events the upgrade read: {built:,} to build the new feature + {runs['upgrade'][0][1]:,} streamed = "
        f"{read:,}; the new feature's lookback and the new day hold {allowed:,} (required: no more); the reset "
        f"streamed {runs['reset'][0][1]:,}",
    ]
    lives: dict[str, list[tuple[float, int, int]]] = {"live upgrade": [], "live, unchanged": []}
    for _ in range(args.rounds):
        for label, kind in zip(lives, ("upgrade", "unchanged"), strict=True):
            lives[label].append(live_round(args.days, args.events_per_day, args.users, kind))
    live, idle = (float(np.median([r[0] for r in series])) for series in lives.values())
    live_built, live_streamed = lives["live upgrade"][0][2], lives["live upgrade"][0][1]
    lines += [
        "",
        "A running stream: `features stream --trigger 1s` (its own process) started on the state a day short and "
        "streaming that day as it lands, then idle (not timed): the same state, in a stream that has been running. "
        "Timed: `features apply` of the added feature (a process), until the running stream has taken the change "
        "up in its own process (its query stopped between batches and started again on the new definition, the "
        "state carried over and the new feature built) and processed the next day, landed once the change was "
        "taken up; unchanged: from the day landing to its batch done.",
        "",
        "| run | seconds (each round) | median |",
        "|---|---|---|",
        *[
            f"| {k} | {', '.join(f'{r[0]:.1f}' for r in v)} | {float(np.median([r[0] for r in v])):.1f} |"
            for k, v in lives.items()
        ],
        "",
        f"- reset / live upgrade: **{reset / live:.1f}x** (required >= 5x); live upgrade / unchanged: "
        f"{live / idle:.1f}x",
        f"- events the live upgrade read: {live_built:,} to build the new feature + {live_streamed:,} streamed = "
        f"{live_built + live_streamed:,} (the new feature's lookback and the new day hold {allowed:,})",
    ]
    saved = json.loads((snapshot / "data" / "checkpoints" / GROUP / "features-definition.json").read_text())
    buckets = 2 * int(saved["buckets"])
    rescales: dict[str, list[float]] = {"live rescale": [], "rescale, scheduled": [], "reset": []}
    for _ in range(args.rounds):
        for kind in rescales:
            if kind == "live rescale":
                took = live_round(args.days, args.events_per_day, args.users, "rescale", buckets)[0]
            else:
                took = rescale_round(snapshot, args.days, args.events_per_day, args.users, buckets, kind == "reset")
            rescales[kind].append(took)
    live_moved, moved, replayed = (float(np.median(v)) for v in rescales.values())
    lines += [
        "",
        f"Rescale from {saved['buckets']} to {buckets} buckets over the next day. Live: the running stream above "
        f"(`--trigger 1s`), asked by `features stream --group {GROUP} --buckets {buckets}` (another process, which "
        "hands the rescale to it and ends once the state has moved), then the day landed; timed from that command "
        f"to the day streamed. Scheduled: `features stream --buckets {buckets} --available-now` over the landed day, "
        "the state moved, or with `--reset` (replayed into the new buckets):",
        "",
        "| run | seconds (each round) | median |",
        "|---|---|---|",
        *[f"| {k} | {', '.join(f'{t:.1f}' for t in v)} | {float(np.median(v)):.1f} |" for k, v in rescales.items()],
        "",
        f"- reset / live rescale: **{replayed / live_moved:.1f}x** (required >= 5x); reset / scheduled rescale: "
        f"{replayed / moved:.1f}x (a new process's floor, see reset / restart above)",
    ]
    _restored(snapshot, add=False)
    taken = time.perf_counter()
    savepoint = WORK / "savepoint"
    shutil.rmtree(savepoint, ignore_errors=True)
    _run("savepoint", "--repo", str(WORK / "repo"), "--group", GROUP, "--to", str(savepoint))
    taken = time.perf_counter() - taken
    restores: dict[str, list[float]] = {"from the savepoint": [], "reset": []}
    for _ in range(args.rounds):
        for kind in restores:
            restores[kind].append(
                savepoint_round(snapshot, savepoint, args.days, args.events_per_day, args.users, kind == "reset")
            )
    restored, replayed = (float(np.median(v)) for v in restores.values())
    lines += [
        "",
        f"Savepoint: `features savepoint` of the {args.days} days' state took {taken:.1f}s (a process of its own); "
        "then `features stream --available-now` over the next day in a new checkpoint folder, started "
        "`--from-savepoint` or with `--reset` (replayed):",
        "",
        "| run | seconds (each round) | median |",
        "|---|---|---|",
        *[f"| {k} | {', '.join(f'{t:.1f}' for t in v)} | {float(np.median(v)):.1f} |" for k, v in restores.items()],
        "",
        f"- reset / from the savepoint: **{replayed / restored:.1f}x**",
    ]
    backfills: dict[str, list[float]] = {"added feature alone": [], "full recompute": []}
    for _ in range(0 if args.skip_backfill else args.rounds):
        for kind in backfills:
            backfills[kind].append(backfill_round(snapshot, alone=kind == "added feature alone"))
    if args.skip_backfill:
        print("\n".join(lines))
        return 0
    alone, full = (float(np.median(v)) for v in backfills.values())
    lines += [
        "",
        f"Backfill of the {args.days} days after the feature was added (`features apply` + `features backfill "
        "--since-last`, whole processes; the added feature alone is `--only-changed`):",
        "",
        "| run | seconds (each round) | median |",
        "|---|---|---|",
        *[f"| {k} | {', '.join(f'{t:.1f}' for t in v)} | {float(np.median(v)):.1f} |" for k, v in backfills.items()],
        "",
        f"- full recompute / added feature alone: **{full / alone:.2f}x** (above 1: `--only-changed` is faster)",
    ]
    print("\n".join(lines))
    if not args.no_save:
        update_section("Definition upgrade (bench/upgrade.py)", "\n".join(lines))
    met = min(reset / live, replayed / live_moved) >= 5 and max(read, live_built + live_streamed) <= allowed
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
