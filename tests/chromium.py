"""Headless Chromium for the tests that look at a page as a browser draws it (Debian's `chromium` package, which
`./dev test` installs when apt-get can run as root or with passwordless sudo). Without it a test fails when the
environment variable CI is set, and is skipped otherwise.

    browser = chromium()                       # the binary, or the failure / skip
    dom = render(browser, url, tmp_path / "profile")   # the DOM after the page's scripts ran
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSER_TIMEOUT_S = 120.0
CHROMIUM_INSTALL = "sudo apt-get install chromium"


def chromium() -> str:
    """Debian's chromium binary; a failure naming the install command under CI, else a skip."""
    found = shutil.which("chromium")
    if found:
        return found
    message = (
        f"Chromium is not installed; this test renders a page with it. Install it: {CHROMIUM_INSTALL} "
        "(./dev test does this when apt-get can run as root or with passwordless sudo)"
    )
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def render(browser: str, url: str, profile: Path) -> str:
    """The DOM of `url` after its scripts ran and their fetches answered (virtual time waits for them)."""
    command = [
        browser,
        "--headless",
        "--no-sandbox",  # the sandbox refuses to run as root, which CI containers often are
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=30000",
        "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)
    assert result.returncode == 0, f"chromium exited with {result.returncode}:\n{result.stderr[-3000:]}"
    return result.stdout
