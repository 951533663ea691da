"""A progress bar over the Spark tasks a block of work runs (Spark's own console bar is turned off)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def spark_progress(spark: SparkSession, desc: str, enabled: bool | None = None) -> Iterator[None]:
    """Show completed/total Spark tasks under `desc` while the block runs (on a terminal by default)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    from tqdm import tqdm

    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    bar = tqdm(total=0, desc=desc, unit="task", leave=False, file=sys.stderr)
    seen: dict[int, tuple[int, int]] = {}

    def poll() -> None:
        while not stop.wait(0.3):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            bar.total = sum(total for _, total in seen.values())
            bar.n = sum(done for done, _ in seen.values())
            bar.refresh()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        bar.close()
