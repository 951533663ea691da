"""The offline tables of versions of features before the tables were Delta: Parquet files in `date=` folders, a
backfill's `part-0.parquet` and a stream's `stream-b*.parquet` per date (features.stores.migration converts them).
That layout is history: it does not follow the current table's."""

from __future__ import annotations

from typing import Any

EARLIER_BACKFILL_FILE = "part-0.parquet"  # the one file per date of a backfill before the table was Delta


def filesystem(table: str) -> tuple[Any, str]:
    """The pyarrow file system of `table` and its path there."""
    import pyarrow.fs as pafs

    if "://" in table:
        return pafs.FileSystem.from_uri(table)
    return pafs.LocalFileSystem(), table


def earlier_files(table: str) -> list[str]:
    """The files of an earlier version's table: a backfill's `part-0.parquet` and a stream's `stream-b*.parquet` in
    `date=` folders. By name, because a first Delta commit writes its data files (`part-00000-<uuid>...`) before its
    log: a reader then sees a table with nothing written yet, not one to migrate."""
    import pyarrow.fs as pafs

    try:
        fs, root = filesystem(table)
        found = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True))
    except (OSError, ValueError):
        return []
    return sorted(
        f.path
        for f in found
        if f.is_file
        and "/date=" in f.path
        and (f.base_name == EARLIER_BACKFILL_FILE or earlier_stream_file(f.base_name))
    )


def earlier_stream_file(name: str) -> bool:
    return name.startswith("stream-b") and name.endswith(".parquet")
