"""What a stream's file source pays each micro-batch to find new files, as its landing folder fills: Spark's file
source lists the whole folder at every trigger (its `latestOffset` phase), files read long ago included.

    python bench/source_listing.py [--files 1000,10000,50000,100000,200000] [--batches 12] [--no-save]
                                   [--live-files 40000] [--live-seconds 60]

For each size: a folder of that many small Parquet files (hard links of a few, in hourly subfolders of 3,600 as a
file-a-second producer would land them) and a plain Structured Streaming query over it as `features stream` reads a
folder (recursive lookup), reading the newest unread file at each trigger (`latestFirst`, `maxFilesPerTrigger` 1:
Spark then lists at every trigger, as it does in a live stream whose batches take what landed since the last),
into Spark's noop sink, batches back to back. Printed: the medians over the batches after the first two of the
`latestOffset` phase and of the whole trigger, and the listing's ratio to the first size's (the baseline, in the
same run).

With `--live-files N`, also a live `features stream --trigger 1s` (its own process, as users run it) on a count over
`Hop("1h", every="1s")`, a file of one event landed every second for `--live-seconds`: once over a folder holding
nothing else (the baseline) and once with N files landed 30 days before among them (never read again: Spark's
`maxFileAge`, but listed at every trigger), put among them once the stream's first batch has run (a new query's
first listing reads every file). Printed: the median of the stream's own "landing to online" from the third batch
after, its ratio to the baseline's, and whether the stream told that finding new files took long.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from features.engine.session import get_spark

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/repo_yaml.py
from repo_yaml import write_feature_store_yaml
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work" / "source_listing"
PER_FOLDER = 3_600  # an hour of a file a second
PER_SEED = 60_000  # under the file system's limit of hard links to one file
DAY_S = 86_400
ONLINE = re.compile(r"landing to online ([\d.]+)s")  # in the stream's progress lines


def seed(i: int) -> Path:
    """The small Parquet file that file `i` of a folder is a hard link to (made at its first use)."""
    path = WORK / f"seed-{i // PER_SEED}.parquet"
    if not path.exists():
        pd.DataFrame({"user_id": ["u1"], "amount": [1.0]}).to_parquet(path)
    return path


def fill(folder: Path, have: int, want: int) -> None:
    """Files `have` .. `want` - 1 of the folder, each a hard link to one of a few small Parquet files."""
    for i in range(have, want):
        hour = folder / f"hour={i // PER_FOLDER:05d}"
        if i % PER_FOLDER == 0:
            hour.mkdir(parents=True, exist_ok=True)
        os.link(seed(i), hour / f"part-{i:07d}.parquet")


def listed(spark, folder: Path, batches: int) -> tuple[float, float]:
    """Medians (s) of the `latestOffset` phase and of the trigger, over the batches after the first two."""
    query = (
        spark.readStream.schema("user_id string, amount double")
        .option("recursiveFileLookup", "true")
        .option("latestFirst", "true")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(folder))
        .writeStream.format("noop")
        .option("checkpointLocation", str(WORK / f"checkpoint-{time.time_ns()}"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < batches + 2:
            time.sleep(0.2)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
    finally:
        query.stop()
    steady = [p["durationMs"] for p in query.recentProgress if p["numInputRows"] > 0][2:]
    return (
        statistics.median(d["latestOffset"] for d in steady) / 1000,
        statistics.median(d["triggerExecution"] for d in steady) / 1000,
    )


GROUP = """
from features import Entity, EventSource, Feature, FeatureGroup, Hop, agg

user = Entity("user", join_keys=["user_id"])
events = EventSource(
    "events", path="events", timestamp="event_ts", watermark="1m",
    schema={"user_id": "string", "amount": "double", "event_ts": "timestamp"},
)
live = FeatureGroup("live", user, events, [Feature("n", agg.count(), window=Hop("1h", every="1s"))])
"""


def live_stream(old_files: int, seconds: int) -> tuple[float, bool]:
    """A live stream fed a file a second, with `old_files` files landed 30 days before put among its files once its
    first batch has run (Spark's file source reads every file of a new query's first listing): the median (s) of its
    batches' landing to online from the third batch after, for `seconds`, and whether it told that finding files
    took long."""
    root = WORK / f"live-{old_files}"
    events = root / "events"
    events.mkdir(parents=True)
    write_feature_store_yaml(root, "bench_listing")
    (root / "live_groups.py").write_text(GROUP)
    apply = [sys.executable, "-m", "features.cli", "apply", "--repo", str(root)]
    subprocess.run(apply, check=True, capture_output=True)
    aged = time.time() - 30 * DAY_S
    for i in range(0, old_files, PER_SEED):  # aged before a link to them is in the folder: links share their times
        os.utime(seed(i), (aged, aged))
    log = root / "stream.log"
    command = [sys.executable, "-m", "features.cli", "stream", "--repo", str(root), "--trigger", "1s", "--no-tracking"]
    deadline = time.time() + 300
    with log.open("w") as out:
        stream = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            since, i = None, 0
            while since is None or i < since + seconds:
                began = time.time()
                frame = pd.DataFrame({"user_id": ["u1"], "amount": [1.0], "event_ts": [pd.Timestamp.now(tz="UTC")]})
                frame.to_parquet(events / f".new-{i}.parquet", index=False, coerce_timestamps="us")
                os.replace(events / f".new-{i}.parquet", events / f"new-{i:05d}.parquet")
                reported = len(ONLINE.findall(log.read_text()))
                if since is None and reported:  # the first batch has run: the old files join the folder
                    fill(events / "old", 0, old_files)
                    since, first = i, reported + 3
                if since is None and time.time() > deadline:
                    raise RuntimeError(f"the stream ran no batch in 300 s: see {log}")
                i += 1
                time.sleep(max(0.0, 1.0 - (time.time() - began)))
        finally:
            stream.terminate()
            stream.wait(timeout=60)
    text = log.read_text()
    online = [float(x) for x in ONLINE.findall(text)][first:]
    if not online:
        raise RuntimeError(f"the stream reported too few batches: see {log}")
    return statistics.median(online), "finding new files took" in text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="1000,10000,50000,100000,200000")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--live-files", type=int, default=0, help="also a live stream among this many old files")
    parser.add_argument("--live-seconds", type=int, default=60)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    spark = get_spark()
    folder, have, rows = WORK / "landing", 0, []
    for n in sorted(int(x) for x in args.files.split(",")):
        fill(folder, have, n)
        have = n
        rows.append((n, *listed(spark, folder, args.batches)))
        print(f"{n:,} files: listing {rows[-1][1]:.3f} s, trigger {rows[-1][2]:.3f} s", flush=True)
    shutil.rmtree(folder)
    live = []
    if args.live_files:
        for old in (0, args.live_files):
            live.append((old, *live_stream(old, args.live_seconds)))
            print(f"live stream among {old:,} old files: landing to online {live[-1][1]:.1f} s", flush=True)
    shutil.rmtree(WORK, ignore_errors=True)
    base = rows[0][1]
    lines = [
        f"`python bench/source_listing.py --files {args.files} --batches {args.batches}"
        + (f" --live-files {args.live_files} --live-seconds {args.live_seconds}" if args.live_files else "")
        + f"`, {load()}. Seconds a "
        "micro-batch (medians); the ratio is the listing's to the first size's (the baseline), in the same run.",
        "",
        "| files in the folder | Spark's `latestOffset` (the listing) | ratio | the whole trigger | days of a file a "
        "second |\n|---|---|---|---|---|",
    ]
    for n, listing, trigger in rows:
        lines.append(f"| {n:,} | {listing:.3f} | **{listing / base:.1f}** | {trigger:.3f} | {n / DAY_S:.2f} |")
    if live:
        lines += [
            "",
            f"A live `features stream --trigger 1s`, a file of one event landed a second for {args.live_seconds} s "
            "(`--live-files`), the old files put among its files once its first batch had run: the median of its "
            "batches' landing to online from the third batch after, the ratio to the folder without old files (the "
            "baseline), in the same run.",
            "",
            "| files landed 30 days before in the folder | landing to online s | ratio | the stream told |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {old:,} | {median:.1f} | **{median / live[0][1]:.2f}** | {'yes' if told else 'no'} |"
            for old, median, told in live
        ]
    body = "\n".join(lines)
    print(body)
    if not args.no_save:
        update_section("A stream's file listing as its folder fills (bench/source_listing.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
