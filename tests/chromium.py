"""Debian's Chromium for the browser tests (tests/test_browser.py, tests/notebook/test_export.py), never a download."""
from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and quiet on a machine with no network beyond the package registries (no background requests).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--lang=en-US"]


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} not found (apt-get install -y chromium fonts-noto-cjk)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e .[test])"
    return None
