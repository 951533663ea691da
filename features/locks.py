"""An exclusive lock on a file, for the read-modify-write of a file several processes share (the offline
table's manifest) and for one-at-a-time downloads (the jars). An advisory `flock`: it works on a local or POSIX
file system.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
