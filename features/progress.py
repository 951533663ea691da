"""Progress bars: the Spark tasks a block of work runs (Spark's own console bar is turned off), and the date
partitions and rows of a backfill schedule.

They show by default where someone watches: on a terminal, and in a notebook (a Jupyter kernel: JupyterLab,
VS Code, Databricks), where stderr is never a terminal. Plain non-interactive processes (jobs, CI logs) get
none. The bars are `tqdm.auto`'s: a widget in Jupyter when ipywidgets is installed, else text.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from tqdm import tqdm


def in_notebook() -> bool:
    """True in a Jupyter kernel: an IPython shell that a kernel runs (not the terminal `ipython`)."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def shown_by_default() -> bool:
    """Whether progress bars show when the caller does not say: on a terminal or in a notebook."""
    stderr = sys.stderr
    return (stderr is not None and stderr.isatty()) or in_notebook()


def _bars_stack() -> bool:
    """Whether a bar can show beneath another one: on a terminal (tqdm moves the cursor back up to redraw the
    outer bar) and as Jupyter widgets, not as text in a notebook, whose output cannot move the cursor up."""
    return not in_notebook() or _bar_class().__module__ == "tqdm.notebook"


def _bar_class() -> type[tqdm]:
    # Without ipywidgets, tqdm.auto warns once on import that it falls back to the text bar: that bar is
    # what a notebook without widgets shows anyway, so the warning would only add a red block to every cell.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm

    return tqdm


_OPEN: list[PartitionProgress] = []  # the schedule bars showing now (a Spark-task bar goes beneath them)


@contextmanager
def spark_progress(spark: SparkSession, desc: str, enabled: bool | None = None) -> Iterator[None]:
    """Show completed/total Spark tasks under `desc` while the block runs (by default on a terminal and in a
    notebook, `shown_by_default`): polled from the SparkContext's status tracker, or on Spark Connect (no
    SparkContext) from the progress the server reports with each operation's results."""
    if enabled is None:
        # Beneath a schedule's bar only where bars stack; else the schedule's bar alone shows the progress.
        enabled = shown_by_default() and (not _OPEN or _bars_stack())
    if not enabled:
        yield
        return
    from features.engine.session import is_connect

    bar = _bar_class()(total=0, desc=desc, unit="task", leave=False, file=sys.stderr)
    seen: dict[int, tuple[int, int]] = {}  # stage id -> (completed tasks, tasks)

    def show() -> None:
        total = sum(total for _, total in seen.values())
        if total != bar.total:
            # `reset` is how a Jupyter widget bar learns its new length; it restarts the clock, which stays.
            started = bar.start_t
            bar.reset(total=total)
            bar.start_t = started
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
    run's Spark tasks get their own bar (`spark_progress`) beneath it where bars stack (not as a notebook's
    text). On a terminal and in a notebook by default (`shown_by_default`)."""

    def __init__(self, total: int, desc: str = "backfill", enabled: bool | None = None, file: TextIO | None = None):
        if enabled is None:
            enabled = shown_by_default()
        self.partitions = 0
        self.rows = 0
        self._bar = None
        if enabled:
            self._bar = _bar_class()(total=total, desc=desc, unit="partition", file=file or sys.stderr)
            self._bar.set_postfix_str("0 rows")
            _OPEN.append(self)

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
            if self in _OPEN:
                _OPEN.remove(self)

    def __enter__(self) -> PartitionProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
