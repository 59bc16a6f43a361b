"""Open a page in a real headless browser (Debian's chromium, driven by Playwright).

The browser is the system's (``apt-get install chromium``, README's install step);
Playwright downloads nothing. Tests that need it skip, saying why, when either
is missing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def chromium_path() -> str:
    """The system chromium, or skip the calling test with the reason."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            break
    else:
        pytest.skip("no chromium on PATH (README's install step: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    return found


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # anything not file: or data:
    plots: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""


def open_page(path: Path, *, screenshot: Path | None = None) -> PageCheck:
    """Load ``path`` (file://) and report console errors, outside requests and how each
    ``img.plot`` rendered (complete, natural size, size on the page)."""
    from playwright.sync_api import sync_playwright

    check = PageCheck()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.on(
                "console",
                lambda msg: check.console_errors.append(msg.text) if msg.type == "error" else None,
            )
            page.on("pageerror", lambda exc: check.console_errors.append(str(exc)))
            page.on(
                "request",
                lambda req: (
                    check.requests.append(req.url)
                    if not req.url.startswith(("file:", "data:"))
                    else None
                ),
            )
            page.goto(path.resolve().as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function(
                "Array.from(document.images).every(i => i.complete)", timeout=120_000
            )
            check.title = page.title()
            check.plots = page.evaluate(
                """Array.from(document.querySelectorAll('img.plot')).map(i => ({
                    alt: i.alt, complete: i.complete, width: i.naturalWidth,
                    height: i.naturalHeight, shown: i.getBoundingClientRect().width}))"""
            )
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    return check
