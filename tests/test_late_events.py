"""A stream's late events set aside (docs/streaming.md, late events): a batch's few late events are written from
the driver, more by Spark's writer; both give the same folder of the same rows."""

from __future__ import annotations

import json

import pandas as pd
from test_batch_reference import SOURCE

from features import Entity, Feature, FeatureGroup, Hop, agg
from features.engine import stream_rows
from features.kernel import TS
from features.pipelines.stale import late_event_micros
from features.pipelines.stream.aside import write_late
from features.spec import DType

GROUP = FeatureGroup(
    "late", Entity("card", join_keys=["user_id", "card_no"]), SOURCE, [Feature("n", agg.count(), Hop("1h", "5m"))]
)
TYPES = {"user_id": DType.STRING, "card_no": DType.INT64}


def test_late_events_written_from_the_driver_are_those_spark_writes(spark, tmp_path) -> None:
    t0 = 1_767_225_600_000_000  # 2026-01-01 UTC, in µs
    late = [(f"ü{i % 3}", i * 7 - 2, t0 + i * 61_000_001) for i in range(12)]
    records = [json.dumps({"user_id": u, "card_no": c, TS: t}) for u, c, t in late]
    batch = spark.createDataFrame(
        [(stream_rows.LATE, r) for r in records] + [(stream_rows.ROW, None)] * 3,
        f"{stream_rows.KIND} string, {stream_rows.RECORD} string",
    )
    write_late(GROUP, TYPES, batch, tmp_path / "spark" / "batch=12", 12)
    write_late(GROUP, TYPES, records, tmp_path / "driver" / "batch=12", 12)

    def read(name: str) -> pd.DataFrame:
        frame = spark.read.parquet(str(tmp_path / name)).toPandas()
        return frame.sort_values(["card_no"], ignore_index=True)

    by_spark, by_driver = read("spark"), read("driver")
    pd.testing.assert_frame_equal(by_driver, by_spark)
    assert list(by_driver.columns) == ["user_id", "card_no", "event_ts", "batch_id", "batch"]
    assert sorted(by_driver["card_no"]) == sorted(c for _, c, _ in late)
    for name in ("spark", "driver"):  # as the stale-day check reads them
        micros = late_event_micros(tmp_path / name / "batch=12", "event_ts")
        assert sorted(micros.tolist()) == [t for _, _, t in late]
