"""An MLflow run as the engines log to it (features.ml.tracking makes them): a run written through an
MlflowClient, one made in the background, and one that records nothing; and the names and values it logs."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from features.quality import ValidationReport

# Numeric attributes of a result object that become `<group>.<name>` metrics (whichever it has).
RESULT_METRICS = (
    "rows_in",
    "rows_out",
    "online_rows",
    "seconds",
    "records_quarantined",
    "late",
    "late_events",
    "batches",
)


TAG_LIMIT = 8000  # characters of a tag value MLflow stores
_UNSAFE = re.compile(r"[^\w.\- /]")


def mlflow_name(*parts: str) -> str:
    """A metric, param or tag name MLflow accepts (letters, digits, _ - . space /)."""
    return ".".join(_UNSAFE.sub("_", str(p)) for p in parts if p)


def as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class Run:
    """One MLflow run of a backfill or stream, written through an MlflowClient (thread-safe, no global state)."""

    enabled = True

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, uri: str) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.tracking_uri = uri

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, group: str | None = None) -> None:
        """Numeric values as metrics (named `<group>.<name>` when `group` is given); others are ignored."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(mlflow_name(group or "", name), number, now, step or 0)
            for name, value in metrics.items()
            if (number := as_number(value)) is not None
        ]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        batch = [Param(mlflow_name(name), clipped(value, 6000)) for name, value in params.items() if value is not None]
        if batch:
            self.client.log_batch(self.run_id, params=batch)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        batch = [
            RunTag(mlflow_name(name), clipped(value, TAG_LIMIT)) for name, value in tags.items() if value is not None
        ]
        if batch:
            self.client.log_batch(self.run_id, tags=batch)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        self.client.log_dict(self.run_id, dict(data), artifact_file)

    def log_validation(
        self, report: ValidationReport, step: int | None = None, artifact: bool = True, metrics: bool = True
    ) -> None:
        """A validation's outcome as `<group>.validation.*` metrics and (by default) a JSON artifact.
        `metrics=False`: the artifact only (a stream rolls the metrics up itself, features.pipelines.rollup)."""
        if metrics:
            self.log_metrics(validation_metrics(report), step=step, group=validation_prefix(report.group))
        if artifact:
            self.log_dict(
                validation_document(report), f"validation/{mlflow_name(report.group)}/{mlflow_name(report.run_id)}.json"
            )

    def log_result(self, result: Any, step: int | None = None) -> None:
        """A BackfillResult (or a stream's result with the same attribute names) as `<group>.*` metrics."""
        group = str(result.group)
        metrics = {name: getattr(result, name) for name in RESULT_METRICS if hasattr(result, name)}
        quarantined = getattr(result, "quarantined", None) or {}
        metrics.update({f"quarantined.{reason}": n for reason, n in quarantined.items()})
        if hasattr(result, "batch_quarantined"):
            metrics["batch_quarantined"] = 0.0 if result.batch_quarantined is None else 1.0
        metrics.update({f"seconds.{name}": value for name, value in (getattr(result, "timings", None) or {}).items()})
        self.log_metrics(metrics, step=step, group=group)
        self.set_tags(
            {
                mlflow_name(group, "quarantine_path"): getattr(result, "quarantine_path", None),
                mlflow_name(group, "batch_quarantined_path"): getattr(result, "batch_quarantined", None),
            }
        )
        validation = getattr(result, "validation", None)
        if validation is not None:
            self.log_validation(validation, step=step)

    def ready(self) -> Run:
        """The run, made (a BackgroundRun waits for it here)."""
        return self

    def __repr__(self) -> str:
        return f"Run(run_id={self.run_id!r}, experiment_id={self.experiment_id!r}, tracking_uri={self.tracking_uri!r})"


class BackgroundRun(Run):
    """A run made in a thread of its own, of the lowest priority where Linux allows one per thread: importing
    MLflow and opening its store take 2.5 s of CPU, and a command that did it while Spark started got its JVM
    0.8 s later on 2 cores. At the lowest priority the thread works in the cores' idle time instead (the JVM's
    start, the driver's planning): the nightly backfill of bench/startup.py took 0.6 s less (median of 4 paired
    whole processes). Its fields and methods wait for the run; `ready()` raises its error."""

    def __init__(self, make: Callable[[], Run]) -> None:
        self._made: Future[Run] = Future()
        threading.Thread(target=self._make, args=(make,), name="features-mlflow-run", daemon=True).start()

    def _make(self, make: Callable[[], Run]) -> None:
        if sys.platform == "linux":  # a thread's own nice value; elsewhere it would name a process
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            self._made.set_result(make())
        except BaseException as exc:
            self._made.set_exception(exc)

    def ready(self) -> Run:
        return self._made.result()

    @property
    def client(self) -> MlflowClient:  # type: ignore[override]
        return self.ready().client

    @property
    def run_id(self) -> str:  # type: ignore[override]
        return self.ready().run_id

    @property
    def experiment_id(self) -> str:  # type: ignore[override]
        return self.ready().experiment_id

    @property
    def tracking_uri(self) -> str:  # type: ignore[override]
        return self.ready().tracking_uri


class DisabledRun(Run):
    """Tracking turned off: the same methods, recording nothing (MLflow is never imported)."""

    enabled = False

    def __init__(self) -> None:
        self.client = None  # type: ignore[assignment]
        self.run_id = None  # type: ignore[assignment]
        self.experiment_id = None  # type: ignore[assignment]
        self.tracking_uri = None  # type: ignore[assignment]

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, group: str | None = None) -> None:
        return None

    def log_params(self, params: Mapping[str, Any]) -> None:
        return None

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        return None

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        return None

    def log_validation(
        self, report: ValidationReport, step: int | None = None, artifact: bool = True, metrics: bool = True
    ) -> None:
        return None

    def log_result(self, result: Any, step: int | None = None) -> None:
        return None


def validation_prefix(group: str) -> str:
    return mlflow_name(group, "validation")


def validation_metrics(report: ValidationReport) -> dict[str, float]:
    """A validation's outcome as the numbers logged under `validation_prefix`."""
    return {
        "success": 1.0 if report.success else 0.0,
        "expectations": len(report.outcomes),
        "failed": len(report.failures),
        "rows": report.rows,
        "seconds": report.seconds,
    }


def clipped(value: Any, limit: int) -> str:
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validation_document(report: ValidationReport) -> dict[str, Any]:
    return {
        "group": report.group,
        "success": report.success,
        "rows": report.rows,
        "evaluated_by": report.evaluated_by,
        "seconds": report.seconds,
        "summary": report.summary(),
        "outcomes": report.to_pandas().to_dict(orient="records"),
        "result": report.to_json_dict() if report.evaluated_by_great_expectations else None,
    }
