"""A Spark session setting for the span of one command: a streaming query copies its session's settings when it
starts, and a command like OPTIMIZE reads them when it runs, so a setting meant for one of them is set just before
and put back after (unset again where the session had none)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def session_setting(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """Set `key` to `value` on `spark` inside the block; afterwards the session holds what it held before."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
