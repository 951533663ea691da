"""spark-submit / Databricks / cron entry point for a backfill; the arguments of `features backfill`.

    spark-submit jobs/backfill.py --repo feature_repo --since-last          # nightly: every day not done yet
    spark-submit jobs/backfill.py --repo feature_repo --date 2026-01-31     # one day (--force: even if done)
    spark-submit jobs/backfill.py --repo feature_repo --start 2026-01-01 --end 2026-01-02

Exit status: 0 done (or nothing to do), 1 the data failed (validation), 2 a usage or configuration error,
3 an unexpected error; every failure ends with one `error:` line on stderr.
"""

import sys

from features.cli import job_main

if __name__ == "__main__":
    status = job_main("backfill", sys.argv[1:])
    # Only a failure exits: a job runner that executes the file inside its own driver process (Databricks)
    # should not see a SystemExit on success.
    if status:
        sys.exit(status)
