"""The one error hierarchy of the package.

Every error a user can cause is a `FeaturesError`; its message names the offending field and says how to
fix it. Anything else escaping the package is a bug.
"""

from __future__ import annotations


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


class DataError(FeaturesError):
    """Input data cannot be processed as declared."""


class ValidationFailed(DataError):
    """A batch of feature rows failed its expectation suite under the `fail` policy: nothing was written.

    `report` is the `features.quality.ValidationReport` (with Great Expectations' own result object)."""

    def __init__(self, message: str, report: object = None) -> None:
        self.report = report
        super().__init__(message)
