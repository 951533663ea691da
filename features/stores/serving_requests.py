"""The feature server's answers to a client's mistakes: a request to `POST /get-online-features` that names an
unknown feature or view, or whose entity keys are missing, uneven or not key values, gets a 4xx answer with a JSON
body saying what was wrong and the fix (features.stores.serving runs the server with this middleware in front of
Feast's app). So does, on any endpoint, a body Feast's request model refuses (not JSON, or a field of the wrong type):
400 where FastAPI answers 422 with its own body (`with_request_errors`); and a body over the server's limits or one
its parsers cannot take (features.stores.serving_input)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.stores.serving_input import (
    RequestLimits,
    RequestProblem,
    declared_too_large,
    is_json,
    key_values_problem,
    parsed,
    read_body,
    rows_problem,
    shown,
)
from features.stores.serving_request_time import REQUEST_FEATURES_FIELD, Extended, HeldRequest, RequestTimeFeatures

if TYPE_CHECKING:
    from fastapi import FastAPI, Request, Response
    from fastapi.exceptions import RequestValidationError
    from feast import FeatureStore, FeatureView


ONLINE_PATH = "/get-online-features"
# The log the workers write to (gunicorn's error log, stderr): one line per request answered 4xx here.
LOG = logging.getLogger("uvicorn.error")


def with_request_errors(app: FastAPI, store: FeatureStore, registry_ttl_s: float, limits: RequestLimits) -> None:
    """Feast's app, with `RequestErrors` in front of it and `invalid_request` answering what its request models
    refuse."""
    from fastapi.exceptions import RequestValidationError

    app.add_middleware(RequestErrors, store=store, registry_ttl_s=registry_ttl_s, limits=limits)
    app.add_exception_handler(RequestValidationError, invalid_request)


class RequestErrors:
    """ASGI middleware around Feast's app. On every endpoint, a body over `limits.max_body_bytes` is answered 413
    before it is read (or as soon as its parts add up to more), and a JSON body the parsers cannot take (not UTF-8,
    nested too deep, a lone surrogate) 400: Feast answered 500.

    For `POST /get-online-features`: more rows than `limits.max_entity_rows` is answered 413; a key value that is
    null, an object or a list, or not of its key's type, or entities that lack a join key of a requested view, or
    hold key lists of different lengths, 400 before Feast reads it (Feast answers 500, or for a composite key given
    in part, 200 with every value NOT_FOUND); when Feast fails on a request because of what it asks for
    (`request_problem`), the answer is 400 or 404 instead of 500. Either way the body says what was wrong and the
    fix, and the log gets one line; any other failure reaches Feast's handler (500, with the traceback in the log).

    The join keys of the registry's views are read again every `registry_ttl_s` seconds, as Feast reads its
    registry. With authentication configured nothing the registry tells is checked before Feast (its permission
    check comes first); the limits and the shape of the body are."""

    def __init__(self, app: Any, store: FeatureStore, registry_ttl_s: float, limits: RequestLimits) -> None:
        self.app = app
        self.store = store
        self.limits = limits
        self.registry_ttl_s = registry_ttl_s or math.inf  # 0: Feast never reads its registry again either
        self.precheck = str(store.config.auth_config.type).lower() == "no_auth"
        self.join_keys: dict[str, dict[str, str]] = {}
        self.read_at = -math.inf
        self.request_time: RequestTimeFeatures | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        too_large = declared_too_large(scope["headers"], self.limits.max_body_bytes)
        messages = too_large or await read_body(receive, self.limits.max_body_bytes)
        if isinstance(messages, RequestProblem):
            await _answer(send, path, messages)
            return
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        problem = await self._body_problem(scope, body)
        if problem is not None:
            await _answer(send, path, problem)
            return
        prepared = await self._extended(scope, body)
        if isinstance(prepared, RequestProblem):
            await _answer(send, path, prepared)
            return
        extended = HeldRequest(scope, prepared, send) if prepared is not None else None
        if extended is not None:  # Feast's app reads the request without its request-time parts, answers to us
            scope, body, send = extended.scope, extended.body, extended.held
            messages = [{"type": "http.request", "body": body, "more_body": False}]
        started = False

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        async def send_watched(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, replay, send_watched)
        except Exception as exc:
            problem = None if started or path != ONLINE_PATH else await self._problem(exc, body)
            if problem is None:
                raise
            await _answer(extended.send if extended is not None else send, path, problem)
            return
        if extended is not None:
            problem = await extended.answer()
            if problem is not None:
                await _answer(extended.send, path, problem)

    async def _extended(self, scope: dict[str, Any], body: bytes) -> Extended | RequestProblem | None:
        """A `POST /get-online-features` asking for request-time features, as Feast's app is to read it
        (features.stores.serving_request_time), or the client's mistake in it; None for any other request."""
        if scope["path"] != ONLINE_PATH or REQUEST_FEATURES_FIELD.encode() not in body or not is_json(scope["headers"]):
            return None
        request, problem = parsed(body)
        if problem is not None or not isinstance(request, dict) or REQUEST_FEATURES_FIELD not in request:
            return problem
        from fastapi.concurrency import run_in_threadpool

        if self.request_time is None:
            self.request_time = RequestTimeFeatures(Path(str(self.store.repo_path)))
        if self.request_time.features is None:  # the first such request loads the definitions: off the event loop
            return await run_in_threadpool(self.request_time.prepare, request)
        return self.request_time.prepare(request)

    async def _body_problem(self, scope: dict[str, Any], body: bytes) -> RequestProblem | None:
        """What is wrong with a JSON body before Feast reads it (none for a body FastAPI does not read as JSON,
        JSON that does not parse, or entities that are no object of lists: FastAPI answers those)."""
        if not body or not is_json(scope["headers"]):
            return None
        request, problem = parsed(body)
        if problem is not None or scope["path"] != ONLINE_PATH or not isinstance(request, dict):
            return problem
        entities = request.get("entities")
        if not isinstance(entities, dict) or not all(isinstance(values, list) for values in entities.values()):
            return None
        problem = rows_problem(entities, self.limits.max_entity_rows)
        keys = await self._requested_keys(request) if problem is None and self.precheck else {}
        return problem or _entities_problem(entities, keys)

    async def _requested_keys(self, request: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        """{feature view: {join key: its kind}} for the views the request names (none for a feature service or a
        view this worker does not know yet: Feast answers those)."""
        if request.get("feature_service") or not isinstance(request.get("features"), list):
            return {}
        if time.monotonic() - self.read_at > self.registry_ttl_s:
            from fastapi.concurrency import run_in_threadpool

            self.join_keys = await run_in_threadpool(_join_keys, self.store)
            self.read_at = time.monotonic()
        names = {_view_name(ref) for ref in request["features"]}
        return {name: self.join_keys[name] for name in names if name in self.join_keys}

    async def _problem(self, exc: Exception, body: bytes) -> RequestProblem | None:
        from fastapi.concurrency import run_in_threadpool
        from feast.errors import FeastPermissionError

        if isinstance(exc, FeastPermissionError):  # Feast's 403 stands (and says nothing of the registry)
            return None
        return await run_in_threadpool(request_problem, self.store, body)


def _join_keys(store: FeatureStore) -> dict[str, dict[str, str]]:
    return {view.name: key_kinds(view) for view in store.list_feature_views(allow_cache=True)}


def key_kinds(view: FeatureView, renamed: Mapping[str, str] | None = None) -> dict[str, str]:
    """{join key (as a feature service may rename it): the kind of value it takes} for the view: `int64`, `int32`,
    `string`, `bool`, or "" for a type whose values are not checked here."""
    from feast.types import Bool, Int32, Int64, String

    kinds = ((Int64, "int64"), (Int32, "int32"), (String, "string"), (Bool, "bool"))
    dtypes = {column.name: column.dtype for column in view.entity_columns}
    renamed = renamed or {}
    return {
        renamed.get(key, key): next((kind for dtype, kind in kinds if dtypes.get(key) == dtype), "")
        for key in view.join_keys
    }


def _view_name(ref: object) -> str:
    """The feature view of a reference `view:feature` (or `view@version:feature`)."""
    return str(ref).partition(":")[0].split("@", 1)[0]


_EXAMPLE_REQUEST = '{"features": ["<view>:<feature>", ...], "entities": {"<join key>": [<value>, ...]}}'


def request_problem(store: FeatureStore, body: bytes) -> RequestProblem | None:
    """What is wrong with a `POST /get-online-features` body for the store's registry, or None when nothing
    the client sent explains a failure: no features, a reference that is not `view:feature`, an unknown feature
    service, feature view or feature (404), a join key of a requested view without values, key lists of
    different lengths or empty."""
    try:
        request = json.loads(body)
    except ValueError:
        return None  # Feast's request model refuses it: `invalid_request` answers
    if not isinstance(request, dict):
        return None
    wanted = _requested_features(store, request)
    if isinstance(wanted, RequestProblem):
        return wanted
    return _entities_problem(request.get("entities"), wanted)


def _requested_features(store: FeatureStore, request: Mapping[str, Any]) -> dict[str, dict[str, str]] | RequestProblem:
    """{feature view: {join key: its kind}} for the views the request reads (none for on-demand views, whose inputs
    are not checked here), or the problem with what it asks for."""
    from feast.errors import FeatureServiceNotFoundException

    views = {view.name: view for view in store.list_feature_views(allow_cache=True)}
    on_demand = {view.name for view in store.list_on_demand_feature_views(allow_cache=True)}
    service = request.get("feature_service")
    if service:
        try:
            projections = store.get_feature_service(str(service), allow_cache=True).feature_view_projections
        except FeatureServiceNotFoundException:
            names = sorted(s.name for s in store.list_feature_services())
            return RequestProblem(
                404,
                f"feature_service: no feature service named {service!r} in the registry",
                f"use one of {', '.join(map(repr, names))}" if names else 'list features instead ("features")',
            )
        refs = [f"{p.name}:{f.name}" for p in projections for f in p.features]
        renamed = {p.name: dict(p.join_key_map or {}) for p in projections}  # a service may rename join keys
    else:
        refs, renamed = request.get("features") or [], {}
    if not isinstance(refs, list) or not refs:
        return RequestProblem(400, "features: no features requested", f"send a body like {_EXAMPLE_REQUEST}")
    keys: dict[str, dict[str, str]] = {}
    for ref in refs:
        name, feature = _view_name(ref), str(ref).partition(":")[2]
        if not name or not feature:
            return RequestProblem(
                400,
                f"features: {ref!r} is not a feature reference",
                f"write '<feature view>:<feature>', e.g. {_example_ref(views)!r}",
            )
        unversioned = _unversioned(store, ref, name, feature)
        if unversioned is not None:
            return unversioned
        if name in on_demand:
            continue
        view = views.get(name)
        if view is None:
            return RequestProblem(
                404,
                f"features: {ref!r}: no feature view named {name!r} in the registry",
                f"use one of {', '.join(map(repr, sorted(views)))}, or run `features apply` if it is new",
            )
        fields = [f.name for f in view.features]
        if feature not in fields:
            return RequestProblem(
                404,
                f"features: {ref!r}: feature view {name!r} has no feature {feature!r}",
                f"use one of {', '.join(map(repr, fields))}",
            )
        keys[name] = key_kinds(view, renamed.get(name))
    return _collision(refs, bool(request.get("full_feature_names"))) or keys


def _unversioned(store: FeatureStore, ref: object, name: str, feature: str) -> RequestProblem | None:
    """A 400 for a reference to a version of a view (`view@v2:feature`) where the registry keeps none online
    (Feast fails on it: 500)."""
    version = str(ref).partition(":")[0].partition("@")[2]
    if not version or version == "latest" or getattr(store.registry, "enable_online_versioning", False):
        return None
    return RequestProblem(
        400,
        f"features: {ref!r} asks for version {version!r} of feature view {name!r}, and this registry serves no "
        "versions online",
        f"ask for '{name}:{feature}' (its latest version), or set enable_online_feature_view_versioning: true "
        "under registry in feature_store.yaml",
    )


def _collision(refs: list[Any], full_feature_names: bool) -> RequestProblem | None:
    """Two references answered under one name (Feast fails on it: 500): the same feature twice, or without
    `full_feature_names` features of one name in two views."""
    names = [str(ref) if full_feature_names else str(ref).partition(":")[2] for ref in refs]
    twice = next((name for name, count in Counter(names).items() if count > 1), None)
    if twice is None:
        return None
    which = [str(ref) for ref, name in zip(refs, names, strict=True) if name == twice]
    return RequestProblem(
        400,
        f"features: {', '.join(map(repr, which))} would be answered under one name, {twice!r}",
        'request each feature once; for features of one name in two views, send "full_feature_names": true',
    )


def _example_ref(views: Mapping[str, Any]) -> str:
    for name, view in sorted(views.items()):
        if view.features:
            return f"{name}:{view.features[0].name}"
    return "user_transactions:txn_count"


def _entities_problem(entities: Any, keys: Mapping[str, Mapping[str, str]]) -> RequestProblem | None:
    """The problem with the request's `entities` for views with these join keys ({view: {key: kind}}), if any;
    with no views known, of the entities themselves (uneven key lists, a value that is no key value)."""
    if not isinstance(entities, dict) or not all(isinstance(values, list) for values in entities.values()):
        return None  # Feast's request model refuses it: `invalid_request` answers, naming the field
    needed = {key: view for view, view_keys in keys.items() for key in view_keys}
    missing = [key for key in needed if key not in entities]
    if missing:
        given = ", ".join(map(repr, entities)) or "none"
        return RequestProblem(
            400,
            f"entities: no values for join key {missing[0]!r} of feature view {needed[missing[0]]!r} "
            f"(keys given: {given})",
            "send every join key of the requested views, e.g. "
            + ", ".join(f'"{key}": [...]' for key in needed)
            + " in entities",
        )
    lengths = {key: len(values) for key, values in entities.items()}
    if len(set(lengths.values())) > 1:
        counts = ", ".join(f"{key!r} has {n}" for key, n in lengths.items())
        return RequestProblem(
            400,
            f"entities: the key lists differ in length ({counts})",
            "give each join key one value per row, in the same order",
        )
    if needed and not any(lengths.get(key) for key in needed):
        return RequestProblem(
            400, "entities: no rows (the key lists are empty)", "send at least one value per join key"
        )
    return key_values_problem(entities, {key: kind for kinds in keys.values() for key, kind in kinds.items()})


async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """FastAPI's answer to a body the endpoint's request model refuses (422, pydantic's errors as its body), as
    400 with `{"error": ..., "fix": ...}` naming the field, and one log line."""
    from fastapi.responses import Response

    problem = validation_problem(request.url.path, exc.errors())
    LOG.info("%s %s: %s", problem.status, request.url.path, problem.error)
    return Response(problem.body(), status_code=problem.status, media_type="application/json")


_FEAST_API = "https://docs.feast.dev/reference/feature-servers/python-feature-server"
_ONLINE_FIXES = {
    "features": 'send "features" as a list of "<feature view>:<feature>" strings',
    "entities": 'send "entities" as an object of join key -> list of values, e.g. {"user_id": ["u1", "u2"]}',
    "feature_service": 'send "feature_service" as the name of a feature service (a string)',
    "full_feature_names": 'send "full_feature_names" as true or false',
    "include_feature_view_version_metadata": 'send "include_feature_view_version_metadata" as true or false',
}
_SHOWN_ERRORS = 3  # the fields named in one answer; the rest are counted


def validation_problem(path: str, errors: Sequence[Mapping[str, Any]]) -> RequestProblem:
    """A 400 naming each field pydantic refused (`errors`: `RequestValidationError.errors()`) and the fix for
    the first."""
    described = [_described(error) for error in errors] or ["body: refused by the request model"]
    more = len(described) - _SHOWN_ERRORS
    error = "; ".join(described[:_SHOWN_ERRORS]) + (f"; and {more} more" if more > 0 else "")
    first = errors[0] if errors else {}
    return RequestProblem(400, error, _validation_fix(path, _field(first), first))


def _field(error: Mapping[str, Any]) -> str:
    """pydantic's location of the error as the field's path in the body (`entities.user_id`, `features.0`);
    "body" for the body as a whole (JSON that does not parse: its location ends with the character), and a query
    or header parameter's name prefixed by where it is."""
    parts = [str(part) for part in error.get("loc", ())]
    if error.get("type") == "json_invalid":
        return "body"
    if parts[:1] == ["body"]:
        return ".".join(parts[1:]) or "body"
    return ".".join(parts) or "body"


def _described(error: Mapping[str, Any]) -> str:
    kind, loc, given = error.get("type"), error.get("loc", ()), error.get("input")
    if kind == "json_invalid":
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"body: not valid JSON ({error.get('ctx', {}).get('error', 'decode error')}{at})"
    field = _field(error)
    if kind == "missing":
        return "body: missing (the request has no JSON body)" if field == "body" else f"{field}: missing"
    if field == "body":
        if isinstance(given, bytes):
            return "body: not read as JSON (its Content-Type is not application/json)"
        return f"body: not a JSON object (got {shown(given)})"
    message = str(error.get("msg", "refused")).removeprefix("Input ").rstrip(".")
    return f"{field}: {message}, got {shown(given)}"


def _validation_fix(path: str, field: str, error: Mapping[str, Any]) -> str:
    if field == "body":
        sent = "" if error.get("type") == "json_invalid" else " with Content-Type: application/json"
        example = f"like {_EXAMPLE_REQUEST}" if path == ONLINE_PATH else f"as {path} takes ({_FEAST_API})"
        return f"send a JSON object {example}{sent}"
    if path == ONLINE_PATH:
        top = field.split(".", 1)[0]
        return _ONLINE_FIXES.get(top, f"send a body like {_EXAMPLE_REQUEST}")
    return f"correct {field} to the type {path} takes ({_FEAST_API})"


_JSON_HEADERS = [(b"content-type", b"application/json")]


async def _answer(send: Any, path: str, problem: RequestProblem) -> None:
    LOG.info("%s %s: %s", problem.status, path, problem.error)
    # Kept alive, the server would go on reading (and dropping) the rest of a body it refused unread.
    headers = [*_JSON_HEADERS, (b"connection", b"close")] if problem.close else _JSON_HEADERS
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": problem.body()})
