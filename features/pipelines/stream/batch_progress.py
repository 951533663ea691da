"""Where a stream stands: each group's progress after its latest micro-batch, and the watermark its checkpoint's
last committed batch emitted up to (read from Spark's checkpoint files, without Spark: `features status` uses it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from features.engine.query_log import last_commit
from features.pipelines.rollup import MetricRollup


class RunState(Protocol):
    """What a sink reports to: the stream run (features.pipelines.stream.runner.StreamRun) its query belongs to."""

    latest: dict[str, StreamProgress]
    history: list[StreamProgress]
    errors: dict[str, BaseException]
    tracker: Any
    rollups: list[MetricRollup]
    stopping: bool  # set by a stop: a batch that fails then was cut short by it


@dataclass(frozen=True)
class StreamProgress:
    """Where one group's stream stands after its latest micro-batch (totals since this run started)."""

    group: str
    batch_id: int = -1
    events: int = 0  # read by the latest batch
    input_rate: float = 0.0  # events per second arriving, as Spark measures it
    processing_rate: float = 0.0  # events per second processed
    watermark: datetime | None = None
    state_rows: int | None = None  # pane rows held in state, all buckets (None: no bucket has run in this run yet)
    state_bytes: int | None = None
    rows_emitted: int = 0  # change points written by the latest batch
    rows_total: int = 0
    late: int = 0  # events behind the watermark in the latest batch (written to the late-events folder)
    late_total: int = 0
    bad_records_total: int = 0  # bad source records quarantined
    batches_quarantined: int = 0  # micro-batches that failed validation (nothing of them written)
    batch_seconds: float = 0.0
    # From the landing of the batch's oldest file (Kafka: record time) to the batch's rows being written.
    freshness_seconds: float | None = None

    def line(self) -> str:
        wm = self.watermark.strftime("%Y-%m-%d %H:%M:%S") if self.watermark else "-"
        text = (
            f"{self.group} batch {self.batch_id}: {self.events:,} events in {self.batch_seconds:.1f}s "
            f"({self.processing_rate:,.0f}/s), watermark {wm}, {self.rows_emitted:,} rows out "
            f"({self.rows_total:,} total), state {_panes(self.state_rows)}, late {self.late_total:,}"
        )
        if self.freshness_seconds is not None:
            text += f", landing to online {self.freshness_seconds:.1f}s"
        if self.bad_records_total:
            text += f", bad records {self.bad_records_total:,}"
        if self.batches_quarantined:
            text += f", batches quarantined {self.batches_quarantined}"
        return text


def emitted_watermark(query_checkpoint: Path) -> datetime | None:
    """The watermark the query's last committed micro-batch emitted up to, or None for a new checkpoint: every
    offline row up to it is final."""
    _, watermark_us = last_commit(query_checkpoint)
    return datetime.fromtimestamp(watermark_us / 1e6, UTC) if watermark_us else None


def _panes(rows: int | None) -> str:
    # Known only from a bucket that ran: a batch that ran none (its only file set aside) says so, not 0 panes.
    return "not read yet" if rows is None else f"{rows:,} panes"


# When finding new files takes this share of the trigger's interval (and at least the floor) in this many batches
# in a row, the stream says so: one slow listing is the machine's, several in a row are the folder's.
LISTING_SHARE = 0.3
LISTING_FLOOR_S = 0.2
LISTING_BATCHES = 3


@dataclass
class ListingWatch:
    """Watches how long Spark's file source takes to find new files at each trigger (the query progress's
    `latestOffset`): it lists every file of the source folder every time, so the time grows with the files the
    folder keeps (docs/streaming.md, "Running a stream for months"). Says it once that time takes a share of the
    trigger, and again each time it has doubled since."""

    group: str
    folder: str
    trigger_seconds: float
    slow: int = 0  # batches in a row over the bound
    said_seconds: float = 0.0
    seconds: float | None = None  # the latest listing's (None before a batch has a progress), a metric

    def observe(self, spark_progress: dict[str, Any] | None) -> str | None:
        """What to tell the user after a batch whose query progress is `spark_progress` (None: nothing)."""
        took = ((spark_progress or {}).get("durationMs") or {}).get("latestOffset")
        self.seconds = None if took is None else float(took) / 1000
        listed = self.seconds or 0.0
        bound = max(LISTING_FLOOR_S, LISTING_SHARE * self.trigger_seconds)
        self.slow = self.slow + 1 if listed >= bound else 0
        if self.slow < LISTING_BATCHES or listed < 2 * self.said_seconds:
            return None
        self.said_seconds = listed
        return (
            f"{self.group}: finding new files took {listed:.1f}s of the last trigger (every {self.trigger_seconds:g}s):"
            f" Spark's file source lists every file of {self.folder} at each trigger, and the time grows with the "
            "files the folder keeps. Fix: move files out of the folder once the offline table holds their days (a "
            'backfill no longer reads them), or land fewer, larger files (docs/streaming.md, "Running a stream for '
            'months")'
        )
