"""A group's streaming query up to its stateful operator, as `features stream` runs it and as a restored
savepoint's first (empty) micro-batch makes its checkpoint: both must build the same operator, which Spark checks
against the checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType

from features.engine import stream_operator, stream_source
from features.engine.files import Conformity
from features.engine.schema import CHECKED_FILE
from features.session_conf import session_setting

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from features.engine.state_upgrade import PendingUpgrade
    from features.spec import FeatureGroup


def stateful_query(
    spark: SparkSession,
    group: FeatureGroup,
    source: stream_source.StreamSource,
    labels: list[int],
    *,
    layout: str,
    upgrade: PendingUpgrade | None,
    nanoseconds: bool,
    nulls: bool,
    max_files_per_trigger: int | None = None,
) -> tuple[DataFrame, stream_operator.Projection, DataFrame]:
    """A group's stream up to its stateful operator: the events read from `source`, their projection, and the
    operator's output (change points, late events, bad records, bucket stats) for the sink. `nanoseconds` and
    `nulls`: the reads its checkpoint started with (features.engine.stream_source.read_stream)."""
    events = stream_source.read_stream(spark, group, source, max_files_per_trigger, nanoseconds, nulls)
    # The records of Spark's Parquet read carry their file, whose conformity the pack decides.
    conformity = Conformity.of(source.schema, nulls) if CHECKED_FILE in events.columns else None
    projected, projection = stream_operator.project(group, events, labels, conformity)
    fields = StructType.fromDDL(projection.output_schema).fields
    output = {f.name: to_arrow_type(f.dataType, timezone="UTC") for f in fields}  # times in UTC, as the kernel's
    processor = stream_operator.PaneProcessor(
        projection.plan,
        group.name,
        output,
        delay_us=group.source.watermark_s * 1_000_000,
        eager=group.online == "eager",
        layout=layout,
        upgrade=upgrade,
        labels=tuple(labels),
    )
    out = projected.groupBy(stream_operator.BUCKET).transformWithStateInPandas(
        processor, projection.output_schema, "append", "EventTime"
    )
    return events, projection, out


@contextmanager
def query_settings(spark: SparkSession, partitions: int) -> Iterator[None]:
    """Start a group's query with its own settings (a streaming query copies the session's when it starts): its
    shuffle partitions (which its stateful operator keeps in the checkpoint from then on), and no micro-batch
    without events. Spark runs one after a batch that moved the watermark, to fire the event-time timers it
    passed; the processor already emitted up to that watermark in the batch that moved it
    (`PaneProcessor._advance`), so such a batch would find nothing to do, at the cost of a job."""
    with (
        session_setting(spark, "spark.sql.shuffle.partitions", str(partitions)),
        session_setting(spark, "spark.sql.streaming.noDataMicroBatches.enabled", "false"),
    ):
        yield


def can_repartition_state(spark: SparkSession) -> bool:
    """Whether this PySpark has Spark's offline state repartitioning (4.2+)."""
    return hasattr(spark, "_streamingCheckpointManager")


def repartition_state(spark: SparkSession, query_checkpoint: Path, partitions: int) -> None:
    """Spread a stopped query's state over `partitions` with Spark's offline state repartitioning
    (`StreamingCheckpointManager.repartition`, where `can_repartition_state`): a micro-batch of its own that reads
    no input and rewrites every state partition; the query then runs that many tasks."""
    spark.streams.active  # noqa: B018  # makes the state store coordinator, which the rewrite's tasks report to
    spark._streamingCheckpointManager.repartition(str(query_checkpoint), partitions)
