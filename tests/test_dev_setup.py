"""`./dev setup`'s choice of installer (dev, install_package): uv when it can be had, pip's install when uv cannot be
had or fails, pip alone with FEATURES_INSTALLER=pip, nothing while pyproject.toml is unchanged.

Without network, in seconds: a copy of `dev` runs against a throwaway .venv whose `python` runs this interpreter
except for `-m pip`, which only writes down what it was asked to do, with a `uv` (when there is one) that does the
same and a `java` that says it is Java 17. PATH holds only those and the few tools `dev` needs, so no real uv, pip
or java of the machine takes part. The real installs are bench/install.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "cat", "dirname", "sed", "grep", "rm", "chmod")
INSTALL = "install --quiet -e .[local,dev]"
UV_INSTALL = f"uv pip {INSTALL} --python .venv/bin/python"
PIP_INSTALL = f"pip {INSTALL}"
GET_UV = "pip install --quiet uv"

FAKE_UV = """#!/usr/bin/env bash
printf 'uv %s\\n' "$*" >>"$FAKE_LOG"
exit "${FAKE_UV_STATUS:-0}"
"""
# `-m pip install --quiet uv` puts FAKE_UV beside it (FAKE_GET_UV=ok) or fails; any other pip command exits with
# FAKE_PIP_STATUS.
FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "${1:-}" == -m && "${2:-}" == pip ]]; then
    shift 2
    printf 'pip %s\\n' "$*" >>"$FAKE_LOG"
    if [[ "$*" == "install --quiet uv" ]]; then
        [[ "${FAKE_GET_UV:-}" == ok ]] || exit 1
        cat "$FAKE_UV_SOURCE" >"$(dirname "$0")/uv"
        chmod +x "$(dirname "$0")/uv"
        exit 0
    fi
    exit "${FAKE_PIP_STATUS:-0}"
fi
exec %(python)s "$@"
"""
FAKE_JAVA = """#!/usr/bin/env bash
printf 'openjdk version "17.0.9" 2023-10-17\\n' >&2
"""


class Checkout:
    """A copy of `dev` with a pyproject.toml and the fake .venv, tools and log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "calls.log"
        self.bin = root / "bin"  # all of PATH
        self.bin.mkdir(parents=True)
        for tool in TOOLS:
            found = shutil.which(tool)
            assert found is not None, f"dev needs {tool}"
            (self.bin / tool).symlink_to(found)
        self.write(self.bin / "java", FAKE_JAVA)
        self.fake_uv = self.write(root / "fake-uv", FAKE_UV)
        venv_bin = root / ".venv" / "bin"
        venv_bin.mkdir(parents=True)
        self.write(venv_bin / "python", FAKE_PYTHON.replace("%(python)s", f"'{sys.executable}'"))
        shutil.copy(ROOT / "dev", root / "dev")
        (root / "pyproject.toml").write_text('[project]\nname = "throwaway"\n')

    @staticmethod
    def write(path: Path, text: str) -> Path:
        path.write_text(text)
        path.chmod(0o755)
        return path

    def uv_on_path(self) -> None:
        (self.bin / "uv").symlink_to(self.fake_uv)

    def setup(self, expect: int = 0, **env: str) -> str:
        """`./dev setup` with `env`, and its output; the log of fake calls starts empty."""
        self.log.write_text("")
        done = subprocess.run(
            ["./dev", "setup"],
            cwd=self.root,
            env={
                "PATH": str(self.bin),
                "HOME": str(self.root),
                "FAKE_LOG": str(self.log),
                "FAKE_UV_SOURCE": str(self.fake_uv),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == expect, done.stdout + done.stderr
        return done.stdout + done.stderr

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()

    def stamped(self) -> bool:
        return (self.root / ".venv" / ".features-install-stamp").is_file()


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    return Checkout(tmp_path / "checkout")


def test_uv_on_path_installs_and_pip_does_not(checkout: Checkout) -> None:
    checkout.uv_on_path()
    out = checkout.setup()
    assert checkout.calls() == [UV_INSTALL]
    assert checkout.stamped()
    assert "with uv" in out and "pip instead" not in out, out


def test_features_installer_pip_uses_pip_even_with_uv(checkout: Checkout) -> None:
    checkout.uv_on_path()
    out = checkout.setup(FEATURES_INSTALLER="pip")
    assert checkout.calls() == [PIP_INSTALL]
    assert checkout.stamped()
    assert "FEATURES_INSTALLER=pip" in out, out


def test_a_failing_uv_falls_back_to_pip(checkout: Checkout) -> None:
    checkout.uv_on_path()
    out = checkout.setup(FAKE_UV_STATUS="2")
    assert checkout.calls() == [UV_INSTALL, PIP_INSTALL]
    assert checkout.stamped()
    assert "uv could not install the package (see above); installing with pip instead" in out, out


def test_without_uv_and_without_getting_it_pip_installs(checkout: Checkout) -> None:
    out = checkout.setup()  # no uv on PATH, and FAKE_GET_UV unset: `pip install uv` fails (as offline)
    assert checkout.calls() == [GET_UV, PIP_INSTALL]
    assert checkout.stamped()
    assert "Could not get uv (pip install uv failed); installing with pip instead" in out, out


def test_without_uv_pip_gets_it_into_the_venv_once(checkout: Checkout) -> None:
    checkout.setup(FAKE_GET_UV="ok")
    assert checkout.calls() == [GET_UV, UV_INSTALL]
    checkout.setup(FAKE_GET_UV="ok")
    assert checkout.calls() == [], "the stamp matches: nothing to install"
    (checkout.root / "pyproject.toml").write_text('[project]\nname = "throwaway"\nversion = "2"\n')
    checkout.setup(FAKE_GET_UV="ok")
    assert checkout.calls() == [UV_INSTALL], "the uv in .venv is used again"


def test_when_both_fail_dev_fails_without_a_stamp(checkout: Checkout) -> None:
    checkout.uv_on_path()
    out = checkout.setup(expect=1, FAKE_UV_STATUS="2", FAKE_PIP_STATUS="1")
    assert checkout.calls() == [UV_INSTALL, PIP_INSTALL]
    assert not checkout.stamped()
    assert "pip could not install the package" in out, out


def test_pips_index_settings_reach_uv_unless_uv_has_its_own(checkout: Checkout) -> None:
    checkout.uv_on_path()
    pip_settings = {
        "PIP_INDEX_URL": "https://mirror.invalid/simple",
        "PIP_EXTRA_INDEX_URL": "https://extra.invalid/simple",
        "PIP_FIND_LINKS": "/wheels/a /wheels/b",
    }
    checkout.setup(**pip_settings)
    assert checkout.calls() == [
        UV_INSTALL + " --default-index https://mirror.invalid/simple --index https://extra.invalid/simple"
        " --find-links /wheels/a --find-links /wheels/b"
    ]
    os.remove(checkout.root / ".venv" / ".features-install-stamp")
    checkout.setup(**pip_settings, UV_DEFAULT_INDEX="https://own.invalid/simple", UV_INDEX="x", UV_FIND_LINKS="y")
    assert checkout.calls() == [UV_INSTALL]
