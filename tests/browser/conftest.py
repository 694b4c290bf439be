"""Browser tests: Debian's chromium driven by playwright (from PyPI, pointed at
the system executable; ``playwright install`` is never used) against a real
``importer serve`` + ``importer worker`` + Redis.

Where no Chromium is installed, ``make test`` does not run them and says so
in one line; in CI (``CI`` set) or with ``make test-browser``
(``IMPORTER_BROWSER_TESTS=required``) they run and fail instead.

On a failure, the screenshots taken at each step of the test (and one of the
page as it was at the end) are written to ``test-artifacts/browser/``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import ROOT, System

CHROMIUM = os.environ.get("IMPORTER_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("IMPORTER_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "browser"
_NOT_RUN: list[str] = []


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("IMPORTER_BROWSER_TESTS") == "required"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    browser_items = [item for item in items if item.get_closest_marker("browser")]
    if not browser_items or os.access(CHROMIUM, os.X_OK) or _required():
        return
    # Deselected, not skipped: nothing is counted as passed; one line says why.
    config.hook.pytest_deselected(items=browser_items)
    items[:] = [item for item in items if not item.get_closest_marker("browser")]
    _NOT_RUN.append(
        f"browser tests: {len(browser_items)} not run (no Chromium at {CHROMIUM}); "
        "install it (apt-get install -y chromium) and run `make test-browser`"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _NOT_RUN:
        terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        shots: Screenshots | None = getattr(item, "funcargs", {}).get("shots")
        if shots is not None:
            shots.save_all(item.name)
    return report


class Screenshots:
    """Screenshots of each state of a test, kept in memory and written only on failure."""

    def __init__(self) -> None:
        self.taken: list[tuple[str, bytes]] = []
        self.pages: list[Any] = []

    def take(self, page: Any, name: str) -> None:
        self.taken.append((name, page.screenshot(full_page=True)))

    def save_all(self, test_name: str) -> None:
        folder = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name)
        folder.mkdir(parents=True, exist_ok=True)
        for i, (name, data) in enumerate(self.taken):
            (folder / f"{i:02d}-{name}.png").write_bytes(data)
        for i, page in enumerate(self.pages):
            try:
                page.screenshot(path=str(folder / f"zz-at-failure-{i}.png"), full_page=True)
            except Exception:  # the page may be gone; the step screenshots are still there
                pass


@pytest.fixture
def shots() -> Screenshots:
    return Screenshots()


@pytest.fixture(scope="session")
def playwright_browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: install it with `apt-get install -y chromium`", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def installation(postgres_server_url: str, system: System, *, worker: bool = True) -> Iterator[System]:
    """``system`` with its own ledger database: `importer serve`, the ledger's exporter and
    (``worker``) a worker; every process stopped and the database dropped after."""
    import psycopg

    name = "importer_b_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    system.env_overrides.update(IMPORTER_DATABASE_URL=postgres_server_url.rsplit("/", 1)[0] + "/" + name,
                                IMPORTER_LEDGER_INTERVAL="0.05")
    try:
        if worker:
            system.start_worker()
        system.start_http()
        system.start_ledger()
        yield system
    finally:
        system.stop_all()
        with psycopg.connect(postgres_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def console_system(redis_url: str, postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One installation for a module's browser tests: a worker, `importer serve` and the ledger's exporter."""
    system = System(
        redis_url, tmp_path_factory.mktemp("browser"),
        env_overrides={"IMPORTER_MAX_UPLOAD_BYTES": "4096", "IMPORTER_EVENT_STREAM_HEARTBEAT": "2"},
    )
    with installation(postgres_server_url, system) as running:
        yield running


@pytest.fixture
def new_page(playwright_browser: Any, shots: Screenshots) -> Iterator[Any]:
    """Opens pages in fresh browser contexts (own sessionStorage each)."""
    contexts: list[Any] = []

    def make(width: int = 1100, height: int = 900) -> Any:
        context = playwright_browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        shots.pages.append(page)
        return page

    yield make
    for context in contexts:
        context.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
