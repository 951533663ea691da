"""The one error hierarchy of the package.

Every error a user can cause is a `FeaturesError`; its message names the offending field and says how to
fix it. Anything else escaping the package is a bug.
"""

from __future__ import annotations

import errno
import re


class FeaturesError(Exception):
    """Base class of every error this package raises on purpose."""


class DefinitionError(FeaturesError, ValueError):
    """A feature definition (entity, source, window, aggregation, group) is invalid."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class SchemaError(DefinitionError):
    """A definition does not match the schema of the data it reads."""


class ConfigError(FeaturesError):
    """The repository, its configuration or a command-line argument is wrong."""


class EnvironmentProblem(FeaturesError):
    """Something the machine must provide is missing (Java, a connector jar, a server)."""


class JobStalled(FeaturesError):
    """Spark made no progress for the stall limit and the command was stopped (features.engine.watchdog)."""


class DataError(FeaturesError):
    """Input data cannot be processed as declared."""


class RequestFieldError(DataError):
    """A request field's value (a training row's column, a model's input, a served request's field) is not of the
    type its request-time feature declares: the caller's mistake (the feature server answers it 400)."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class ValidationFailed(DataError):
    """A batch of feature rows failed its expectation suite under the `fail` policy: nothing was written.

    `report` is the `features.quality.ValidationReport` (with Great Expectations' own result object)."""

    def __init__(self, message: str, report: object = None) -> None:
        self.report = report
        super().__init__(message)


DISK_FULL = re.compile(r"No space left on device|os error 28\b|\bENOSPC\b")
# A table file deleted outside the package, as deltalake (Rust) and Spark's Delta reader say it.
MISSING_FILE = re.compile(
    r"(?:Object at location|File|file) (?P<path>/\S*?/offline/(?P<group>[^/\s]+)/date=(?P<day>\d{4}-\d{2}-\d{2})/\S+?)"
    r":? (?:not found|does not exist)"
)


def machine_problem(exc: BaseException) -> EnvironmentProblem | None:
    """What went wrong with the machine or its files, not with the package, told from an exception a library
    raised (deltalake's Rust errors and Spark's Java ones arrive as text): a full disk, or an offline table's
    file deleted by hand. None for anything else (a bug)."""
    seen: BaseException | None = exc
    texts = []
    while seen is not None and len(texts) < 10:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            texts.append("No space left on device")
        texts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    text = " ".join(texts)
    if DISK_FULL.search(text):
        return EnvironmentProblem(
            "the disk is full (No space left on device). Fix: free space on the file system that holds the repo's "
            "data folder, then run the same command again (a backfill resumes with the first day it did not "
            "finish; the table keeps its last commit)"
        )
    missing = MISSING_FILE.search(text)
    if missing:
        return EnvironmentProblem(
            f"a file of the offline table of {missing['group']!r} is missing: {missing['path']} (deleted outside "
            f"features?). Fix: `features backfill --group {missing['group']} --date {missing['day']} --force` "
            "rebuilds that day"
        )
    return None
