"""`features plan`: what `features apply` would change, and what it would make stale, without doing it.

    the_plan = plan_apply(Repo.load("feature_repo"))
    print("\\n".join(the_plan.lines()))

- groups added (defined, not registered with Feast), removed (registered, no longer defined: `apply` refuses
  them without `--prune`) and changed, per feature: added, removed, or changed definition. A group's features
  are compared with the hashes its offline table was computed with (features.stores.manifest, per feature) when a
  backfill completed a day of it, else with the feature view registered in Feast (names, types, and the
  aggregation and window each field's description states);
- the completed days a backfill computed with another definition: `features backfill --since-last` (or
  `--date`) recomputes them (features.pipelines.schedule_plan);
- the Feast objects (entities, data sources, feature views) whose registered spec differs from the repo's,
  from Feast's own dry run of the apply (`FeatureStore.plan`), which writes nothing to the registry.

Before that, each `where` gets the check `features apply` makes (Spark's analyzer, against the source's schema):
one that apply would refuse fails the plan with the same error.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from features.pipelines.stale import definition_change
from features.repo import Repo
from features.spec import FeatureGroup
from features.spec.fingerprint import definition_hash, feature_hashes
from features.stores.manifest import read_manifest

ADDED, REMOVED, CHANGED = "added", "removed", "changed"


@dataclass(frozen=True)
class FeatureChange:
    feature: str
    change: str  # added | removed | changed


@dataclass(frozen=True)
class GroupChange:
    group: str
    change: str  # added | removed | changed
    features: tuple[FeatureChange, ...] = ()
    compared_with: str = ""  # "the offline table's manifest" | "the Feast registry" | ""


@dataclass(frozen=True)
class StaleDay:
    group: str
    day: date
    reason: str


@dataclass(frozen=True)
class FeastChange:
    kind: str  # Feast's object type: Entity, Data Source, Feature View, ...
    name: str
    change: str  # create | delete | update
    properties: tuple[str, ...] = ()  # for an update: the spec properties that differ


@dataclass
class ApplyPlan:
    repo: str
    groups: list[GroupChange] = field(default_factory=list)
    stale: list[StaleDay] = field(default_factory=list)
    feast: list[FeastChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.groups or self.stale or self.feast)

    def lines(self) -> list[str]:
        from features.pipelines.days import spans

        out = []
        for g in self.groups:
            detail = ", ".join(f"{f.change} {f.feature}" for f in g.features)
            basis = f" (against {g.compared_with})" if g.compared_with else ""
            out.append(f"group {g.change}: {g.group}" + (f": {detail}{basis}" if detail else ""))
        by_group: dict[tuple[str, str], list[date]] = {}
        for s in self.stale:
            by_group.setdefault((s.group, s.reason), []).append(s.day)
        for (group, reason), days in by_group.items():
            out.append(f"stale: {group} {spans(days)} ({reason}); `features backfill --since-last` recomputes them")
        for f in self.feast:
            props = f" ({', '.join(f.properties)})" if f.properties else ""
            out.append(f"feast {f.change}: {f.kind} {f.name}{props}")
        out += [f"note: {note}" for note in self.notes]
        if self.empty:
            out.insert(0, "no changes: `features apply` would leave the registry and the tables as they are")
        return out


def plan_apply(repo: Repo) -> ApplyPlan:
    """What `features apply` on `repo` would change (see the module docstring); changes nothing. A `where` that
    `features apply` would refuse raises its SchemaError here (`check_wheres_unapplied`), and so does a change a
    running stream cannot take (`check_running_streams_take`)."""
    from features.pipelines.registration import check_wheres_unapplied, removed_groups
    from features.pipelines.stream.handoff import check_running_streams_take

    check_running_streams_take(repo)
    check_wheres_unapplied(repo)
    the_plan = ApplyPlan(str(repo.root))
    registered = _registered_views(repo)
    for group in repo.groups.values():
        change = _group_change(repo, group, registered.get(group.name))
        if change is not None:
            the_plan.groups.append(change)
        the_plan.stale += _stale_days(repo, group)
    removed = removed_groups(repo)
    the_plan.groups += [GroupChange(name, REMOVED) for name in removed]
    if removed:
        the_plan.notes.append(
            "`features apply` refuses to remove feature views of groups no longer defined; "
            "`features apply --prune` removes them with their online values"
        )
    the_plan.feast = feast_changes(repo)
    return the_plan


def _registered_views(repo: Repo) -> dict[str, Any]:
    from features.pipelines.registration import TAG

    views = repo.feature_store().list_feature_views(allow_cache=False)
    return {v.name: v for v in views if TAG in (v.tags or {})}


def _group_change(repo: Repo, group: FeatureGroup, view: Any) -> GroupChange | None:
    if view is None:
        return GroupChange(group.name, ADDED, tuple(FeatureChange(f.name, ADDED) for f in group.features))
    partitions = read_manifest(repo.offline_path(group), group.name).partitions
    if partitions:
        newest = partitions[max(partitions)]
        changes = _hash_changes(newest.feature_hashes, feature_hashes(group))
        basis = "the offline table's manifest"
    else:
        changes = _view_changes(repo, group, view)
        basis = "the Feast registry"
    return GroupChange(group.name, CHANGED, changes, basis) if changes else None


def _hash_changes(recorded: dict[str, str] | Any, current: dict[str, str]) -> tuple[FeatureChange, ...]:
    out = [FeatureChange(n, ADDED) for n in current if n not in recorded]
    out += [FeatureChange(n, REMOVED) for n in recorded if n not in current]
    out += [FeatureChange(n, CHANGED) for n in current if n in recorded and recorded[n] != current[n]]
    return tuple(out)


def _view_changes(repo: Repo, group: FeatureGroup, view: Any) -> tuple[FeatureChange, ...]:
    """Features against the registered view's fields: the name, the type, and the description (which states
    the aggregation, window and filter)."""
    from features.stores.feast_objects import to_feast

    def described(fields: Any) -> dict[str, tuple[str, str]]:
        return {f.name: (str(f.dtype), f.description) for f in fields if f.name not in group.join_keys}

    [*_, ours] = to_feast(group, repo_root=repo.root)
    return _hash_changes(described(view.features), described(ours.features))


def _stale_days(repo: Repo, group: FeatureGroup) -> list[StaleDay]:
    """Completed days computed with another definition of the group than the current one."""
    current, hashes = definition_hash(group), feature_hashes(group)
    partitions = read_manifest(repo.offline_path(group), group.name).partitions
    return [
        StaleDay(group.name, day, definition_change(entry.feature_hashes, hashes))
        for day, entry in sorted(partitions.items())
        if entry.definition_hash != current
    ]


def feast_changes(repo: Repo) -> list[FeastChange]:
    """Feast's dry run of the apply: the repo's objects (what `features apply` registers) against the registry."""
    from feast.diff.property_diff import TransitionType
    from feast.feature_store import DUMMY_ENTITY_NAME
    from feast.repo_config import load_repo_config

    from features.stores.feast_paths import repo_store

    config = load_repo_config(repo.root, repo.root / "feature_store.yaml")
    contents = _desired_contents(repo, config)
    store = repo_store(repo)  # its infra read as this repo's: a copy's plan opens no file of the original
    registry_diff, _infra_diff, _infra = store.plan(contents)
    out = []
    for diff in registry_diff.feast_object_diffs:
        if diff.name == DUMMY_ENTITY_NAME or diff.transition_type in (TransitionType.UNCHANGED, TransitionType.UNKNOWN):
            continue
        props = tuple(p.property_name for p in diff.feast_object_property_diffs)
        out.append(FeastChange(diff.feast_object_type.value, diff.name, diff.transition_type.name.lower(), props))
    return out


def _desired_contents(repo: Repo, config: Any) -> Any:
    """The repo's objects as `features apply` assembles them (features.stores.feast_repo.apply_repo), without the
    apply. Feast imports the modules from the repo folder and prints notes on stdout: both kept in check (the notes
    go to stderr, but for the one every such repo gets, `without_project_note`)."""
    import os

    from features.pipelines.registration import without_project_note
    from features.stores.feast_repo import repo_contents

    before = os.getcwd()
    try:
        os.chdir(repo.root)
        with contextlib.redirect_stdout(sys.stderr), without_project_note(repo.project):
            return repo_contents(repo, config)
    finally:
        os.chdir(before)
