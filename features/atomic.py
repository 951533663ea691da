"""Files written whole: to a hidden file beside the target, then renamed over it. A reader, or a process killed
while it writes, finds the previous file or the new one, never one cut short."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Replace `path` with `text`, synced to disk before the rename (its folder must exist). A failure leaves the
    previous file and nothing beside it."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def replace_hadoop_file(path: Path, text: str) -> None:
    """`write_whole` for a file Spark wrote through Hadoop's local file system (a stream's checkpoint), which keeps
    a `.<name>.crc` beside each file it writes: that no longer matches, and goes (without one, a reader checks
    nothing; with it, Spark's next read of the file fails its checksum)."""
    write_whole(path, text)
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
