"""Demo data: realistic card transactions with a detectable fraud pattern (pure numpy/pandas, no Spark)."""

from features.demo.datagen import generate_transactions, write_events

__all__ = ["generate_transactions", "write_events"]
