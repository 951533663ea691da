"""The local JVM's class data sharing archive (features.engine.jvm_archive): made once by a JVM as it exits,
used by every later local session, and never a file cut short (Java would crash mapping it)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from features.engine.jvm_archive import ENV, MAGIC, MAKE_ENV, QUIET, java_options

JAVA = "openjdk version 17 (test)"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.delenv(MAKE_ENV, raising=False)
    return tmp_path


def archive_name(folder: Path) -> str:
    option = java_options(JAVA)[0]
    return Path(option.split("=", 1)[1]).name.split(".jsa")[0] + ".jsa"


def test_turned_off_it_adds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "off")
    assert java_options(JAVA) == []


def test_without_an_archive_this_jvm_makes_one_in_a_file_of_its_own(folder: Path) -> None:
    name = archive_name(folder)
    assert java_options(JAVA) == [f"-XX:ArchiveClassesAtExit={folder / name}.{os.getpid()}.tmp", QUIET]
    assert folder.is_dir() and not list(folder.iterdir())  # Java writes the file as it exits


def test_a_complete_file_becomes_the_archive_and_a_cut_one_is_deleted(folder: Path) -> None:
    name = archive_name(folder)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    cut = folder / f"{name}.{pid}.tmp"
    cut.write_bytes(bytes(64))  # the header, written last, is still zeros
    assert java_options(JAVA) == []  # its JVM may still be writing it
    old = time.time() - 120
    os.utime(cut, (old, old))
    assert java_options(JAVA)[0].startswith("-XX:ArchiveClassesAtExit=")
    assert not cut.exists()
    (folder / f"{name}.{pid}.tmp").write_bytes(MAGIC + bytes(60))
    assert java_options(JAVA) == [f"-XX:SharedArchiveFile={folder / name}", QUIET]
    assert [p.name for p in folder.iterdir()] == [name]


def test_told_not_to_make_one_a_jvm_uses_the_archive_it_finds_and_makes_none(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = archive_name(folder)
    monkeypatch.setenv(MAKE_ENV, "no")  # as `features demo` sets it
    assert java_options(JAVA) == []
    (folder / name).write_bytes(MAGIC + bytes(60))
    assert java_options(JAVA) == [f"-XX:SharedArchiveFile={folder / name}", QUIET]


def test_while_another_process_makes_it_a_jvm_starts_without(folder: Path) -> None:
    name = archive_name(folder)
    (folder / f"{name}.{os.getppid()}.tmp").write_bytes(bytes(64))  # a live process, its JVM still running
    assert java_options(JAVA) == []


def test_a_session_starts_with_the_archive_made_beforehand(tmp_path: Path) -> None:
    """`make_class_archive` (what `./dev test` runs first) leaves a complete archive, with Delta's classes in it,
    which the next local session maps; a later call finds it made. The archive is the one every local session
    of this machine uses (made here if `./dev test` has not made it already), unless that is turned off."""
    make = "from features.engine.session import make_class_archive as m; print(m()); print(m())"
    script = (
        "from features.engine.session import get_spark\n"
        "spark = get_spark()\n"
        "args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()\n"
        "print(spark.range(1000).count(), [str(a) for a in args if 'Archive' in str(a)])\n"
        "print([str(a) for a in args if 'Tiered' in str(a)])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    if env.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        env[ENV] = str(tmp_path)
    made = subprocess.run([sys.executable, "-c", make], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert made.stdout.split()[1:] == ["False"] and made.stdout.split()[0] in ("True", "False"), made.stdout
    # Options of the user's own come after the archive's (docs/operations.md, local sessions).
    env["FEATURES_JAVA_OPTIONS"] = "-XX:TieredStopAtLevel=1"
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert ast.literal_eval(second.stdout.split("\n")[1]) == ["-XX:TieredStopAtLevel=1"], second.stdout
    count, options = second.stdout.split("\n")[0].split(" ", 1)
    assert count == "1000"
    [option] = ast.literal_eval(options)  # the JVM's one archive option: mapping the archive, not making one
    flag, archive = option.split("=", 1)
    assert flag == "-XX:SharedArchiveFile", option
    assert Path(archive).read_bytes()[:4] == MAGIC
    assert b"org/apache/spark/sql/delta/" in Path(archive).read_bytes()  # the Delta jobs it ran put their classes in
