"""Feast's online storage format, a column at a time: entity keys (`serialize_entity_key`), `ValueProto` bytes,
the SQL stores' `value_text` / `value_num`, event timestamps, and Redis protocol bulk strings of them.

Built with numpy or one concatenation per value, not through protobuf objects (building a protobuf per value
cost more than the store's write); tests/test_online_redis.py checks every encoding byte for byte against Feast
and protobuf. Feast itself is imported only for the rare key types encoded through its own function.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from features.errors import DataError
from features.spec import WINDOW_END, DType

if TYPE_CHECKING:
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

# feast.value_type.ValueType numbers of the key types encoded here (importing Feast for two constants would cost
# every Spark task that writes seconds: the `feast` package imports all of Feast). tests/test_online_redis.py
# checks them against Feast's.
STRING_TYPE, INT64_TYPE = 2, 4


def entity_keys(
    rows: pd.DataFrame, join_keys: Mapping[str, DType], version: int = 3, suffix: bytes = b"", resp: bool = False
) -> list[bytes]:
    """`feast.infra.key_encoding_utils.serialize_entity_key` of every row's key (+ `suffix`), column-wise;
    with `resp`, each as a Redis protocol bulk string.

    String and integer keys (the types Feast can serialize) are encoded here byte for byte like Feast does
    (version 3: key count, sorted key names, then each value's type, length and bytes); anything else goes
    through Feast's own function.
    """
    if resp:
        if len(join_keys) == 1 and next(iter(join_keys.values())) is DType.STRING and version >= 3:
            return _resp_string_keys(rows[next(iter(join_keys))], next(iter(join_keys)), suffix)
        heads = _BulkHeads()
        return [heads[len(k)] + k + b"\r\n" for k in entity_keys(rows, join_keys, version, suffix)]
    names = sorted(join_keys)
    if version < 3 or any(join_keys[k] not in (DType.STRING, DType.INT64) for k in names):
        return [key + suffix for key in _entity_keys_by_feast(rows, join_keys, version)]
    header = [struct.pack("<I", len(names))]
    for name in names:
        encoded = name.encode("utf8")
        header.append(struct.pack("<II", STRING_TYPE, len(encoded)) + encoded)
    head = b"".join(header)
    parts: list[list[bytes]] = []
    for name in names:
        what = f"join key {name!r}"
        column = rows[name]
        if join_keys[name] is DType.STRING:
            if _null_mask(column).any():
                raise DataError(f"{what}: null value; change points need a non-null key")
            encoded = list(map(_utf8, column.tolist()))
            if len(names) == 1:  # the common case, in one pass
                prefix = _LengthPrefixes(head + struct.pack("<I", STRING_TYPE))
                return [prefix[len(e)] + e + suffix for e in encoded]
            prefix = _LengthPrefixes(struct.pack("<I", STRING_TYPE))
            parts.append([prefix[len(e)] + e for e in encoded])
        else:
            ints, null = _int_array(column, what)
            if null.any():
                raise DataError(f"{what}: null value; change points need a non-null key")
            record = np.zeros(len(ints), dtype=[("type", "<u4"), ("size", "<u4"), ("value", "<i8")])
            record["type"] = INT64_TYPE
            record["size"] = 8
            record["value"] = ints
            parts.append(_split_fixed(record.tobytes(), 16, len(ints)))
    return [head + b"".join(values) + suffix for values in zip(*parts, strict=True)]


def _resp_string_keys(column: pd.Series, name: str, suffix: bytes) -> list[bytes]:
    """The common case (one string join key) straight to bulk strings: one concatenation per key."""
    values = column.tolist()
    try:
        encoded = [value.encode("utf8") for value in values]
    except AttributeError:  # not all strings: nulls are an error, anything else is written as str(value)
        if _null_mask(column).any():
            raise DataError(f"join key {name!r}: null value; change points need a non-null key") from None
        encoded = list(map(_utf8, values))
    encoded_name = name.encode("utf8")
    head = struct.pack("<III", 1, STRING_TYPE, len(encoded_name)) + encoded_name
    head += struct.pack("<I", STRING_TYPE)
    frames = _KeyFrames(head, len(head) + 4 + len(suffix))
    tail = suffix + b"\r\n"
    return [frames[len(e)] + e + tail for e in encoded]


class _KeyFrames(dict):
    """Per value length: "$<key length>\\r\\n" + the key's bytes before the value."""

    def __init__(self, head: bytes, fixed: int) -> None:
        super().__init__()
        self.head, self.fixed = head, fixed

    def __missing__(self, length: int) -> bytes:
        frame = self[length] = b"$%d\r\n%b%b" % (self.fixed + length, self.head, struct.pack("<I", length))
        return frame


class _LengthPrefixes(dict):
    """`start + <4-byte little-endian length>` per length, built once per distinct length."""

    def __init__(self, start: bytes) -> None:
        super().__init__()
        self.start = start

    def __missing__(self, length: int) -> bytes:
        prefix = self[length] = self.start + struct.pack("<I", length)
        return prefix


def _utf8(value: Any) -> bytes:
    return (value if isinstance(value, str) else str(value)).encode("utf8")


def _entity_keys_by_feast(rows: pd.DataFrame, join_keys: Mapping[str, DType], version: int) -> list[bytes]:
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto

    names = list(join_keys)
    converters = [proto_converter(join_keys[k], f"join key {k!r}", nullable=False) for k in names]
    cache: dict[tuple[Any, ...], bytes] = {}
    out = []
    for values in zip(*(rows[k].tolist() for k in names), strict=True):
        key = cache.get(values)
        if key is None:
            proto = EntityKeyProto(
                join_keys=names, entity_values=[c(v) for c, v in zip(converters, values, strict=True)]
            )
            key = serialize_entity_key(proto, entity_key_serialization_version=version)
            cache[values] = key
        out.append(key)
    return out


class Encoded:
    """A column as Feast stores it: serialized ValueProto bytes (b"" for null), and for the SQL stores the
    `value_text` / `value_num` columns Feast fills with `extract_text_and_num`."""

    __slots__ = ("num", "text", "values")

    def __init__(self, values: list[bytes], text: list[Any] | None = None, num: list[Any] | None = None) -> None:
        self.values = values
        self.text = text
        self.num = num


_TAG_STRING = 0x12  # field 2, length-delimited
_TAG_INT64 = 0x20  # field 4, varint
_TAG_DOUBLE = 0x29  # field 5, 64-bit
_TAG_BOOL = 0x38  # field 7, varint


def encode_values(column: pd.Series, dtype: DType, what: str, *, text: bool = False, num: bool = False) -> Encoded:
    """Serialized `feast.types.Value` of every value of a column, byte for byte what protobuf writes; with
    `text` / `num`, also what Feast's SQL stores put in `value_text` / `value_num` (`extract_text_and_num`)."""
    n = len(column)
    out = Encoded([])
    null: np.ndarray | None = None
    if dtype is DType.INT64:
        ints, null = _int_array(column, what)
        out.values = _varint_field(_TAG_INT64, ints)
        if text:
            out.text = _strings(ints)
        if num:
            out.num = ints.astype(np.float64).tolist()
    elif dtype is DType.FLOAT64:
        floats, null = _float_array(column, what)
        out.values = _fixed64_field(_TAG_DOUBLE, floats)
        if text:
            out.text = list(map(str, floats.tolist()))
        if num:
            out.num = floats.tolist()
    elif dtype is DType.BOOL:
        bools, null = _bool_array(column, what)
        out.values = [b"\x38\x01" if b else b"\x38\x00" for b in bools.tolist()]
        if text:
            out.text = [str(b) for b in bools.tolist()]
        if num:
            out.num = bools.astype(np.float64).tolist()
    elif dtype is DType.STRING:
        null = _null_mask(column)
        strings = ["" if isnull else str(v) for v, isnull in zip(column.tolist(), null.tolist(), strict=True)]
        encoded = [s.encode("utf8") for s in strings]
        out.values = [b"\x12" + _varint(len(e)) + e for e in encoded]
        out.text = strings if text else None
        out.num = [None] * n if num else None
    else:
        convert = proto_converter(dtype, what)
        out.values = [convert(v).SerializeToString() for v in column.tolist()]
        out.text = [None] * n if text else None
        out.num = [None] * n if num else None
    if null is not None and null.any():
        for i in np.flatnonzero(null).tolist():
            out.values[i] = b""
            if out.text is not None:
                out.text[i] = None
            if out.num is not None:
                out.num[i] = None
    return out


def _strings(ints: np.ndarray) -> list[str]:
    """str() of every integer, once per distinct value (counts repeat a lot)."""
    cache: dict[int, str] = {}
    return [cache.get(i) or cache.setdefault(i, str(i)) for i in ints.tolist()]


class RespColumn:
    """Values as consecutive Redis protocol bulk strings (`$<length>\\r\\n<bytes>\\r\\n`), with where each starts."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes, offsets: list[int]) -> None:
        self.data = data
        self.offsets = offsets  # len(values) + 1 positions

    def slice(self, lo: int, hi: int) -> bytes:
        return self.data[self.offsets[lo] : self.offsets[hi]]


def resp_bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


class _BulkHeads(dict):
    def __missing__(self, length: int) -> bytes:
        head = self[length] = b"$%d\r\n" % length
        return head


def resp_bulks(values: list[bytes], framed: bool = False) -> RespColumn:
    """Any byte strings as bulk strings (one Python concatenation per value); `framed`: already are."""
    if not framed:
        heads = _BulkHeads()
        values = [heads[len(v)] + v + b"\r\n" for v in values]
    return RespColumn(b"".join(values), [0, *accumulate(map(len, values))])


_NULL_BULK = np.frombuffer(b"$0\r\n\r\n", dtype=np.uint8)


def resp_values(column: pd.Series, dtype: DType, what: str) -> RespColumn:
    """`encode_values` of a column as bulk strings; integers and doubles built as one byte matrix."""
    if dtype is DType.FLOAT64:
        floats, null = _float_array(column, what)
        n = len(floats)
        matrix = np.empty((n, 15), dtype=np.uint8)  # $9 CR LF, tag, 8 bytes, CR LF
        matrix[:, :4] = np.frombuffer(b"$9\r\n", dtype=np.uint8)
        matrix[:, 4] = _TAG_DOUBLE
        matrix[:, 5:13] = np.ascontiguousarray(floats, dtype="<f8").view(np.uint8).reshape(n, 8)
        matrix[:, 13:] = np.frombuffer(b"\r\n", dtype=np.uint8)
        lengths = np.full(n, 15, dtype=np.int64)
    elif dtype is DType.INT64:
        ints, null = _int_array(column, what)
        data, size = _varint_matrix(_TAG_INT64, ints)  # size: 2 to 11 bytes
        n, width = data.shape
        digits = 1 + (size >= 10)  # of the length: "$9" or "$11"
        matrix = np.zeros((n, width + 7), dtype=np.uint8)
        rows = np.arange(n)
        matrix[:, 0] = ord("$")
        matrix[rows, 1] = np.where(digits == 1, 48 + size, 48 + size // 10)
        matrix[digits == 2, 2] = 48 + size[digits == 2] % 10
        matrix[rows, digits + 1] = 13
        matrix[rows, digits + 2] = 10
        body = digits + 3  # where the value starts
        for count in (1, 2):  # rows whose value starts at the same column: plain slice assignments
            rows_of = digits == count
            matrix[rows_of, count + 3 : count + 3 + width] = data[rows_of]
        matrix[rows, body + size] = 13
        matrix[rows, body + size + 1] = 10
        lengths = body + size + 2
    else:
        return resp_bulks(encode_values(column, dtype, what).values)
    if null.any():
        matrix[null, :6] = _NULL_BULK
        lengths[null] = 6
    keep = np.arange(matrix.shape[1]) < lengths[:, None]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return RespColumn(matrix[keep].tobytes(), offsets.tolist())


def timestamp_resp(ends: pd.Series) -> RespColumn:
    """Each window end as the serialized google.protobuf.Timestamp Feast's Redis store keeps in `_ts:<view>`, as
    bulk strings, each distinct window end framed once (a batch has few).

    Feast builds it with `Timestamp.FromDatetime` from a Python datetime, i.e. at microsecond precision.
    """
    codes, protos = _timestamp_codes(ends)
    framed = [resp_bulk(p) for p in protos]
    lengths = np.array([len(f) for f in framed], dtype=np.int64)[codes]
    offsets = np.zeros(len(codes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return RespColumn(b"".join(list(map(framed.__getitem__, codes.tolist()))), offsets.tolist())


def _timestamp_codes(ends: pd.Series) -> tuple[np.ndarray, list[bytes]]:
    """(index of each row's window end among the distinct ones, the distinct ones' Timestamp protos)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    codes, uniques = _window_end_codes(ends)
    protos = []
    for end in uniques:
        micros = end.value // 1000
        seconds, rest = divmod(micros, 1_000_000)
        protos.append(Timestamp(seconds=seconds, nanos=rest * 1000).SerializeToString())
    return codes, protos


def _window_end_codes(ends: pd.Series) -> tuple[np.ndarray, pd.DatetimeIndex]:
    """(index of each row's window end among the distinct ones, the distinct ones in UTC)."""
    codes, uniques = pd.factorize(_utc(ends))
    if (codes < 0).any():
        raise DataError(f"column {WINDOW_END!r}: null window end; every change point needs its window end")
    return codes, uniques


def _utc(ends: pd.Series) -> pd.Series:
    values = ends if pd.api.types.is_datetime64_any_dtype(ends) else pd.to_datetime(ends)
    return values.dt.tz_localize("UTC") if values.dt.tz is None else values.dt.tz_convert("UTC")


def _null_mask(column: pd.Series) -> np.ndarray:
    return np.asarray(column.isna(), dtype=bool)


def _int_array(column: pd.Series, what: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iu":
        return column.to_numpy(dtype=np.int64), np.zeros(len(column), dtype=bool)
    try:
        array = pd.array(column, dtype="Int64")
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: expected integers or nulls ({exc})") from exc
    return array.to_numpy(dtype=np.int64, na_value=0), np.asarray(array.isna(), dtype=bool)


def _float_array(column: pd.Series, what: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "fiu":
        values = column.to_numpy(dtype=np.float64)
    else:
        try:
            values = pd.array(column, dtype="Float64").to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{what}: expected numbers or nulls ({exc})") from exc
    return values, np.isnan(values)


def _bool_array(column: pd.Series, what: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        array = pd.array(column, dtype="boolean")
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: expected booleans or nulls ({exc})") from exc
    return array.to_numpy(dtype=bool, na_value=False), np.asarray(array.isna(), dtype=bool)


def _split_fixed(data: bytes, width: int, n: int) -> list[bytes]:
    return [data[i : i + width] for i in range(0, width * n, width)]


def _fixed64_field(tag: int, values: np.ndarray) -> list[bytes]:
    """tag + 8 little-endian bytes per value (a double field of ValueProto)."""
    n = len(values)
    buffer = np.empty((n, 9), dtype=np.uint8)
    buffer[:, 0] = tag
    buffer[:, 1:] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
    return _split_fixed(buffer.tobytes(), 9, n)


def _varint_matrix(tag: int, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tag + base-128 varint per value (an int64 field: negatives as their 64-bit two's complement), as rows
    of a byte matrix, and each row's length."""
    n = len(values)
    rest = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64).copy()
    columns = [np.full(n, tag, dtype=np.uint8)]
    length = np.ones(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    seven, low_bits = np.uint64(7), np.uint64(0x7F)
    while active.any():
        low = (rest & low_bits).astype(np.uint8)
        rest >>= seven
        more = rest != 0
        columns.append(np.where(active, low | (more.astype(np.uint8) << 7), 0).astype(np.uint8))
        length += active
        active = more
    if n == 0:
        return np.zeros((0, 2), dtype=np.uint8), length
    return np.stack(columns, axis=1), length


def _varint_field(tag: int, values: np.ndarray) -> list[bytes]:
    matrix, length = _varint_matrix(tag, values)
    width = matrix.shape[1]
    data = matrix.tobytes()
    return [data[s : s + size] for s, size in zip(range(0, width * len(values), width), length.tolist(), strict=True)]


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def feast_epoch(ts: datetime) -> int:
    """event_ts as Feast's SQLite store keeps it, so that Feast reads back the same instant.

    Feast stores `int(naive_utc.timestamp())` (Python reads a naive datetime as local time) and reads it with
    `datetime.fromtimestamp` (local again), so the round trip is exact; mirroring it keeps our values
    comparable with rows Feast itself wrote. On a UTC machine this is plain epoch seconds.
    """
    return int(ts.astimezone(UTC).replace(tzinfo=None).timestamp())


def feast_epoch_seconds(ends: pd.Series) -> list[int]:
    """`feast_epoch` of every row, computed once per distinct window end (a batch has few)."""
    codes, uniques = _window_end_codes(ends)
    seconds = [feast_epoch(ts.to_pydatetime(warn=False)) for ts in uniques]
    return [seconds[c] for c in codes.tolist()]


def _is_null(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def proto_converter(dtype: DType, what: str, nullable: bool = True) -> Callable[[Any], ValueProto]:
    """value -> ValueProto for one logical type; nulls become an empty ValueProto, which Feast reads as None."""
    from feast.protos.feast.types.Value_pb2 import BoolList, DoubleList, Int64List, StringList
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    scalars: dict[DType, tuple[str, Callable[[Any], Any]]] = {
        DType.INT64: ("int64_val", int),
        DType.FLOAT64: ("double_val", float),
        DType.STRING: ("string_val", str),
        DType.BOOL: ("bool_val", bool),
        DType.TIMESTAMP: ("unix_timestamp_val", _epoch_seconds),
    }
    lists: dict[DType, tuple[str, Any, Callable[[Any], Any]]] = {
        DType.INT64_LIST: ("int64_list_val", Int64List, int),
        DType.FLOAT64_LIST: ("double_list_val", DoubleList, float),
        DType.STRING_LIST: ("string_list_val", StringList, str),
        DType.BOOL_LIST: ("bool_list_val", BoolList, bool),
    }

    def null(value: Any) -> ValueProto:
        if not nullable:
            raise DataError(f"{what}: null value; change points need a non-null key")
        return ValueProto()

    if dtype in scalars:
        field, cast = scalars[dtype]

        def scalar(value: Any) -> ValueProto:
            return null(value) if _is_null(value) else ValueProto(**{field: cast(value)})

        return scalar

    if dtype is DType.COUNT_MAP:
        return _map_converter(what, null)

    field, list_type, cast = lists[dtype]

    def sequence(value: Any) -> ValueProto:
        if value is None or (not isinstance(value, list | tuple | np.ndarray) and _is_null(value)):
            return null(value)
        items = list(value)
        if any(_is_null(item) for item in items):
            raise DataError(f"{what}: a list holds a null element, which Feast cannot store; drop nulls first")
        return ValueProto(**{field: list_type(val=[cast(item) for item in items])})

    return sequence


def _epoch_seconds(value: Any) -> int:
    """A time as Feast's `unix_timestamp_val`: whole seconds since the epoch (a time without a zone is UTC)."""
    ts = pd.Timestamp(value)
    return (ts if ts.tzinfo is None else ts.tz_convert("UTC").tz_localize(None)).value // 1_000_000_000


def _map_converter(what: str, null: Callable[[Any], ValueProto]) -> Callable[[Any], ValueProto]:
    """value -> ValueProto(map_val=...) for a COUNT_MAP: Feast's Map of string -> Value, each count an int64 Value
    (Feast reads it back as a dict of ints). A value may be a dict, or the (key, count) pairs pyarrow's `to_pandas`
    and Spark's Arrow batches give for a map column; null (None, NaN) is a missing value, {} an empty window."""
    from feast.protos.feast.types.Value_pb2 import Map
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    def mapping(value: Any) -> ValueProto:
        pairs = map_items(value, what)
        if pairs is None:
            return null(value)
        entries = {}
        for key, count in pairs:
            # Spark maps may hold null values; Feast's empty Value reads back as None, as for a null scalar.
            entries[str(key)] = ValueProto() if _is_null(count) else ValueProto(int64_val=_count(count, what))
        return ValueProto(map_val=Map(val=entries))

    return mapping


def map_items(value: Any, what: str = "map value") -> list[tuple[Any, Any]] | None:
    """A map value's (key, value) pairs, whether it comes as a dict or as pairs (pyarrow's and Spark's form of a
    map column in pandas); None for a null."""
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, list | tuple | np.ndarray):
        pairs = list(value)  # an array of pairs may be 2-D (n, 2): its rows are the pairs
        if not all(isinstance(p, tuple | list | np.ndarray) and len(p) == 2 for p in pairs):
            raise DataError(f"{what}: expected a dict or (key, value) pairs for a map, got {_sample(value)}")
        return [(p[0], p[1]) for p in pairs]
    if _is_null(value):
        return None
    raise DataError(f"{what}: expected a dict or (key, value) pairs for a map, got {_sample(value)}")


def _count(value: Any, what: str) -> int:
    integer = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
    # A whole float is taken: pandas turns integers into floats where a column also holds nulls.
    if not integer and not (isinstance(value, float | np.floating) and float(value).is_integer()):
        raise DataError(f"{what}: a map holds {value!r} where a count (an integer) belongs")
    return int(value)


def _sample(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
