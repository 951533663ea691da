"""Demo data: realistic card transactions with a detectable fraud pattern (pure numpy/pandas, no Spark), and
what lands them in a feature repository, as `features demo` and the notebooks do: `write_sources` (replace the
files of every source folder the repo's groups read) and `clear_outputs` (forget the tables, online values and
Feast registry of earlier runs). `START` is the demo data's first day."""

from features.demo.datagen import generate_transactions, write_events
from features.demo.run import START, clear_outputs, write_sources

__all__ = ["START", "clear_outputs", "generate_transactions", "write_events", "write_sources"]
