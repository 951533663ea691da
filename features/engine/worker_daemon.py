"""The Python worker daemon of local sessions: PySpark's own (`pyspark.daemon`), with PySpark imported from the
installed package instead of the zip that Spark puts first on its workers' path.

Python imports a zip's modules from source, compiling each one anew (the zip holds no bytecode), and re-reads the
zip's directory in every worker the daemon forks: about 2 s in each daemon and 1 s in each worker, paid on the first
batch of every process (docs/operations.md, local sessions). The package beside it is the same PySpark with its
compiled files. Nothing else is imported before the fork: the daemon forks its workers, and the libraries the
workers need start threads when imported (PySpark imports them after the fork for that reason).

Spark starts it as `python -m features.engine.worker_daemon [worker module]` (`spark.python.daemon.module`)."""

from __future__ import annotations

import importlib.machinery
import os
import sys


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


def main() -> None:
    for entry in _installed_pyspark_zips():
        sys.path.remove(entry)
        # Python keeps an importer per path entry and asks each to refresh its cache when a worker adds a folder.
        sys.path_importer_cache.pop(entry, None)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
