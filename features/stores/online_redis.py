"""The Redis online store's writer: pipelined `EVALSHA` calls of a Lua script that, for each key, compares the
stored `_ts:<view>` field with the new event time and writes the view's fields only if the new one is newer or
equal, in Feast's key and hash layout (features.stores.online). Each check-and-write is atomic in Redis, so
any number of executors may write at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import pandas as pd

from features.errors import ConfigError
from features.spec import WINDOW_END, DType
from features.stores.feast_codec import entity_keys, resp_bulk, resp_bulks, resp_values, timestamp_resp
from features.stores.online_interface import OnlineWriter

# Feast's Redis layout (feast/infra/online_stores/redis.py): one hash per entity key, named
# serialize_entity_key(key) + project; per view, field mmh3("<view>:<feature>") holds the serialized ValueProto
# and field "_ts:<view>" the serialized google.protobuf.Timestamp of the row. Other views' fields in the same
# hash are left alone.
#
# The script that writes them, for a view with F features: KEYS are the n hashes; ARGV holds "_ts:<view>", the
# key ttl in seconds (0: none), the F field names, then column by column: n timestamps, n values of feature 1,
# ..., n values of feature F. A key is written only if it has no timestamp for the view yet, or the new one is
# newer or equal. It returns how many keys it wrote.
_LUA_HEAD = """
local function seconds_nanos(ts)
  -- google.protobuf.Timestamp: field 1 seconds, field 2 nanos, both varints. A negative int64 takes ten
  -- bytes (two's complement); it is -(1 + the complement of its low 63 bits), exact below 2^53 in a double.
  local seconds, nanos, i, n = 0, 0, 1, #ts
  while i <= n do
    local tag = string.byte(ts, i)
    i = i + 1
    local value, inverse, scale, count = 0, 0, 1, 0
    repeat
      local b = string.byte(ts, i)
      i = i + 1
      count = count + 1
      if count <= 9 then
        inverse = inverse + (127 - b % 128) * scale
      end
      value = value + (b % 128) * scale
      scale = scale * 128
    until b < 128
    if count == 10 then
      value = -(1 + inverse)
    end
    if tag == 8 then
      seconds = value
    elseif tag == 16 then
      nanos = value
    end
  end
  return {seconds, nanos}
end
local decoded = {}
local function time_of(ts)
  local t = decoded[ts]
  if not t then
    t = seconds_nanos(ts)
    decoded[ts] = t
  end
  return t
end
local ts_field = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = #KEYS
local written = 0
for i = 1, n do
  local key = KEYS[i]
  local new = ARGV[FIRST + i]
  local old = redis.call('HGET', key, ts_field)
  local write = true
  if old and old ~= new then
    local o, t = time_of(old), time_of(new)
    write = t[1] > o[1] or (t[1] == o[1] and t[2] >= o[2])
  end
  if write then
"""
_LUA_TAIL = """
    if ttl > 0 then
      redis.call('EXPIRE', key, ttl)
    end
    written = written + 1
  end
end
return written
"""


def guarded_hset_lua(n_features: int) -> str:
    """The Lua script that writes the rows of a view with `n_features` features (one HSET per key)."""
    first = 2 + n_features  # ARGV[FIRST + i]: the timestamp of key i
    pairs = "".join(f", ARGV[{3 + j}], ARGV[{first} + {j + 1} * n + i]" for j in range(n_features))
    body = f"    redis.call('HSET', key, ts_field, new{pairs})"
    return _LUA_HEAD.replace("FIRST", str(first)) + body + _LUA_TAIL


class RedisOnlineWriter(OnlineWriter):
    """Writes into Feast's Redis online store, in Feast's key and hash layout, with an atomic event-time guard.

    `keys_per_call` keys go into one script call, which holds Redis for well under a millisecond, so reads
    are not held up; all calls of a batch go into one pipeline. A batch is not one transaction (each key's
    check-and-write is): if it fails half-way, writing it again completes it, since writes are idempotent.
    """

    parallel: ClassVar[bool] = True
    ROWS_PER_ENCODE: ClassVar[int] = 8192

    def __init__(
        self,
        connection_string: str,
        project: str,
        view: str,
        join_keys: Mapping[str, DType],
        features: Mapping[str, DType],
        *,
        view_name: str | None = None,
        redis_type: str = "redis",
        sentinel_master: str = "mymaster",
        key_ttl_seconds: int | None = None,
        entity_key_serialization_version: int = 3,
        keys_per_call: int = 256,
    ) -> None:
        super().__init__(view, join_keys, features)
        if redis_type not in ("redis", "redis_sentinel"):
            raise ConfigError(
                f"feature_store.yaml online_store.redis_type: {redis_type!r} is not supported by the online writer "
                "(its multi-key script calls need one Redis node). Fix: use redis_type redis or redis_sentinel"
            )
        self.connection_string = connection_string
        self.project = project
        self.view_name = view_name or view  # the name in the hash fields (with Feast's version suffix, if any)
        self.redis_type = redis_type
        self.sentinel_master = sentinel_master
        self.key_ttl_seconds = int(key_ttl_seconds or 0)
        self.entity_key_serialization_version = entity_key_serialization_version
        self.keys_per_call = max(1, int(keys_per_call))
        self._client: Any = None
        self._sha: str = ""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_sha": ""}

    @property
    def address(self) -> str:
        """Where the writer connects, without credentials (for messages)."""
        return ",".join(part for part in self.connection_string.split(",") if "=" not in part)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
            self._sha = ""

    def check_ready(self) -> None:
        self._connection()
        self.close()

    def write(self, rows: pd.DataFrame) -> int:
        self.check_columns(rows)
        if rows.empty:
            return 0
        client = self._connection()
        self._run(client, lambda: self._calls(rows))
        return len(rows)

    def _calls(self, rows: pd.DataFrame) -> Iterator[tuple[int, bytes]]:
        """The script calls for the rows as (number of keys, RESP-encoded arguments after the key count),
        encoded ROWS_PER_ENCODE rows at a time, so Redis runs the first calls while later rows are encoded.

        The arguments are Redis protocol bulk strings built a column at a time (`resp_values`): no Python
        object per value, no per-argument packing.
        """
        version, suffix = self.entity_key_serialization_version, self.project.encode("utf8")
        header = b"".join(resp_bulk(a) for a in [f"_ts:{self.view_name}".encode(), b"%d" % self.key_ttl_seconds])
        header += b"".join(resp_bulk(field) for field in self._fields())
        for start in range(0, len(rows), self.ROWS_PER_ENCODE):
            part = rows.iloc[start : start + self.ROWS_PER_ENCODE]
            keys = resp_bulks(entity_keys(part, self.join_keys, version, suffix=suffix, resp=True), framed=True)
            stamps = timestamp_resp(part[WINDOW_END])
            values = [resp_values(part[n], t, f"feature {n!r}") for n, t in self.features.items()]
            for lo in range(0, len(part), self.keys_per_call):
                hi = min(lo + self.keys_per_call, len(part))
                chunks = [keys.slice(lo, hi), header, stamps.slice(lo, hi), *(v.slice(lo, hi) for v in values)]
                yield hi - lo, b"".join(chunks)

    def _fields(self) -> list[bytes]:
        from feast.infra.online_stores.helpers import _mmh3

        return [_mmh3(f"{self.view_name}:{name}") for name in self.features]

    def _run(self, client: Any, calls: Callable[[], Iterator[tuple[int, bytes]]]) -> None:
        """Send every script call on one connection, then read the replies: one pipeline, in which Redis runs
        the first calls while the later ones are still being encoded and sent."""
        from redis.exceptions import NoScriptError, ResponseError

        for attempt in (1, 2):
            pool = client.connection_pool
            try:
                connection = pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                connection = pool.get_connection("EVALSHA")
            errors: list[ResponseError] = []
            sent = 0
            try:
                head = b"$7\r\nEVALSHA\r\n" + resp_bulk(self._sha.encode())
                fixed = 5 + len(self.features)  # EVALSHA, sha, key count, ts field, ttl, the field names
                for n_keys, arguments in calls():
                    count = b"*%d\r\n" % (fixed + n_keys * (2 + len(self.features)))  # + keys, times, values
                    connection.send_packed_command([count + head + resp_bulk(b"%d" % n_keys) + arguments], False)
                    sent += 1
                for _ in range(sent):
                    try:
                        connection.read_response()
                    except ResponseError as exc:  # an error reply: the connection stays in step
                        errors.append(exc)
            except BaseException:
                connection.disconnect()  # replies may be pending: never hand this connection out again
                raise
            finally:
                pool.release(connection)
            if not errors:
                return
            if attempt == 1 and all(isinstance(e, NoScriptError) for e in errors):
                # The server restarted or flushed its scripts: load it again and resend (writes are idempotent).
                self._sha = client.script_load(guarded_hset_lua(len(self.features)))
                continue
            raise errors[0]

    def _connection(self) -> Any:
        if self._client is None:
            from feast.infra.online_stores.redis import RedisOnlineStore
            from redis import Redis
            from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
            from redis.exceptions import RedisError
            from redis.retry import Retry
            from redis.sentinel import Sentinel

            nodes, options = RedisOnlineStore._parse_connection_string(self.connection_string)
            try:
                if self.redis_type == "redis_sentinel":
                    sentinel = Sentinel([(n["host"], int(n["port"])) for n in nodes], **options)
                    client = sentinel.master_for(self.sentinel_master)
                else:
                    # The first call fails at once when nothing listens there (redis-py's default retries back off
                    # for about 10 s); the writes after it retry as redis-py does by default.
                    client = Redis(
                        host=nodes[0]["host"], port=int(nodes[0]["port"]), retry=Retry(NoBackoff(), 0), **options
                    )
                self._sha = client.script_load(guarded_hset_lua(len(self.features)))
                client.set_retry(Retry(ExponentialWithJitterBackoff(base=1, cap=10), 3))
            except RedisError as exc:
                raise ConfigError(
                    f"online store of feature view {self.view!r}: cannot use Redis at {self.address} ({exc}). "
                    "Fix: start redis-server there, or set online_store.connection_string in feature_store.yaml "
                    "to a reachable Redis (host:port[,db=N,password=...])"
                ) from exc
            self._client = client
        return self._client
