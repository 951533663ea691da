"""Request-time features over HTTP: `features serve` takes a request's fields in the body of
`POST /get-online-features` and answers the request-time features beside the stored ones, computed by the one
function training sets and the logged model call (features.kernel.request_time, through
features.stores.request_inputs).

    {"features": ["user_transactions:failed_count_24h"], "entities": {"user_id": ["u1", "u2"]},
     "request_features": ["amount_vs_max_24h"], "request": {"amount": [120.0, 7.5]}}

`request` holds one list per request field, one value per entity row; an optional `request_time` list gives each
row's time (ISO-8601 or epoch seconds), else it is the moment the server reads the values. Feast's app answers the
stored features, with the inputs the request-time features read added to what it is asked (and removed from its
answer); each request-time feature is added as one more result, its values in Feast's JSON forms (times as epoch
seconds). A request field missing, of another length or not of its declared type is the client's mistake: 400. A
function that fails is the definitions' owner's bug, not the client's: 500, naming the feature and the row.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from features.errors import DataError, RequestFieldError
from features.spec.request import REQUEST_TIME, RequestFeature
from features.spec.types import DType
from features.stores.feature_refs import FeatureColumn
from features.stores.request_inputs import input_refs, request_columns_of_values, request_fields, typed_field_values
from features.stores.serving_input import RequestProblem

REQUEST_FEATURES_FIELD = "request_features"
INLINE_ROWS = 100  # requests of at most this many rows are completed on the event loop (a millisecond or two)
REQUEST_FIELD = "request"


class RequestTimeFeatures:
    """The repo's request-time features, loaded once per worker at their first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.features: dict[str, RequestFeature] | None = None
        self.columns: dict[str, FeatureColumn] = {}

    def load(self) -> dict[str, RequestFeature]:
        if self.features is None:
            from features.repo import Repo
            from features.stores.feature_refs import resolve_features

            repo = Repo.load(self.root)
            refs = input_refs(list(repo.request_features.values()))
            resolved = resolve_features(repo, refs) if refs else []
            self.columns = {r.ref: replace(r.as_column(), name=r.ref) for r in resolved}  # named as in `completed`
            self.features = dict(repo.request_features)
        return self.features

    def prepare(self, request: dict[str, Any]) -> Extended | RequestProblem:
        """The request Feast's app is given instead (the inputs added, the request-time parts removed), or the
        client's mistake."""
        known = self.load()
        names = request.get(REQUEST_FEATURES_FIELD)
        listed = ", ".join(map(repr, sorted(known))) or "none (the repo defines no RequestFeature)"
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return RequestProblem(
                400,
                f"{REQUEST_FEATURES_FIELD}: not a list of names",
                f'send "{REQUEST_FEATURES_FIELD}" as a list of request-time feature names, of {listed}',
            )
        unknown = [n for n in names if n not in known]
        if unknown:
            return RequestProblem(
                404, f"{REQUEST_FEATURES_FIELD}: no request-time feature named {unknown[0]!r}", f"use one of {listed}"
            )
        asked = [known[n] for n in dict.fromkeys(names)]
        fields = request.get(REQUEST_FIELD, {})
        entities = request.get("entities")
        lists = [v for v in entities.values() if isinstance(v, list)] if isinstance(entities, dict) else []
        rows = max((len(v) for v in lists), default=0)
        problem = _fields_problem(fields, request_fields(asked), rows)
        if problem is not None:
            return problem
        full = bool(request.get("full_feature_names"))
        wanted = [str(r) for r in request.get("features") or []]
        added = [ref for ref in input_refs(asked) if ref not in wanted]
        forwarded = {k: v for k, v in request.items() if k not in (REQUEST_FEATURES_FIELD, REQUEST_FIELD)}
        forwarded["features"] = [*wanted, *added]
        stored = {ref: self.columns[ref] for ref in input_refs(asked)}
        return Extended(json.dumps(forwarded).encode(), asked, stored, added, fields, full, rows)


class Extended:
    """A request with request-time features: the body Feast's app reads, and how its answer is completed."""

    def __init__(
        self,
        body: bytes,
        features: list[RequestFeature],
        stored: dict[str, FeatureColumn],
        added: list[str],
        fields: dict[str, list[Any]],
        full_feature_names: bool,
        rows: int,
    ) -> None:
        self.body = body
        self.features = features
        self.stored = stored
        self.added = added
        self.fields = fields
        self.full = full_feature_names
        self.rows = rows
        self.moment = datetime.now(UTC)

    def name_of(self, ref: str) -> str:
        """The name Feast answers a feature under."""
        return ref.replace(":", "__") if self.full else ref.partition(":")[2]

    def completed(self, body: bytes) -> bytes | RequestProblem:
        """Feast's answer (its body) with the request-time features after the stored ones and the added inputs
        removed; or a 400 for a request field not of its type, a 500 for a function that fails."""
        answer = json.loads(body)
        names = list(answer["metadata"]["feature_names"])
        results = list(answer["results"])
        computed = self._computed(dict(zip(names, results, strict=True)), len(results[0]["values"]) if results else 0)
        if isinstance(computed, RequestProblem):
            return computed
        if not self.added:  # Feast's own part as it wrote it: encoding it again took ~1 ms for 100 rows
            appended = _appended(body, computed)
            if appended is not None:
                return appended
        dropped = {self.name_of(ref) for ref in self.added}
        kept = [(n, r) for n, r in zip(names, results, strict=True) if n not in dropped] + computed
        answer["metadata"] = {**answer["metadata"], "feature_names": [n for n, _ in kept]}
        answer["results"] = [r for _, r in kept]
        return json.dumps(answer, separators=_COMPACT).encode()

    def _computed(self, by_name: dict[str, Any], rows: int) -> list[tuple[str, dict[str, Any]]] | RequestProblem:
        """Each request-time feature's result in Feast's form, by its name, from Feast's results by name."""
        # JSON's lists as they are: a request's rows are one or a few, and each pandas object made costs.
        values = {ref: by_name[self.name_of(ref)]["values"] for ref in self.stored} | self.fields
        times = self.fields.get(REQUEST_TIME)
        try:
            moment = _times(times, rows) if times is not None else self.moment
            computed = request_columns_of_values(values, self.features, self.stored, moment, rows)
        except RequestFieldError as exc:
            return RequestProblem(400, f"{REQUEST_FIELD}.{exc.field}: {exc.problem}", exc.fix)
        except DataError as exc:
            error, _, fix = str(exc).partition(". Fix: ")
            return RequestProblem(500, error, fix or "correct the request-time feature's function")
        stamps = _stamps(moment, rows)
        out = []
        for feature in self.features:
            answered = json_values(computed[feature.name])
            statuses = ["PRESENT" if v is not None else "NULL_VALUE" for v in answered]
            out.append((feature.name, {"values": answered, "statuses": statuses, "event_timestamps": stamps}))
        return out


# How Feast's app writes its answer (compact JSON, the results first, then the metadata: the feature names alone).
_RESULTS = b'{"results":['
_NAMES = b'],"metadata":{"feature_names":['
_END = b"]}}"
_COMPACT = (",", ":")


def _appended(body: bytes, more: list[tuple[str, dict[str, Any]]]) -> bytes | None:
    """Feast's answer with `more` results (and their names) after its own, its own bytes as they are; None for an
    answer not of the form Feast writes, or of no result. `_NAMES` is found only where Feast wrote it: in a
    string, JSON escapes its quotes."""
    split = body.rfind(_NAMES)
    if split <= len(_RESULTS) or not body.startswith(_RESULTS) or not body.endswith(_END) or not more:
        return None
    results = json.dumps([r for _, r in more], separators=_COMPACT)[1:-1].encode()
    names = json.dumps([n for n, _ in more], separators=_COMPACT)[1:-1].encode()
    return b"".join((body[:split], b",", results, body[split : -len(_END)], b",", names, _END))


def _fields_problem(fields: Any, declared: dict[str, Any], rows: int) -> RequestProblem | None:
    if not isinstance(fields, dict) or not all(isinstance(v, list) for v in fields.values()):
        return RequestProblem(
            400,
            f"{REQUEST_FIELD}: not an object of field -> list of values",
            f'send "{REQUEST_FIELD}" as {{"<field>": [<one value per entity row>], ...}}',
        )
    missing = [f for f in declared if f not in fields]
    if missing:
        return RequestProblem(
            400,
            f"{REQUEST_FIELD}: no values for the request field {missing[0]!r}",
            f'send every field the request-time features read: {", ".join(declared)} in "{REQUEST_FIELD}"',
        )
    extra = [f for f in fields if f not in declared and f != REQUEST_TIME]
    if extra:
        return RequestProblem(
            400,
            f"{REQUEST_FIELD}.{extra[0]}: no requested request-time feature reads this field",
            f"send only {', '.join(declared) or 'no fields'} (and {REQUEST_TIME}), or ask for the feature reading it",
        )
    uneven = [f for f, v in fields.items() if len(v) != rows]
    if uneven:
        return RequestProblem(
            400,
            f"{REQUEST_FIELD}.{uneven[0]}: {len(fields[uneven[0]])} values for {rows} entity rows",
            "send one value per entity row, in the rows' order",
        )
    return None


def _times(values: list[Any], rows: int) -> pd.Series:
    """Each row's request time as the body gives it (ISO-8601 or epoch seconds), a RequestFieldError naming one
    that is neither."""
    return typed_field_values(values, REQUEST_TIME, DType.TIMESTAMP, pd.RangeIndex(rows))


def _stamps(moment: pd.Series | datetime, rows: int) -> list[str]:
    if isinstance(moment, pd.Series):
        return [_feast_time_text(t) for t in moment]
    return [moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")] * rows  # the server's moment


def _feast_time_text(moment: Any) -> str:
    """A time as Feast's answer writes event timestamps (the epoch for none)."""
    return "1970-01-01T00:00:00Z" if pd.isna(moment) else pd.Timestamp(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def json_values(values: pd.Series) -> list[Any]:
    """A column as Feast's JSON answers it: null for a missing value, a time as epoch seconds, lists as lists (a
    whole column at a time where its type allows)."""
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iub":
        return values.tolist()
    if isinstance(values.dtype, np.dtype) and values.dtype.kind == "f":
        return [None if math.isnan(v) else v for v in values.tolist()]
    if isinstance(values.dtype, pd.Int64Dtype | pd.BooleanDtype):
        return values.to_numpy(dtype=object, na_value=None).tolist()
    return [_json_value(v) for v in values.tolist()]


def _json_value(value: Any) -> Any:
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, pd.Timestamp | datetime):
        return int(pd.Timestamp(value).timestamp())
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return value


class HeldRequest:
    """Feast's answer to an extended request, held (`held` is the `send` Feast's app is given) until `answer`
    completes it and sends it on."""

    def __init__(self, scope: dict[str, Any], extended: Extended, send: Any) -> None:
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        self.scope = {**scope, "headers": [*headers, (b"content-length", str(len(extended.body)).encode())]}
        self.body = extended.body
        self.extended = extended
        self.send = send
        self.messages: list[dict[str, Any]] = []

    async def held(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    async def answer(self) -> RequestProblem | None:
        """Send Feast's answer completed with the request-time features (as it is, when it is not a 200), or give
        the problem to answer instead."""
        from fastapi.concurrency import run_in_threadpool

        start = next((m for m in self.messages if m["type"] == "http.response.start"), None)
        if start is None or start["status"] != 200:
            for message in self.messages:
                await self.send(message)
            return None
        body = b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")
        if self.extended.rows <= INLINE_ROWS:  # a thread's hand-over costs more than the work, and adds to the tail
            content = self.extended.completed(body)
        else:  # many rows, or slow functions: the event loop stays free for other requests
            content = await run_in_threadpool(self.extended.completed, body)
        if isinstance(content, RequestProblem):
            return content
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(content)).encode()))
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        await self.send({"type": "http.response.body", "body": content})
        return None
