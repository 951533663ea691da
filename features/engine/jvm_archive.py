"""A class data sharing (CDS) archive for the local Spark JVM.

A cold JVM spends seconds loading, parsing and verifying Spark's classes before the first job can run. Java
can save the classes an application loaded into an archive as it exits (`-XX:ArchiveClassesAtExit`) and map
that archive on later starts (`-XX:SharedArchiveFile`): measured on 2 cores, a local session then starts in
3.4 s instead of 5.3 s and runs its first jobs in 3.3 s instead of 5.1 s. The first local session of an
installation makes the archive (about 180 MB in the user's cache folder, one per Java and PySpark install);
every later one uses it. `FEATURES_JVM_ARCHIVE` names another folder, or `off`; `FEATURES_JVM_ARCHIVE_MAKE=no`
uses an archive that exists but leaves making one to a later session (`features demo` sets it: making the archive
cost a first demo 25 s of its 60 on 2 cores, and its first impression is the one a new user gets).

Java maps an archive without checking that the whole file is there, so a file cut short would crash the JVM:
each JVM writes its own temporary file, and one becomes the archive only once complete. Java writes the
archive's header last, so a file with the header's magic number is complete; a leftover without it is deleted
once its process is gone and it has not grown for a minute.
An archive made for another class path (e.g. with extra `spark.jars`) is ignored by Java, not an error.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from features.cache import user_cache

ENV = "FEATURES_JVM_ARCHIVE"
MAKE_ENV = "FEATURES_JVM_ARCHIVE_MAKE"
NO = ("off", "0", "false", "no")
MAGIC = bytes.fromhex("a8ab0bf0")  # a dynamic archive's header (0xf00baba8, little-endian)
QUIET = "-Xlog:cds=off,cds+dynamic=off"  # Java's notes about the archive (e.g. a class path mismatch)
# What the process that makes an archive loads into it (features.engine.session._fill_archive): raised when that
# changes, so that archives made before (without Delta's classes, say) are made again instead of used.
FILL_VERSION = "2"
WRITING_S = 60.0  # a file written to this recently may still be growing


def java_options(java_description: str, class_path: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The JVM options that use the archive, or that make it when there is none yet (none when turned off,
    or while another process is making it). `java_description`: what `java -version` prints; `class_path`: the
    jars the JVM gets beside Spark's."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in NO:
        return []
    folder = Path(setting).expanduser() if setting else user_cache("jvm")
    archive = folder / f"spark-{_install_key(java_description, class_path)}.jsa"
    making = _settle(archive)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", QUIET]
    if making or os.environ.get(MAKE_ENV, "").strip().lower() in NO:
        return []
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []  # a read-only home: start without
    return [f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}.tmp", QUIET]


def making(options: list[str]) -> bool:
    """Whether a JVM started with `options` (from java_options) makes the archive at its exit."""
    return any(o.startswith("-XX:ArchiveClassesAtExit=") for o in options)


def _install_key(java_description: str, class_path: list[str] | tuple[str, ...]) -> str:
    """Which Java and which jars (an archive is only valid for the classes it was made from), and what filled it."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    digest = hashlib.sha1(
        "\n".join([FILL_VERSION, java_description, str(jars), *names, *class_path]).encode()
    ).hexdigest()[:16]
    return f"{pyspark.__version__}-{digest}"


def _settle(archive: Path) -> bool:
    """Turn a complete temporary file into the archive and delete failed ones; whether a process that is
    still alive is making one."""
    making = False
    for temp in archive.parent.glob(f"{archive.name}.*.tmp"):
        pid = temp.name.removeprefix(f"{archive.name}.").removesuffix(".tmp")
        if not archive.exists() and _complete(temp):
            os.replace(temp, archive)
        elif not archive.exists() and ((pid.isdigit() and _alive(int(pid))) or _recent(temp)):
            making = True  # its JVM may still be writing it after its Python process ended
        else:
            temp.unlink(missing_ok=True)
    return making


def _complete(temp: Path) -> bool:
    try:
        with temp.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _recent(temp: Path) -> bool:
    try:
        return time.time() - temp.stat().st_mtime < WRITING_S
    except OSError:
        return False


def _alive(pid: int) -> bool:
    if sys.platform == "win32":  # os.kill would end the process there
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
