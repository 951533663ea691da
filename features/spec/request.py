"""Request-time features: values known only when a request arrives (this transaction's amount, its merchant),
combined with stored features by one function that training sets, the logged model and the feature server all
apply (docs/definitions.md, "Request-time features"; the application is features.kernel.request_time).

    amount_vs_max_24h = RequestFeature(
        "amount_vs_max_24h",
        lambda amount, amount_max_24h: amount / amount_max_24h,
        request={"amount": "double"},
        features=["user_transactions:amount_max_24h"],
        dtype="double",
    )

The function's parameters are the request fields, the stored features (by their names, or the names given as the
keys of a mapping `{"parameter": "group:feature"}`) and, when it asks for it, `request_time`: the time the value is
asked for (a training row's timestamp, the moment of a serving request). It takes a column per parameter (pandas
Series of equal length) and returns a column of that length; `row=True` calls it once per row with plain values
instead."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from types import MappingProxyType
from typing import Any

from features.errors import DefinitionError
from features.spec.definitions import FeatureGroup, check_name, reserved_fix, reserved_use
from features.spec.types import TYPE_NAMES, DType

REQUEST_TIME = "request_time"
REQUEST_TYPES: Mapping[str, DType] = MappingProxyType(
    {**TYPE_NAMES, "float64_list": DType.FLOAT64_LIST, "int64_list": DType.INT64_LIST, "string_list": DType.STRING_LIST}
)
_TYPES_TEXT = "int64, double, string, bool or timestamp (or int64_list, float64_list, string_list)"


@dataclass(frozen=True)
class StoredInput:
    """A stored feature a request-time feature reads, as the parameter `name` of its function."""

    name: str
    group: str
    feature: str

    @property
    def ref(self) -> str:
        return f"{self.group}:{self.feature}"


@dataclass(frozen=True)
class RequestFeature:
    """One value computed from request fields and stored features by `function` (see the module's docstring)."""

    name: str
    function: Callable[..., Any]
    request: Mapping[str, DType]
    features: tuple[StoredInput, ...]
    dtype: DType
    row: bool = False
    description: str = ""

    def __init__(
        self,
        name: str,
        function: Callable[..., Any],
        *,
        request: Mapping[str, str | DType] | None = None,
        features: Sequence[str] | Mapping[str, str] = (),
        dtype: str | DType,
        row: bool = False,
        description: str = "",
    ) -> None:
        check_name(name, "RequestFeature.name")
        where = f"RequestFeature({name!r})"
        reason = reserved_use(name, feature=True)
        if reason is not None:
            raise DefinitionError(f"{where}.name", reason, reserved_fix("feature"))
        if not callable(function):
            raise DefinitionError(
                f"{where}.function",
                f"{function!r} is not callable",
                "pass a function of the request fields and features, e.g. lambda amount, amount_max_24h: ...",
            )
        fields = {field: _dtype(kind, f"{where}.request[{field!r}]") for field, kind in (request or {}).items()}
        for field in fields:
            check_name(field, f"{where}.request")
            if field == REQUEST_TIME:
                raise DefinitionError(
                    f"{where}.request",
                    f"{REQUEST_TIME!r} is given to every request-time feature that asks for it",
                    f"leave it out of request and take a parameter named {REQUEST_TIME}",
                )
        stored = _stored_inputs(features, where)
        clash = sorted(set(fields) & {s.name for s in stored})
        if clash:
            raise DefinitionError(
                f"{where}.features",
                f"{clash[0]!r} is both a request field and a stored feature's parameter",
                'name the feature\'s parameter apart: features={"stored_amount": "group:amount"}',
            )
        _check_parameters(function, [*fields, *(s.name for s in stored)], where)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "function", function)
        object.__setattr__(self, "request", MappingProxyType(fields))
        object.__setattr__(self, "features", stored)
        object.__setattr__(self, "dtype", _dtype(dtype, f"{where}.dtype"))
        object.__setattr__(self, "row", bool(row))
        object.__setattr__(self, "description", description)

    def __hash__(self) -> int:
        return hash((self.name, self.function))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its function by value (Spark's workers, a logged model in a clean environment): the
        module a repo's definitions come from is importable only where the repo was loaded."""
        stored = {s.name: s.ref for s in self.features}
        args = (self.name, function_bytes(self.function), dict(self.request), stored, self.dtype.value, self.row)
        return restored_request_feature, (*args, self.description)

    @cached_property  # asked at every request served: the signature is read once
    def parameters(self) -> tuple[str, ...]:
        """The function's parameters, in its own order."""
        return tuple(inspect.signature(self.function).parameters)

    @cached_property
    def positional(self) -> bool:
        """Whether every parameter can be given by position (none is keyword-only)."""
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return all(p.kind in kinds for p in inspect.signature(self.function).parameters.values())

    @property
    def wants_request_time(self) -> bool:
        return REQUEST_TIME in self.parameters

    def check_against(self, groups: Mapping[str, FeatureGroup]) -> None:
        """Raise naming the field when a stored feature it reads is not defined, or its name is a stored one's."""
        where = f"RequestFeature({self.name!r})"
        for stored in self.features:
            group = groups.get(stored.group)
            if group is None:
                raise DefinitionError(
                    f"{where}.features",
                    f"{stored.ref!r} names no feature group of the repo",
                    f"use one of {sorted(groups)} before the colon",
                )
            if stored.feature not in {f.name for f in group.features}:
                raise DefinitionError(
                    f"{where}.features",
                    f"group {stored.group!r} has no feature {stored.feature!r}",
                    f"use one of {[f.name for f in group.features]}",
                )
        for group in groups.values():
            if self.name in {f.name for f in group.features} or self.name in group.join_keys:
                raise DefinitionError(
                    f"{where}.name",
                    f"{self.name!r} is also a column of feature group {group.name!r}, and a row holds both",
                    "rename the request-time feature",
                )


def function_bytes(function: Callable[..., Any]) -> bytes:
    """The function pickled with cloudpickle, by value unless it comes from the standard library or an installed
    distribution (this package among them), which are importable wherever it is unpickled."""
    import sys

    import cloudpickle

    module = sys.modules.get(getattr(function, "__module__", None) or "")
    top = module.__name__.partition(".")[0] if module is not None else ""
    installed = top in sys.stdlib_module_names or top in _installed_modules()
    if module is None or installed or module.__name__ == "__main__":
        return cloudpickle.dumps(function)
    cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(function)
    finally:
        cloudpickle.unregister_pickle_by_value(module)


@cache
def _installed_modules() -> frozenset[str]:
    """The top-level modules of the installed distributions (a scan of them all: a second or more, done once)."""
    from importlib import metadata

    return frozenset(metadata.packages_distributions())


def restored_request_feature(
    name: str,
    function: bytes,
    request: dict[str, str],
    features: dict[str, str],
    dtype: str,
    row: bool,
    description: str,
) -> RequestFeature:
    """A RequestFeature from what `RequestFeature.__reduce__` pickled."""
    import pickle

    return RequestFeature(
        name,
        pickle.loads(function),
        request={k: DType(v) if isinstance(v, str) else v for k, v in request.items()},
        features=features,
        dtype=DType(dtype),
        row=row,
        description=description,
    )


def check_request_features(features: Sequence[RequestFeature], groups: Mapping[str, FeatureGroup]) -> None:
    """Every request-time feature of a repo against its groups, and their names unique."""
    seen: set[str] = set()
    for feature in features:
        if feature.name in seen:
            raise DefinitionError(
                f"RequestFeature({feature.name!r}).name",
                "two request-time features have this name",
                "give each its own name",
            )
        seen.add(feature.name)
        feature.check_against(groups)


def _dtype(value: object, field: str) -> DType:
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value.lower() in REQUEST_TYPES:
        return REQUEST_TYPES[value.lower()]
    raise DefinitionError(field, f"unknown type {value!r}", f"use {_TYPES_TEXT}")


def _stored_inputs(features: Sequence[str] | Mapping[str, str], where: str) -> tuple[StoredInput, ...]:
    if isinstance(features, str):
        raise DefinitionError(
            f"{where}.features", f"{features!r} is one string", f'pass a list: features=["{features}"]'
        )
    pairs = list(features.items()) if isinstance(features, Mapping) else [(None, ref) for ref in features]
    out: list[StoredInput] = []
    for parameter, ref in pairs:
        group, colon, feature = str(ref).partition(":")
        if not colon or not group or not feature:
            raise DefinitionError(
                f"{where}.features",
                f"{ref!r} is not a reference to a stored feature",
                'write "group:feature", e.g. "user_transactions:amount_max_24h"',
            )
        name = parameter if parameter is not None else feature
        check_name(name, f"{where}.features")
        if name in {s.name for s in out}:
            raise DefinitionError(
                f"{where}.features",
                f"two stored features would both be the parameter {name!r}",
                'name them apart with a mapping: features={"a_amount": "a:amount", "b_amount": "b:amount"}',
            )
        out.append(StoredInput(name, group, feature))
    return tuple(out)


def _check_parameters(function: Callable[..., Any], inputs: list[str], where: str) -> None:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: told by its calls instead
        return
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters.values()):
        raise DefinitionError(
            f"{where}.function",
            "the function takes *args or **kwargs",
            f"name each parameter: {', '.join(inputs) or REQUEST_TIME}",
        )
    given = set(inputs) | {REQUEST_TIME}
    unknown = [name for name in parameters if name not in given]
    if unknown:
        raise DefinitionError(
            f"{where}.function",
            f"its parameter {unknown[0]!r} is no request field or stored feature",
            f"declare it in request={{{unknown[0]!r}: 'double'}} (its type) or features=[...], or rename the "
            f"parameter to one of {sorted(given)}",
        )
    unused = [name for name in inputs if name not in parameters]
    if unused:
        raise DefinitionError(
            f"{where}.function",
            f"the function takes no parameter {unused[0]!r}, which is declared",
            f"add the parameter, or remove {unused[0]!r} from request or features",
        )
