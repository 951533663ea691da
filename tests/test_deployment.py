"""The Databricks deployment (databricks.yml, jobs/databricks/, docs/deployment.md) and the package as a cluster
installs it.

Without Spark: the bundle has the fields the Databricks CLI requires, every variable it uses is defined, every path
it names exists, the entry points get arguments the CLI accepts, its runtime's Spark is within the supported range
(features/engine/runtime.py), the Redis secret reaches feature_store.yaml, and the docs' commands match the bundle.

Slow: the bundle's own build command builds the wheel; the wheel installs into a fresh virtualenv next to a PySpark
that is already there without touching it; and `spark-submit jobs/backfill.py` runs a backfill from that install,
writing the offline table and Redis through the Databricks feature_store.yaml.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyspark
import pytest
import redis_server as redis_fixtures
import yaml
from conftest import spark_submit_java_options
from redis_server import RedisServer

from features.cli import build_parser
from features.engine import jars, runtime
from features.errors import EnvironmentProblem
from features.repo import read_config
from features.stores.offline import read_pandas

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_FILE = ROOT / "databricks.yml"
DATABRICKS = ROOT / "jobs" / "databricks"
STORE_YAML = DATABRICKS / "feature_store.yaml"
DOC = ROOT / "docs" / "deployment.md"
VAR = re.compile(r"\$\{var\.([A-Za-z][\w-]*)\}")
SECRET = re.compile(r"^\{\{secrets/([^/]+)/([^/{}]+)\}\}$")
ENTRY_POINTS = {"jobs/backfill.py": "backfill", "jobs/stream.py": "stream", "jobs/databricks/apply.py": "apply"}
TASK_KINDS = ("spark_python_task", "python_wheel_task")
redis_server = redis_fixtures.redis_server  # the session's real Redis (a fixture)


def bundle() -> dict[str, Any]:
    return yaml.safe_load(BUNDLE_FILE.read_text())


def jobs() -> dict[str, dict[str, Any]]:
    return bundle()["resources"]["jobs"]


def tasks() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, job in jobs().items():
        for task in job["tasks"]:
            yield name, task


def resolved(value: Any, variables: dict[str, Any]) -> Any:
    """`value` with `${var.x}` replaced by x's default (recursively), `<x>` for a variable without one."""
    if isinstance(value, dict):
        return {k: resolved(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [resolved(v, variables) for v in value]
    if not isinstance(value, str):
        return value
    for _ in range(10):  # defaults may name other variables
        new = VAR.sub(lambda m: str(variables[m.group(1)].get("default", f"<{m.group(1)}>")), value)
        if new == value:
            return new
        value = new
    raise AssertionError(f"variables refer to each other in a cycle: {value}")


def build_command() -> tuple[str, Path]:
    """The wheel artifact's build command and the folder it runs in."""
    [artifact] = [a for a in bundle()["artifacts"].values() if a["type"] == "whl"]
    return artifact["build"], (ROOT / artifact["path"]).resolve()


def wheel_dir(command: str) -> str:
    """The folder `pip wheel -w DIR` writes to."""
    match = re.search(r"pip wheel\b.*?(?:-w|--wheel-dir)[ =](\S+)", command)
    assert match is not None, f"the build command does not name its wheel folder: {command}"
    return match.group(1)


# ---------------------------------------------------------------------------------------------------------
# The supported Spark range (features/engine/runtime.py)


@pytest.mark.parametrize("version", ["4.1.0", "4.2.0", "4.3.0", "4.1.0.dev0", "4.9.1"])
def test_supported_spark_versions_pass(version: str) -> None:
    assert runtime.version_problem(version) is None
    runtime.check_spark_version(version)


@pytest.mark.parametrize("version", ["4.0.0", "3.5.2", "5.0.0", "not a version"])
def test_other_spark_versions_fail_naming_the_range_the_version_and_the_runtimes(version: str) -> None:
    with pytest.raises(EnvironmentProblem) as raised:
        runtime.check_spark_version(version)
    message = str(raised.value)
    assert message.startswith("features needs PySpark >= 4.1, < 5.0; this environment has PySpark ")
    assert version in message
    assert "18.x (Spark 4.1) or 19.x (Spark 4.2)" in message and "windowed-features[local]" in message


def test_databricks_runtimes_map_to_their_spark() -> None:
    assert runtime.runtime_spark("19.x-scala2.13") == (4, 2)
    assert runtime.runtime_spark("18.2.x-scala2.13") == (4, 1)
    assert runtime.runtime_spark("17.3.x-scala2.13") == (4, 0)
    assert runtime.runtime_spark("99.x-scala2.13") is None
    assert runtime.supported_runtimes() == [18, 19]


def test_the_installed_pyspark_passes_and_a_missing_one_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime.check_pyspark()  # the test environment's PySpark (the `local` extra)
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` now raises ImportError
    with pytest.raises(EnvironmentProblem, match=r"PySpark is not installed.*pip install 'windowed-features\[local\]'"):
        runtime.check_pyspark()


def test_pyspark_is_an_extra_pinned_within_the_supported_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if re.match(r"pyspark\b", d)], "PySpark must not be required"
    extras = project["optional-dependencies"]
    [local] = extras["local"]
    # Exact: Delta Lake's and the Kafka connector's jars (features.engine.jars) are built for one Spark release.
    pinned = re.fullmatch(r"pyspark==(\d+\.\d+)\.\d+", local)
    assert pinned is not None, local
    version = runtime.parse_version(pinned.group(1))
    assert version == runtime.TESTED_SPARK and version is not None and runtime.supported(version)
    assert version in jars.PACKAGES
    assert all(local.removeprefix("pyspark") in d for d in extras["connect"] if d.startswith("pyspark"))
    # ./dev installs the extras that bring the local PySpark (tests, demo).
    installed = re.search(r'pip install --quiet -e "\.\[([\w,]+)\]"', (ROOT / "dev").read_text())
    assert installed is not None and "local" in installed.group(1).split(","), "./dev must install the local extra"


# ---------------------------------------------------------------------------------------------------------
# The bundle: structure, variables, paths, runtime


def test_the_bundle_has_the_fields_the_databricks_cli_requires() -> None:
    config = bundle()
    assert config["bundle"]["name"]
    assert config["workspace"]["artifact_path"].startswith("${var.volume}/"), "the wheel goes to the volume"
    assert set(jobs()) == {"features_apply", "features_nightly_backfill", "features_stream"}
    for name, job in jobs().items():
        assert job["name"] and job["tasks"], name
        assert job["max_concurrent_runs"] == 1, name  # two runs of one job would write the same partitions
        clusters = {c["job_cluster_key"]: c["new_cluster"] for c in job["job_clusters"]}
        for cluster in clusters.values():
            assert {"spark_version", "node_type_id", "num_workers"} <= set(cluster), name
            assert cluster["data_security_mode"] == "SINGLE_USER", name  # a classic session (the stream)
            assert cluster["spark_conf"]["spark.sql.session.timeZone"] == "UTC", name
        for task in job["tasks"]:
            assert task["task_key"], name
            kinds = [kind for kind in TASK_KINDS if kind in task]
            assert len(kinds) == 1, f"{name}: a task runs a spark_python_task or a python_wheel_task"
            assert task["job_cluster_key"] in clusters, name
            if "spark_python_task" in task:
                assert task["spark_python_task"]["python_file"], name
            else:
                assert task["python_wheel_task"]["package_name"] == "windowed-features", name
    schedule = jobs()["features_nightly_backfill"]["schedule"]
    assert schedule["quartz_cron_expression"] and schedule["timezone_id"] == "UTC"
    assert "schedule" not in jobs()["features_stream"] and "continuous" in jobs()["features_stream"]


def test_every_task_installs_the_wheel_that_the_artifact_builds() -> None:
    command, folder = build_command()
    assert folder == ROOT and (folder / "pyproject.toml").is_file()
    assert "pip wheel --no-deps" in command, "the wheel alone: the cluster resolves its dependencies"
    built = (folder / wheel_dir(command)).resolve()
    for name, task in tasks():
        wheels = [lib["whl"] for lib in task.get("libraries", []) if "whl" in lib]
        assert len(wheels) == 1, f"{name}: the task installs the package's wheel"
        assert (ROOT / wheels[0]).resolve().parent == built, f"{name}: {wheels[0]} is not where the build writes"
        assert Path(wheels[0]).suffix == ".whl"


def test_every_variable_used_is_defined_and_every_one_defined_is_used() -> None:
    text = BUNDLE_FILE.read_text()
    defined = bundle()["variables"]
    used = set(VAR.findall(text))
    assert used <= set(defined), f"used but not defined: {sorted(used - set(defined))}"
    assert set(defined) <= used, f"defined but not used: {sorted(set(defined) - used)}"
    assert all(v.get("description") for v in defined.values())


def test_every_path_the_bundle_names_exists() -> None:
    config = bundle()
    synced = [ROOT / p for p in config["sync"]["paths"]]
    assert all(p.is_dir() for p in synced), synced
    for name, task in tasks():
        if "spark_python_task" in task:
            script = (ROOT / task["spark_python_task"]["python_file"]).resolve()
            assert script.is_file(), f"{name}: {script}"
            assert any(script.is_relative_to(p) for p in synced), f"{name}: {script} is not uploaded (sync.paths)"
    # Files named in comments and descriptions (docs, tests, modules), relative to the repository.
    named = re.findall(r"(?<![\w/$.-])((?:\.?[\w-]+/)+[\w.-]+\.(?:py|md|ya?ml|toml))\b", BUNDLE_FILE.read_text())
    assert len(named) >= 5, named
    missing = [n for n in named if not (ROOT / n).is_file()]
    assert not missing, missing


def test_the_default_runtime_has_a_supported_spark() -> None:
    variables = bundle()["variables"]
    key = variables["spark_version"]["default"]
    spark = runtime.runtime_spark(key)
    assert spark is not None, f"{key}: add its Spark to features.engine.runtime.DATABRICKS_RUNTIMES"
    assert runtime.supported(spark), f"{key} has Spark {spark}, outside the supported range"
    for runtime_major in runtime.supported_runtimes():  # the description names the runtimes that work
        assert f"{runtime_major}.x" in variables["spark_version"]["description"]
    for job in jobs().values():
        assert all(c["new_cluster"]["spark_version"] == "${var.spark_version}" for c in job["job_clusters"])


def test_the_entry_points_get_arguments_the_command_line_accepts() -> None:
    variables = bundle()["variables"]
    parser = build_parser()
    for name, task in tasks():
        python = task["spark_python_task"]
        script = str(Path(python["python_file"]))
        assert script in ENTRY_POINTS, f"{name}: {script}"
        args = parser.parse_args([ENTRY_POINTS[script], *resolved(python["parameters"], variables)])
        assert args.repo == resolved("${var.repo_path}", variables), name
        assert args.repo.startswith("/Volumes/"), f"{name}: the repo folder lives on a Unity Catalog volume"
    backfill = jobs()["features_nightly_backfill"]["tasks"][0]["spark_python_task"]["parameters"]
    assert "--since-last" in backfill


def test_the_entry_points_run_the_command_they_are_named_for() -> None:
    for script, command in ENTRY_POINTS.items():
        text = (ROOT / script).read_text()
        assert f'job_main("{command}"' in text or f'main(["{command}"' in text, script


# ---------------------------------------------------------------------------------------------------------
# Secrets: the secret scope -> spark_env_vars -> feature_store.yaml


def test_the_redis_secret_reaches_feature_store_yaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wanted = set(re.findall(r"\$\{(\w+)\}", STORE_YAML.read_text()))
    assert wanted == {"REDIS_CONNECTION_STRING"}
    for name, job in jobs().items():
        for cluster in job["job_clusters"]:
            env = cluster["new_cluster"]["spark_env_vars"]
            assert wanted <= set(env), f"{name}: spark_env_vars lacks {sorted(wanted - set(env))}"
            secret = SECRET.match(env["REDIS_CONNECTION_STRING"])
            assert secret is not None, f"{name}: REDIS_CONNECTION_STRING is not read from a secret"
            assert secret.groups() == ("${var.secret_scope}", "redis_connection_string"), name

    # What the job's driver and executors read, with the variable set as Databricks sets it from the secret.
    value = "redis.internal:6380,password=s3cret,ssl=true"
    monkeypatch.setenv("REDIS_CONNECTION_STRING", value)
    config = read_config(STORE_YAML)
    assert config["online_store"] == {"type": "redis", "connection_string": value}
    from feast.repo_config import load_repo_config

    feast_config = load_repo_config(tmp_path, STORE_YAML)
    assert feast_config.online_store.connection_string == value


# ---------------------------------------------------------------------------------------------------------
# The step by step in docs/deployment.md names what the bundle defines


def test_the_docs_commands_match_the_bundle() -> None:
    text = DOC.read_text()
    config = bundle()
    variables = config["variables"]
    runs = set(re.findall(r"databricks bundle run (?:--[\w-]+ )*(\w+)", text))
    assert runs == set(jobs()), f"the docs run {sorted(runs)}, the bundle has {sorted(jobs())}"
    passed = set(re.findall(r"--var[= ]\"?(\w+)=", text))
    assert passed <= set(variables), sorted(passed - set(variables))
    required = {name for name, v in variables.items() if "default" not in v}
    assert required <= passed, f"the deploy command must set {sorted(required - passed)}"
    scope = variables["secret_scope"]["default"]
    assert f"databricks secrets put-secret {scope} redis_connection_string" in text
    assert f"databricks secrets create-scope {scope}" in text
    build, _ = build_command()
    assert build.split("&& ")[-1] in text, "the docs show the bundle's build command"
    assert "jobs/databricks/feature_store.yaml" in text


# ---------------------------------------------------------------------------------------------------------
def delta_args() -> list[str]:
    """Delta Lake for spark-submit, as a cluster adds it (docs/deployment.md): here the jars the local sessions
    use (the same packages as `--packages io.delta:delta-spark_2.13:4.4.0`, without resolving them again)."""
    delta = [str(j) for j in jars.class_path(runtime.parse_version(pyspark.__version__) or (0, 0))]
    args = ["--jars", ",".join(delta)]
    for key, value in jars.DELTA_CONF.items():
        args += ["--conf", f"{key}={value}"]
    return args


# Slow: the wheel, built and installed as on a cluster, and spark-submit from it


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the bundle's build command builds, in a copy of the sources (the build writes build/ and dist/)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "features", source / "features", ignore=shutil.ignore_patterns("__pycache__"))
    command, _ = build_command()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-ec", command], cwd=source, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    built = sorted((source / wheel_dir(command)).glob("*.whl"))
    assert len(built) == 1, built
    return built[0]


@pytest.mark.slow
def test_the_wheel_holds_the_package_and_requires_no_pyspark(wheel: Path) -> None:
    assert wheel.name.startswith("windowed_features-") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    package = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "features").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert package <= names, f"missing from the wheel: {sorted(package - names)}"  # modules and data files
    pyspark = [r for r in requires if re.match(r"Requires-Dist:\s*pyspark\b", r)]
    assert pyspark and all("extra ==" in r for r in pyspark), pyspark


def _cluster_site(root: Path, *, pyspark_registered: bool) -> Path:
    """A folder that stands for a cluster's Python libraries: everything installed in the test environment (its
    PySpark, py4j, pandas, Feast, MLflow, ...) but this package and the packaging tools, linked, not copied. With
    `pyspark_registered` false, PySpark is importable but pip does not list it, as when Spark put it on the
    interpreter's path (a Spark distribution's SPARK_HOME/python, Databricks Runtime)."""
    site = Path(sysconfig.get_paths()["purelib"])
    root.mkdir(parents=True)
    skipped = re.compile(
        r"^(windowed_features[-.]|__editable__|_distutils_hack|pip|setuptools|pkg_resources|__pycache__)|\.pth$"
        + ("" if pyspark_registered else r"|^pyspark-[\d.]+\.dist-info$")
    )
    for entry in site.iterdir():
        if not skipped.search(entry.name):
            (root / entry.name).symlink_to(entry)
    assert (root / "pyspark").exists() and (root / "py4j").exists()
    return root


@pytest.fixture(scope="module")
def blank_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with nothing in it, not even pip (`_pip` runs this environment's pip on it: `venv` took
    5 s to install one), which each test copies rather than creating its own."""
    path = tmp_path_factory.mktemp("blank") / "venv"
    command = [sys.executable, "-m", "venv", "--without-pip", str(path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    return path


def _fresh_venv(path: Path, cluster: Path, blank: Path) -> Path:
    """A new virtualenv that also sees the cluster's libraries, after its own: its python. A copy of `blank`:
    nothing in a virtualenv names its folder but the activation and entry-point scripts, which these tests do
    not use (pip writes the entry points of what it installs here)."""
    shutil.copytree(blank, path, symlinks=True)
    python = path / "bin" / "python"
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    (Path(purelib) / "cluster-libraries.pth").write_text(f"{cluster}\n")
    return python


def _run(python: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python args` in the virtualenv's folder: not in this checkout, which `-c` and `-m` would put on sys.path."""
    venv = python.parent.parent
    return subprocess.run([str(python), *args], cwd=venv, capture_output=True, text=True, timeout=600, check=check)


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pip on the virtualenv of `python` (`--python`: it inspects and installs into that environment as its own
    pip would), in the virtualenv's folder."""
    venv = python.parent.parent
    command = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", *args]
    return subprocess.run(command, cwd=venv, capture_output=True, text=True, timeout=600, check=False)


def _pyspark_of(python: Path) -> tuple[str, str]:
    out = _run(python, "-c", "import pyspark; print(pyspark.__version__); print(pyspark.__file__)").stdout.split()
    return out[0], out[1]


@pytest.fixture(scope="module")
def installed(wheel: Path, blank_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh virtualenv where the wheel was installed with pip, offline, next to a cluster's
    PySpark that pip does not list: everything else it needs is the cluster's."""
    root = tmp_path_factory.mktemp("installed")
    python = _fresh_venv(root / "venv", _cluster_site(root / "cluster", pyspark_registered=False), blank_venv)
    before = _pyspark_of(python)
    result = _pip(python, "install", "--no-index", str(wheel))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert _pyspark_of(python) == before
    return python


@pytest.mark.slow
@pytest.mark.parametrize("registered", [True, False], ids=["pyspark-listed-by-pip", "pyspark-on-the-path"])
def test_installing_the_wheel_keeps_the_clusters_pyspark(
    wheel: Path, blank_venv: Path, tmp_path: Path, registered: bool
) -> None:
    """pip's resolver, asked to install the wheel next to a PySpark that is already there, installs the package
    alone. With PySpark a hard requirement, the PySpark that pip does not list would be installed over (offline,
    as here: the install fails for want of it)."""
    cluster = _cluster_site(tmp_path / "cluster", pyspark_registered=registered)
    python = _fresh_venv(tmp_path / "venv", cluster, blank_venv)
    before = _pyspark_of(python)
    assert Path(before[1]).is_relative_to(cluster)
    report = tmp_path / "report.json"
    result = _pip(python, "install", "--dry-run", "--no-index", "--report", str(report), str(wheel))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    install = json.loads(report.read_text())["install"]
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in install}
    assert planned == {"windowed-features": "0.1.0"}, planned
    assert _pyspark_of(python) == before


@pytest.mark.slow
def test_spark_submit_runs_a_backfill_from_the_installed_wheel(
    spark: object,
    installed: Path,
    tmp_path: Path,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the nightly job runs it: jobs/backfill.py under spark-submit, the package from the wheel, the repo with
    the Databricks feature_store.yaml and REDIS_CONNECTION_STRING set as the job's spark_env_vars set it."""
    from features.demo import generate_transactions, write_events
    from features.pipelines.registration import apply

    venv = installed.parent.parent
    imported = _run(installed, "-c", "import features; print(features.__file__)").stdout.strip()
    assert Path(imported).is_relative_to(venv), imported  # the wheel's copy, not this checkout's

    project = RedisServer.project("deploy")
    repo = tmp_path / "feature_repo"
    repo.mkdir()
    for name in ("fraud.py", ".feastignore"):
        shutil.copy2(ROOT / "feature_repo" / name, repo / name)
    store = STORE_YAML.read_text()
    assert "project: fraud\n" in store
    (repo / "feature_store.yaml").write_text(store.replace("project: fraud\n", f"project: {project}\n"))
    start = date(2026, 1, 5)
    events = generate_transactions(2_000, 20, start.isoformat(), 1.0, seed=3, late_fraction=0.0)
    write_events(events, repo / "data" / "transactions", n_files=2)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME")}
    env |= {
        "PYSPARK_PYTHON": str(installed),
        "PYSPARK_DRIVER_PYTHON": str(installed),
        "REDIS_CONNECTION_STRING": redis_server.connection_string,
    }
    monkeypatch.setenv("REDIS_CONNECTION_STRING", redis_server.connection_string)
    try:
        apply(str(repo))  # in the tests' session: the job under test is the backfill (its own JVM)
        spark_submit = Path(sys.executable).with_name("spark-submit")
        end = start + timedelta(days=2)
        result = subprocess.run(
            [
                str(spark_submit), "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=4",
                *delta_args(), *spark_submit_java_options(), str(ROOT / "jobs" / "backfill.py"),
                "--repo", str(repo), "--start", start.isoformat(), "--end", end.isoformat(), "--no-tracking",
            ],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]

        offline = read_pandas(str(repo / "data" / "offline" / "user_transactions"))
        assert len(offline) > 0
        newest = offline.sort_values("window_end").groupby("user_id").tail(1).set_index("user_id")
        user = str(events["user_id"].value_counts().index[0])
        from feast import FeatureStore

        online = (
            FeatureStore(repo_path=str(repo))
            .get_online_features(features=["user_transactions:txn_count_lifetime"], entity_rows=[{"user_id": user}])
            .to_dict()
        )
        assert online["txn_count_lifetime"] == [newest.loc[user, "txn_count_lifetime"]] != [None]
    finally:
        redis_server.delete_project(project)
