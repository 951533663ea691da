"""Spark engines: batch backfill (`batch`) and, built on the same compiler, streaming."""
