"""The `features` commands that check stored values: `validate` (each offline table against its suite) and
`verify` (online against offline, offline against a recompute); and the JSON lines every command prints."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from features.errors import ConfigError

if TYPE_CHECKING:
    from features.pipelines.verify import GroupReport


def print_json(value: object) -> None:
    import json

    from features.pipelines.status import jsonable

    print(json.dumps(jsonable(value)), flush=True)


def verify_command(args: argparse.Namespace) -> int:
    """`features verify`: the tables per group; exit 1 when any value disagrees or an online row is staler than
    --max-staleness, naming the feature and key."""
    from features.pipelines.verify import verify
    from features.repo import Repo
    from features.spec.durations import parse_duration

    if args.sample < 1:
        raise ConfigError(f"--sample: {args.sample} is not a positive number of keys")
    tolerated = 0 if args.max_staleness is None else parse_duration(args.max_staleness, "--max-staleness")
    reports = verify(
        Repo.load(args.repo), args.group, sample=args.sample, max_staleness_s=tolerated, track=not args.no_tracking
    )
    for report in reports:
        if args.json:
            print_json(verify_json(report))
        else:
            print(report.table())
    failed = [(r.group, check, feature, t) for r in reports for (check, feature), t in r.tallies.items() if not t.ok]
    for group, check, feature, tally in failed:
        first = tally.examples[0] if tally.examples else ""
        print(
            f"error: {group}.{feature} ({check}): {tally.mismatch} mismatched, {tally.missing} missing, "
            f"{tally.extra} extra, {tally.stale} stale; {first}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def verify_json(report: GroupReport) -> dict[str, object]:
    """One group's outcome as `features verify --json` prints it: per check and feature the counts, the mismatch
    rate and the largest lag (online), and the examples."""
    from features.pipelines.status import jsonable

    return {
        "group": report.group,
        "keys": report.keys,
        "ok": report.ok,
        "tallies": [
            {"check": check, "feature": feature, **jsonable(tally), "mismatch_rate": tally.mismatch_rate}
            for (check, feature), tally in report.tallies.items()
        ],
    }


def validate_command(repo_path: str, groups: list[str], *, as_json: bool = False) -> int:
    """`features validate`: each group's offline table against its suite; 1 if any expectation failed."""
    from features.quality import validate_table
    from features.repo import Repo

    repo = Repo.load(repo_path)
    failed = False
    for report in validate_table(repo, groups):
        failed |= not report.success
        if as_json:
            print_json(
                {
                    "group": report.group,
                    "success": report.success,
                    "rows": report.rows,
                    "expectations": len(report.outcomes),
                    "failed": report.failed_names(),
                    "docs_path": report.docs_path,
                    "seconds": report.seconds,
                }
            )
            continue
        print(report.summary())
        for outcome in report.failures:
            print(f"  FAILED {'user expectation' if outcome.user else 'expectation'} {outcome.name!r}")
        print(f"  Data Docs: {report.docs_path}")
    return 1 if failed else 0
