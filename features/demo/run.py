"""`features demo`: generate transactions, register the groups with Feast, backfill, and read features back.

Everything the demo does is what a user would do by hand:

    1. land event files in each source folder     (here: synthetic card transactions)
    2. features apply --repo PATH                 (Feast objects for every FeatureGroup)
    3. features backfill --repo PATH --start ... --end ...
    4. FeatureStore.get_online_features / get_historical_features

The data is deterministic (fixed seed and start date) and the demo owns the repo's data: every run replaces
the source files, the offline tables and the online store, so it can be re-run with other sizes.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa

from features.demo.datagen import generate_transactions, write_events
from features.engine.jvm_archive import MAKE_ENV
from features.errors import ConfigError
from features.parquet_schema import schema_of_arrow
from features.repo import Repo
from features.spec import DType, FeatureGroup

START = datetime(2026, 1, 1, tzinfo=UTC)
SEED = 20260101
FILES_PER_SOURCE = 4
ONLINE_GROUP = "user_transactions"  # the view whose values the demo reads back
LABEL = "is_fraud"
# The features of the view the demo prints (a terminal's width; the group's others, those the request-time
# features read among them, are read the same way).
SHOW_FEATURES = ("failed_count_24h", "amount_sum_1h", "amount_max_24h", "merchants_24h", "txn_count_lifetime")
SHOW_USERS = 5
SHOW_TRANSACTIONS = 10


def features_shown(group: FeatureGroup) -> list[str]:
    """The names of `group`'s features the demo prints: SHOW_FEATURES it has, or all of them when it has none."""
    return [f.name for f in group.features if f.name in SHOW_FEATURES] or [f.name for f in group.features]


def run_demo(repo: str, *, events: int, users: int, days: float) -> None:
    """Run the whole loop on `repo` (normally the example `feature_repo/`) and print what each step gives."""
    check_sizes(events, users, days)
    # A new user's first demo does not pay for the JVM class archive; the process's later sessions may.
    making = os.environ.get(MAKE_ENV)
    os.environ.setdefault(MAKE_ENV, "no")
    try:
        _run_demo(repo, events=events, users=users, days=days)
    finally:
        if making is None:
            os.environ.pop(MAKE_ENV, None)


def _run_demo(repo: str, *, events: int, users: int, days: float) -> None:
    from features.pipelines.registration import apply
    from features.pipelines.schedule import execute
    from features.pipelines.schedule_plan import plan, request

    loaded = Repo.load(repo)
    group = online_group(loaded)
    end = START + timedelta(hours=math.ceil(days * 24))  # whole hours, so every window end lines up

    _step(1, f"Generating {events:,} card transactions of {users:,} users from {START:%Y-%m-%d} for {days:g} days")
    transactions = generate_transactions(events, users, START, days, seed=SEED)
    schema = schema_of_arrow(pa.Schema.from_pandas(transactions, preserve_index=False))
    for group_ in loaded.groups.values():
        group_.check_schema(schema)
    for folder, files in write_sources(loaded, transactions).items():
        print(f"   wrote {files} files to {shown(folder)}")
    clear_outputs(loaded)

    _step(2, f"Registering the feature groups with Feast: features apply --repo {shown(loaded.root)}")
    names = apply(str(loaded.root))
    print(f"   feature views: {', '.join(names)}")

    _step(3, f"Backfilling [{START:%Y-%m-%d %H:%M}, {end:%Y-%m-%d %H:%M}) UTC with Spark (two-phase, pane partials)")
    # As `features backfill --start --end` does: the days it computes are recorded as completed, so that the
    # nightly `--since-last` after the demo finds nothing left to do.
    execute(loaded, plan(loaded, request(start=START, end=end)), say=lambda line: print(f"   {line}"))

    store = loaded.feature_store()
    shown_features = features_shown(group)
    refs = [f"{group.name}:{name}" for name in shown_features]
    key = group.join_keys[0]

    _step(4, f"Online values (FeatureStore.get_online_features) as of {end:%Y-%m-%d %H:%M} UTC")
    recent = most_recent(transactions[key], transactions["event_ts"], SHOW_USERS)
    online = store.get_online_features(features=refs, entity_rows=[{key: k} for k in recent]).to_df()
    print_table(with_types(online[[key, *shown_features]], group, schema))

    _step(5, "A point-in-time training set (FeatureStore.get_historical_features)")
    print("   each row: a labelled transaction and its user's features at that time, from earlier events only")
    # From the later part of the data, when most users have some history (before a user's first event,
    # Feast has no row for them yet and returns nulls).
    later = transactions[transactions["event_ts"] >= START + timedelta(days=min(1.0, days / 2))]
    entity_df = _labelled_sample(later if len(later) >= SHOW_TRANSACTIONS else transactions, key, SHOW_TRANSACTIONS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # from Feast's DuckDB backend, not actionable here
        training = store.get_historical_features(entity_df=entity_df, features=refs).to_df()
    training = training.sort_values("event_timestamp", kind="stable").reset_index(drop=True)
    print_table(with_types(training[[key, "event_timestamp", LABEL, *shown_features]], group, schema))

    root = shown(loaded.root)
    print(
        f"\nNext: change the definitions in {root}/*.py, then run `features apply --repo {root}` and "
        f"`features backfill --repo {root} --since-last` (it recomputes the days the change made stale)."
    )


def check_sizes(events: int, users: int, days: float) -> None:
    """A ConfigError naming the option when a size of generated data is not usable."""
    if events < 1:
        raise ConfigError(f"--events: {events} is too small; generate at least 1 event (e.g. --events 20000)")
    if users < 1:
        raise ConfigError(f"--users: {users} is too small; use at least 1 user (e.g. --users 200)")
    if not (math.isfinite(days) and days > 0):
        raise ConfigError(f"--days: {days} is not a positive number of days; write e.g. --days 3 or --days 0.5")


def online_group(repo: Repo) -> FeatureGroup:
    group = repo.groups.get(ONLINE_GROUP)
    if group is None:
        raise ConfigError(
            f"--repo: {repo.root} has no feature group {ONLINE_GROUP!r}, which the demo reads back; "
            "run the demo on the example repository (feature_repo/) or a copy of it"
        )
    return group


def write_sources(repo: Repo, transactions: pd.DataFrame) -> dict[Path, int]:
    """Replace the files of every source folder the groups read (each folder once) with `transactions`, as
    FILES_PER_SOURCE files in each folder's format; returns the files written per folder."""
    folders: dict[str, str] = {}
    for group in repo.groups.values():
        folders.setdefault(repo.source_path(group), group.source.format)
    written = {}
    for folder, fmt in folders.items():
        shutil.rmtree(folder, ignore_errors=True)
        n_files = min(FILES_PER_SOURCE, len(transactions))  # never an empty file
        written[Path(folder)] = len(write_events(transactions, folder, format=fmt, n_files=n_files))
    return written


def clear_outputs(repo: Repo) -> None:
    """Forget earlier demo runs: their offline rows and online values may be newer than this run's.

    Removes the groups' offline tables and, when they are local files, the SQLite online store and the Feast
    registry (Feast only creates online tables for views it has not registered yet); `apply` makes both anew.
    """
    for group in repo.groups.values():
        shutil.rmtree(repo.offline_path(group), ignore_errors=True)
    online = repo.config.get("online_store") or {}
    registry = repo.config.get("registry", "data/registry.db")
    registry = registry if isinstance(registry, dict) else {"path": registry}
    local_files = []
    if repo.online_store_type == "sqlite":
        local_files.append(str(online.get("path", "data/online_store.db")))
    if registry.get("registry_type", "file") == "file":
        local_files.append(str(registry.get("path", "")))
    for name in local_files:
        if name and "://" not in name:
            path = Path(name) if Path(name).is_absolute() else repo.root / name
            path.unlink(missing_ok=True)


def most_recent(keys: pd.Series, times: pd.Series, n: int) -> list[str]:
    """The `n` keys with the latest events (their short windows still hold something at the end)."""
    latest = times.groupby(keys).max().sort_values(ascending=False, kind="stable")
    return sorted(latest.index[:n].tolist())


def _labelled_sample(transactions: pd.DataFrame, key: str, n: int) -> pd.DataFrame:
    """About `n` transactions of different users, half of them fraud when there is any, as Feast entity rows."""
    shuffled = transactions.sample(frac=1.0, random_state=SEED).drop_duplicates(subset=[key, LABEL])
    fraud = shuffled[shuffled[LABEL] == 1]
    n_fraud = min(len(fraud), n // 2)
    picked = pd.concat([fraud.head(n_fraud), shuffled[shuffled[LABEL] == 0].head(n - n_fraud)])
    entity_df = picked[[key, "event_ts", LABEL]].rename(columns={"event_ts": "event_timestamp"})
    return entity_df.sort_values("event_timestamp", kind="stable").reset_index(drop=True)


def with_types(frame: pd.DataFrame, group: FeatureGroup, schema: dict[str, DType]) -> pd.DataFrame:
    """Integer features as integers (pandas turns them into floats when a value is null)."""
    frame = frame.copy()
    for name, dtype in group.output_types(schema).items():
        if dtype is DType.INT64 and name in frame and pd.api.types.is_float_dtype(frame[name]):
            frame[name] = frame[name].astype("Int64")
    return frame


def _step(number: int, text: str) -> None:
    print(f"\n[{number}/5] {text}", flush=True)


def print_table(frame: pd.DataFrame) -> None:
    frame = frame.copy()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = frame[column].dt.tz_convert("UTC").dt.strftime("%Y-%m-%d %H:%M:%S")
    with pd.option_context(
        "display.width", 250, "display.max_columns", None, "display.max_colwidth", 60, "display.precision", 2
    ):
        print("\n".join("   " + line for line in frame.to_string(index=False).splitlines()), flush=True)


def shown(path: Path | str) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)
