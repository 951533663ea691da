"""The days a logged model's training set covered, read from the lineage its MLflow run recorded
(features.ml.tracking.log_training_lineage: the tags `features.training.start` and `.end`): the reference that
`features monitor --reference-model` compares recent days with."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from features.errors import ConfigError
from features.ml.tracking import client_for

if TYPE_CHECKING:
    from features.repo import Repo

START_TAG, END_TAG = "features.training.start", "features.training.end"
FIX = (
    "give a run that built a training set with features.training_set (runs:/<run id>), a registered model logged "
    "from such a run (models:/<name>/<version>, or <name> for its latest version), or --reference-start and "
    "--reference-end instead"
)


def training_days(repo: Repo, model: str) -> tuple[date, date]:
    """The UTC days [first, last + 1) of the entity rows of the training set(s) the model's run built."""
    client, _uri, _experiment = client_for(repo)
    run_id = _run_of(client, model)
    try:
        tags = client.get_run(run_id).data.tags
    except Exception as exc:
        raise ConfigError(f"--reference-model: no MLflow run {run_id!r} in the repo's store ({exc}); {FIX}") from None
    if START_TAG not in tags or END_TAG not in tags:
        raise ConfigError(f"--reference-model: run {run_id} recorded no training set ({START_TAG} is not set); {FIX}")
    first, last = (_utc(tags[t]).date() for t in (START_TAG, END_TAG))
    return first, last + timedelta(days=1)


def _run_of(client: object, model: str) -> str:
    """The run id of `runs:/<id>[/path]`, `models:/<name>/<version>`, `<name>/<version>` or `<name>` (latest)."""
    if model.startswith("runs:/"):
        return model.removeprefix("runs:/").split("/", 1)[0]
    name, _, version = model.removeprefix("models:/").partition("/")
    try:
        if not version:
            versions = client.search_model_versions(f"name = '{name}'")  # type: ignore[attr-defined]
            if not versions:
                raise ConfigError(f"--reference-model: no registered model {name!r} in the repo's store; {FIX}")
            version = str(max(int(v.version) for v in versions))
        found = client.get_model_version(name, version)  # type: ignore[attr-defined]
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"--reference-model: no model version {name}/{version} ({exc}); {FIX}") from None
    run_id = found.run_id
    if not run_id and getattr(found, "model_id", None):  # MLflow 3 logged models carry the run that logged them
        run_id = client.get_logged_model(found.model_id).source_run_id  # type: ignore[attr-defined]
    if not run_id:
        raise ConfigError(f"--reference-model: model version {name}/{version} names no run; {FIX}")
    return str(run_id)


def _utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
