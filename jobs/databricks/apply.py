"""Databricks entry point for `features apply` (the bundle's `features_apply` job, databricks.yml); the arguments
of `features apply`.

    jobs/databricks/apply.py --repo /Volumes/<catalog>/<schema>/<volume>/feature_repo

Exit status as `features apply`: 0 done, 2 a usage or configuration error, 3 an unexpected error; every failure
ends with one `error:` line on stderr.
"""

import sys

from features.cli import job_main

if __name__ == "__main__":
    status = job_main("apply", sys.argv[1:])
    # Only a failure exits: Databricks runs the file inside its own driver process, which should not see a
    # SystemExit on success.
    if status:
        sys.exit(status)
