"""The `features` commands that check stored values: `validate` (each offline table against its suite) and
`verify` (online against offline, offline against a recompute); and the JSON lines every command prints."""

from __future__ import annotations

import argparse
import sys

from features.errors import ConfigError


def print_json(value: object) -> None:
    import json

    from features.pipelines.status import jsonable

    print(json.dumps(jsonable(value)), flush=True)


def verify_command(args: argparse.Namespace) -> int:
    """`features verify`: the tables per group; exit 1 when any value disagrees, naming the feature and key."""
    from features.pipelines.verify import verify
    from features.repo import Repo

    if args.sample < 1:
        raise ConfigError(f"--sample: {args.sample} is not a positive number of keys")
    reports = verify(Repo.load(args.repo), args.group, sample=args.sample, track=not args.no_tracking)
    for report in reports:
        if args.json:
            print_json(
                {
                    "group": report.group,
                    "keys": report.keys,
                    "ok": report.ok,
                    "tallies": [
                        {"check": check, "feature": feature, **tally_fields(tally)}
                        for (check, feature), tally in report.tallies.items()
                    ],
                }
            )
        else:
            print(report.table())
    failed = [(r.group, check, feature, t) for r in reports for (check, feature), t in r.tallies.items() if not t.ok]
    for group, check, feature, tally in failed:
        first = tally.examples[0] if tally.examples else ""
        print(
            f"error: {group}.{feature} ({check}): {tally.mismatch} mismatched, {tally.missing} missing, "
            f"{tally.extra} extra; {first}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def tally_fields(tally: object) -> dict[str, object]:
    from features.pipelines.status import jsonable

    return jsonable(tally)


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
