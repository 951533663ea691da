"""Shared test fixtures: one local SparkSession per test process, and temporary Feast repositories.

- `spark` (session scope): built once per test process (`./dev test` runs two, pytest-xdist) with
  `features.engine.session.get_spark`, two shuffle partitions (tests use tiny data, and every shuffle partition is
  a task), stopped when the run ends. Mark tests that use it with `@pytest.mark.spark`.
- `feast_repo_factory` (session scope) / `feast_repo` (per test): a Feast repo in a temporary folder holding a
  copy of feature_repo/feature_store.yaml and a definitions module generated from the FeatureGroups a test
  passes, with their `to_feast` objects as module-level names, applied like `features apply`.
- `connect_url` / `spark_connect` (session scope): the tests' Spark Connect server (tests/connect_server.py), one
  per test process, and a client session to it.

Under pytest-xdist (`./dev test`) the files that take longest run first (tests/suite_order.py;
`--record-file-seconds` records their seconds again).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from features.cache import user_cache

# Compiled modules kept for this process and every Python it starts (commands, Spark's Python workers, notebook
# kernels), in a folder of the user's cache. With PYTHONDONTWRITEBYTECODE set (as on the machine the suite runs
# on) in a virtualenv installed without bytecode (uv's default), Python compiled every module it imported from
# source, in every process: pandas took 1.5 s to import against 0.5 s compiled, MLflow 4.6 against 1.8 s, Great
# Expectations 9.2 against 4.0 s, in each command, each Spark worker and each kernel. Nothing is written beside the
# sources (PYTHONPYCACHEPREFIX); a prefix set outside the tests stands.
if sys.dont_write_bytecode and "PYTHONPYCACHEPREFIX" not in os.environ:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = str(user_cache("pycache"))
    sys.dont_write_bytecode = False

import pandas as pd
import pytest

TESTS = Path(__file__).resolve().parent
EXAMPLE_REPO = TESTS.parent / "feature_repo"

# `from reference import ...` works whatever the rootdir or import mode.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from suite_order import longest_first, record, recorded  # noqa: E402 - after the sys.path setup above

from features import FeatureGroup  # noqa: E402
from features.spec.definitions import DEFAULT_MIN_TIMESTAMP_US  # noqa: E402

SHUFFLE_PARTITIONS = 2
# The JVMs of the commands, notebooks and jobs the tests start compile with Java's first compiler only, in a code
# cache of the size the second compiler would get: tiny data in cold processes, where the second compiler's work
# competes for the two cores and is never paid back (docs/operations.md, local sessions). Alone, the first
# compiler's 48 MB fill within half a minute of Spark and Java stops compiling. Not this process's session: it
# lives for the whole run, which took 22.5 min with the first compiler against 21.5 without (the first three
# minutes of it were faster with it: 155-159 s against 174-179 s). A value set outside the tests stands for all.
JAVA_OPTIONS = "FEATURES_JAVA_OPTIONS"
OURS = JAVA_OPTIONS not in os.environ
os.environ.setdefault(JAVA_OPTIONS, "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")


def spark_submit_java_options() -> list[str]:
    """spark-submit's flag for the options above (Java's first compiler only), for a JVM a test starts with
    spark-submit: its driver starts before a session could add them."""
    options = os.environ.get(JAVA_OPTIONS, "")
    return ["--driver-java-options", options] if options else []


# One OpenMP thread in this process and every one it starts (notebook kernels, commands). scikit-learn's gradient
# boosting runs on OpenMP, whose threads spin at each barrier: with the other pytest process and its Spark on the
# same two cores, notebook 02's training cell took 28.5 s in a whole run against 0.5 s alone.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)  # without xdist (`-p no:xdist`) the hook does not exist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile` (./dev test), except that the modules using the Spark Connect server (the fixtures
    `connect_url` and `spark_connect` below: a JVM of its own per test process) are one unit of work: on one
    worker, the server starts and warms up once per run."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # the files in the order the processes collected them (below)

    connect = {
        str(path.relative_to(config.rootpath))
        for path in TESTS.glob("test_*.py")
        if re.search(r"\b(connect_url|spark_connect)\b", path.read_text(encoding="utf-8"))
    }

    class WithConnectTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "spark-connect" if module in connect else module

    return WithConnectTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a process of pytest-xdist, the files that take longest first (tests/suite_order.py): the order in which
    `--dist loadfile` hands them out."""
    if hasattr(config, "workerinput"):
        items[:] = longest_first(items, recorded())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-seconds",
        action="store_true",
        help="write each test file's seconds in this (whole) run to tests/file_seconds.json: the order of the "
        "files under pytest-xdist (tests/suite_order.py)",
    )


class FileSeconds:
    """`--record-file-seconds`: the run's test reports, each file's seconds written from them at its end."""

    def __init__(self) -> None:
        self.reports: list[pytest.TestReport] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)

    def pytest_sessionfinish(self) -> None:
        record(self.reports, [path.name for path in TESTS.glob("test_*.py")])


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_file_seconds") and not hasattr(config, "workerinput"):  # xdist's main process
        config.pluginmanager.register(FileSeconds(), "file-seconds")


# What MLFLOW_TRACKING_URI was when the run started. `mlflow.set_tracking_uri` exports its URI to this process's
# environment, where every command a later test starts would take it for the user's choice: two tests' commands then
# write one store at once (MLflow's schema creation is not safe for that).
MLFLOW_URI_AT_START = os.environ.get("MLFLOW_TRACKING_URI")


@pytest.fixture(autouse=True)
def mlflow_uri_left_alone() -> Iterator[None]:
    """Fails a test (or a module fixture set up before it) that leaves MLFLOW_TRACKING_URI changed."""
    yield
    now = os.environ.get("MLFLOW_TRACKING_URI")
    if now == MLFLOW_URI_AT_START:
        return
    if MLFLOW_URI_AT_START is None:
        os.environ.pop("MLFLOW_TRACKING_URI")
    else:
        os.environ["MLFLOW_TRACKING_URI"] = MLFLOW_URI_AT_START
    pytest.fail(f"MLFLOW_TRACKING_URI was left set to {now!r} (mlflow.set_tracking_uri exports it); reset it")


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of this test process (local, UTC, few shuffle partitions)."""
    from features.engine.session import get_spark

    subprocesses = os.environ.pop(JAVA_OPTIONS) if OURS else None
    try:
        session = get_spark(app_name="features-tests", shuffle_partitions=SHUFFLE_PARTITIONS)
    finally:
        if subprocesses is not None:
            os.environ[JAVA_OPTIONS] = subprocesses
    session.conf.set("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
    session.conf.set("spark.sql.session.timeZone", "UTC")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_url() -> Iterator[str]:
    """The `sc://` address of the tests' Spark Connect server (tests/connect_server.py): one per test process,
    started when a test first asks for it. Here rather than imported by each module that uses it: a module's own
    fixture is cached apart, and each such module started (and warmed up) a server of its own."""
    from connect_server import running_server

    with running_server() as url:
        yield url


@pytest.fixture(scope="session")
def spark_connect(connect_url: str) -> Iterator[object]:
    """A Spark Connect client session to the tests' server (tests/connect_server.py)."""
    from connect_server import client_session

    with client_session(connect_url) as session:
        yield session


# ---------------------------------------------------------------------------------------------------------
# Temporary Feast repositories


def _event_source_code(group: FeatureGroup) -> str:
    source = group.source
    args = [
        f"name={source.name!r}",
        f"path={source.path!r}",
        f"timestamp={source.timestamp!r}",
        f"format={source.format!r}",
        f"watermark='{source.watermark_s}s'",
    ]
    if source.schema is not None:
        args.append(f"schema={ {column: dtype.value for column, dtype in source.schema.items()}!r}")
    if source.options:
        args.append(f"options={dict(source.options)!r}")
    if source.max_future_s != 86400:
        args.append(f"max_future={'None' if source.max_future_s is None else repr(f'{source.max_future_s}s')}")
    if source.min_timestamp_us != DEFAULT_MIN_TIMESTAMP_US:
        args.append(f"min_timestamp={None if source.min_timestamp is None else source.min_timestamp.isoformat()!r}")
    if source.kafka is not None:
        topic = source.kafka
        args.append(
            f"kafka=KafkaTopic({topic.topic!r}, {topic.bootstrap_servers!r}, value_format={topic.value_format!r}, "
            f"event_time={topic.event_time!r}, archive={topic.archive!r}, options={dict(topic.options)!r}, "
            f"schema={topic.schema!r})"
        )
    return f"EventSource({', '.join(args)})"


def _expectation_code(expectation) -> str:
    """A Great Expectations expectation as source, e.g. gx.expectations.ExpectColumnValuesToBeBetween(**{...})."""
    kwargs = expectation.dict(exclude_defaults=True, exclude={"id"})
    return f"gx.expectations.{type(expectation).__name__}(**{kwargs!r})"


def _feature_code(feature) -> str:
    args = [repr(feature.name), feature.aggregation.describe(), f"window={feature.window.describe()}"]
    if feature.where is not None:
        args.append(f"where={feature.where!r}")
    if feature.description:
        args.append(f"description={feature.description!r}")
    return f"Feature({', '.join(args)})"


def definitions_code(groups: Sequence[FeatureGroup]) -> str:
    """A repo module that re-declares `groups` in plain source (as a user would write them) and exports the
    Feast objects of each one as module-level names, so that both `features` and `feast apply` pick them up."""
    lines = [
        '"""Feature groups of a temporary test repository (generated by tests/conftest.py)."""',
        "",
        "from pathlib import Path",
        "",
        "from features import Entity, EventSource, Feature, FeatureGroup, Hop, KafkaTopic, Lifetime, Session, agg",
        "from features import to_feast",
        *(["", "import great_expectations as gx"] if any(g.expectations for g in groups) else []),
        "",
        "HERE = Path(__file__).resolve().parent",
    ]
    for i, group in enumerate(groups):
        entity = group.entity
        lines += [
            "",
            f"group_{i} = FeatureGroup(",
            f"    name={group.name!r},",
            f"    entity=Entity({entity.name!r}, join_keys={list(entity.join_keys)!r}, "
            f"description={entity.description!r}),",
            f"    source={_event_source_code(group)},",
            "    features=[",
            *[f"        {_feature_code(feature)}," for feature in group.features],
            "    ],",
            f"    description={group.description!r},",
            *([f"    on_invalid={group.on_invalid!r},"] if group.on_invalid is not None else []),
            *([f"    online={group.online!r},"] if group.online != "eager" else []),
            *(
                ["    expectations=[", *[f"        {_expectation_code(e)}," for e in group.expectations], "    ],"]
                if group.expectations
                else []
            ),
            ")",
        ]
        # Feast's apply only sees module attributes, not objects inside a list: one name per object.
        names = [f"group_{i}_entity_{j}" for j in range(len(group.join_keys))]
        names += [f"group_{i}_source", f"group_{i}_view"]
        lines.append(f"{', '.join(names)} = to_feast(group_{i}, repo_root=HERE)")
    return "\n".join(lines) + "\n"


def build_feast_repo(
    root: Path,
    groups: Sequence[FeatureGroup],
    events: pd.DataFrame | None = None,
    *,
    n_files: int = 2,
    apply: bool = True,
) -> Path:
    """Create a Feast repo for `groups` in `root` and (by default) apply it; returns `root`.

    `events` (if given) land in the groups' source folder first, since Feast objects infer the source
    schema from the files when the EventSource declares none.
    """
    from features.demo import write_events
    from features.pipelines.registration import apply as apply_repo
    from features.repo import Repo, resolve

    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLE_REPO / "feature_store.yaml", root / "feature_store.yaml")
    shutil.copy(EXAMPLE_REPO / ".feastignore", root / ".feastignore")
    if events is not None:
        for path in sorted({resolve(root, g.source.path) for g in groups}):
            write_events(events, path, n_files=n_files)
    # A module name of its own: Feast imports repo files by name, and sys.modules outlives one repo.
    module = f"test_definitions_{uuid.uuid4().hex[:12]}"
    (root / f"{module}.py").write_text(definitions_code(groups))
    loaded = Repo.load(root)
    assert loaded.groups == {g.name: g for g in groups}, "generated definitions differ from the groups passed"
    if apply:
        apply_repo(str(root))
    return root


@pytest.fixture(scope="session")
def feast_repo_factory() -> Iterator[Callable[..., Path]]:
    """`make(root, groups, events=None, *, n_files=2, apply=True) -> root`, usable from fixtures of any scope."""
    yield build_feast_repo


@pytest.fixture
def feast_repo(tmp_path: Path) -> Callable[..., Path]:
    """`make(groups, events=None, **kwargs) -> root`: an applied Feast repo under this test's tmp_path."""

    def make(groups: Sequence[FeatureGroup], events: pd.DataFrame | None = None, **kwargs) -> Path:
        return build_feast_repo(tmp_path / "repo", groups, events, **kwargs)

    return make


@pytest.fixture
def kafka_topic():
    """A new 4-partition topic on the tests' Kafka broker (tests/kafka_broker.py), deleted after the test."""
    from kafka_broker import create_topic, delete_topic, require_broker, topic_name

    require_broker()
    name = topic_name("stream")
    create_topic(name, 4)
    yield name
    delete_topic(name)
