"""MLflow tracking: every backfill and stream run is an MLflow run; training sets log their lineage.

This module, features.ml.runs (the runs it makes) and features.ml.model are the only ones that import MLflow, and
only when tracking is on.

Where runs go: `MLFLOW_TRACKING_URI` when it is set; on Databricks, the workspace ("databricks"); otherwise a
SQLite store under the feature repo, `sqlite:///<repo>/data/mlflow.db`, with artifacts in
`<repo>/data/mlartifacts` (of the repo where it is now: a copied or moved repo's store is relocated when opened,
features.ml.sqlite_store.relocate). Runs land in the experiment `MLFLOW_EXPERIMENT_NAME`, by default
`features-<project>` (`/Shared/features-<project>` on Databricks). Look at them with
`mlflow ui --backend-store-uri sqlite:///feature_repo/data/mlflow.db`.

The API the engines use (one run per backfill or stream; `enabled=False` gives a run that records nothing):

    from features.ml import tracking

    with tracking.start_run(repo, kind="backfill", groups=[group, ...], params={"start": ..., "end": ...}) as run:
        run.log_metrics({"rows_in": 10, "late": 2}, step=None, group=None)  # group="g" names them "g.rows_in"
        run.log_validation(report, step=None)  # a features.quality.ValidationReport
        run.log_result(result)                  # a features.pipelines.backfill.BackfillResult (or any result like it)

What a run holds:
- tags `features.kind` (backfill | stream), `features.groups`, `features.project`, `features.repo`, and per group
  `features.definition_hash.<group>` and `features.feature.<group>.<feature>` (the feature's hash); the same
  hashes as params `definition_hash.<group>`; the caller's `params` (the range, options);
- artifact `features/definitions.json`: each group's definition (features.spec.fingerprint.describe) and hashes;
- metrics `<group>.rows_in`, `.rows_out`, `.online_rows`, `.seconds`, `.records_quarantined`,
  `.quarantined.<reason>`, `.batch_quarantined` (1 when a batch failed validation and was set aside),
  whatever else the caller logs (a stream's `late` counts, per micro-batch with `step`);
- per validation: metrics `<group>.validation.success` (1/0), `.expectations`, `.failed`, `.rows`, `.seconds`,
  and the artifact `validation/<group>/<report run id>.json` (the outcomes, and Great Expectations' result when
  it evaluated the batch: not for a batch the one-pass screen passed, whose result would only restate them);
- status FINISHED, or FAILED with the error in tag `features.error` (a ValidationFailed's report is logged).

A run in progress when an MLflow run is active in the same thread and store becomes its child run.
If tracking cannot start (a bad `MLFLOW_TRACKING_URI`, an unwritable store), `start_run` raises ConfigError
naming `MLFLOW_TRACKING_URI` (with `background=True`, the run's first use or `run.ready()` does); errors while
logging are raised too, never swallowed.

Training sets (features.ml.training) call `log_training_lineage` on the active run: tags `features.training.features`,
`.start`, `.end`, `.rows`, the same `features.definition_hash.<group>` / `features.feature.<group>.<feature>`
tags as above, `features.table_version.<group>` (the offline table's version read), and the artifact
`features/training_set.json` (its `table_versions` rebuild the set: `training_set(..., as_of_version=...)`).
`find_runs` queries them later.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.errors import ConfigError, ValidationFailed
from features.ml.runs import TAG_LIMIT, BackgroundRun, DisabledRun, Run, as_number, clipped, mlflow_name
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, describe, feature_hashes

if TYPE_CHECKING:
    import pandas as pd
    from mlflow import MlflowClient

    from features.ml.lineage import Lineage
    from features.repo import Repo

KINDS = ("backfill", "stream", "verify", "monitor")
ENV_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
STORE_FILE = Path("data") / "mlflow.db"
ARTIFACT_DIR = Path("data") / "mlartifacts"
DEFINITIONS_ARTIFACT = "features/definitions.json"
TRAINING_ARTIFACT = "features/training_set.json"


def _is_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def default_uri(repo: Repo) -> str:
    """The repo's own store: SQLite under its data folder."""
    return f"sqlite:///{(repo.root / STORE_FILE).resolve()}"


def tracking_uri(repo: Repo) -> str:
    """MLFLOW_TRACKING_URI if set, "databricks" on Databricks, else the repo's SQLite store."""
    configured = os.environ.get(ENV_URI, "").strip()
    if configured:
        return configured
    return "databricks" if _is_databricks() else default_uri(repo)


def experiment_name(repo: Repo) -> str:
    configured = os.environ.get(ENV_EXPERIMENT, "").strip()
    if configured:
        return configured
    name = f"features-{repo.project or repo.root.name}"
    return f"/Shared/{name}" if _is_databricks() else name


def quiet_mlflow() -> None:
    # Creating a SQLite store logs its schema migrations at INFO on stderr: noise in a CLI's error output.
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow's own use of SQLAlchemy warns on every process start; nothing a user can act on.
    warnings.filterwarnings("ignore", message=r"The ``noload`` loader strategy is deprecated")


def _start_failed(uri: str, repo: Repo, exc: BaseException) -> ConfigError:
    where = f"{ENV_URI}={uri}" if os.environ.get(ENV_URI, "").strip() else f"the default store {uri}"
    return ConfigError(
        f"{ENV_URI}: MLflow tracking could not start with {where} ({type(exc).__name__}: {exc}). Fix: set "
        f"{ENV_URI} to a reachable tracking server or a writable store (unset it to use {default_uri(repo)}), "
        "or turn tracking off (--no-tracking, track=False)"
    )


def client_for(repo: Repo) -> tuple[MlflowClient, str, str]:
    """An MlflowClient for the repo's tracking store, the URI, and the id of the repo's experiment (created
    when missing, with artifacts under the repo for the default store). ConfigError if that fails."""
    uri = tracking_uri(repo)
    try:
        quiet_mlflow()
        from mlflow import MlflowClient

        if uri == default_uri(repo):
            from features.ml.sqlite_store import ensure_store, relocate

            ensure_store(repo.root / STORE_FILE)
            if (repo.root / STORE_FILE).exists():  # a copied or moved repo's store writes into the repo it is in
                relocate(repo.root / STORE_FILE, repo.root, ARTIFACT_DIR)
        client = MlflowClient(tracking_uri=uri)
        return client, uri, _experiment_id(client, repo, uri)
    except ConfigError:
        raise
    except Exception as exc:  # any failure of the store: a bad URI, a locked or unwritable file, a server down
        raise _start_failed(uri, repo, exc) from exc


def _experiment_id(client: MlflowClient, repo: Repo, uri: str) -> str:
    from mlflow.exceptions import MlflowException

    name = experiment_name(repo)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = (repo.root / ARTIFACT_DIR).resolve().as_uri() if uri == default_uri(repo) else None
    try:
        return str(client.create_experiment(name, artifact_location=location))
    except MlflowException:
        found = client.get_experiment_by_name(name)  # another process created it meanwhile
        if found is None:
            raise
        return str(found.experiment_id)


def use(repo: Repo | str | Path) -> str:
    """Point MLflow's own API (mlflow.start_run, mlflow.log_metric, ...) at the repo's store and experiment;
    returns the experiment id. Notebooks call it before `mlflow.start_run()` for a training run."""
    import mlflow

    loaded = _load(repo)
    _client, uri, experiment_id = client_for(loaded)
    # mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI to the environment, where `tracking_uri` would
    # later take it for the user's choice (for every other repo too): keep the environment as it was.
    before = os.environ.get(ENV_URI)
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment_id=experiment_id)
    finally:
        if before is None:
            os.environ.pop(ENV_URI, None)
        else:
            os.environ[ENV_URI] = before
    return experiment_id


@contextmanager
def training_run(repo: Repo | str | Path, run_name: str | None = None) -> Iterator[Any]:
    """`mlflow.start_run(run_name=...)` in the repo's store and experiment (see `use`): the active run that
    training sets log their lineage on and models are logged to."""
    import mlflow

    use(repo)
    with mlflow.start_run(run_name=run_name) as run:
        yield run


def log_run_metrics(metrics: Mapping[str, Any]) -> None:
    """Numeric values as metrics of the active MLflow run (others are ignored)."""
    import mlflow

    numbers = {mlflow_name(k): number for k, value in metrics.items() if (number := as_number(value)) is not None}
    mlflow.log_metrics(numbers)


def _load(repo: Repo | str | Path) -> Repo:
    from features.repo import Repo

    return repo if isinstance(repo, Repo) else Repo.load(repo)


# ---------------------------------------------------------------------------------------------------------
# Runs


def definition_tags(groups: Sequence[FeatureGroup]) -> dict[str, str]:
    """Tags naming each group's definition hash and each feature's hash (queryable with `find_runs`)."""
    tags = {}
    for group in groups:
        tags[mlflow_name("features.definition_hash", group.name)] = definition_hash(group)
        for feature, digest in feature_hashes(group).items():
            tags[mlflow_name("features.feature", group.name, feature)] = digest
    return tags


def definitions_document(groups: Sequence[FeatureGroup]) -> dict[str, Any]:
    return {
        g.name: {"definition_hash": definition_hash(g), "feature_hashes": feature_hashes(g), "definition": describe(g)}
        for g in groups
    }


@contextmanager
def start_run(
    repo: Repo,
    kind: str,
    groups: Sequence[FeatureGroup],
    params: Mapping[str, Any] | None = None,
    *,
    enabled: bool = True,
    run_name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    background: bool = False,
) -> Iterator[Run]:
    """An MLflow run for one backfill or stream over `groups`, ended when the block ends (FINISHED, or FAILED
    with the error when the block raises; the error propagates). See the module docstring for its contents.

    `background`: the run is made in a thread of low priority while the block starts (see `BackgroundRun`); the
    block calls `run.ready()` before it writes anything, which raises the ConfigError of a store that cannot
    start."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not enabled:
        yield DisabledRun()
        return
    # The parent is the run active in the caller's thread. Without MLflow imported, no run can be active.
    parent = _active_parent(tracking_uri(repo)) if "mlflow" in sys.modules else None
    make = partial(_create_run, repo, kind, groups, params or {}, run_name, tags or {}, parent)
    run = BackgroundRun(make) if background else make()
    try:
        yield run
    except BaseException as exc:
        _record_failure(run, exc)
        raise
    run.client.set_terminated(run.run_id, status="FINISHED")


def _create_run(
    repo: Repo,
    kind: str,
    groups: Sequence[FeatureGroup],
    params: Mapping[str, Any],
    run_name: str | None,
    tags: Mapping[str, Any],
    parent: str | None,
) -> Run:
    client, uri, experiment_id = client_for(repo)
    names = [g.name for g in groups]
    all_tags = {
        "features.kind": kind,
        "features.groups": ",".join(names),
        "features.project": repo.project,
        "features.repo": str(repo.root),
        **definition_tags(groups),
        **tags,
    }
    if parent is not None:
        all_tags["mlflow.parentRunId"] = parent
    try:
        created = client.create_run(
            experiment_id,
            run_name=run_name or f"{kind} {', '.join(names)}",
            tags={k: str(v) for k, v in all_tags.items()},
        )
    except Exception as exc:
        raise _start_failed(uri, repo, exc) from exc
    run = Run(client, created.info.run_id, experiment_id, uri)
    try:
        run.log_params({**{mlflow_name("definition_hash", g.name): definition_hash(g) for g in groups}, **params})
        run.log_dict(definitions_document(groups), DEFINITIONS_ARTIFACT)
    except BaseException as exc:
        _record_failure(run, exc)
        raise
    return run


def _active_parent(uri: str) -> str | None:
    """The run id of the MLflow run active in this thread, if it writes to the same store."""
    import mlflow

    active = mlflow.active_run()
    if active is None or mlflow.get_tracking_uri() != uri:
        return None
    return str(active.info.run_id)


def _record_failure(run: Run, exc: BaseException) -> None:
    """End the run FAILED (KILLED on interrupt) with the error; a failure to record it is added to `exc`."""
    try:
        run = run.ready()
        report = getattr(exc, "report", None) if isinstance(exc, ValidationFailed) else None
        if report is not None:
            run.log_validation(report)
        run.set_tags({"features.error": f"{type(exc).__name__}: {exc}"})
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        run.client.set_terminated(run.run_id, status=status)
    except Exception as tracking_error:
        exc.add_note(f"(The MLflow run could not record this failure: {tracking_error})")


# ---------------------------------------------------------------------------------------------------------
# Training-set lineage


def log_training_lineage(lineage: Lineage) -> str | None:
    """Record a training set's lineage on the active MLflow run (in whatever store it is); its run id, or None
    when no run is active (then nothing is logged)."""
    import mlflow

    active = mlflow.active_run()
    if active is None:
        return None
    run_id = active.info.run_id
    client = mlflow.MlflowClient()
    existing = client.get_run(run_id).data.tags
    count = int(existing.get("features.training.sets", "0")) + 1
    features = _merge(existing.get("features.training.features"), lineage.features)
    start = _earliest(existing.get("features.training.start"), lineage.start, min)
    end = _earliest(existing.get("features.training.end"), lineage.end, max)
    rows = int(existing.get("features.training.rows", "0")) + lineage.rows
    tags = {
        "features.training.sets": count,
        "features.training.features": ",".join(features),
        "features.training.start": start,
        "features.training.end": end,
        "features.training.rows": rows,
        "features.training.timestamp_column": lineage.timestamp_column,
    }
    for ref in lineage.features:
        group, feature = ref.split(":", 1)
        tags[mlflow_name("features.feature", group, feature)] = lineage.feature_hashes[ref]
    for group, digest in lineage.definition_hashes.items():
        tags[mlflow_name("features.definition_hash", group)] = digest
    for group, version in lineage.table_versions.items():
        tags[mlflow_name("features.table_version", group)] = version  # the last set's; each set's artifact has its own
    mlflow.set_tags({k: clipped(v, TAG_LIMIT) for k, v in tags.items() if v is not None})
    artifact = TRAINING_ARTIFACT if count == 1 else TRAINING_ARTIFACT.replace(".json", f"_{count}.json")
    mlflow.log_dict(lineage.to_dict(), artifact)
    return str(run_id)


def _merge(existing: str | None, features: Sequence[str]) -> list[str]:
    merged = [f for f in (existing or "").split(",") if f]
    return merged + [f for f in features if f not in merged]


def _earliest(existing: str | None, value: Any, pick: Any) -> str | None:
    from datetime import datetime

    values = [v for v in (existing and datetime.fromisoformat(existing), value) if v]
    return pick(values).isoformat() if values else None


def find_runs(
    repo: Repo | str | Path,
    *,
    group: str | None = None,
    definition_hash: str | None = None,
    feature: str | None = None,
    kind: str | None = None,
) -> pd.DataFrame:
    """Runs in the repo's store (every experiment) that used a group (optionally with this exact definition
    hash) or a feature ("group:feature"), or of a kind ("backfill", "stream"), newest first; columns as
    mlflow.search_runs gives them (run_id, status, start_time, tags.*, params.*, metrics.*)."""
    import pandas as pd

    client, _uri, _experiment = client_for(_load(repo))
    conditions = []
    if group is not None:
        key = mlflow_name("features.definition_hash", group)
        conditions.append(f"tags.`{key}` = '{definition_hash}'" if definition_hash else f"tags.`{key}` != ''")
    elif definition_hash is not None:
        raise ValueError("definition_hash needs group= (the group it is a hash of)")
    if feature is not None:
        group_name, _, feature_name = feature.partition(":")
        conditions.append(f"tags.`{mlflow_name('features.feature', group_name, feature_name)}` != ''")
    if kind is not None:
        conditions.append(f"tags.`features.kind` = '{kind}'")
    experiments = [e.experiment_id for e in client.search_experiments()]
    rows, token = [], None
    while True:
        page = client.search_runs(
            experiments, " and ".join(conditions), order_by=["attributes.start_time DESC"], page_token=token
        )
        rows += [_run_row(run) for run in page]
        token = page.token
        if not token:
            break
    frame = pd.DataFrame(rows)
    for column in ("start_time", "end_time"):
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], unit="ms", utc=True)
    return frame


def _run_row(run: Any) -> dict[str, Any]:
    info, data = run.info, run.data
    return {
        "run_id": info.run_id,
        "experiment_id": info.experiment_id,
        "run_name": info.run_name,
        "status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
        **{f"metrics.{k}": v for k, v in data.metrics.items()},
        **{f"params.{k}": v for k, v in data.params.items()},
        **{f"tags.{k}": v for k, v in data.tags.items()},
    }
