"""What a stream's check of landed files costs a micro-batch as the landing folder fills: the files of the batch
read from its file source's log (features.engine.source_log.batch_files, what the stream does) against the
baseline, the folder listed through Spark each batch (what it did before, and still does for a batch whose logs
do not tell).

    python bench/landed_files.py [--files 200,10000] [--repeats 20] [--no-save]

For each size: a landing folder of that many Parquet files (a small file copied), and a query checkpoint whose
file-source log lists them as Spark writes it, folded every 10 source batches, the newest batch holding one file.
Timed: the listing (`files.input_files` of `spark.read.parquet(folder)`, as the set-aside check listed it), and
`batch_files` for an ordinary batch and for a batch whose entries are in a fold (every tenth, which reads the
fold's whole file). Medians of `--repeats`, the ratio to the listing in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from features.engine import files, source_log
from features.engine.session import get_spark

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import load, update_section

WORK = Path(__file__).resolve().parent / "work" / "landed_files"
FOLD_EVERY = 10  # Spark's spark.sql.streaming.fileSource.log.compactInterval


def landing(root: Path, n: int) -> Path:
    """A folder of `n` small Parquet files."""
    folder = root / "landing"
    folder.mkdir(parents=True)
    first = folder / "part-00000.parquet"
    pd.DataFrame({"user_id": ["u1"], "amount": [1.0]}).to_parquet(first)
    for i in range(1, n):
        shutil.copyfile(first, folder / f"part-{i:05d}.parquet")
    return folder


def checkpoint(root: Path, folder: Path, n: int, fold_last: bool) -> tuple[Path, int]:
    """A query checkpoint whose source read the files one per source batch (each query batch one); its last
    batch's entries in a fold when `fold_last`. The query's last batch."""
    query = root / ("fold" if fold_last else "plain") / "query"
    sources, offsets = query / "sources" / "0", query / "offsets"
    sources.mkdir(parents=True)
    offsets.mkdir(parents=True)
    names = [(folder / f"part-{i:05d}.parquet").as_uri() for i in range(n)]
    last = n - 1 if fold_last else n - 2  # a fold at batch b when (b + 1) % FOLD_EVERY == 0
    while fold_last and (last + 1) % FOLD_EVERY:
        last -= 1
    fold = max(b for b in range(last + 1) if (b + 1) % FOLD_EVERY == 0)
    entries = [json.dumps({"path": names[b], "timestamp": 0, "batchId": b}) for b in range(fold + 1)]
    (sources / f"{fold}.compact").write_text("\n".join(["v1", *entries]))
    for b in range(fold + 1, last + 1):
        (sources / str(b)).write_text("\n".join(["v1", json.dumps({"path": names[b], "timestamp": 0, "batchId": b})]))
    for b in (last - 1, last):
        (offsets / str(b)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{b}}}')
    return query, last


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="200,10000")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    spark = get_spark()
    rows = []
    for n in (int(x) for x in args.files.split(",")):
        shutil.rmtree(WORK, ignore_errors=True)
        folder = landing(WORK, n)
        read = spark.read.schema("user_id string, amount double").option("recursiveFileLookup", "true")
        listing = median_seconds(lambda r=read, f=folder: files.input_files(r.parquet(str(f))), args.repeats)
        plain, fold = checkpoint(WORK, folder, n, False), checkpoint(WORK, folder, n, True)
        assert source_log.batch_files(*plain) == [(folder / f"part-{plain[1]:05d}.parquet").as_uri()]
        assert len(source_log.batch_files(*fold) or []) == 1
        logged = median_seconds(lambda plain=plain: source_log.batch_files(*plain), args.repeats)
        folded = median_seconds(lambda fold=fold: source_log.batch_files(*fold), args.repeats)
        rows.append((n, listing, logged, folded))
    shutil.rmtree(WORK, ignore_errors=True)
    lines = [
        f"`python bench/landed_files.py --files {args.files} --repeats {args.repeats}`, {load()}. Seconds a "
        "micro-batch (medians); the ratio is to the listing, the baseline, in the same run.",
        "",
        "| files landed | listing through Spark (before) | the batch's log (now) | ratio | a folded batch's log "
        "| ratio |\n|---|---|---|---|---|---|",
    ]
    for n, listing, logged, folded in rows:
        lines.append(
            f"| {n:,} | {listing:.4f} | {logged:.5f} | **{logged / listing:.4f}** | {folded:.5f} | "
            f"**{folded / listing:.4f}** |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_save:
        update_section("The landed-files check of a stream's batch (bench/landed_files.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
