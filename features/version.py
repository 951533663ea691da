"""This package's version, for `features --version` and what the package writes down (savepoints)."""

from __future__ import annotations

from pathlib import Path

# What pip installs and PyPI would list (`pip install windowed-features`); the import package is `features`, as
# PyYAML installs `yaml`. The name `features` on PyPI belongs to an unrelated project.
DISTRIBUTION = "windowed-features"
# The distribution as a wheel's file name spells it (PEP 427: `-` becomes `_`).
WHEEL_PREFIX = DISTRIBUTION.replace("-", "_")


def package_version() -> str:
    """The installed package's version, or the source's (pyproject.toml) when running from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
