"""The Python of local sessions' workers: PySpark imported from the installed package instead of the zip that Spark
puts first on its workers' path.

Python imports a zip's modules from source, compiling each one anew (the zip holds no bytecode), and re-reads the
zip's directory in every worker the daemon forks: about 2 s in each daemon and 1 s in each worker, paid on the first
batch of every process, and 0.7 s in the driver-side process that Spark starts for every stream's
`transformWithStateInPandas` at each start (docs/operations.md, local sessions). The package beside it is the same
PySpark with its compiled files.

Two ways in, one rule (`drop_installed_pyspark_zips`):
- `main`: the worker daemon, `python -m features.engine.worker_daemon [worker module]` (`spark.python.daemon.module`);
- `python`: the `features-spark-python` command, the interpreter Spark starts its other Python processes with
  (`PYSPARK_PYTHON`): `features-spark-python -m <module> [arguments]` runs the module as `python -m` would.

Nothing else is imported before the daemon forks: the libraries the workers need start threads when imported
(PySpark imports them after the fork for that reason). Each worker freezes the objects its imports made once a task
has imported them (`freezing_imports`), which the daemon's collection after every task would otherwise traverse."""

from __future__ import annotations

import ctypes
import gc
import importlib.machinery
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

COMMAND = "features-spark-python"
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h


def _installed_pyspark_zips() -> list[str]:
    """The entries of `sys.path` that are the zips inside the installed PySpark package: `python/lib/*.zip` of
    the `pyspark` folder found without them (empty when PySpark is only in a zip, or in another folder)."""
    zips = [p for p in sys.path if p.endswith(".zip")]
    rest = [p for p in sys.path if p not in zips]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if spec is None or spec.origin is None:
        return []
    lib = os.path.join(os.path.dirname(spec.origin), "python", "lib")
    # py4j's zip goes only when py4j is installed beside PySpark (it is a dependency of the package).
    py4j = importlib.machinery.PathFinder.find_spec("py4j", rest) is not None
    return [z for z in zips if os.path.dirname(z) == lib and (os.path.basename(z) == "pyspark.zip" or py4j)]


def drop_installed_pyspark_zips() -> None:
    for entry in _installed_pyspark_zips():
        sys.path.remove(entry)
        # Python keeps an importer per path entry and asks each to refresh its cache when a worker adds a folder.
        sys.path_importer_cache.pop(entry, None)


def workers_python() -> str:
    """The `features-spark-python` command of this interpreter's installation, else the interpreter itself."""
    import sysconfig

    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        command = os.path.join(folder, COMMAND)
        if os.access(command, os.X_OK):
            return command
    return sys.executable


def keep_freed_memory() -> None:
    """Make freed memory stay in this process's heap for the next allocation (glibc's `mallopt`; nothing elsewhere).

    By default glibc maps every allocation over 32 MB afresh and returns it to the system when freed, so each large
    array a batch makes faults in every page again: a stream's step copies its whole pane table (hundreds of MB for
    an hour of 1 s panes), and those faults cost a fifth of it and made every other step up to twice as slow
    (bench/state_size.py). A worker's memory then stays at its peak between batches, which the next batch reuses."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_MAX, 0)  # glibc still maps when the heap cannot grow
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def freezing_imports(worker: Callable[..., int]) -> Callable[..., int]:
    """PySpark's `worker` (one task in a forked worker), followed by `gc.freeze()` after each task that imported
    modules: the objects alive then (the modules', mostly) leave the collector's sight.

    The daemon runs a full `gc.collect()` in each worker after every task, and a worker that has imported pandas,
    pyarrow and this package holds hundreds of thousands of objects for it to traverse: 20-100 ms a task, on every
    Python task of every micro-batch (a stream's pack, its stateful step, its statistics), about a tenth of a
    steady batch's CPU on two cores. Frozen objects are still freed when their last reference goes; only cycles
    among them would stay, and they are frozen only at the few tasks that import."""

    def run(*args: Any) -> int:
        before = len(sys.modules)
        code = worker(*args)
        if len(sys.modules) > before:
            gc.collect()
            gc.freeze()
        return code

    return run


def main() -> None:
    drop_installed_pyspark_zips()
    keep_freed_memory()  # inherited by every worker the daemon forks
    from pyspark import daemon

    daemon.worker = freezing_imports(daemon.worker)  # looked up by `manager` at each fork
    daemon.manager()


def python() -> None:
    """`features-spark-python -m <module> [arguments]`, as Spark starts a Python process; any other arguments go to
    this interpreter unchanged."""
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    drop_installed_pyspark_zips()
    # As `python -m` has them: the working folder first on the path (not this command's folder), and the module's
    # arguments (runpy puts the module's file in front).
    sys.path[0] = os.getcwd()
    sys.argv = [args[1], *args[2:]]
    if args[1] == __name__:  # this daemon (spark.python.daemon.module), imported already: run, not run again
        main()
    else:
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
