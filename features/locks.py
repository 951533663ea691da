"""A lock per offline table, so that a backfill and a stream of the same group never write it at once.

The backfill holds it from reading the partitions it rewrites to swapping the new ones in; the stream holds it
while it adds a micro-batch's files. Without it, a stream file written between the backfill's read and its
swap would be deleted by the swap (rows lost), or would repeat rows the swap brings in. It is an advisory
`flock` on a file beside the table: it works where the table is on a local or POSIX file system (a single
machine, a cluster's shared NFS); on object stores (s3://, dbfs:/) it is a no-op, and backfills there must not
rewrite the days a stream is writing.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def table_lock(table: str) -> Iterator[None]:
    """Hold the table's lock (waiting for another holder to finish)."""
    if "://" in table or table.startswith("dbfs:"):
        yield
        return
    with held(Path(table).parent / "_locks" / f"{Path(table).name}.lock"):
        yield


@contextmanager
def held(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_file` (created with its folder), waiting for another holder."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
