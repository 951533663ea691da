"""Logical value types shared by definitions, engines and stores (no library imports)."""

from __future__ import annotations

from enum import Enum


class DType(Enum):
    INT64 = "int64"
    FLOAT64 = "float64"
    STRING = "string"
    BOOL = "bool"
    TIMESTAMP = "timestamp"
    INT64_LIST = "int64_list"
    FLOAT64_LIST = "float64_list"
    STRING_LIST = "string_list"
    BOOL_LIST = "bool_list"
    COUNT_MAP = "count_map"  # histogram / top_frequent: each value's text -> its count (Feast's Map type)

    @property
    def is_numeric(self) -> bool:
        return self in (DType.INT64, DType.FLOAT64)

    def list_of(self) -> DType:
        return _LIST_OF[self]


_LIST_OF = {
    DType.INT64: DType.INT64_LIST,
    DType.FLOAT64: DType.FLOAT64_LIST,
    DType.STRING: DType.STRING_LIST,
    DType.BOOL: DType.BOOL_LIST,
}

# Spellings accepted in `EventSource(schema=...)`, mapped to one logical type.
TYPE_NAMES: dict[str, DType] = {
    "int": DType.INT64,
    "integer": DType.INT64,
    "long": DType.INT64,
    "bigint": DType.INT64,
    "int64": DType.INT64,
    "int32": DType.INT64,
    "float": DType.FLOAT64,
    "double": DType.FLOAT64,
    "float64": DType.FLOAT64,
    "string": DType.STRING,
    "str": DType.STRING,
    "bool": DType.BOOL,
    "boolean": DType.BOOL,
    "timestamp": DType.TIMESTAMP,
}
