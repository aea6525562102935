"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium through Playwright, a login
helper, screenshots under artifacts/, and an axe-core check (axe-playwright-python ships
axe-core and injects it into the page) that fails on serious or critical violations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
BLOCKING_IMPACTS = {"serious", "critical"}


# How long an expectation waits by default: generous, for a machine shared with other builds.
EXPECT_TIMEOUT_MS = 20_000


@contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright browser (sync API); closed however the test ends."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any, errors: list[str], *, color_scheme: str = "dark") -> Any:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme=color_scheme)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc} {exc.stack}"))
    return page


def log_in(page: Any, base_url: str, username: str, password: str) -> None:
    from playwright.sync_api import expect

    page.goto(base_url + "/accounts/login/")
    page.fill('input[name="username"]', username)
    page.fill('input[name="password"]', password)
    page.click('button[type="submit"]')
    expect(page.locator("h1")).to_have_text("Cluster")


def shot(page: Any, name: str, *, full_page: bool = True) -> Path:
    path = ARTIFACTS / f"{name}.png"
    # A full-page shot of a scrolled page draws the sticky top bar mid-page.
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=full_page)
    return path


def axe_violations(page: Any, exclude: list[str] | None = None) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations on the page as it is now."""
    from axe_playwright_python.sync_playwright import Axe

    context: dict[str, Any] | None = {"exclude": [[s] for s in exclude]} if exclude else None
    results = Axe().run(page, context=context)
    violations: list[dict[str, Any]] = results.response["violations"]
    return [v for v in violations if v.get("impact") in BLOCKING_IMPACTS]


def assert_accessible(page: Any, name: str, exclude: list[str] | None = None) -> None:
    found = axe_violations(page, exclude)
    summary = [
        {
            "id": v["id"],
            "impact": v["impact"],
            "nodes": [
                (n["target"], n.get("failureSummary", "")[:300], n.get("html", "")[:200])
                for n in v["nodes"][:4]
            ],
        }
        for v in found
    ]
    assert not found, f"axe on {name}: {json.dumps(summary, indent=1)}"
