"""The stream's step on each bucket, apart from Spark: the stateful processor's Python work, replayed in one process.

    python bench/stream_step.py [--shape group|count] [--files 12] [--runs 2] [--against PATH]

bench/stream.py's events (10,000 keys, files of 500,000 events) are projected and packed per bucket as the stream
packs them, one Spark job per file, once; then every bucket's batches are stepped through the processor's step
(`PaneProcessor._step`: the keys coded, the kernel's phase 1 and 2, the output frames) in a process with no Spark,
as a worker steps them with its state resident. `group` is the 5-feature group `user_transactions`, `count` one
count over `Hop("24h", every="5m")`. Printed: the steady steps' median and mean (the batches after the first two),
and a digest of every output row. With `--against PATH` (another checkout of this repository), the same batches
are stepped by that tree too, each tree in a process of its own, alternated `--runs` times: the ratio of the
medians (this tree over that one) and whether the digests agree (they must: the same rows).

The step is what a stream's stateful stage waits on for the 5-feature group (docs/benchmarks.md, "A steady
micro-batch's time"); here its changes are measured without the stage's other costs and their noise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = HERE / "work-step"
LABELS = [0, 1]
WARM = 2  # batches stepped before the timed ones: the state fills, as a stream's first batches fill it


def capture(shape: str, files: int) -> Path:
    """The packed events of every file, per bucket (Arrow IPC blobs), with what a processor is built from."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructType

    sys.path.insert(0, str(HERE))
    import stream as stream_bench

    from features.engine import stream_operator
    from features.engine.schema import FILE, LANDED
    from features.engine.session import get_spark

    out = WORK / f"{shape}.pickle"
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    stream_bench.WORK = WORK
    group = next(iter(stream_bench.shape_repo(shape, files).groups.values()))
    spark = get_spark()
    batches = []
    for path in sorted(Path(group.source.path).rglob("*.parquet")):
        read = spark.read.parquet(str(path)).withColumn(FILE, F.col("_metadata.file_path"))
        read = read.withColumn(LANDED, F.unix_micros(F.col("_metadata.file_modification_time")))
        projected, projection = stream_operator.project(group, read, LABELS)
        batches.append([tuple(row) for row in projected.collect()])
    fields = StructType.fromDDL(projection.output_schema).fields
    output = {f.name: to_arrow_type(f.dataType, timezone="UTC") for f in fields}
    with out.open("wb") as f:
        delay_us = group.source.watermark_s * 1_000_000
        pickle.dump(
            {"plan": projection.plan, "group": group.name, "output": output, "delay_us": delay_us, "batches": batches},
            f,
        )
    return out


def replay(packed: Path) -> dict[str, Any]:
    """Every bucket's batches stepped in turn; the steady steps' seconds and a digest of the output rows."""
    import numpy as np
    import pandas as pd

    from features import kernel as pt
    from features.engine import stream_operator as so

    with packed.open("rb") as f:
        captured = pickle.load(f)
    processor = so.PaneProcessor(captured["plan"], captured["group"], captured["output"], delay_us=captured["delay_us"])
    processor.keys = _NoStore()  # the key dictionary's new entries are written to the state store: none here
    held = {b: pt.Held.of(processor.coded, processor.chunk_us, []) for b in LABELS}
    keys = {b: pt.KeyDictionary(processor.plan.keys) for b in LABELS}
    meta: dict[int, Any] = dict.fromkeys(LABELS)
    digest, seconds = hashlib.sha256(), []
    for i, batch in enumerate(captured["batches"]):
        newest = max((r[2] for r in batch if r[2] is not None), default=None)
        for bucket in LABELS:
            frames = iter([pd.DataFrame({so.PACK: [r[1] for r in batch if r[0] == bucket and r[1] is not None]})])
            began = time.perf_counter()
            table, _ = so._unpack(frames)
            events = pt.events_frame(table.drop_columns([so.REASON, so.RECORD, so.LANDED]))
            state = so._Loaded(held[bucket], keys[bucket], {}, meta[bucket], processor.layout, None)
            stepped = processor._step(state, events, 0, newest)
            if i >= WARM:
                seconds.append(time.perf_counter() - began)
            meta[bucket] = (stepped.upto, stepped.newest, 0)
            for frame in stepped.output:
                digest.update(pd.util.hash_pandas_object(frame.astype(str), index=False).to_numpy().tobytes())
    return {"median_s": statistics.median(seconds), "mean_s": float(np.mean(seconds)), "digest": digest.hexdigest()}


class _NoStore:
    def updateValue(self, *_: Any) -> None:  # noqa: N802 (Spark's MapState)
        pass


def run_tree(tree: Path, packed: Path) -> dict[str, Any]:
    """`replay` in a process of its own, importing `features` from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--replay", str(packed)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("group", "count"), default="group")
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--against", type=Path, help="another checkout, stepped in turns with this one")
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)  # one tree's run (`run_tree`)
    args = parser.parse_args()
    if args.replay is not None:
        print(json.dumps(replay(args.replay)))
        return 0
    packed = capture(args.shape, args.files)
    trees = {"this tree": HERE.parent, **({"against": args.against.resolve()} if args.against else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(run_tree(tree, packed))
    print("| tree | runs | a bucket's step, median s | mean s | digest of the output rows |\n|---|---|---|---|---|")
    for name, done in runs.items():
        medians = ", ".join(f"{r['median_s']:.3f}" for r in done)
        means = ", ".join(f"{r['mean_s']:.3f}" for r in done)
        print(f"| {name} | {len(done)} | {medians} | {means} | {done[0]['digest'][:16]} |")
    if args.against:
        mine = statistics.median(r["median_s"] for r in runs["this tree"])
        theirs = statistics.median(r["median_s"] for r in runs["against"])
        same = {r["digest"] for r in runs["this tree"] + runs["against"]}
        rows = "equal" if len(same) == 1 else "DIFFER"
        print(f"this tree / against, median step: {mine / theirs:.2f}; output rows {rows}")
        return 0 if len(same) == 1 else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
