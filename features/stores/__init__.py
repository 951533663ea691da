"""Where feature values are kept and read: the offline change-point table (a Delta table, its compaction), the
online writers in Feast's own storage format, the Feast objects generated from the definitions, and serving."""
