"""The Java packages a local session adds to Spark: Delta Lake, for the offline table, and Spark's Kafka
connector and Avro reader, for Kafka sources.

A cluster brings its own (a Databricks Runtime includes them; spark-submit takes them as docs/deployment.md
shows). For a session this package starts, they are fetched once from Maven Central by Spark's own resolver (Ivy)
into the user's cache folder, then put on the driver's class path from there: later sessions resolve nothing,
need no network and print nothing, and the JVM's class archive (features.engine.jvm_archive) holds their classes
too. `FEATURES_JARS` names another folder, e.g. one copied to a machine without network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from features.cache import user_cache
from features.errors import EnvironmentProblem
from features.locks import held
from features.version import DISTRIBUTION

ENV = "FEATURES_JARS"


@dataclass(frozen=True)
class Package:
    group: str
    artifact: str
    version: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        """The name Spark's resolver gives the package's jar in its `jars` folder."""
        return f"{self.group}_{self.artifact}-{self.version}.jar"


# Per Spark minor version: Delta Lake's release built for it, the Kafka connector of that Spark release with the
# client it was built against, and its Avro reader (`from_avro`, for Avro values). Jars Spark itself ships (Scala,
# Hadoop, Avro, compression codecs) are not repeated: Spark's own copies serve. Delta's kernel and Unity Catalog
# client serve catalog-managed tables, which a table at a path is not.
PACKAGES: dict[tuple[int, int], tuple[Package, ...]] = {
    (4, 2): (
        Package("io.delta", "delta-spark_2.13", "4.4.0"),
        Package("io.delta", "delta-storage", "4.4.0"),
        Package("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0"),
        Package("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.2.0"),
        Package("org.apache.kafka", "kafka-clients", "3.9.2"),
        Package("org.apache.commons", "commons-pool2", "2.13.1"),
        Package("org.apache.spark", "spark-avro_2.13", "4.2.0"),
    ),
}
# Left out of the download: what the packages above depend on that Spark already has, or that they do not need.
EXCLUDED = (
    "io.delta:delta-kernel-api",
    "io.delta:delta-kernel-defaults",
    "io.delta:delta-kernel-unitycatalog",
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.spark:spark-tags_2.13",
    "io.unitycatalog:unitycatalog-client",
    "io.unitycatalog:unitycatalog-hadoop",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.tukaani:xz",
)
# The settings that make a session's SQL and readers know Delta tables.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def folder() -> Path:
    setting = os.environ.get(ENV, "").strip()
    if setting:
        return Path(setting).expanduser()
    return user_cache("ivy")


def packages_for(spark_version: tuple[int, int]) -> tuple[Package, ...]:
    packages = PACKAGES.get(spark_version)
    if packages is None:
        known = ", ".join(f"{major}.{minor}" for major, minor in sorted(PACKAGES))
        raise EnvironmentProblem(
            f"features has no Delta Lake and Kafka packages listed for Spark {spark_version[0]}.{spark_version[1]} "
            f"(it has them for Spark {known}). Fix: `pip install '{DISTRIBUTION}[local]'` for the PySpark it runs on"
        )
    return packages


def class_path(spark_version: tuple[int, int]) -> list[Path]:
    """The jar files of the packages for `spark_version`, fetched first if any is missing."""
    packages = packages_for(spark_version)
    jars = folder() / "jars"
    files = [jars / p.file_name for p in packages]
    if not all(f.is_file() for f in files):
        with held(folder() / ".fetching.lock"):  # one process fetches at a time: Ivy's cache is not safe to share
            if not all(f.is_file() for f in files):
                fetch(packages, folder())
    return files


def fetch(packages: tuple[Package, ...], into: Path, exclude: tuple[str, ...] = EXCLUDED) -> None:
    """Let Spark's resolver download `packages` and what they depend on (but `exclude`, and Scala's library,
    which Spark's resolver always leaves out) into `into` (a JVM that starts, resolves and exits)."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    with tempfile.TemporaryDirectory() as scratch:
        nothing = Path(scratch) / "resolve_only.py"
        nothing.write_text("")
        command = [str(submit), "--packages", ",".join(p.coordinate for p in packages)]
        if exclude:
            command += ["--exclude-packages", ",".join(exclude)]
        command += ["--conf", f"spark.jars.ivy={into}", str(nothing)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    missing = [p.coordinate for p in packages if not (into / "jars" / p.file_name).is_file()]
    if done.returncode != 0 or missing:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise EnvironmentProblem(
            f"could not fetch the Java packages a local Spark session needs ({', '.join(missing) or 'all'}) into "
            f"{into}. Fix: allow this machine to reach Maven Central once, or copy a `jars` folder holding "
            f"{', '.join(p.file_name for p in packages)} from a machine that has them and point {ENV} at its "
            f"parent folder. Spark's resolver said:\n{tail}"
        )
