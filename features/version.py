"""This package's version, for `features --version` and what the package writes down (savepoints)."""

from __future__ import annotations

from pathlib import Path


def package_version() -> str:
    """The installed package's version, or the source's (pyproject.toml) when running from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("features")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])
