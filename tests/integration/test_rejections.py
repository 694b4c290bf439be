"""Rejection reports through real `importer serve` + `importer worker` on Redis:
a failed validation keeps every located issue up to the bound, and
GET /api/imports/{jobId}/rejections.csv returns them as spreadsheet-safe CSV."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest
from importer.domain.shipment import MAX_ISSUES

from tests.integration.support import ROOT, System, wait_for

pytestmark = pytest.mark.integration

HEADER = ["line", "column", "code", "message", "value"]


def report_of(system: System, job_id: str, **kw: object) -> tuple[int, dict[str, str], bytes]:
    return system.request("GET", f"/api/imports/{job_id}/rejections.csv", **kw)  # type: ignore[arg-type]


def rows_of(body: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(body.decode("utf-8"), newline="")))


def test_a_file_with_30000_bad_rows_gives_a_report_cut_at_the_bound(system: System) -> None:
    # 100,000 rows; every row whose index is 0, 3 or 6 mod 10 has a bad quantity: 30,000 bad rows.
    bad = {i for i in range(100_000) if i % 10 in (0, 3, 6)}
    data = "sku,quantity\n" + "".join(f"SKU-{i},{'x' if i in bad else 1}\n" for i in range(100_000))
    assert system.post_csv("rej-big", data.encode())[0] == 202
    record = system.wait_state("shipment-rej-big", timeout=120)

    assert record["state"] == "failed" and record["error"]["code"] == "csv.bad_quantity"
    error = record["error"]
    assert error["rejections"] == {
        "found": 30_000, "listed": MAX_ISSUES, "truncated": True, "url": "/api/imports/shipment-rej-big/rejections.csv",
    }
    assert len(error["issues"]) == 100 and error["issuesTruncated"] is True

    status, headers, body = report_of(system, "shipment-rej-big")
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = rows_of(body)
    assert rows[0] == HEADER
    data_rows, note = rows[1:-1], rows[-1]
    assert len(data_rows) == MAX_ISSUES == 10_000
    # The first 10,000 bad rows, in file order (file line = row index + 2).
    expected_lines = [i + 2 for i in sorted(bad)[:MAX_ISSUES]]
    wrong = [(r, line) for r, line in zip(data_rows, expected_lines) if r[:3] != [str(line), "2", "csv.bad_quantity"] or r[4] != "x"]
    assert wrong == [] and data_rows[0][0] == "2" and data_rows[-1][0] == str(expected_lines[-1])
    assert note[:3] == ["", "", "report.truncated"] and "30000 issues found" in note[3]


def test_a_file_with_12_bad_rows_gives_exactly_12_lines(system: System) -> None:
    bad_lines = {}
    lines = ["sku,quantity"]
    for i in range(200):
        if i % 17 == 5 and len(bad_lines) < 12:
            lines.append(f"BAD SKU {i},{i + 1}")
            bad_lines[len(lines)] = f"BAD SKU {i}"
        else:
            lines.append(f"OK-{i},{i + 1}")
    assert len(bad_lines) == 12
    assert system.post_csv("rej-12", ("\n".join(lines) + "\n").encode())[0] == 202
    record = system.wait_state("shipment-rej-12")
    assert record["error"]["rejections"]["found"] == 12 and record["error"]["rejections"]["truncated"] is False

    status, _, body = report_of(system, "shipment-rej-12")
    rows = rows_of(body)
    assert status == 200 and rows[0] == HEADER
    assert [(int(r[0]), r[1], r[2], r[4]) for r in rows[1:]] == [
        (line, "1", "csv.bad_sku", value) for line, value in bad_lines.items()
    ]
    assert body.count(b"\r\n") == 13  # the header and 12 lines: nothing else


def test_formula_cells_come_back_neutralised(system: System) -> None:
    data = (
        'sku,quantity\n'
        '=HYPERLINK("http://evil.example","click"),5\n'  # line 2: three columns
        '@SUM(A1:A9),5\n'  # line 3: bad SKU
        'A-1,+1\n'  # line 4: bad quantity
        'A-2,-1\n'  # line 5: bad quantity
        'A-3,=1+1\n'  # line 6: bad quantity
    ).encode()
    system.post_csv("rej-formula", data)
    system.wait_state("shipment-rej-formula")
    rows = rows_of(report_of(system, "shipment-rej-formula")[2])
    assert [r[4] for r in rows[1:]] == [
        '\'=HYPERLINK("http://evil.example","click"),5', "'@SUM(A1:A9)", "'+1", "'-1", "'=1+1",
    ]
    for row in rows[1:]:
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in row), row


def test_only_the_owner_reads_a_report_and_a_job_without_one_says_so(system: System) -> None:
    system.post_csv("rej-mine", b"sku,quantity\nA,0\n")
    system.post_csv("rej-good", b"sku,quantity\nA,1\n")
    system.wait_state("shipment-rej-mine")
    system.wait_state("shipment-rej-good")
    other = {"key": system.other_key}

    foreign = report_of(system, "shipment-rej-mine", **other)
    missing = report_of(system, "shipment-rej-nope", **other)
    status_404 = system.request("GET", "/api/imports/shipment-rej-nope", **other)  # type: ignore[arg-type]
    assert foreign[0] == missing[0] == 404
    assert foreign[2] == missing[2] == status_404[2] and b"job.not_found" in foreign[2]
    assert report_of(system, "shipment-rej-mine", key=None)[0] == 401

    completed = report_of(system, "shipment-rej-good")
    assert completed[0] == 404 and b'"code":"rejections.not_found"' in completed[2]
    assert rows_of(report_of(system, "shipment-rej-mine")[2])[1][:3] == ["2", "2", "csv.bad_quantity"]


def test_retention_removes_the_report_with_its_record(make_system: object) -> None:
    system = make_system(IMPORTER_KEEP_FAILED_COUNT="1")  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    store = system.store()
    system.post_csv("rej-old", b"sku,quantity\nA,0\n")
    system.wait_state("shipment-rej-old")
    assert store.client.exists(store.keys.rejections("shipment-rej-old")) == 1

    system.post_csv("rej-new", b"sku,quantity\nB,0\n")
    system.wait_state("shipment-rej-new")
    wait_for(lambda: store.client.exists(store.keys.job("shipment-rej-old")) == 0, 10, message="retention")
    assert store.client.exists(store.keys.rejections("shipment-rej-old")) == 0
    assert store.client.exists(store.keys.rejections("shipment-rej-new")) == 1
    assert report_of(system, "shipment-rej-old")[0] == 404


def test_submit_wait_prints_where_the_report_is(system: System, tmp_path: object) -> None:
    path = tmp_path / "bad.csv"  # type: ignore[operator]
    path.write_bytes(b"sku,quantity\nA,0\nB,x\n")
    env = {**system.env, "IMPORTER_API_KEY": system.api_key, "IMPORTER_URL": system.base_url}
    out = subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "submit", str(path), "--batch-id", "rej-cli", "--wait"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    url = f"{system.base_url}/api/imports/shipment-rej-cli/rejections.csv"
    assert f"rejection report (2 issue(s)): {url}" in out.stdout
    assert f"-o rejections.csv {url}" in out.stdout


def test_a_job_failed_for_another_reason_has_no_report(make_system: object) -> None:
    from importer.domain.errors import CsvIssue, PublicError

    store = make_system().store()  # type: ignore[operator]
    store.enqueue(job_id="shipment-rej-x", batch_id="rej-x", owner="owner-a", content_sha256="c" * 64,
                  upload_id="u-rej-x", csv=b"sku,quantity\nA,1\n")
    # A report left behind by an earlier record of the same id (removed by hand) is never served.
    store.client.set(store.keys.rejections("shipment-rej-x"), '{"found":1,"issues":[[2,1,"csv.bad_sku","old","z"]]}')
    assert store.get_owned_rejections("shipment-rej-x", "owner-a") == ("waiting", None)
    error = PublicError.from_code("import.upload_missing")
    assert store.record_failure(job_id="shipment-rej-x", attempt=None, final=True, error=error, diagnostic="",
                                next_attempt_at_ms=None) == "failed"
    assert store.get_owned_rejections("shipment-rej-x", "owner-a") == ("failed", None)
    assert store.client.exists(store.keys.rejections("shipment-rej-x")) == 0  # fail.lua removed it
    assert store.get_owned_rejections("shipment-rej-x", "owner-b") is None

    # The same step with located issues writes the report the read returns.
    store.enqueue(job_id="shipment-rej-y", batch_id="rej-y", owner="owner-a", content_sha256="d" * 64,
                  upload_id="u-rej-y", csv=b"sku,quantity\nA,0\n")
    issues = (CsvIssue(2, 2, "csv.bad_quantity", "quantity '0' is bad", "0"),)
    store.record_failure(job_id="shipment-rej-y", attempt=None, final=True, diagnostic="", next_attempt_at_ms=None,
                         error=PublicError.from_code("csv.bad_quantity", issues, found=3))
    state, report = store.get_owned_rejections("shipment-rej-y", "owner-a")
    assert state == "failed" and report is not None
    assert (report.issues, report.found, report.truncated) == (issues, 3, True)
