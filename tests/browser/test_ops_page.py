"""[ops] The operators' page (/ops) in a real Chromium against real `importer
serve`, workers, the ledger's exporter, Redis and PostgreSQL: live workers and
lag panels, a bulk retry after a simulated outage (a worker that reads no
message this server sends), intake paused and resumed; a producer's key is
refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from importer.handlers.auth import hash_key, new_key
from tests.browser.conftest import Screenshots, installation, unique
from tests.integration.support import FIXTURES, System, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
OPERATOR = new_key()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


@pytest.fixture(scope="module")
def ops_system(redis_url: str, postgres_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """No worker at first: the test starts the outage's worker, then a healthy one."""
    system = System(redis_url, tmp_path_factory.mktemp("ops-browser"))
    system.env_overrides["IMPORTER_API_KEYS"] = (
        f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},night-shift:{hash_key(OPERATOR)} scopes=ops"
    )
    with installation(postgres_server_url, system, worker=False) as running:
        yield running


def open_ops(page: Any, system: System, key: str) -> None:
    page.goto(system.base_url + "/ops")
    page.fill("#key-input", key)
    page.keyboard.press("Enter")
    expect(page.locator("#key-set")).to_be_visible()


def post(system: System, batch: str, key: str | None = None) -> tuple[int, dict[str, Any]]:
    status, _, raw = system.request("POST", f"/api/imports?batchId={batch}", body=SEED, ctype="text/csv",
                                    key=key or system.api_key)
    return status, json.loads(raw)


def test_a_producer_key_is_refused_on_the_operators_page(ops_system: System, new_page: Any) -> None:
    page = new_page()
    open_ops(page, ops_system, ops_system.api_key)
    expect(page.locator("#alert")).to_contain_text("auth.scope_required")
    expect(page.locator("#ops-panels")).to_be_hidden()


def test_operators_retry_an_outage_in_bulk_pause_and_resume_and_see_workers_and_lag(
    ops_system: System, new_page: Any, shots: Screenshots,
) -> None:
    system = ops_system
    batches = [unique("outage") for _ in range(3)]
    for n, batch in enumerate(batches):
        assert post(system, batch, key=system.other_key if n == 2 else None)[0] == 202
    page = new_page()
    open_ops(page, system, OPERATOR)
    main = page.locator("#locations-table tbody tr[data-location=main]")
    expect(main.locator("td").nth(0)).to_have_text("3")  # waiting
    expect(page.locator("#workers-empty")).to_be_visible()

    # The outage: a worker that reads only contract version 2 fails every import.
    odd = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="2")
    retry = main.get_by_role("button", name="Retry contract.unsupported_version at main")
    expect(retry).to_be_visible(timeout=30_000)
    expect(main.locator("td").nth(5)).to_contain_text("contract.unsupported_version: 3 (3)")
    workers = page.locator("#workers-table tbody tr")
    expect(workers).to_have_count(1)
    expect(workers.first.locator("td").nth(1)).to_have_text("2")  # the versions it reads
    shots.take(page, "outage")
    odd.stop()

    # Fixed: a healthy worker runs, the operator retries the code's failures in one click.
    system.start_worker()
    expect(workers.first.locator("td").nth(1)).to_have_text("1, 3")  # single and group messages
    retry.click()
    expect(page.locator("#announce")).to_have_text("Retried 3 imports that failed with contract.unsupported_version at main.")
    for n, batch in enumerate(batches):
        record = system.wait_state(f"shipment-{batch}", ("completed",), key=system.other_key if n == 2 else "default")
        assert record["retries"] == 1
    # The lag panel follows the exporter: every applied shipment reaches the ledger.
    expect(main.locator("td").nth(6)).to_have_text("0 (0.0 s)", timeout=30_000)
    expect(page.locator("#actions-list li").first).to_contain_text("night-shift retry-failed")

    # Pause: a producer's POST is refused, /health says so; resume: it is taken.
    page.click("#intake-pause")
    expect(page.locator("#intake-state")).to_have_text("paused (everywhere)")
    expect(main.locator("td").nth(7)).to_have_text("paused")
    status, problem = post(system, unique("while-paused"))
    assert (status, problem["code"]) == (503, "intake.paused")
    health = json.loads(system.request("GET", "/health", key=None)[2])
    assert health["status"] == "ok" and health["intake"]["paused"] is True
    shots.take(page, "paused")
    page.click("#intake-resume")
    expect(page.locator("#intake-state")).to_have_text("running")
    assert post(system, unique("resumed"))[0] == 202
    wait_for(lambda: "intake" in page.locator("#actions-list li").first.inner_text(), 10, message="action listed")
