"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright
(`playwright install` cannot download browsers on these machines; `.ci/run` installs chromium).

    with chromium() as browser:
        page = browser.new_page()
        ...
        page.screenshot(path=artifact("overview.png"))
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("RW_TEST_ARTIFACTS") or ROOT / "test-artifacts")

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]


def chromium_path() -> str:
    path = os.environ.get("RW_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        # CI installs it (.ci/run); locally: apt-get install chromium. Failing, not skipping:
        # a browser test that silently does not run checks nothing.
        pytest.fail(f"Chromium not found at {path}: apt-get install chromium (or set RW_CHROMIUM)")
    return path


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def artifact(name: str) -> str:
    """A path under test-artifacts/ (screenshots and the like) for a test to write."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return str(ARTIFACTS / name)
