"""`features serve --log-served`: a sample of what the feature server answers, appended to the served log
(features.stores.served_log) without costing a request anything but a copy of its bytes.

`ServedLog`, an ASGI middleware outside every other, draws each `POST /get-online-features` with probability
`sample`; for a drawn one it keeps the request's and the answer's bytes as they pass (nothing is parsed, nothing
waited for) and, when the answer is 200, offers them to the worker's `ServedWriter`. The writer holds at most
QUEUE_BYTES of them (beyond, a request is dropped and counted: the log is a sample, memory is not), and a
background thread parses them into rows and appends them every FLUSH_S seconds or FLUSH_ROWS rows. A failed append
is logged with its reason and its rows dropped: logging never fails or slows a request. The rows still held are
appended when the worker shuts down (the app's lifespan shutdown, which a stopped server runs).
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from features.errors import ConfigError
from features.stores.served_log import append_served, served_table
from features.stores.serving_requests import LOG, ONLINE_PATH

MODEL_HEADER = b"x-model"
DEFAULT_SAMPLE = 0.01
QUEUE_BYTES = 64 << 20  # request and answer bytes waiting for the writer, per worker
FLUSH_S = 5.0
FLUSH_ROWS = 10_000
CLOSE_TIMEOUT_S = 10.0  # what a shutting-down worker waits for its last append


def served_sample(log_served: bool, sample: float | None) -> float | None:
    """The share of requests `--log-served --log-sample` asks to log (DEFAULT_SAMPLE unless given), None for none."""
    if not log_served:
        if sample is not None:
            raise ConfigError("--log-sample: given without --log-served; add --log-served to log what is served")
        return None
    if sample is None:
        return DEFAULT_SAMPLE
    if not 0 < sample <= 1:
        raise ConfigError(
            f"--log-sample: {sample} is not a share of requests; give a number above 0 and at most 1, "
            "e.g. --log-sample 0.01 for one request in a hundred"
        )
    return sample


@dataclass(frozen=True)
class ServedRequest:
    served_at: datetime
    model: str | None
    body: bytes
    answer: bytes


# A feature service's features: (the view name its answer uses, the view, the feature) of each.
ServiceFeatures = Callable[[str], list[tuple[str, str, str]]]


def served_rows(request: ServedRequest, service_features: ServiceFeatures) -> list[dict[str, Any]]:
    """The rows of the served log (features.stores.served_log.SERVED_SCHEMA) of one answered request."""
    body, answer = json.loads(request.body), json.loads(request.answer)
    entities: Mapping[str, list[Any]] = body.get("entities") or {}
    names = answer["metadata"]["feature_names"]
    logged_as = _references(body, service_features)
    columns = {
        logged_as.get(name, name): result["values"]
        for name, result in zip(names, answer["results"], strict=True)
        if name not in entities
    }
    common = {
        "date": request.served_at.date(),
        "served_at": request.served_at,
        "request_id": uuid.uuid4().hex,
        "model": request.model,
        "feature_service": body.get("feature_service"),
    }
    rows = len(next(iter(entities.values()), []))
    return [
        {
            **common,
            "row": i,
            "entity_key": json.dumps({key: values[i] for key, values in entities.items()}),
            "values": json.dumps({ref: values[i] for ref, values in columns.items()}),
        }
        for i in range(rows)
    ]


def _references(body: Mapping[str, Any], service_features: ServiceFeatures) -> dict[str, str]:
    """{the name a feature is answered under: its reference `view:feature`} for the features the request asked."""
    full = bool(body.get("full_feature_names"))
    if body.get("feature_service"):
        asked = service_features(str(body["feature_service"]))
    else:
        asked = []
        for ref in body.get("features") or []:
            view, _, feature = str(ref).partition(":")
            view = view.split("@", 1)[0]  # `view@v2:feature` is answered as the view's
            asked.append((view, view, feature))
    return {(f"{shown}__{feature}" if full else feature): f"{view}:{feature}" for shown, view, feature in asked}


class ServedWriter:
    """A worker's bounded queue of answered requests and the thread that appends them to the served log."""

    def __init__(self, table: str, service_features: ServiceFeatures) -> None:
        self.table = table
        self.service_features = service_features
        self.dropped = 0
        self._queue: queue.Queue[ServedRequest | None] = queue.Queue()
        self._held = 0  # bytes in the queue
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def offer(self, request: ServedRequest) -> None:
        """Queue the request for the writer, or drop it when QUEUE_BYTES are held already; never waits."""
        size = len(request.body) + len(request.answer)
        with self._lock:
            if self._held + size > QUEUE_BYTES:
                self.dropped += 1
                if self.dropped & (self.dropped - 1) == 0:  # 1, 2, 4, 8, ...: a few lines, however many
                    LOG.warning("served log: %d sampled requests dropped, the writer is behind", self.dropped)
                return
            self._held += size
            if self._thread is None:  # started in the worker that serves, never in gunicorn's master
                self._thread = threading.Thread(target=self._run, name="served-log", daemon=True)
                self._thread.start()
        self._queue.put_nowait(request)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Append what is held, then stop the thread (waiting at most `timeout_s`)."""
        if self._thread is None:
            return
        self._queue.put_nowait(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        pending: list[dict[str, Any]] = []
        flush_at = time.monotonic() + FLUSH_S
        stop = False
        while not stop:
            try:
                request = self._queue.get(timeout=max(flush_at - time.monotonic(), 0.0))
                stop = request is None
            except queue.Empty:
                request = None  # time to append what is pending
            if request is not None:
                with self._lock:
                    self._held -= len(request.body) + len(request.answer)
                pending += self._rows(request)
            if stop or len(pending) >= FLUSH_ROWS or time.monotonic() >= flush_at:
                self._append(pending)
                pending, flush_at = [], time.monotonic() + FLUSH_S

    def _rows(self, request: ServedRequest) -> list[dict[str, Any]]:
        try:
            return served_rows(request, self.service_features)
        except Exception as exc:  # an answer of a form this does not know: the request was served all the same
            LOG.warning("served log: a request left out (%s: %s)", type(exc).__name__, exc)
            return []

    def _append(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        try:
            append_served(self.table, rows)
        except Exception as exc:  # a full disk, a table changed by hand: the server goes on serving
            LOG.warning(
                "served log: %d rows not appended to %s (%s: %s)", len(rows), self.table, type(exc).__name__, exc
            )


class ServedLog:
    """The ASGI middleware that offers a sample of the answered `POST /get-online-features` to a ServedWriter
    (see the module's text)."""

    def __init__(self, app: Any, writer: ServedWriter, sample: float) -> None:
        self.app = app
        self.writer = writer
        self.sample = sample

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._closing(receive), send)
            return
        # Forked workers draw apart: CPython reseeds `random` in a forked child.
        if scope["type"] != "http" or scope["path"] != ONLINE_PATH or random.random() >= self.sample:
            await self.app(scope, receive, send)
            return
        served_at = datetime.now(UTC)
        body: list[bytes] = []
        answer: list[bytes] = []
        status = 0

        async def receive_kept() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def send_kept(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status == 200:
                answer.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive_kept, send_kept)
        if status == 200:
            model = dict(scope["headers"]).get(MODEL_HEADER)
            self.writer.offer(
                ServedRequest(served_at, model.decode("latin-1") if model else None, b"".join(body), b"".join(answer))
            )

    def _closing(self, receive: Any) -> Any:
        """The lifespan's `receive`, which appends what the writer holds before passing a shutdown on."""

        async def receive_closing() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self.writer.close)
            return message

        return receive_closing


def with_served_log(app: Any, store: Any, sample: float) -> None:
    """Feast's app (`app`, of the FeatureStore `store`) with ServedLog outside its other middleware."""

    def service_features(name: str) -> list[tuple[str, str, str]]:
        service = store.get_feature_service(name, allow_cache=True)
        return [(p.name_to_use(), p.name, f.name) for p in service.feature_view_projections for f in p.features]

    writer = ServedWriter(served_table(store.repo_path), service_features)
    app.add_middleware(ServedLog, writer=writer, sample=sample)
