"""The local JVM's stderr, passed on to this process's stderr without the lines that tell a user nothing.

Two kinds of line cannot be turned off by any setting:
- PySpark's driver-side worker of `transformWithStateInPandas` prints five lines at every stream start (plain
  `print` calls, with the processor object's repr and the whole output schema), and the JVM copies a Python
  worker's stdout to its own stderr;
- Java warns "Using incubator modules" at every start, because Spark adds the vector module.

So the JVM this package starts writes its stderr into a pipe, and a thread copies it on without those lines.
Everything else passes unchanged and at once: Spark's log, a Python worker's traceback, and a line still being
written (Spark's console progress bar redraws one line without ending it)."""

from __future__ import annotations

import os
import subprocess
import threading

NOISE = (
    b"Starting Streaming TransformWithStateInPandas Python worker",
    b"Streaming TransformWithStateInPandas Python worker ",
    b"WARNING: Using incubator modules: ",
)


def start_jvm(settings: dict[str, str]) -> None:
    """Start the JVM with `settings` (as `SparkSession.builder` would from the same settings) and its stderr
    filtered, unless this process already has one: PySpark's session then uses this JVM."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    SparkContext._gateway = gateway
    SparkContext._jvm = gateway.jvm
    source = gateway.proc.stderr.fileno()
    threading.Thread(target=copy_lines, args=(source, 2), name="jvm-stderr", daemon=True).start()


def copy_lines(source: int, target: int) -> None:
    """Copy what `source` gives to `target` until it ends, less the NOISE lines (and the empty line that each
    `print` of a text ending in a newline adds)."""
    pending = b""  # the start of a line that may be noise: held until its end shows
    midline = False  # the line under way was partly copied already: its rest is copied too
    after_noise = False
    while chunk := os.read(source, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        out = []
        for line in lines:
            noise = not midline and line.startswith(NOISE)
            if not noise and not (after_noise and not line and not midline):
                out.append(line + b"\n")
            after_noise, midline = noise, False
        if pending and (midline or not _may_be_noise(pending)):
            out.append(pending)
            pending, midline = b"", True
        if out:
            _write(target, b"".join(out))


def _may_be_noise(start: bytes) -> bool:
    return any(prefix.startswith(start) or start.startswith(prefix) for prefix in NOISE)


def _write(target: int, data: bytes) -> None:
    """Write all of `data`; if the target is gone, drop it: the JVM must never block on a pipe nobody reads."""
    try:
        while data:
            data = data[os.write(target, data) :]
    except OSError:
        pass
