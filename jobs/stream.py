"""spark-submit / Databricks entry point for the stream; same arguments as `features stream`.

    spark-submit jobs/stream.py --repo feature_repo --trigger 5s
"""

import sys

from features.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
