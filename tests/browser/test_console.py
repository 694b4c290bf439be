"""The console in a real Chromium against real `importer serve` + `importer
worker` + Redis: upload, watch it live, read a failed file's issues, list,
owners, error messages, keyboard, phone width, contrast."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Screenshots, unique
from tests.integration.support import FIXTURES, ROOT, System

pytestmark = [pytest.mark.browser, pytest.mark.integration]

DOC_SCREENSHOT = ROOT / "docs" / "console.png"

#: The event log of a 3-row import that completed at its first attempt.
MILESTONES = [
    "waiting", "active attempt 1", "progress validated (3 rows) attempt 1",
    "progress committed (3 rows) attempt 1", "completed attempt 1",
]


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def open_console(page: Any, system: System, key: str) -> None:
    """Open the page and paste the key, with the keyboard only."""
    page.goto(system.base_url + "/")
    page.keyboard.press("Tab")  # the skip link
    page.keyboard.press("Tab")  # the key field
    assert page.evaluate("document.activeElement.id") == "key-input"
    page.keyboard.type(key)
    page.keyboard.press("Enter")
    expect(page.locator("#key-set")).to_be_visible()
    assert key not in page.url


def copy_fixture(tmp_path: Path, name: str, as_name: str) -> Path:
    target = tmp_path / as_name
    shutil.copyfile(FIXTURES / name, target)
    return target


def test_upload_and_watch_it_complete_live(console_system: System, new_page: Any, shots: Screenshots, tmp_path: Path) -> None:
    page = new_page()
    open_console(page, console_system, console_system.api_key)
    page.evaluate("window.__sameDocument = true")
    batch = unique("shipment-a-2026")
    page.set_input_files("#file-input", str(copy_fixture(tmp_path, "shipment-a-2026.csv", batch + ".csv")))
    expect(page.locator("#batch-input")).to_have_value(batch)  # suggested from the file name
    shots.take(page, "file-chosen")
    with page.expect_request(lambda r: r.method == "POST" and "/api/imports" in r.url) as sent:
        page.click("#send-button")
    # The upload carries its RFC 9530 digest: the server refuses it if it arrives cut.
    data = (FIXTURES / "shipment-a-2026.csv").read_bytes()
    assert sent.value.headers["content-digest"] == "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"

    expect(page.locator("#send-result")).to_contain_text(f"202 Accepted: job shipment-{batch}")
    expect(page.locator("#job-state")).to_have_text("completed", timeout=60_000)
    shots.take(page, "completed")
    expect(page.locator("#job-attempt")).to_have_text("(attempt 1)")
    expect(page.locator("#job-steps li[data-step=validated]")).to_have_text("validated (3 rows)")
    expect(page.locator("#job-result")).to_have_text("Imported 3 rows.")
    # Every milestone came through the event stream (only the stream fills this log).
    events = page.locator("#job-events li").all_text_contents()
    assert events == MILESTONES, events
    assert page.evaluate("window.__sameDocument") is True  # no reload
    expect(page.locator("#announce")).to_have_text(f"Import shipment-{batch} completed.")
    status, record = console_system.get_job(f"shipment-{batch}")
    assert status == 200 and record["state"] == "completed"


def test_a_completed_import_links_to_its_receipt_and_a_skus_movements(
    console_system: System, new_page: Any, shots: Screenshots, tmp_path: Path,
) -> None:
    page = new_page()
    open_console(page, console_system, console_system.api_key)
    batch = unique("ledger-shown")
    page.set_input_files("#file-input", str(copy_fixture(tmp_path, "shipment-a-2026.csv", batch + ".csv")))
    page.click("#send-button")
    expect(page.locator("#job-state")).to_have_text("completed", timeout=60_000)
    page.click("#receipt-show")
    rows = page.locator("#receipt-table tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0).locator("td").nth(0)).to_have_text("WIDGET-RED-01")
    before = int(rows.nth(0).locator("td").nth(1).inner_text())
    expect(rows.nth(0).locator("td").nth(2)).to_have_text(str(before + 10))
    # the ledger has the shipment about a second after it completed: ask until it shows
    for _ in range(50):
        page.click("#receipt-table tbody tr:first-child button")
        # a locator, not wait_for_function: its polled string is an eval, which the console's CSP forbids
        page.locator("#moves-table:not([hidden]), #moves-empty:not([hidden])").first.wait_for()
        if page.locator("#moves-table tbody tr", has_text=batch).count():
            break
        page.wait_for_timeout(200)
    moved = page.locator("#moves-table tbody tr", has_text=batch)
    expect(moved).to_have_count(1)
    expect(moved.locator("td").nth(4)).to_have_text("+10")
    expect(page.locator("#moves-caption")).to_have_text("Movements of WIDGET-RED-01 at main")
    shots.take(page, "movements")


def test_an_invalid_file_shows_its_located_issues(console_system: System, new_page: Any, shots: Screenshots, tmp_path: Path) -> None:
    page = new_page()
    open_console(page, console_system, console_system.api_key)
    batch = unique("bad-quantity")
    page.set_input_files("#file-input", str(copy_fixture(tmp_path, "invalid-bad-quantity.csv", batch + ".csv")))
    page.click("#send-button")
    expect(page.locator("#job-state")).to_have_text("failed", timeout=60_000)
    shots.take(page, "failed")
    expect(page.locator("#job-error-code")).to_have_text("csv.bad_quantity")
    expect(page.locator("#job-error-message")).to_have_text("A quantity is a whole number from 1 to 1000000, digits only.")
    rows = page.locator("#issues-table tbody tr")
    expect(rows).to_have_count(2)
    assert rows.nth(0).locator("td").all_inner_texts() == [
        "2", "2", "csv.bad_quantity", "quantity 'abc' is not a whole number from 1 to 1000000",
    ]
    assert rows.nth(1).locator("td").all_inner_texts()[:3] == ["3", "2", "csv.bad_quantity"]
    # The link to every rejected row: fetched with the key, saved as a file.
    link = page.locator("#rejections-link")
    expect(link).to_be_visible()
    expect(link).to_have_attribute("href", f"/api/imports/shipment-{batch}/rejections.csv")
    expect(page.locator("#rejections-size")).to_have_text("(2 issues)")
    with page.expect_download() as download_info:
        link.click()
    download = download_info.value
    assert download.suggested_filename == f"shipment-{batch}-rejections.csv"
    lines = Path(download.path()).read_text(encoding="utf-8").splitlines()
    assert lines[0] == "line,column,code,message,value"
    assert lines[1] == "2,2,csv.bad_quantity,quantity 'abc' is not a whole number from 1 to 1000000,abc"
    assert lines[2].startswith("3,2,csv.bad_quantity,") and lines[2].endswith(",'-3")  # spreadsheet-safe
    assert len(lines) == 3
    # Announced to screen readers.
    alert = page.locator("#alert")
    expect(alert).to_have_attribute("aria-live", "assertive")
    expect(alert).to_contain_text("failed: csv.bad_quantity")


def test_the_list_updates_live_filters_and_opens_and_another_owner_sees_nothing(
    console_system: System, new_page: Any, shots: Screenshots, tmp_path: Path,
) -> None:
    page = new_page()
    open_console(page, console_system, console_system.api_key)
    # An import sent from elsewhere (curl, the CLI) appears without a reload.
    batch = unique("from-curl")
    status, _ = console_system.post_csv(batch, (FIXTURES / "shipment-a-2026.csv").read_bytes().replace(b"10", b"14"))
    assert status == 202
    failed_batch = unique("bad-header")
    assert console_system.post_csv(failed_batch, (FIXTURES / "invalid-bad-header.csv").read_bytes())[0] == 202
    console_system.wait_state(f"shipment-{failed_batch}")
    row = page.locator(f"#list-table tbody tr[data-job-id='shipment-{batch}']")
    expect(row).to_be_visible(timeout=30_000)
    expect(row.locator(".badge")).to_have_text("completed", timeout=30_000)
    shots.take(page, "list")

    page.select_option("#state-filter", "failed")
    expect(page.locator(f"#list-table tbody tr[data-job-id='shipment-{batch}']")).to_have_count(0)
    expect(page.locator(f"#list-table tbody tr[data-job-id='shipment-{failed_batch}']")).to_be_visible()
    states = page.locator("#list-table tbody .badge").all_inner_texts()
    assert set(states) == {"failed"}, states
    page.select_option("#state-filter", "")
    row.get_by_role("button", name=f"Open {batch}").click()
    expect(page.locator("#job-id")).to_have_text(f"shipment-{batch}")
    expect(page.locator("#job-state")).to_have_text("completed")
    # A job that finished before it was opened still shows how it got there:
    # its stored events, replayed by the stream, which then ends.
    expect(page.locator("#job-events li")).to_have_text(MILESTONES)

    if os.environ.get("IMPORTER_UPDATE_SCREENSHOT") == "1":
        DOC_SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(DOC_SCREENSHOT), full_page=True)

    # Another producer, in another tab session: nothing of owner-a's.
    other = new_page()
    open_console(other, console_system, console_system.other_key)
    expect(other.locator("#list-empty")).to_be_visible()
    expect(other.locator("#list-table tbody tr")).to_have_count(0)
    probe = other.evaluate(
        """async (jobId) => {
            const key = sessionStorage.getItem("importer.apiKey");
            const r = await fetch("/api/imports/" + jobId + "/events", {headers: {Authorization: "Bearer " + key}});
            return [r.status, await r.text()];
        }""",
        f"shipment-{batch}",
    )
    assert probe[0] == 404 and json.loads(probe[1])["code"] == "job.not_found"
    shots.take(other, "other-owner")


def test_a_shipment_for_a_location_and_the_location_column(
    console_system: System, new_page: Any, shots: Screenshots, tmp_path: Path,
) -> None:
    page = new_page()
    open_console(page, console_system, console_system.api_key)
    at_main = unique("at-main")
    assert console_system.post_csv(at_main, (FIXTURES / "shipment-a-2026.csv").read_bytes())[0] == 202
    batch = unique("at-paris")
    page.set_input_files("#file-input", str(copy_fixture(tmp_path, "shipment-a-2026.csv", batch + ".csv")))
    page.fill("#location-input", "paris")
    with page.expect_request(lambda r: r.method == "POST" and "/api/imports" in r.url) as sent:
        page.click("#send-button")
    assert sent.value.url.endswith(f"/api/imports?batchId={batch}&location=paris")
    expect(page.locator("#send-result")).to_contain_text(f"202 Accepted: job shipment-{batch}@paris (batch {batch} at paris")
    expect(page.locator("#job-state")).to_have_text("completed", timeout=60_000)
    # The list says where each import is.
    expect(page.locator("#list-table thead th").nth(1)).to_have_text("Location")
    for job_id, location in ((f"shipment-{batch}@paris", "paris"), (f"shipment-{at_main}", "main")):
        row = page.locator(f"#list-table tbody tr[data-job-id='{job_id}']")
        expect(row.locator("td").nth(1)).to_have_text(location, timeout=30_000)
    shots.take(page, "locations")

    # A key that may not send there: one clear sentence (the answer substituted in the browser).
    page.route(re.compile(r".*/api/imports\?batchId=.*"), lambda route: route.fulfill(
        status=404, headers={"Content-Type": "application/problem+json"},
        body=json.dumps({"status": 404, "code": "location.not_found", "title": "", "detail": "", "type": ""}),
    ))
    page.fill("#location-input", "lyon")
    page.click("#send-button")
    expect(page.locator("#alert")).to_contain_text("Your API key cannot send shipments to this location (location.not_found)")


def test_clear_messages_for_refusals(console_system: System, new_page: Any, shots: Screenshots, tmp_path: Path) -> None:
    page = new_page()
    open_console(page, console_system, "imp_not-a-key")
    expect(page.locator("#alert")).to_contain_text("The API key was refused")
    page.click("#key-forget")
    page.fill("#key-input", console_system.api_key)
    page.press("#key-input", "Enter")

    batch = unique("conflict")
    console_system.post_csv(batch, (FIXTURES / "shipment-a-2026.csv").read_bytes())
    page.set_input_files("#file-input", str(copy_fixture(tmp_path, "invalid-duplicate-sku.csv", batch + ".csv")))
    page.click("#send-button")
    expect(page.locator("#alert")).to_contain_text("batchId is already used")

    big = tmp_path / "big.csv"
    big.write_text("sku,quantity\n" + "".join(f"SKU-{i:05d},1\n" for i in range(400)))
    page.set_input_files("#file-input", str(big))
    page.click("#send-button")
    expect(page.locator("#alert")).to_contain_text("larger than the server accepts")

    # 429 and 503 as the server sends them (answers substituted in the browser).
    def problem(status: int, code: str, retry_after: str) -> Any:
        def fulfil(route: Any) -> None:
            route.fulfill(status=status, headers={"Retry-After": retry_after, "Content-Type": "application/problem+json"},
                          body=json.dumps({"status": status, "code": code, "title": "", "detail": "", "type": ""}))
        return fulfil

    page.route(re.compile(r".*/api/imports\?batchId=.*"), problem(429, "request.rate_limited", "7"))
    page.set_input_files("#file-input", str(copy_fixture(tmp_path, "shipment-a-2026.csv", unique("rl") + ".csv")))
    page.click("#send-button")
    expect(page.locator("#alert")).to_contain_text("Wait 7 seconds")
    page.unroute(re.compile(r".*/api/imports\?batchId=.*"))
    page.route(re.compile(r".*/api/imports\?batchId=.*"), problem(503, "service.unavailable", "5"))
    page.click("#send-button")
    expect(page.locator("#alert")).to_contain_text("The service is unavailable right now")
    shots.take(page, "503")


def test_phone_width_and_contrast(console_system: System, new_page: Any, shots: Screenshots) -> None:
    page = new_page(width=360, height=740)
    open_console(page, console_system, console_system.api_key)
    expect(page.locator("#list-table")).to_be_visible()
    shots.take(page, "phone")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    # WCAG 2.1 AA: every visible text on its effective background >= 4.5:1.
    worst = page.evaluate(
        """() => {
          const lum = (c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map(v => {
              v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
          const bg = (el) => { for (; el; el = el.parentElement) { const c = getComputedStyle(el).backgroundColor;
              if (c && !c.startsWith("rgba(0, 0, 0, 0)")) return c; } return "rgb(255, 255, 255)"; };
          const out = [];
          for (const el of document.querySelectorAll("body *")) {
            if (!el.offsetParent || ![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
            const a = lum(getComputedStyle(el).color), b = lum(bg(el));
            out.push([(Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), el.tagName + "#" + el.id + "." + el.className]);
          }
          out.sort((x, y) => x[0] - y[0]);
          return out.slice(0, 3);
        }"""
    )
    assert worst and worst[0][0] >= 4.5, worst


def test_a_failed_import_is_retried_with_its_button_and_followed_live(
    redis_url: str, tmp_path: Path, new_page: Any, shots: Screenshots,
) -> None:
    """Its own installation: two imports fail for a reason a retry can change
    (a worker that accepts only contract version 2 took their version 1
    messages); once a right worker runs, the owner retries one with its
    button and watches it complete; the other was retried elsewhere meanwhile
    (the button then gets a clear 409 sentence); a failed validation has no
    button."""
    from tests.integration.test_retry import fail_for_a_contract_version

    system = System(redis_url, tmp_path, env_overrides={"IMPORTER_EVENT_STREAM_HEARTBEAT": "2"})
    try:
        system.start_http()
        batch, raced = unique("retry"), unique("raced")
        job_id, raced_id = fail_for_a_contract_version(system, batch, raced)
        system.start_worker()
        page = new_page()
        open_console(page, system, system.api_key)
        page.evaluate("window.__sameDocument = true")
        row = page.locator(f"#list-table tbody tr[data-job-id='{job_id}']")
        row.get_by_role("button", name=f"Open {batch}").click()
        expect(page.locator("#job-state")).to_have_text("failed")
        expect(page.locator("#job-error-code")).to_have_text("contract.unsupported_version")
        button = page.get_by_role("button", name=f"Retry {batch}")
        expect(button).to_be_visible()
        shots.take(page, "failed-retryable")

        button.click()
        expect(page.locator("#job-state")).to_have_text("completed", timeout=60_000)
        shots.take(page, "retried-completed")
        expect(page.locator("#job-attempt")).to_have_text("(attempt 1, retry 1)")
        expect(page.locator("#job-result")).to_have_text("Imported 3 rows.")
        expect(button).to_be_hidden()
        expect(page.locator("#announce")).to_have_text(f"Import {job_id} completed.")
        events = page.locator("#job-events li").all_text_contents()
        assert events == [
            "waiting", "failed contract.unsupported_version attempt 1", "waiting (retry 1)", *MILESTONES[1:],
        ], events
        assert page.evaluate("window.__sameDocument") is True  # no reload
        assert system.store().stock_of(["WIDGET-RED-01", "GADGET-BLU-02", "SPROCKET-07"]) == {
            "WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5,
        }

        # The other one is retried from elsewhere (curl, the CLI) while the page still shows it failed.
        page.locator(f"#list-table tbody tr[data-job-id='{raced_id}']").get_by_role("button", name=f"Open {raced}").click()
        raced_button = page.get_by_role("button", name=f"Retry {raced}")
        expect(raced_button).to_be_visible()
        expect(page.locator("#announce")).to_have_text(f"Import {raced_id} failed.")  # no longer followed
        assert system.request("POST", f"/api/imports/{raced_id}/retry")[0] == 202
        raced_button.click()
        expect(page.locator("#alert")).to_contain_text("This import cannot be retried (job.not_retryable). Only a failed import")
        expect(page.locator("#job-state")).to_have_text("completed", timeout=60_000)  # shown as it is now
        shots.take(page, "raced-409")
        assert system.get_job(raced_id)[1]["retries"] == 1

        # A failed validation: no button (the same bytes would give the same issues).
        bad = unique("bad-retry")
        page.set_input_files("#file-input", str(copy_fixture(tmp_path, "invalid-bad-quantity.csv", bad + ".csv")))
        page.click("#send-button")
        expect(page.locator("#job-state")).to_have_text("failed", timeout=60_000)
        expect(page.get_by_role("button", name=f"Retry {bad}")).to_be_hidden()
        expect(page.locator("#alert")).not_to_contain_text("Retry button")
    finally:
        system.stop_all()


def test_several_files_go_in_one_bulk_request_each_answered(console_system: System, new_page: Any, tmp_path: Path) -> None:
    page = new_page()
    open_console(page, console_system, console_system.api_key)
    names = [unique("many") + ".csv" for _ in range(3)]
    for n, name in enumerate(names):
        (tmp_path / name).write_text(f"sku,quantity\nMANY-{n},{n + 1}\n")
    taken = unique("taken") + ".csv"  # another producer's batchId already: refused, the others go on
    (tmp_path / taken).write_text("sku,quantity\nMANY-0,1\n")
    status, _, _ = console_system.request("POST", f"/api/imports?batchId={taken[:-4]}", body=b"sku,quantity\nT,1\n",
                                          ctype="text/csv", key=console_system.other_key)
    assert status == 202
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/imports/bulk")) as sent:
        page.set_input_files("#file-input", [str(tmp_path / name) for name in [*names, taken]])
        expect(page.locator("#batch-input")).to_be_disabled()
        page.click("#send-button")
    assert sent.value.headers["content-type"] == "application/x-ndjson"
    expect(page.locator("#send-result")).to_have_text("3 of 4 files accepted.")
    items = page.locator("#send-many li")
    expect(items).to_have_count(4)
    expect(items.nth(0)).to_contain_text(f"{names[0]}: 202 Accepted, job shipment-{names[0][:-4]}")
    expect(items.nth(3)).to_contain_text(f"{taken}: This batchId is already used")
    # Sent again: each file answers its job again; nothing is recorded twice.
    page.click("#send-button")
    expect(page.locator("#send-result")).to_have_text("3 of 4 files accepted.")
    for name in names:
        assert console_system.wait_state(f"shipment-{name[:-4]}", ("completed",))["state"] == "completed"
