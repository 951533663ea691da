"""Which Spark the package runs on, checked when a session starts.

PySpark is not a hard dependency of the package: a cluster (Databricks, `spark-submit`) brings its own, and an
install that pulled another PySpark on top would replace or shadow it. `pip install 'windowed-features[local]'`
brings the PySpark the tests run on, for a local session. Whatever PySpark is there must be one whose Spark has
every API the engines use: `check_pyspark` says so in one error when it is not (docs/deployment.md, Databricks).
"""

from __future__ import annotations

import re

from features.errors import EnvironmentProblem
from features.version import DISTRIBUTION

# The oldest Spark with every API the package uses. Spark 4.0.0 brought transformWithStateInPandas with its
# StatefulProcessor, MapState and event-time timers (features/engine/stream_operator.py), GroupedData.applyInArrow
# (features/engine/batch.py) and Spark Connect's registerProgressHandler (features/progress.py); 4.1.0 brought
# DataFrame.repartitionById (features/stores/offline.py), `arrow_udf` (features/ml/training_request.py) and the
# `spark.sql.unionOutputPartitioning` setting that `features.engine.session.REQUIRED_CONF` turns off.
MIN_SPARK = (4, 1)
# Spark removes public APIs only in a major release; the next one is supported once the tests run on it.
BELOW_SPARK = (5, 0)
# The PySpark of the `local` extra (pyproject.toml), which the test suite runs on.
TESTED_SPARK = (4, 2)

# The Apache Spark that each Databricks Runtime major version includes (a cluster's `spark_version` key, e.g.
# `19.x-scala2.13`), from Databricks' release notes.
DATABRICKS_RUNTIMES = {16: (3, 5), 17: (4, 0), 18: (4, 1), 19: (4, 2)}


def _text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of a Spark version string such as `4.2.0` or `4.1.0.dev0`; None when it has none."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def supported(version: tuple[int, int]) -> bool:
    return MIN_SPARK <= version < BELOW_SPARK


def supported_runtimes() -> list[int]:
    """The Databricks Runtime major versions whose Spark is supported, oldest first."""
    return [runtime for runtime, spark in sorted(DATABRICKS_RUNTIMES.items()) if supported(spark)]


def runtime_spark(spark_version_key: str) -> tuple[int, int] | None:
    """The Spark of a Databricks Runtime `spark_version` key (`19.x-scala2.13`, `18.2.x-scala2.13`), or None for
    a runtime this table does not know."""
    match = re.match(r"(\d+)\.", spark_version_key)
    return None if match is None else DATABRICKS_RUNTIMES.get(int(match.group(1)))


def version_problem(version: str) -> str | None:
    """Why PySpark `version` cannot run the package, with the fix; None when it can."""
    parsed = parse_version(version)
    if parsed is not None and supported(parsed):
        return None
    runtimes = supported_runtimes()
    databricks = " or ".join(f"{runtime}.x (Spark {_text(DATABRICKS_RUNTIMES[runtime])})" for runtime in runtimes)
    needed = f">= {_text(MIN_SPARK)}, < {_text(BELOW_SPARK)}"
    return (
        f"features needs PySpark {needed}; this environment has PySpark {version}. "
        f"Fix: on Databricks use a runtime with Spark {_text(MIN_SPARK)} or newer, {databricks}; elsewhere install "
        f"a Spark in that range, or `pip install '{DISTRIBUTION}[local]'` (PySpark {_text(TESTED_SPARK)}) for a "
        "local session"
    )


def check_spark_version(version: str) -> None:
    """Raise EnvironmentProblem, naming the version and the fix, when Spark `version` cannot run the package."""
    problem = version_problem(version)
    if problem is not None:
        raise EnvironmentProblem(problem)


def check_pyspark() -> None:
    """Check the PySpark this process imports: installed at all, and of a supported version."""
    try:
        import pyspark
    except ImportError:
        raise EnvironmentProblem(
            "PySpark is not installed, and features needs PySpark >= "
            f"{_text(MIN_SPARK)}, < {_text(BELOW_SPARK)}. Fix: `pip install '{DISTRIBUTION}[local]'` for a local "
            "session, or run where Spark is installed (spark-submit, a Databricks cluster)"
        ) from None
    check_spark_version(pyspark.__version__)
