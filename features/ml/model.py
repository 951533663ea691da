"""A model that serves itself: an MLflow pyfunc that fetches its features from the Feast online store.

    info = features.ml.model.log_model(classifier, features=refs, repo="feature_repo", input_example=rows.head(5),
                                    input_columns=["amount"], registered_model_name="fraud_classifier")
    mlflow models serve -m models:/fraud_classifier/1 --env-manager local     # POST /invocations

Given rows of entity keys (and any request-time columns the model reads, `input_columns`), `predict` reads
each key's current values from the online store (FeatureStore.get_online_features, through
features.stores.serving), gives keys without an online row the empty-window values (0 for counts, sums and
distinct counts, {} for maps, null otherwise: features.stores.feature_refs.fill_empty, the same as in training
sets), and returns the wrapped model's probability of the positive class, one per row, as a Series named
`probability`.

The wrapped model is anything with `predict_proba` (scikit-learn style) fitted on the columns
`input_columns + feature columns` of a training set.

Where the model is served, it finds its feature repo (the folder with feature_store.yaml, whose registry and
online store it reads; the definitions and data are not needed) by, in order: a `repo` other than the recorded
one in the model config at load (`mlflow.pyfunc.load_model(uri, model_config={"repo": PATH})`, or
`MLFLOW_PYFUNC_INFERENCE_CONFIG`), then `FEATURES_REPO`, then the path the repo had when the model was logged.

A logged model carries what it needs to load in a clean environment (Model Serving, `mlflow models serve` with
its own virtualenv): the `features` package as a wheel built from the source imported at log time
(`code/features-<version>-py3-none-any.whl` in the model folder), and a requirements.txt naming that wheel
and pinning, at the versions installed where it was logged, what loading and `predict` import: MLflow and
cloudpickle, Feast for the online reads (with the extras that opening the repo's store needs: duckdb, which
Feast imports for the offline store feature_store.yaml names, and redis for a Redis online store), pandas,
numpy, pyarrow, pyyaml, and the libraries the wrapped model's classes come from (`extra_pip_requirements`
adds others). Not Spark or Great Expectations: the wheel declares no dependencies, so neither comes along.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from features.cache import user_cache
from features.errors import ConfigError
from features.ml.model_request import input_specs, request_field_names, with_model_request_features
from features.repo import ONLINE_STORE_TYPES
from features.spec import DType
from features.spec.aggregations import Empty
from features.spec.request import REQUEST_TIME, RequestFeature
from features.stores.feature_refs import FeatureColumn, fill_empty, join_keys, resolve_features
from features.version import DISTRIBUTION, WHEEL_PREFIX

if TYPE_CHECKING:
    from feast import FeatureStore
    from mlflow.models.model import ModelInfo

    from features.repo import Repo

ENV_REPO = "FEATURES_REPO"
CONFIG_REPO = "repo"  # the model_config key naming the feature repo
OUTPUT = "probability"
CODE_DIR = "code"  # where MLflow puts `code_paths` in a model folder; requirements.txt names the wheel there
# What loading the model and `predict` import where it is served: MLflow and cloudpickle (the pickled model),
# Feast (features.stores.serving), pandas, numpy, pyarrow and pyyaml (features.ml.training, features.repo).
_REQUIREMENTS = ("mlflow", "cloudpickle", "feast", "pandas", "numpy", "pyarrow", "pyyaml")
# The Feast extras that opening the repo's store needs where the model is served: the online store's client
# (SQLite's is in the standard library), and the offline store's, which Feast imports to read feature_store.yaml
# even when only online values are read (DuckDB's: ibis and duckdb).
_ONLINE_EXTRAS = {"redis": "redis"}
_OFFLINE_EXTRAS = {"duckdb": "duckdb", "feast.infra.offline_stores.duckdb.DuckDBOfflineStore": "duckdb"}
# The wheel a model ships: the package's modules, and no dependencies (the model's requirements pin them).
_WHEEL_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "{version}"
description = "features as shipped with a logged model; the model's requirements.txt pins what it needs"
requires-python = ">=3.11"
dependencies = []

[tool.setuptools.packages.find]
include = ["features*"]
"""


class FeatureModel(mlflow.pyfunc.PythonModel):
    """A fitted classifier plus the features it reads online; picklable (the feature store is opened on load)."""

    def __init__(
        self,
        model: Any,
        features: Sequence[dict[str, Any]],
        input_columns: Sequence[str],
        keys: Sequence[str],
        repo: str,
        request_features: Sequence[RequestFeature] = (),
        request_inputs: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.model = model
        # {"ref", "group", "feature", "column", "dtype", "empty"}; models logged before maps have "empty_is_zero"
        self.features = [dict(f) for f in features]
        self.input_columns = list(input_columns)
        self.keys = list(keys)
        self.repo = repo
        # Request-time features (pickled with their functions by value), and the specs of the stored inputs they
        # read that the wrapped model was not fitted on (features.ml.model_request).
        self.request_features = list(request_features)
        self.request_inputs = [dict(f) for f in request_inputs]
        self._store: FeatureStore | None = None

    @property
    def columns(self) -> list[str]:
        """The columns the wrapped model was fitted on, in order."""
        asked = [f.name for f in getattr(self, "request_features", [])]  # none in a model logged before them
        return self.input_columns + [f["column"] for f in self.features] + asked

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None  # a live store (connections, registry cache) is not part of the model
        return state

    def load_context(self, context: Any) -> None:
        config = getattr(context, "model_config", None) or {}
        self._configured_repo = config.get(CONFIG_REPO)
        # Open the store while the server starts, not in its first request (Feast's import, the registry).
        self._store = None
        self.store()

    def repo_root(self) -> Path:
        """The feature repo where the model runs: a model_config `repo` given at load (one other than the
        recorded path), else FEATURES_REPO, else the path recorded when the model was logged."""
        configured = getattr(self, "_configured_repo", None)  # absent in a model never loaded by MLflow
        env = os.environ.get(ENV_REPO, "").strip()
        if configured and configured != self.repo:
            path, origin = configured, f"model_config {CONFIG_REPO!r} given at load"
        elif env:
            path, origin = env, f"{ENV_REPO}={env}"
        else:
            path, origin = self.repo, f"{ENV_REPO} is not set; the path recorded when the model was logged"
        root = Path(path).expanduser().resolve()
        if not (root / "feature_store.yaml").is_file():
            raise ConfigError(
                f"{ENV_REPO}: {root} has no feature_store.yaml ({origin}). Fix: set {ENV_REPO} where the model "
                "is served to its feature repository (the folder holding feature_store.yaml and the registry and "
                f"online store it names), or load it with model_config={{{CONFIG_REPO!r}: PATH}}"
            )
        return root

    def store(self) -> FeatureStore:
        if self._store is None:
            from features.stores.serving import feature_store

            self._store = feature_store(self.repo_root())
        return self._store

    def feature_frame(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The rows' input columns and their current online features, filled and typed as in training."""
        from features.stores.serving import online_features

        requested = getattr(self, "request_features", [])
        inputs = getattr(self, "request_inputs", [])
        fields = request_field_names(requested)
        missing = [c for c in [*self.keys, *self.input_columns, *fields] if c not in rows.columns]
        if missing:
            raise ConfigError(
                f"model input: no column {', '.join(map(repr, missing))}; the model needs the join keys "
                f"{', '.join(self.keys)} and the inputs {', '.join(self.input_columns) or '(none)'}"
                + (f", and the request fields {', '.join(fields)}" if fields else "")
            )
        rows = rows.reset_index(drop=True)
        out = rows[self.input_columns].copy()
        by_group: dict[str, list[dict[str, Any]]] = {}
        for spec in [*self.features, *inputs]:
            by_group.setdefault(spec["group"], []).append(spec)
        for group, specs in by_group.items():
            view_keys = list(self.store().get_feature_view(group).join_keys)
            values = online_features(self.store(), group, rows[view_keys], features=[s["feature"] for s in specs])
            for spec in specs:
                out[spec["column"]] = values[spec["feature"]].to_numpy()
        filled = fill_empty(out, [_column(s) for s in [*self.features, *inputs]])
        if requested:
            stored = {s["ref"]: _column(s) for s in [*self.features, *inputs]}
            filled = with_model_request_features(filled, rows, requested, stored)
        return filled[self.columns]

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.Series:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if frame.empty:
            return pd.Series([], dtype="float64", name=OUTPUT)
        features = self.feature_frame(frame)
        probability = np.asarray(self.model.predict_proba(features))[:, 1]
        return pd.Series(probability.astype("float64"), name=OUTPUT)


def _column(spec: dict[str, Any]) -> FeatureColumn:
    if "empty" not in spec:  # a model logged by an earlier version: a bool, from when an empty window gave 0 or null
        return FeatureColumn(spec["column"], DType(spec["dtype"]), Empty.ZERO if spec["empty_is_zero"] else Empty.NULL)
    return FeatureColumn(spec["column"], DType(spec["dtype"]), Empty[spec["empty"]])


def feature_model(
    model: Any,
    features: Sequence[str],
    repo: str | Path | Repo,
    input_columns: Sequence[str] = (),
    full_feature_names: bool = False,
    request_features: Sequence[str | RequestFeature] = (),
) -> FeatureModel:
    """Wrap a fitted model with its feature references ("group:feature" or group names, as for training_set) and
    request-time features (the repo's names or RequestFeature objects), computed after them as training_set does."""
    from features.repo import Repo

    loaded = repo if isinstance(repo, Repo) else Repo.load(repo)
    if not hasattr(model, "predict_proba"):
        raise ConfigError(f"model: {type(model).__name__} has no predict_proba; wrap a fitted classifier")
    refs = resolve_features(loaded, features)
    specs = [
        {
            "ref": r.ref,
            "group": r.group.name,
            "feature": r.feature.name,
            "column": r.column(full_feature_names),
            "dtype": r.dtype.value,
            "empty": r.feature.aggregation.kind.op.empty.name,
        }
        for r in refs
    ]
    requested, inputs = input_specs(loaded, request_features, refs) if request_features else ([], [])
    every_key = join_keys([*refs, *resolve_features(loaded, [s["ref"] for s in inputs])]) if inputs else join_keys(refs)
    return FeatureModel(model, specs, input_columns, every_key, str(loaded.root), requested, inputs)


def requirements(repo: Repo | None = None, model: Any = None, extra: Sequence[str] = ()) -> list[str]:
    """Pinned requirements of the serving environment, at the versions installed here: what loading the model
    and `predict` import (Feast with the extras the repo's stores need), the distributions the wrapped model's
    classes come from, then `extra` as given (replacing a pin of the same name). Not `features` itself:
    log_model ships it as a wheel."""
    extras = {"feast": feast_extras(repo)} if repo is not None else {}
    pins: dict[str, str] = {}
    for name in [*_REQUIREMENTS, *(model_distributions(model) if model is not None else [])]:
        spec = f"{name}[{','.join(extras[name])}]" if extras.get(name) else name
        pins.setdefault(_canonical(name), f"{spec}=={metadata.version(name)}")
    for requirement in extra:
        pins[_canonical(re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0])] = requirement.strip()
    return list(pins.values())


def feast_extras(repo: Repo) -> list[str]:
    """The Feast extras that opening the repo's FeatureStore needs (its online and offline stores' clients)."""
    offline = repo.config.get("offline_store") or {}
    offline_type = offline if isinstance(offline, str) else str(offline.get("type", "file"))
    online_type = ONLINE_STORE_TYPES.get(repo.online_store_type, "")
    return sorted({e for e in (_ONLINE_EXTRAS.get(online_type), _OFFLINE_EXTRAS.get(offline_type)) if e})


def model_distributions(model: Any) -> list[str]:
    """The installed distributions the model's classes come from: scikit-learn for a scikit-learn classifier,
    and for a composite one (a Pipeline) those of its parts too (the objects in `get_params(deep=True)`)."""
    objects = [model]
    get_params = getattr(model, "get_params", None)
    if callable(get_params):
        objects += list(get_params(deep=True).values())
    providers = metadata.packages_distributions()
    names: list[str] = []
    for obj in objects:
        for name in providers.get(type(obj).__module__.partition(".")[0], []):
            if name not in names and _canonical(name) != DISTRIBUTION:  # shipped as the wheel, not a pin
                names.append(name)
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def build_wheel(wheel_dir: str | Path) -> Path:
    """Build the `features` wheel a logged model ships into `wheel_dir`, from the source of the package
    imported here (`pip wheel --no-deps`); its path. The wheel declares no dependencies, so installing it
    brings neither Spark nor Great Expectations: the model's requirements pin what serving needs. A wheel of
    the same source was built before (the digest of every file and the version): a copy of it, without pip."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # imported from a source folder (sys.path), never installed
        version = "0+source"
    out = Path(wheel_dir)
    package = Path(__file__).resolve().parents[1]  # features/, this module being features/ml/model.py
    cached = user_cache("wheels") / source_digest(package, version)
    made = sorted(cached.glob(f"{WHEEL_PREFIX}-*.whl")) if cached.is_dir() else []
    if made:
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(made[0], out / made[0].name))
    with tempfile.TemporaryDirectory(prefix="features-wheel-") as tmp:
        project = Path(tmp)
        shutil.copytree(package, project / "features", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (project / "pyproject.toml").write_text(_WHEEL_PYPROJECT.format(distribution=DISTRIBUTION, version=version))
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--quiet"]
        done = subprocess.run(
            [*command, "--wheel-dir", str(out), str(project)], capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise ConfigError(
            f"log_model: building the features wheel the model ships failed (pip wheel exited {done.returncode}):"
            f"\n{(done.stdout + done.stderr)[-4000:]}\nFix: pip needs setuptools>=68 to build it, from the package "
            "index or its cache"
        )
    wheel = next(out.glob(f"{WHEEL_PREFIX}-*.whl"))
    _keep(wheel, cached)
    return wheel


def source_digest(package: Path, version: str) -> str:
    """What a shipped wheel is built from: the version and every file of the package (not compiled ones)."""
    digest = hashlib.sha256(version.encode())
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def _keep(wheel: Path, cached: Path) -> None:
    """A copy of the wheel in the cache, made whole before it shows (another process may be reading it). A cache
    that cannot be written (a read-only home) only means the next model builds its wheel again."""
    try:
        cached.mkdir(parents=True, exist_ok=True)
        partial = cached / f".{wheel.name}.{os.getpid()}"
        shutil.copy2(wheel, partial)
        os.replace(partial, cached / wheel.name)
    except OSError:
        return


def log_model(
    model: Any,
    features: Sequence[str],
    repo: str | Path | Repo,
    *,
    input_example: pd.DataFrame,
    input_columns: Sequence[str] = (),
    name: str = "model",
    registered_model_name: str | None = None,
    full_feature_names: bool = False,
    extra_pip_requirements: Sequence[str] = (),
    request_features: Sequence[str | RequestFeature] = (),
) -> ModelInfo:
    """Log the wrapped model on the active MLflow run, with a signature taken from `input_example` (rows of
    join keys and input columns) and its prediction, and register it under `registered_model_name`.

    The model ships the `features` wheel and pins its requirements (`requirements`; `extra_pip_requirements`
    adds to them, e.g. "xgboost==2.1.1", or replaces a pin of the same name), so that it loads in a clean
    environment. Its model config records the repo's path (`repo`; where the model is served, a `repo` given at
    load or FEATURES_REPO overrides it). Its metadata lists its feature references, their groups' definition
    hashes and the shipped wheel. `request_features`: computed at `predict` from the input rows (which then hold
    their request fields) and the online values (features.ml.model_request)."""
    from mlflow.models import infer_signature

    from features.repo import Repo
    from features.spec.fingerprint import definition_hash

    loaded = repo if isinstance(repo, Repo) else Repo.load(repo)
    wrapped = feature_model(model, features, loaded, input_columns, full_feature_names, request_features)
    fields = [f for f in request_field_names(wrapped.request_features) if f not in wrapped.input_columns]
    if any(f.wants_request_time for f in wrapped.request_features) and REQUEST_TIME in input_example.columns:
        fields.append(REQUEST_TIME)  # in the signature (MLflow drops other columns): each request's time is given
    needed = list(dict.fromkeys([*wrapped.keys, *wrapped.input_columns, *fields]))  # a field may be a key too
    missing = [c for c in needed if c not in input_example.columns]
    if missing:
        raise ConfigError(
            f"input_example: no column {', '.join(map(repr, missing))}; pass rows with the join keys and input "
            f"columns the model reads ({', '.join(needed)}), e.g. the training set"
        )
    example = input_example[needed].head(5).reset_index(drop=True)
    if REQUEST_TIME in example.columns:  # MLflow's signatures take naive times: UTC, as predict reads them
        example[REQUEST_TIME] = pd.to_datetime(example[REQUEST_TIME], utc=True).dt.tz_localize(None)
    signature = infer_signature(example, wrapped.predict(None, example))
    groups = {f["group"] for f in wrapped.features}
    with tempfile.TemporaryDirectory(prefix="features-model-") as tmp:
        wheel = build_wheel(tmp)
        shipped = f"{CODE_DIR}/{wheel.name}"  # relative to the model folder, where MLflow and pip install it
        metadata_ = {
            "features": [f["ref"] for f in wrapped.features],
            "definition_hashes": {g: definition_hash(loaded.groups[g]) for g in sorted(groups)},
            "input_columns": wrapped.input_columns,
            "request_features": [f.name for f in wrapped.request_features],
            "join_keys": wrapped.keys,
            "features_wheel": shipped,
        }
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=wrapped,
            signature=signature,
            input_example=example,
            registered_model_name=registered_model_name,
            pip_requirements=[*requirements(loaded, model, extra_pip_requirements), shipped],
            code_paths=[str(wheel)],
            model_config={CONFIG_REPO: wrapped.repo},
            metadata=metadata_,
        )


def latest_version(name: str, tracking_uri: str | None = None) -> int | None:
    """The newest version of a registered model, or None when there is none (or no such model)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from features.ml.tracking import quiet_mlflow

    quiet_mlflow()
    client = MlflowClient(tracking_uri=tracking_uri) if tracking_uri else MlflowClient()
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    return max((int(v.version) for v in versions), default=None)


# ---------------------------------------------------------------------------------------------------------
# `mlflow models serve`


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _mlflow_command() -> list[str]:
    script = Path(sys.executable).with_name("mlflow")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "mlflow"]


@contextmanager
def serve(
    model_uri: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    tracking_uri: str | None = None,
    repo: str | Path | None = None,
    timeout_s: float = 180.0,
) -> Iterator[str]:
    """Run `mlflow models serve -m MODEL_URI --env-manager local` on host:port (a free port by default) until
    the block ends; yields the server's base URL once it answers /ping. `tracking_uri` resolves `models:/` and
    `runs:/` URIs; `repo` sets FEATURES_REPO for the server."""
    port = port or free_port(host)
    env = dict(os.environ)
    # The server runs `uvicorn` from PATH: the one installed next to this interpreter, also in a venv that was
    # never activated.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    if repo is not None:
        env[ENV_REPO] = str(Path(repo).resolve())
    command = [*_mlflow_command(), "models", "serve", "-m", model_uri, "-h", host, "-p", str(port)]
    command += ["--env-manager", "local"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    url = f"http://{host}:{port}"
    try:
        _wait_ready(process, url, timeout_s)
        yield url
    finally:
        _stop(process)


def _wait_ready(process: subprocess.Popen[str], url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise ConfigError(f"mlflow models serve exited with status {process.returncode}:\n{output[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise ConfigError(f"mlflow models serve did not answer on {url}/ping within {timeout_s:.0f}s")


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop the server and its workers (its own process group), waiting for them."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        except ProcessLookupError:
            pass
    if process.stdout:
        process.stdout.close()


def predict_http(url: str, rows: pd.DataFrame, timeout_s: float = 60.0) -> pd.Series:
    """POST rows to a served model's /invocations (pandas split format); its predictions as a Series."""
    payload = json.dumps({"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}).encode()
    request = urllib.request.Request(
        f"{url}/invocations", data=payload, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ConfigError(f"{url}/invocations answered {exc.code}: {exc.read().decode(errors='replace')}") from exc
    predictions = body["predictions"]
    values = [p[OUTPUT] if isinstance(p, dict) else p for p in predictions]
    return pd.Series(values, dtype="float64", name=OUTPUT)
