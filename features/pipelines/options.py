"""The options of the commands that run groups, as values: one frozen object per command, built once (from the
command line by features.cli, or from the keyword arguments of the Python call) and passed down to where each option
is used. An option added to a command is one field here, its flag where the command line builds the object, and its
use. What a backfill computes (a range, a day, the days not completed) is its plan's request
(features.pipelines.schedule_plan.Request), not an option of how it runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from features.errors import ConfigError
from features.pipelines.stream.handoff import check_buckets
from features.spec.durations import parse_duration

DEFAULT_KEEP = "30d"  # how long a stream keeps late events and quarantined data (features.pipelines.retention)


@dataclass(frozen=True)
class BackfillOptions:
    """How a backfill runs, whatever it computes (`features backfill`, `backfill`, `execute`)."""

    online: bool = True  # also bring the online store up to each key's value as of the end
    on_invalid: str | None = None  # "fail" or "quarantine" for change points failing validation; None: each group's
    track: bool = True  # record the run in MLflow (features.ml.tracking)
    progress: bool | None = None  # progress bars; None: on a terminal or in a notebook
    now: datetime | None = None  # the current time of the source's `max_future` check; None: the clock
    validate: bool = True  # validate the change points before writing (False: benchmarks measure its cost)
    statistics: bool = True  # record the rows' statistics per feature and day (False: as `validate`)


@dataclass(frozen=True)
class StreamOptions:
    """How a stream runs its groups (`features stream`, `stream`); checked as it is built, before Spark starts."""

    trigger: str = "5s"  # how often a micro-batch starts
    available_now: bool = False  # process what has landed, then stop
    checkpoint_root: str | None = None  # root of the per-group checkpoints; None: <repo>/data/checkpoints
    reset: bool = False  # delete the saved state and rebuild it by replaying the source
    from_savepoint: str | None = None  # start the one group selected from this savepoint, in a new checkpoint
    online: bool = True  # also write the online store
    validate: bool = True  # validate each micro-batch's change points
    buckets: int | None = None  # hash buckets of keys the state is split into; None: the checkpoint's, or one a core
    max_files_per_trigger: int | None = None  # at most this many new files per micro-batch
    progress: bool | None = None  # a line per micro-batch; None: on a terminal or in a notebook
    tracking: bool = True  # record the run in MLflow
    metrics_every: str = "1m"  # MLflow gets one point per metric per this much wall time
    retention: str | None = DEFAULT_KEEP  # keep late events and quarantined data this long; None: for ever

    def __post_init__(self) -> None:
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ConfigError(
                f"--max-files-per-trigger: {self.max_files_per_trigger} is not a positive number of files"
            )
        check_buckets(self.buckets)
        # Each duration read once here, so that a wrong one raises as the options are built, naming its option.
        _ = (self.trigger_seconds, self.metrics_seconds, self.keep_seconds)

    @property
    def trigger_seconds(self) -> int:
        return parse_duration(self.trigger, "--trigger")

    @property
    def metrics_seconds(self) -> int:
        return parse_duration(self.metrics_every, "--metrics-every")

    @property
    def keep_seconds(self) -> int | None:
        return None if self.retention is None else parse_duration(self.retention, "--retention")

    @property
    def spark_trigger(self) -> dict[str, Any]:
        """The trigger of the queries, as `DataStreamWriter.trigger` takes it."""
        return {"availableNow": True} if self.available_now else {"processingTime": f"{self.trigger_seconds} seconds"}

    @property
    def shows_progress(self) -> bool:
        from features.progress import shown_by_default

        return shown_by_default() if self.progress is None else self.progress
