"""Spark engines: batch backfill (`batch`) and streaming (`stream`), both running the one phase-2 kernel
(`features.kernel`) on the same inputs (`inputs`)."""
