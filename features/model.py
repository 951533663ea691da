"""A model that serves itself: an MLflow pyfunc that fetches its features from the Feast online store.

    info = features.model.log_model(classifier, features=refs, repo="feature_repo", input_example=rows.head(5),
                                    input_columns=["amount"], registered_model_name="fraud_classifier")
    mlflow models serve -m models:/fraud_classifier/1 --env-manager local     # POST /invocations

Given rows of entity keys (and any request-time columns the model reads, `input_columns`), `predict` reads
each key's current values from the online store (FeatureStore.get_online_features, through
features.serving), gives keys without an online row the empty-window values (0 for counts, sums and
approx_count_distinct, null otherwise: features.training.fill_empty, the same as in training sets), and
returns the wrapped model's probability of the positive class, one per row, as a Series named `probability`.

The wrapped model is anything with `predict_proba` (scikit-learn style) fitted on the columns
`input_columns + feature columns` of a training set. The model knows its repo by the absolute path it had when
logged; set `FEATURES_REPO` where it is served to point it at another copy (with the same feature_store.yaml).
The `features` package must be installed where the model is served (it is with `--env-manager local`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
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

from features.errors import ConfigError
from features.spec import DType
from features.training import FeatureColumn, fill_empty, join_keys, resolve_features

if TYPE_CHECKING:
    from feast import FeatureStore
    from mlflow.models.model import ModelInfo

    from features.repo import Repo

ENV_REPO = "FEATURES_REPO"
OUTPUT = "probability"
_REQUIREMENTS = ("mlflow", "scikit-learn", "pandas", "numpy", "feast", "pyarrow", "pyyaml")


class FeatureModel(mlflow.pyfunc.PythonModel):
    """A fitted classifier plus the features it reads online; picklable (the feature store is opened on load)."""

    def __init__(
        self,
        model: Any,
        features: Sequence[dict[str, Any]],
        input_columns: Sequence[str],
        keys: Sequence[str],
        repo: str,
    ) -> None:
        self.model = model
        self.features = [dict(f) for f in features]  # {"ref", "group", "feature", "column", "dtype", "empty_is_zero"}
        self.input_columns = list(input_columns)
        self.keys = list(keys)
        self.repo = repo
        self._store: FeatureStore | None = None

    @property
    def columns(self) -> list[str]:
        """The columns the wrapped model was fitted on, in order."""
        return self.input_columns + [f["column"] for f in self.features]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None  # a live store (connections, registry cache) is not part of the model
        return state

    def load_context(self, context: Any) -> None:
        # Open the store while the server starts, not in its first request (Feast's import, the registry).
        self._store = None
        self.store()

    def store(self) -> FeatureStore:
        if self._store is None:
            from features.serving import feature_store

            self._store = feature_store(os.environ.get(ENV_REPO) or self.repo)
        return self._store

    def feature_frame(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The rows' input columns and their current online features, filled and typed as in training."""
        from features.serving import online_features

        missing = [c for c in [*self.keys, *self.input_columns] if c not in rows.columns]
        if missing:
            raise ConfigError(
                f"model input: no column {', '.join(map(repr, missing))}; the model needs the join keys "
                f"{', '.join(self.keys)} and the inputs {', '.join(self.input_columns) or '(none)'}"
            )
        rows = rows.reset_index(drop=True)
        out = rows[self.input_columns].copy()
        by_group: dict[str, list[dict[str, Any]]] = {}
        for spec in self.features:
            by_group.setdefault(spec["group"], []).append(spec)
        for group, specs in by_group.items():
            view_keys = list(self.store().get_feature_view(group).join_keys)
            values = online_features(self.store(), group, rows[view_keys], features=[s["feature"] for s in specs])
            for spec in specs:
                out[spec["column"]] = values[spec["feature"]].to_numpy()
        filled = fill_empty(out, [_column(s) for s in self.features])
        return filled[self.columns]

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.Series:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if frame.empty:
            return pd.Series([], dtype="float64", name=OUTPUT)
        features = self.feature_frame(frame)
        probability = np.asarray(self.model.predict_proba(features))[:, 1]
        return pd.Series(probability.astype("float64"), name=OUTPUT)


def _column(spec: dict[str, Any]) -> FeatureColumn:
    return FeatureColumn(spec["column"], DType(spec["dtype"]), bool(spec["empty_is_zero"]))


def feature_model(
    model: Any,
    features: Sequence[str],
    repo: str | Path | Repo,
    input_columns: Sequence[str] = (),
    full_feature_names: bool = False,
) -> FeatureModel:
    """Wrap a fitted model with its feature references ("group:feature" or group names, as for training_set)."""
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
            "empty_is_zero": r.feature.aggregation.kind.empty_is_zero,
        }
        for r in refs
    ]
    return FeatureModel(model, specs, input_columns, join_keys(refs), str(loaded.root))


def requirements() -> list[str]:
    """Pinned requirements of the serving environment (what is installed here), so MLflow need not infer them."""
    pins = []
    for name in _REQUIREMENTS:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return pins


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
) -> ModelInfo:
    """Log the wrapped model on the active MLflow run, with a signature taken from `input_example` (rows of
    join keys and input columns) and its prediction, and register it under `registered_model_name`.

    The model's metadata lists its feature references and their groups' definition hashes."""
    from mlflow.models import infer_signature

    from features.spec.fingerprint import definition_hash

    wrapped = feature_model(model, features, repo, input_columns, full_feature_names)
    needed = [*wrapped.keys, *wrapped.input_columns]
    missing = [c for c in needed if c not in input_example.columns]
    if missing:
        raise ConfigError(
            f"input_example: no column {', '.join(map(repr, missing))}; pass rows with the join keys and input "
            f"columns the model reads ({', '.join(needed)}), e.g. the training set"
        )
    example = input_example[needed].head(5).reset_index(drop=True)
    signature = infer_signature(example, wrapped.predict(None, example))
    from features.repo import Repo

    loaded = repo if isinstance(repo, Repo) else Repo.load(repo)
    groups = {f["group"] for f in wrapped.features}
    metadata_ = {
        "features": [f["ref"] for f in wrapped.features],
        "definition_hashes": {g: definition_hash(loaded.groups[g]) for g in sorted(groups)},
        "input_columns": wrapped.input_columns,
        "join_keys": wrapped.keys,
    }
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=wrapped,
        signature=signature,
        input_example=example,
        registered_model_name=registered_model_name,
        pip_requirements=requirements(),
        metadata=metadata_,
    )


def latest_version(name: str, tracking_uri: str | None = None) -> int | None:
    """The newest version of a registered model, or None when there is none (or no such model)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from features.tracking import quiet_mlflow

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
