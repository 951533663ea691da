"""Progress bars: the Spark tasks a block of work runs (Spark's own console bar is turned off), and the date
partitions and rows of a backfill schedule."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def spark_progress(spark: SparkSession, desc: str, enabled: bool | None = None) -> Iterator[None]:
    """Show completed/total Spark tasks under `desc` while the block runs (on a terminal by default): polled
    from the SparkContext's status tracker, or on Spark Connect (no SparkContext) from the progress the server
    reports with each operation's results."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    from tqdm import tqdm

    from features.engine.session import is_connect

    bar = tqdm(total=0, desc=desc, unit="task", leave=False, file=sys.stderr)
    seen: dict[int, tuple[int, int]] = {}  # stage id -> (completed tasks, tasks)

    def show() -> None:
        bar.total = sum(total for _, total in seen.values())
        bar.n = sum(done for done, _ in seen.values())
        bar.refresh()

    try:
        with _connect_progress(spark, seen, show) if is_connect(spark) else _polled_progress(spark, seen, show):
            yield
    finally:
        bar.close()


@contextmanager
def _polled_progress(spark: SparkSession, seen: dict[int, tuple[int, int]], show: Callable[[], None]) -> Iterator[None]:
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.3):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            show()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def _connect_progress(
    spark: SparkSession, seen: dict[int, tuple[int, int]], show: Callable[[], None]
) -> Iterator[None]:
    """Spark Connect's progress handler (`registerProgressHandler`): called with each operation's stages as the
    server reports them, in the thread that runs the operation."""

    def handler(stages: Iterable[Any] | None, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        for stage in stages or ():
            seen[stage.stage_id] = (stage.num_completed_tasks, stage.num_tasks)
        show()

    spark.registerProgressHandler(handler)  # type: ignore[arg-type]
    try:
        yield
    finally:
        spark.removeProgressHandler(handler)  # type: ignore[arg-type]


class PartitionProgress:
    """Date partitions done (of a plan's total) and rows written so far, over a whole backfill schedule; each
    run's Spark tasks get their own bar (`spark_progress`) beneath it. On a terminal by default."""

    def __init__(self, total: int, desc: str = "backfill", enabled: bool | None = None, file: TextIO | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self.partitions = 0
        self.rows = 0
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="partition", file=file or sys.stderr)
            self._bar.set_postfix_str("0 rows")

    def advance(self, partitions: int, rows: int) -> None:
        self.partitions += partitions
        self.rows += rows
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.rows:,} rows", refresh=False)
            self._bar.update(partitions)

    def write(self, line: str) -> None:
        """Print a line to stdout without garbling the bar."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> PartitionProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
