"""spark-submit / Databricks / cron entry point for a backfill; same arguments as `features backfill`.

    spark-submit jobs/backfill.py --repo feature_repo --start 2026-01-01 --end 2026-01-02
"""

import sys

from features.cli import main

if __name__ == "__main__":
    sys.exit(main(["backfill", *sys.argv[1:]]))
