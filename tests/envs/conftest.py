"""Environment fixtures: one headless Chromium per test module for the gui tests."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def host():
    """A running Debian Chromium driven by Playwright; skipped with a hint where it is missing."""
    from openclaw_rl.envs.gui import BrowserHost

    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not installed; run `make sysdeps` (Debian package chromium)")
    h = BrowserHost(executable_path=CHROMIUM)
    yield h
    h.close()
