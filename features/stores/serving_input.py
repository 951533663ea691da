"""What the feature server takes from a client before anything parses it: a body of at most `max_body_bytes`
(413 beyond, told by Content-Length or counted as it streams in); JSON that is UTF-8, nested at most
`MAX_JSON_DEPTH` levels, free of lone surrogates and of numbers too long to read (400, naming where in the body);
and for `POST /get-online-features` at most `max_entity_rows` rows (413) whose key values are strings or numbers
(400). Each problem is a `RequestProblem`, answered as `{"error": ..., "fix": ...}`
(features.stores.serving_requests)."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from features.errors import ConfigError

DEFAULT_MAX_ENTITY_ROWS = 10_000
DEFAULT_MAX_BODY_BYTES = 1 << 20
# Feast's request bodies are 2-5 levels deep; Python's JSON parser, pydantic and Feast recurse once per level and
# fail (500) near 1,000, and sooner the deeper the call stack they are parsed on.
MAX_JSON_DEPTH = 32


@dataclass(frozen=True)
class RequestProblem:
    """What is wrong with a request (the client's mistake) and how to fix it, as the HTTP answer gives it."""

    status: int
    error: str
    fix: str
    close: bool = False  # the body was not read to its end: close the connection rather than read the rest

    def body(self) -> bytes:
        return json.dumps({"error": self.error, "fix": self.fix}).encode()


@dataclass(frozen=True)
class RequestLimits:
    """The most one request may ask of a worker (`features serve --max-entity-rows --max-body-bytes`): a request of
    1,000,000 rows held a worker for 14.5 s and left it 2 GiB larger; within these its memory comes back
    (docs/serving.md, Limits)."""

    max_entity_rows: int = DEFAULT_MAX_ENTITY_ROWS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        for flag, value in (("--max-entity-rows", self.max_entity_rows), ("--max-body-bytes", self.max_body_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{flag}: {value!r} is not a positive whole number. Fix: pass e.g. {flag} 1000")


# ---------------------------------------------------------------------------------------------------------
# The body's size


def declared_too_large(headers: list[tuple[bytes, bytes]], most: int) -> RequestProblem | None:
    """A 413 when the request's Content-Length says it is larger than `most` bytes: answered before any of it is
    read."""
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit() and int(value) > most:
            return body_too_large(f"{int(value):,} bytes (its Content-Length)", most)
    return None


def body_too_large(size: str | None, most: int) -> RequestProblem:
    """A 413 for a body of `size` (None: one sent in parts, past `most` bytes so far)."""
    told = f"{size}, more than" if size else "sent in parts (no Content-Length), larger than"
    return RequestProblem(
        413,
        f"body: {told} the server takes ({most:,} bytes, --max-body-bytes)",
        "send fewer entity rows per request (split the keys over several requests), or start the server with a "
        "larger --max-body-bytes",
        close=True,
    )


async def read_body(receive: Any, most: int) -> list[dict[str, Any]] | RequestProblem:
    """The ASGI messages of the request's body, up to its last part (or the client's disconnect), or a 413 as soon
    as the parts add up to more than `most` bytes (a chunked body has no Content-Length)."""
    messages: list[dict[str, Any]] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        size += len(message.get("body", b""))
        if size > most:
            return body_too_large(None, most)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


# ---------------------------------------------------------------------------------------------------------
# JSON the parsers can take


def is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether FastAPI reads the body as JSON: a Content-Type of application/json or application/*+json."""
    for name, value in headers:
        if name.lower() == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return False


NOT_PARSED = object()  # what `parsed` gives for a body the JSON parser refuses: FastAPI answers it (400)


def parsed(body: bytes) -> tuple[Any, RequestProblem | None]:
    """The body's JSON (`NOT_PARSED` for JSON that does not parse), or what makes it unsafe to parse: not UTF-8,
    nested deeper than `MAX_JSON_DEPTH`, a number too long for Python's int, a string with a lone UTF-16 surrogate
    (Feast fails encoding it)."""
    try:  # as Python's JSON parser reads bytes (it also takes UTF-16 and UTF-32), but refusing what is not text
        text = body.decode(json.detect_encoding(body), "surrogatepass")
    except UnicodeDecodeError as exc:
        return NOT_PARSED, RequestProblem(
            400,
            f"body: not UTF-8 (byte {exc.start} is 0x{body[exc.start]:02x})",
            "send the JSON body encoded in UTF-8",
        )
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth(text) > MAX_JSON_DEPTH:
        return NOT_PARSED, _too_deep(_path_at(text))
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return NOT_PARSED, None
    except ValueError:  # a number of more digits than Python converts: FastAPI answers 400 {"detail": ...}
        return NOT_PARSED, _too_long(text)
    except RecursionError:  # not expected within MAX_JSON_DEPTH; never a 500 for it
        return NOT_PARSED, _too_deep("body")
    if _LONE_SURROGATE_CHAR.search(text) or _SURROGATE_ESCAPE.search(text):
        where = next(_surrogate_paths(value, ()), None)
        if where is not None:
            return NOT_PARSED, _lone_surrogate(where)
    return value, None


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_TOKEN = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")(\s*:)?|[\[\]{},]', re.DOTALL)  # a string (a key if ":" follows)


def _depth(text: str) -> int:
    """How deep the JSON text nests (brackets outside strings), in C: legitimate bodies with many lists (a push of
    list features) pay no Python loop."""
    import numpy as np

    brackets = np.frombuffer(_NOT_BRACKET.sub("", _STRING.sub("", text)).encode(), dtype=np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps).max(initial=0))


def _path_at(text: str, end: int | None = None) -> str:
    """The path in the body (`entities.user_id.0.0...`) to the value at character `end`, or (None) to the first one
    nested deeper than `MAX_JSON_DEPTH`: a walk over the text's tokens, up to there (only for a body refused)."""
    path: list[Any] = []  # per open container: the key or index of the value being read in it
    in_object: list[bool] = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        if end is not None and match.start() >= end:
            break
        if token in ("[", "{"):
            if len(path) == MAX_JSON_DEPTH:
                break
            path.append(0 if token == "[" else "")
            in_object.append(token == "{")
        elif token in ("]", "}") and path:
            path.pop()
            in_object.pop()
        elif token == "," and path and not in_object[-1]:
            path[-1] += 1
        elif match.group(2) and in_object and in_object[-1]:
            path[-1] = _key(match.group(1))
    return _joined(path)


def _key(token: str) -> str:
    try:
        return str(json.loads(token))
    except ValueError:  # an escape JSON does not know: the body is refused either way
        return token.strip('"')


def _too_long(text: str) -> RequestProblem:
    """A number of more digits than Python converts to an int (`sys.get_int_max_str_digits`), where it is."""
    most = sys.get_int_max_str_digits()
    numbers = _STRING.sub(lambda string: " " * len(string.group()), text)  # the same length: a digit's place stays
    found = re.search(rf"-?\d{{{most + 1},}}", numbers)
    where = _path_at(text, found.start()) if found else "body"
    fix = "send the value as a string, or a number of fewer digits"
    return RequestProblem(400, f"{where}: a number of more than {most:,} digits", fix)


def _too_deep(where: str) -> RequestProblem:
    return RequestProblem(
        400,
        f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep",
        f"send a body nested at most {MAX_JSON_DEPTH} levels deep (key values are strings or numbers: "
        '{"entities": {"user_id": ["u1", "u2"]}} is 3 levels)',
    )


_LONE_SURROGATE_CHAR = re.compile("[\ud800-\udfff]")  # after parsing, a pair is one character: these are alone
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _surrogate_paths(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """The paths of the strings (values or keys) holding a lone surrogate."""
    if isinstance(value, str):
        if _LONE_SURROGATE_CHAR.search(value):
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _surrogate_paths(key, (*path, key))
            yield from _surrogate_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _surrogate_paths(item, (*path, index))


def _lone_surrogate(path: tuple[Any, ...]) -> RequestProblem:
    return RequestProblem(
        400,
        f"{_joined(list(path))}: a string holding a lone UTF-16 surrogate (U+D800-U+DFFF), which is not text",
        "send valid Unicode: a \\ud800-\\udbff escape only as the first half of a surrogate pair (followed by a "
        "\\udc00-\\udfff one), and no surrogates encoded as UTF-8 bytes",
    )


def _joined(path: list[Any], most: int = 4) -> str:
    """A path in the body as `entities.user_id.0`, its first `most` parts (a lone surrogate shown escaped)."""
    if not path:
        return "body"
    text = ".".join(str(part).encode("utf-8", "backslashreplace").decode() for part in path[:most])
    return text + ("..." if len(path) > most else "")


# ---------------------------------------------------------------------------------------------------------
# The entities of POST /get-online-features


def rows_problem(entities: Mapping[str, Any], most: int) -> RequestProblem | None:
    """A 413 for more entity rows than `most` (the longest key list: uneven lists are answered later)."""
    rows = max((len(values) for values in entities.values()), default=0)
    if rows <= most:
        return None
    return RequestProblem(
        413,
        f"entities: {rows:,} rows, more than the server takes in one request ({most:,}, --max-entity-rows)",
        f"split the keys over requests of at most {most:,} rows, or start the server with a larger --max-entity-rows",
    )


# A key value Feast can read: Feast fails (500) on null, objects and lists, and quietly reads true as "True".
_KEY_EXAMPLE = 'e.g. "entities": {"user_id": ["u1", "u2"]}'
_INT_RANGE = {"int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1)}


def key_values_problem(entities: Mapping[str, list[Any]], kinds: Mapping[str, str]) -> RequestProblem | None:
    """The first key value that is no key: null, an object or a list (any key), or not of the key's kind where
    `kinds` knows it (`int64`, `int32`, `string`, `bool`, from the registry): a value out of an integer key's range
    or not an integer, true or false for a key that is not boolean."""
    for key, values in entities.items():
        kind = kinds.get(key, "")
        for index, value in enumerate(values):
            wrong = _not_a_key(value, kind)
            if wrong is not None:
                article = "an" if kind[:1] in ("a", "e", "i", "o", "u") else "a"
                of = f" ({_joined([key])} is {article} {kind} key)" if kind else ""
                return RequestProblem(400, f"entities.{_joined([key])}.{index}: {wrong}{of}", _key_fix(key, kind))
    return None


def _not_a_key(value: Any, kind: str) -> str | None:
    if isinstance(value, str) and kind not in _INT_RANGE:
        return None  # the common case first: most keys are strings
    if value is None or isinstance(value, dict | list) or (isinstance(value, bool) and kind not in ("bool", "")):
        return f"{shown(value)} is not a key value"
    if isinstance(value, float) and not math.isfinite(value):  # Python's JSON parser reads NaN and Infinity
        return f"{shown(value)} is not a key value"
    if kind in _INT_RANGE and not isinstance(value, bool):
        return _not_an_integer(value, kind)
    return None


def _not_an_integer(value: Any, kind: str) -> str | None:
    """Feast reads an integer key with int(): a string that is no integer fails it (500), a fraction is cut off
    (another key's values), a value out of range fails Feast's encoding (500)."""
    if isinstance(value, float) and not value.is_integer():
        return f"{shown(value)} is not an integer"
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return f"{shown(value)} is not an integer"
    low, high = _INT_RANGE[kind]
    return None if low <= number <= high else f"{shown(value)} is out of range"


def _key_fix(key: str, kind: str) -> str:
    if kind in _INT_RANGE:
        low, high = _INT_RANGE[kind]
        return f'send "{key}" values as integers from {low} to {high}'
    return f"send each key value as a string or a number, {_KEY_EXAMPLE}"


def shown(value: Any, most: int = 60) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."
