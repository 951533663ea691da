"""What `features apply` registers with Feast: the repo folder's own Feast objects, every group's objects
(features.stores.feast_objects) in place of a module's exports of them, and an on-demand feature view per
request-time feature Feast can carry (features.stores.feast_request)."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from features.repo import Repo
from features.stores.feast_objects import repo_objects
from features.stores.feast_request import request_views


def apply_repo(repo: Repo) -> None:
    """`feast apply` for the repo folder, with every group's objects added: a module's own `to_feast` exports
    are replaced by the same objects made here, and objects that two modules define alike (a copied module)
    are applied once. It changes the working directory to the repo, as `feast apply` does (Feast imports the
    repo's modules by their path from there), and gives Feast the repo as that folder, so that the paths it
    records are relative to the repo (features.stores.feast_paths)."""
    import os

    from feast.repo_operations import apply_total_with_repo_instance

    from features.stores.feast_paths import repo_store

    os.chdir(repo.root)
    store = repo_store(repo, here=True)
    contents = repo_contents(repo, store.config)
    with warnings.catch_warnings():  # at every apply with one: docs/serving.md says what it means here
        warnings.filterwarnings("ignore", "On demand feature view is an experimental feature", RuntimeWarning)
        apply_total_with_repo_instance(store, store.config.project, store.registry, contents, True)


def repo_contents(repo: Repo, config: Any) -> Any:
    """Feast's repo contents as `features apply` registers them: the modules' own objects (Feast imports them
    from the working directory, the repo folder) with every group's objects in place of a module's exports, and
    an on-demand feature view per request-time feature Feast can carry (a warning on stderr for each one it
    cannot)."""
    import feast
    from feast.repo_operations import _get_repo_contents

    contents = _get_repo_contents(repo.root, config.project, config)
    ours = repo_objects(repo)

    def kind(name: str) -> list[Any]:
        return [o for o in ours if isinstance(o, getattr(feast, name))]

    on_demand, warnings = request_views(repo, kind("FeatureView"))
    for warning in warnings:  # a feature Feast cannot carry: the rest of the repo is registered all the same
        print(f"warning: {warning}", file=sys.stderr)
    return contents._replace(
        entities=_merged(contents.entities, kind("Entity")),
        data_sources=_merged(contents.data_sources, kind("FileSource")),
        feature_views=_merged(contents.feature_views, kind("FeatureView")),
        on_demand_feature_views=_merged(contents.on_demand_feature_views, on_demand),
    )


def _merged(found: list[Any], ours: list[Any]) -> list[Any]:
    """`ours`, then the objects the modules define themselves, one per name: a module's export of a group is
    replaced by ours (the same object), and equal copies count once. Two different objects under one name
    are both kept, for Feast to refuse as it does."""
    names = {o.name for o in ours}
    kept: list[Any] = list(ours)
    for obj in found:
        if obj.name in names:
            continue  # a module's export of a group: the object made here is the same one
        if any(obj.name == other.name and obj == other for other in kept):
            continue  # a copy of an object already kept
        kept.append(obj)
    return kept
