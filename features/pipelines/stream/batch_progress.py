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
