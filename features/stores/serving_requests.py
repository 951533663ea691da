"""The feature server's answers to a client's mistakes: a request to `POST /get-online-features` that names an
unknown feature or view, or whose entity keys are missing or uneven, gets a 4xx answer with a JSON body saying
what was wrong and the fix (features.stores.serving runs the server with this middleware in front of Feast's app).
So does a body Feast's request model refuses, on any endpoint (not JSON, or a field of the wrong type): 400 where
FastAPI answers 422 with its own body (`with_request_errors`)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI, Request, Response
    from fastapi.exceptions import RequestValidationError
    from feast import FeatureStore


ONLINE_PATH = "/get-online-features"
# The log the workers write to (gunicorn's error log, stderr): one line per request answered 4xx here.
LOG = logging.getLogger("uvicorn.error")


@dataclass(frozen=True)
class RequestProblem:
    """What is wrong with a request (the client's mistake) and how to fix it, as the HTTP answer gives it."""

    status: int
    error: str
    fix: str

    def body(self) -> bytes:
        return json.dumps({"error": self.error, "fix": self.fix}).encode()


def with_request_errors(app: FastAPI, store: FeatureStore, registry_ttl_s: float) -> None:
    """Feast's app, with `RequestErrors` in front of it and `invalid_request` answering what its request models
    refuse."""
    from fastapi.exceptions import RequestValidationError

    app.add_middleware(RequestErrors, store=store, registry_ttl_s=registry_ttl_s)
    app.add_exception_handler(RequestValidationError, invalid_request)


class RequestErrors:
    """ASGI middleware around Feast's app, for `POST /get-online-features`: a request whose entities lack a join
    key of a requested view, or hold key lists of different lengths, is answered 400 before Feast reads it (Feast
    answers 500, or for a composite key given in part, 200 with every value NOT_FOUND); when Feast fails on a
    request because of what it asks for (`request_problem`), the answer is 400 or 404 instead of 500. Either
    way the body says what was wrong and the fix, and the log gets one line; any other failure reaches Feast's
    handler (500, with the traceback in the log).

    The join keys of the registry's views are read again every `registry_ttl_s` seconds, as Feast reads its
    registry. With authentication configured nothing is checked before Feast (its permission check comes first)."""

    def __init__(self, app: Any, store: FeatureStore, registry_ttl_s: float) -> None:
        self.app = app
        self.store = store
        self.registry_ttl_s = registry_ttl_s or math.inf  # 0: Feast never reads its registry again either
        self.precheck = str(store.config.auth_config.type).lower() == "no_auth"
        self.join_keys: dict[str, list[str]] = {}
        self.read_at = -math.inf

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != ONLINE_PATH:
            await self.app(scope, receive, send)
            return
        messages = await _whole_request(receive)
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        problem = await self._entities_problem(body) if self.precheck else None
        if problem is not None:
            await _answer(send, problem)
            return
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
            problem = None if started else await self._problem(exc, body)
            if problem is None:
                raise
            await _answer(send, problem)

    async def _entities_problem(self, body: bytes) -> RequestProblem | None:
        """What is wrong with the request's entities for the feature views it names (none for a feature service,
        a view this worker does not know yet, or a body that is not a JSON object: Feast answers those)."""
        try:
            request = json.loads(body)
        except ValueError:
            return None
        if not isinstance(request, dict) or request.get("feature_service"):
            return None
        if not isinstance(request.get("features"), list):
            return None
        if time.monotonic() - self.read_at > self.registry_ttl_s:
            from fastapi.concurrency import run_in_threadpool

            self.join_keys = await run_in_threadpool(_join_keys, self.store)
            self.read_at = time.monotonic()
        names = {_view_name(ref) for ref in request["features"]}
        keys = {name: self.join_keys[name] for name in names if name in self.join_keys}
        return _entities_problem(request.get("entities"), keys) if keys else None

    async def _problem(self, exc: Exception, body: bytes) -> RequestProblem | None:
        from fastapi.concurrency import run_in_threadpool
        from feast.errors import FeastPermissionError

        if isinstance(exc, FeastPermissionError):  # Feast's 403 stands (and says nothing of the registry)
            return None
        return await run_in_threadpool(request_problem, self.store, body)


def _join_keys(store: FeatureStore) -> dict[str, list[str]]:
    return {view.name: list(view.join_keys) for view in store.list_feature_views(allow_cache=True)}


def _view_name(ref: object) -> str:
    """The feature view of a reference `view:feature` (or `view@version:feature`)."""
    return str(ref).partition(":")[0].split("@", 1)[0]


_JSON_HEADERS = [(b"content-type", b"application/json")]


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


def _requested_features(store: FeatureStore, request: Mapping[str, Any]) -> dict[str, list[str]] | RequestProblem:
    """{feature view: its join keys} for the views the request reads (none for on-demand views, whose inputs
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
    keys: dict[str, list[str]] = {}
    for ref in refs:
        name, feature = _view_name(ref), str(ref).partition(":")[2]
        if not name or not feature:
            return RequestProblem(
                400,
                f"features: {ref!r} is not a feature reference",
                f"write '<feature view>:<feature>', e.g. {_example_ref(views)!r}",
            )
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
        keys[name] = [renamed.get(name, {}).get(key, key) for key in view.join_keys]
    return keys


def _example_ref(views: Mapping[str, Any]) -> str:
    for name, view in sorted(views.items()):
        if view.features:
            return f"{name}:{view.features[0].name}"
    return "user_transactions:txn_count"


def _entities_problem(entities: Any, keys: Mapping[str, list[str]]) -> RequestProblem | None:
    """The problem with the request's `entities` for views with these join keys, if any."""
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
    lengths = {key: len(values) for key, values in entities.items() if isinstance(values, list)}
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
    return None


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
        return f"body: not a JSON object (got {_shown(given)})"
    message = str(error.get("msg", "refused")).removeprefix("Input ").rstrip(".")
    return f"{field}: {message}, got {_shown(given)}"


def _shown(value: Any, most: int = 60) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


def _validation_fix(path: str, field: str, error: Mapping[str, Any]) -> str:
    if field == "body":
        sent = "" if error.get("type") == "json_invalid" else " with Content-Type: application/json"
        example = f"like {_EXAMPLE_REQUEST}" if path == ONLINE_PATH else f"as {path} takes ({_FEAST_API})"
        return f"send a JSON object {example}{sent}"
    if path == ONLINE_PATH:
        top = field.split(".", 1)[0]
        return _ONLINE_FIXES.get(top, f"send a body like {_EXAMPLE_REQUEST}")
    return f"correct {field} to the type {path} takes ({_FEAST_API})"


async def _whole_request(receive: Any) -> list[dict[str, Any]]:
    """The ASGI messages of the request's body, up to its last part (or the client's disconnect)."""
    messages = [await receive()]
    while messages[-1]["type"] == "http.request" and messages[-1].get("more_body", False):
        messages.append(await receive())
    return messages


async def _answer(send: Any, problem: RequestProblem) -> None:
    LOG.info("%s %s: %s", problem.status, ONLINE_PATH, problem.error)
    await send({"type": "http.response.start", "status": problem.status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": problem.body()})
