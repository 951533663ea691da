"""A logged model (features.ml.model.log_model) loads and predicts outside this environment.

- The model folder ships the `features` wheel (`code/windowed_features-<version>-py3-none-any.whl`, no declared
  dependencies); its requirements.txt names that wheel and pins what loading and `predict` import (MLflow,
  cloudpickle, Feast with the DuckDB extra its offline store config needs, pandas, numpy, pyarrow, pyyaml,
  scikit-learn for the classifier): no pyspark, no Great Expectations, no path of this machine.
- In a fresh virtualenv (no system site packages) holding only that requirements.txt, installed as MLflow
  restores a model's environment by default (`uv pip install -r requirements.txt`; pip's where uv is missing),
  `mlflow.pyfunc.load_model` loads the model from its folder and predicts what it predicts here, with
  `features` imported from the shipped wheel and no pyspark installed. Its repo is a copy elsewhere holding
  only feature_store.yaml, the registry and the online store, named by FEATURES_REPO: the repo it was logged
  from is gone. Without FEATURES_REPO, loading fails with an error naming it.
- The repo comes from a model_config `repo` given at load, else FEATURES_REPO, else the path recorded at log time.
- The pins follow the repo's stores (Feast's duckdb and redis extras), the wrapped model's libraries (also
  inside a Pipeline) and `extra_pip_requirements`.

No Spark: the online values are the reference values as of END, written by the project's own online writer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import yaml
from reference import reference_frame

from features import ConfigError, Entity, EventSource, Feature, FeatureGroup, Hop, Lifetime, agg
from features.ml import tracking
from features.ml.model import ENV_REPO, OUTPUT, log_model, model_distributions, requirements
from features.repo import Repo
from features.spec import WINDOW_END
from features.stores.feast_objects import source_schema
from features.stores.online import online_writer

START = pd.Timestamp("2026-01-01", tz="UTC")
END = pd.Timestamp("2026-01-01 20:00", tz="UTC")
GROUP = FeatureGroup(
    name="user_spend",
    entity=Entity("user", join_keys=["user_id"]),
    source=EventSource("transactions", path="data/transactions", timestamp="event_ts"),
    features=[
        Feature("txn_1h", agg.count(), window=Hop("1h", every="5m")),
        Feature("amount_sum_1h", agg.sum("amount"), window=Hop("1h", every="5m")),
        Feature("amount_max_1h", agg.max("amount"), window=Hop("1h", every="5m")),
        Feature("txn_lifetime", agg.count(), window=Lifetime(every="1h")),
    ],
)
REFS = [f"user_spend:{f.name}" for f in GROUP.features]
FEATURES = [f.name for f in GROUP.features]
# What Feast reads to serve: the configuration, the registry and the online store (not definitions or data).
SERVING_FILES = ("feature_store.yaml", "data/registry.db", "data/online_store.db")
# Run in the fresh virtualenv, started without FEATURES_REPO: loading the model from its folder fails (the
# traceback on stderr); then, with argv[3] (FEATURES_REPO) set to argv[4], it loads the model and predicts the
# rows; one line of JSON on stdout. One process for both: each start imports MLflow and Feast anew.
LOAD_AND_PREDICT = """
import importlib.util, json, os, sys, traceback
import mlflow.pyfunc, pandas as pd
try:
    mlflow.pyfunc.load_model(sys.argv[1])
    unset_failed = False
except Exception:
    traceback.print_exc()
    unset_failed = True
os.environ[sys.argv[3]] = sys.argv[4]
model = mlflow.pyfunc.load_model(sys.argv[1])
with open(sys.argv[2]) as f:
    split = json.load(f)
predicted = model.predict(pd.DataFrame(split["data"], columns=split["columns"]))
import features
print(json.dumps({
    "predictions": [float(p) for p in predicted],
    "features_from": features.__file__,
    "pyspark": importlib.util.find_spec("pyspark") is not None,
    "unset_failed": unset_failed,
}))
"""


@dataclass
class Logged:
    model_dir: Path  # the model folder, downloaded from the tracking store
    origin: Path  # the repo it was logged from, removed since
    expected: np.ndarray  # its predictions of `rows` in this environment, before the repo was removed


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    from features.demo import generate_transactions

    return generate_transactions(1_200, 15, START, 1, seed=23)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, feast_repo_factory, events: pd.DataFrame) -> Repo:
    """An applied repo whose online store holds every user's reference values as of END."""
    loaded = Repo.load(feast_repo_factory(tmp_path_factory.mktemp("serving") / "repo", [GROUP], events))
    values = reference_frame(events, GROUP, [((user,), END) for user in sorted(events["user_id"].unique())])
    values = values.drop(columns="t").assign(**{WINDOW_END: END})
    with online_writer(loaded, GROUP, GROUP.output_types(source_schema(GROUP, loaded.root))) as writer:
        writer.write(values)
    return loaded


@pytest.fixture(scope="module")
def classifier(events: pd.DataFrame):
    """Fitted on the reference values at the events' times: every fraud, and a sample of the rest."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    before = events[events["event_ts"] < END]
    rows = pd.concat([before[before["is_fraud"] == 1], before[before["is_fraud"] == 0].sample(250, random_state=0)])
    frame = reference_frame(events, GROUP, [((u,), t) for u, t in zip(rows["user_id"], rows["event_ts"], strict=True)])
    frame["amount"] = rows["amount"].to_numpy()
    features = frame[["amount", *FEATURES]].apply(pd.to_numeric).astype("float64")
    assert rows["is_fraud"].nunique() == 2
    return HistGradientBoostingClassifier(max_iter=20, random_state=0).fit(features, rows["is_fraud"].to_numpy())


@pytest.fixture(scope="module")
def rows(events: pd.DataFrame) -> pd.DataFrame:
    users = [*sorted(events["user_id"].unique())[:6], "nobody"]
    return pd.DataFrame({"user_id": users, "amount": np.linspace(5.0, 900.0, len(users))})


@pytest.fixture(scope="module")
def served(repo: Repo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo as a serving host has it: a copy elsewhere of only what Feast reads online."""
    root = tmp_path_factory.mktemp("host") / "feature_repo"
    for name in SERVING_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo.root / name, root / name)
    return root


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The XDG_CACHE_HOME this module's models build their wheel in: empty at first, so that the wheel is built
    from this source (not taken from an earlier run's cache), once, for `logged` and the cache's own test."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def logged(
    repo: Repo, classifier, rows: pd.DataFrame, wheel_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Logged:
    """The model logged from a copy of the repo (tracked in that copy's store) and downloaded; then the copy is
    removed, so that nothing can fall back on the path recorded at log time."""
    base = tmp_path_factory.mktemp("logged")
    origin = base / "logged_from"
    shutil.copytree(repo.root, origin)
    tracking.use(origin)
    try:
        with mlflow.start_run(run_name="serving"), pytest.MonkeyPatch.context() as patch:
            patch.setenv("XDG_CACHE_HOME", str(wheel_cache))
            info = log_model(classifier, REFS, origin, input_example=rows, input_columns=["amount"])
        model_dir = Path(mlflow.artifacts.download_artifacts(info.model_uri, dst_path=str(base / "download")))
    finally:
        # None, not the URI read before: setting a URI exports it to the environment, for every later command.
        mlflow.set_tracking_uri(None)
    expected = np.asarray(mlflow.pyfunc.load_model(str(model_dir)).predict(rows), dtype="float64")
    shutil.rmtree(origin)
    return Logged(model_dir, origin, expected)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment (proxies, pip's settings and cache) without anything that points Python or
    the model at this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", ENV_REPO)}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def requirement_lines(model_dir: Path) -> list[str]:
    return [line.strip() for line in (model_dir / "requirements.txt").read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def venv(tmp_path: Path):
    """A fresh virtualenv (no system site packages), removed afterwards (it holds about 1 GB). Without pip: the
    requirements are installed from outside it (`install_command`), and ensurepip took 7 s."""
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, env=clean_env())
    yield path
    shutil.rmtree(path)


def install_command(python: str) -> list[str]:
    """Installing into the virtualenv of `python` as MLflow restores a model's environment by default (its `uv`
    env manager: `uv pip install`), with the uv `./dev` installs; pip's install where there is none. uv took
    4 s where pip took 46 s, fetching every package again (pip's cache holds none of them: ./dev installs with
    uv). Not byte-compiled by either: Python compiles what serving imports as it imports it."""
    uv = shutil.which("uv", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if uv is not None:
        return [uv, "pip", "install", "--quiet", "--python", python]
    return [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile"]


@pytest.mark.slow
def test_loads_and_predicts_in_a_clean_virtualenv(logged: Logged, served: Path, rows: pd.DataFrame, venv, tmp_path):
    python = str(venv / "bin" / "python")
    started = time.monotonic()
    # Only the model's own requirements, from its folder: requirements.txt names the wheel relative to it.
    install = subprocess.run(
        [*install_command(python), "-r", "requirements.txt"],
        cwd=logged.model_dir,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    print(f"\ninstalling requirements.txt into a fresh virtualenv: {time.monotonic() - started:.1f} s")
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    rows_file = tmp_path / "rows.json"
    rows_file.write_text(rows.to_json(orient="split", index=False))
    command = [python, "-c", LOAD_AND_PREDICT, str(logged.model_dir), str(rows_file), ENV_REPO, str(served)]
    # cwd outside this checkout, so that `import features` cannot find its source
    done = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["unset_failed"] is True
    assert f"ConfigError: {ENV_REPO}: {logged.origin} has no feature_store.yaml ({ENV_REPO} is not set" in done.stderr
    assert Path(result["features_from"]).is_relative_to(venv), result["features_from"]
    assert result["pyspark"] is False
    np.testing.assert_allclose(result["predictions"], logged.expected, rtol=1e-12)


def test_a_wheel_of_the_same_source_is_built_once(
    wheel_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped wheel is cached by the digest of the package's files: a second model logged from the same
    source copies it, without pip; a changed file makes another digest. (The cache starts empty; its wheel was
    built by this call or, in a whole run of this module, by the model `logged` logged.)"""
    from features.ml import model

    monkeypatch.setenv("XDG_CACHE_HOME", str(wheel_cache))
    first = model.build_wheel(tmp_path / "one")
    [cached] = (wheel_cache / "features" / "wheels").glob("*/windowed_features-*.whl")

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip ran for a wheel of a source built before")

    monkeypatch.setattr(model.subprocess, "run", no_pip)
    second = model.build_wheel(tmp_path / "two")
    assert second.read_bytes() == first.read_bytes() == cached.read_bytes() and second.parent == tmp_path / "two"

    package = tmp_path / "package"
    shutil.copytree(Path(model.__file__).resolve().parents[1], package, ignore=shutil.ignore_patterns("__pycache__"))
    before = model.source_digest(package, "1.0")
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "x.pyc").write_bytes(b"compiled")  # compiled files are not the source
    assert model.source_digest(package, "1.0") == before
    (package / "errors.py").write_text((package / "errors.py").read_text() + "\n# changed\n")
    assert model.source_digest(package, "1.0") != before != model.source_digest(package, "1.1")


def test_the_model_folder_ships_the_wheel_and_pins_what_predict_needs(logged: Logged):
    lines = requirement_lines(logged.model_dir)
    wheels = [line for line in lines if line.endswith(".whl")]
    assert len(wheels) == 1 and wheels[0].startswith("code/windowed_features-"), lines
    wheel = logged.model_dir / wheels[0]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {"features/ml/model.py", "features/stores/serving.py", "features/ml/training.py"} <= set(names)
    assert not any("__pycache__" in n for n in names)
    assert "Requires-Dist" not in metadata  # installing the wheel brings nothing the requirements do not pin

    pins = {line.split("==")[0].split("[")[0]: line for line in lines if "==" in line}
    assert {"mlflow", "cloudpickle", "feast", "pandas", "numpy", "pyarrow", "pyyaml", "scikit-learn"} <= set(pins)
    assert all(line in pins.values() or line in wheels for line in lines), lines
    unpinned = {"pyspark", "great-expectations", "great_expectations", "matplotlib", "features", "windowed-features"}
    assert not unpinned & set(pins)
    assert not any(str(logged.origin) in line or line.startswith("/") for line in lines)

    mlmodel = yaml.safe_load((logged.model_dir / "MLmodel").read_text())
    assert mlmodel["flavors"]["python_function"]["config"] == {"repo": str(logged.origin)}
    assert mlmodel["metadata"]["features_wheel"] == wheels[0]


def test_the_repo_comes_from_model_config_then_features_repo_then_the_recorded_path(
    logged: Logged, served: Path, rows: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
):
    model_dir = str(logged.model_dir)
    monkeypatch.delenv(ENV_REPO, raising=False)
    with pytest.raises(ConfigError, match=rf"{ENV_REPO}: .*logged_from has no feature_store.yaml \({ENV_REPO} is not"):
        mlflow.pyfunc.load_model(model_dir)

    monkeypatch.setenv(ENV_REPO, str(served))
    predicted = mlflow.pyfunc.load_model(model_dir).predict(rows)
    assert predicted.name == OUTPUT
    np.testing.assert_allclose(predicted.to_numpy(), logged.expected, rtol=1e-12)

    monkeypatch.setenv(ENV_REPO, str(served / "nowhere"))
    with pytest.raises(ConfigError, match=rf"nowhere has no feature_store.yaml \({ENV_REPO}=.*nowhere\)"):
        mlflow.pyfunc.load_model(model_dir)
    configured = mlflow.pyfunc.load_model(model_dir, model_config={"repo": str(served)})  # wins over the variable
    np.testing.assert_allclose(configured.predict(rows).to_numpy(), logged.expected, rtol=1e-12)


def test_pins_follow_the_online_store_the_model_and_extra_requirements(repo: Repo, classifier):
    from importlib import metadata

    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    version = metadata.version("feast")
    assert f"feast[duckdb]=={version}" in requirements(repo)  # Feast imports the offline store's client too
    redis = Repo(repo.root, {**repo.config, "online_store": {"type": "redis", "connection_string": "localhost:6379"}})
    assert f"feast[duckdb,redis]=={version}" in requirements(redis)
    file_and_sqlite = Repo(repo.root, {**repo.config, "offline_store": {"type": "file"}})
    assert f"feast=={version}" in requirements(file_and_sqlite)

    assert model_distributions(classifier) == ["scikit-learn"]
    assert model_distributions(make_pipeline(StandardScaler(), classifier)) == ["scikit-learn"]
    pins = requirements(repo, classifier, ["pandas>=2.2", "xgboost==2.1.1"])
    assert f"scikit-learn=={metadata.version('scikit-learn')}" in pins
    assert "pandas>=2.2" in pins and not any(p.startswith("pandas==") for p in pins)  # the caller's replaces ours
    assert pins[-1] == "xgboost==2.1.1"
