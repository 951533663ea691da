"""Delta tables the process keeps open between micro-batches. A stream's batch reads its offline table's log twice,
appends to it and to its statistics table: opened by path, each of those replays the table's log (about 25 ms at a
hundred commits, more until the next checkpoint), where bringing a table already open up to date reads only the
commits made since (about 3 ms; deltalake's `update_incremental`).

A table deleted and made anew at the same path (a `--reset`, a test's fresh repo) is told apart by its log: the
commit file of the version held must still be the one read (same inode and modification time), else the table is
opened afresh. Meant for one writer thread per table, as a stream's sink is.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deltalake import DeltaTable

_HELD: dict[str, tuple[DeltaTable, int, tuple[int, int]]] = {}  # path -> (table, version checked, its mark)
_LOCK = threading.Lock()


def newest(table: str) -> DeltaTable:
    """The Delta table at `table` at its newest version: the one this process holds, brought up to date, or opened
    (a table that is not there raises deltalake's TableNotFoundError, as opening it does). A write through the
    table returned moves it on: the next call reads only the commits after that."""
    from deltalake import DeltaTable

    with _LOCK:
        held = _HELD.get(table)
    if held is not None and _mark(table, held[1]) == held[2]:
        delta = held[0]
        delta.update_incremental()
    else:
        delta = DeltaTable(table)
    version = delta.version()
    mark = _mark(table, version)
    with _LOCK:
        if mark is None:
            _HELD.pop(table, None)
        else:
            _HELD[table] = (delta, version, mark)
    return delta


def _mark(table: str, version: int) -> tuple[int, int] | None:
    """The identity of a version's commit file (inode, modification time in ns); None once the log no longer
    holds it (cleaned up after a checkpoint: the table is then opened afresh) or the table is not on a local disk."""
    try:
        found = os.stat(Path(table) / "_delta_log" / f"{version:020d}.json")
    except (OSError, ValueError):
        return None
    return found.st_ino, found.st_mtime_ns
