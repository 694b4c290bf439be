"""The rejection report: the CSV writer (RFC 4180, spreadsheet-safe) and
GET /api/imports/{jobId}/rejections.csv through the real WSGI app with the
fake store (handlers/rejections.py)."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from importer.domain.errors import CsvIssue, PublicError
from importer.domain.jobs import RejectionReport
from importer.domain.shipment import MAX_ISSUES, MAX_VALUE_CHARS, parse_shipment
from importer.handlers.rejections import (
    FORMULA_STARTS,
    HEADER,
    TRUNCATED_CODE,
    rejections_csv,
    spreadsheet_safe,
)

from tests.unit.test_http_handlers import (
    KEY_B,
    Harness,
    assert_problem,
    make_harness,
    record,
)

DANGEROUS = ("=", "+", "-", "@", "\t", "\r")


def rows_of(body: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(body.decode("utf-8"), newline="")))


def report(*issues: CsvIssue, found: int | None = None) -> RejectionReport:
    return RejectionReport("shipment-b-1", tuple(issues), len(issues) if found is None else found)


# -- the writer ---------------------------------------------------------------


def test_header_then_one_row_per_issue_crlf_terminated() -> None:
    body = rejections_csv(report(
        CsvIssue(3, 2, "csv.bad_quantity", "quantity 'x' is not a whole number from 1 to 1000000", "x"),
        CsvIssue(5, None, "csv.bad_row", "3 columns, expected 2", 'A,"1",2'),
    ))
    assert body == (
        b"line,column,code,message,value\r\n"
        b"3,2,csv.bad_quantity,quantity 'x' is not a whole number from 1 to 1000000,x\r\n"
        b'5,,csv.bad_row,"3 columns, expected 2","A,""1"",2"\r\n'
    )


def test_formula_cells_are_neutralised() -> None:
    cells = ['=HYPERLINK("http://evil.example","click")', "@SUM(A1:A9)", "+1", "-1", "\t=1", "\r=1", "\uff1d1+1"]
    body = rejections_csv(report(*(CsvIssue(i + 2, 1, "csv.bad_sku", "SKU is not valid", v) for i, v in enumerate(cells))))
    values = [row[4] for row in rows_of(body)[1:]]
    assert values == ["'" + v for v in cells]
    # The text is unchanged after the quote: a person sees what the file held.
    assert spreadsheet_safe("plain-SKU") == "plain-SKU" and spreadsheet_safe("") == ""


def test_a_cut_report_ends_with_a_note_row() -> None:
    issues = [CsvIssue(i, 2, "csv.bad_quantity", "bad", "0") for i in range(2, 7)]
    rows = rows_of(rejections_csv(report(*issues, found=30_000)))
    assert len(rows) == 1 + 5 + 1
    assert rows[-1][:3] == ["", "", TRUNCATED_CODE]
    assert "30000 issues found" in rows[-1][3] and "first 5" in rows[-1][3]
    uncut = rows_of(rejections_csv(report(*issues)))
    assert len(uncut) == 1 + 5 and uncut[-1][2] != TRUNCATED_CODE


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(1, 10**6), st.sampled_from([None, 1, 2]), _text, _text, _text), max_size=20))
def test_any_issue_text_round_trips_and_no_cell_starts_a_formula(raw: list[tuple[int, int | None, str, str, str]]) -> None:
    issues = [CsvIssue(line, column, code, message, value) for line, column, code, message, value in raw]
    rows = rows_of(rejections_csv(report(*issues)))
    assert rows[0] == list(HEADER)
    assert len(rows) == 1 + len(issues)
    for row, issue in zip(rows[1:], issues):
        assert len(row) == 5
        assert row[0] == str(issue.line) and row[1] == ("" if issue.column is None else str(issue.column))
        for cell, text in zip(row[2:], (issue.code, issue.message, issue.value)):
            assert not cell.startswith(FORMULA_STARTS), cell
            # Round trip: the cell is the text, or the text behind one added quote.
            assert cell == text or (cell == "'" + text and text.startswith(FORMULA_STARTS))


@settings(max_examples=100)
@given(st.lists(st.sampled_from(["=1", "+1", "-1", "@A", "\t", "A,1", "\"x\"", "B,0", "C", ",", "é", "=A,1"]), max_size=40))
def test_any_parsed_file_gives_a_report_without_a_formula(lines: list[str]) -> None:
    parsed = parse_shipment(("sku,quantity\n" + "\n".join(lines)).encode())
    if not hasattr(parsed, "issues"):
        return
    error = PublicError.from_code(parsed.code, parsed.issues, parsed.truncated, parsed.found)
    rows = rows_of(rejections_csv(RejectionReport("j", error.issues, error.issues_found)))
    assert len(rows) == 1 + len(parsed.issues)
    for row in rows[1:]:
        assert not any(cell.startswith(DANGEROUS) for cell in row), row


# -- the bound as the job record shows it --------------------------------------


def test_the_job_record_keeps_100_issues_inline_and_the_report_size() -> None:
    data = b"sku,quantity\n" + b"".join(f"S{i},0\n".encode() for i in range(MAX_ISSUES + 500))
    parsed = parse_shipment(data, max_rows=MAX_ISSUES * 2)
    error = PublicError.from_code(parsed.code, parsed.issues, parsed.truncated, parsed.found).to_dict()
    assert len(error["issues"]) == 100 and error["issuesTruncated"] is True
    assert error["issues"][0] == {"line": 2, "column": 2, "code": "csv.bad_quantity",
                                  "message": "quantity '0' is not a whole number from 1 to 1000000"}
    assert error["rejections"] == {"found": MAX_ISSUES + 500, "listed": MAX_ISSUES, "truncated": True}
    assert MAX_VALUE_CHARS == 100


def test_a_small_failure_lists_everything_inline_too() -> None:
    parsed = parse_shipment(b"sku,quantity\nA,0\nB,x\n")
    error = PublicError.from_code(parsed.code, parsed.issues, parsed.truncated, parsed.found).to_dict()
    assert error["issuesTruncated"] is False and len(error["issues"]) == 2
    assert error["rejections"] == {"found": 2, "listed": 2, "truncated": False}
    assert "rejections" not in PublicError.from_code("batch.conflict").to_dict()


# -- the route ---------------------------------------------------------------


@pytest.fixture
def h() -> Harness:
    return make_harness()


def _failed(h: Harness, job_id: str = "shipment-b-err") -> None:
    error = PublicError.from_code("csv.bad_quantity", (CsvIssue(2, 2, "csv.bad_quantity", "bad", "-1"),)).to_dict()
    h.store.jobs[job_id] = record(id=job_id, state="failed", result=None, progress=None, error=error)
    h.store.rejections[job_id] = report(CsvIssue(2, 2, "csv.bad_quantity", "bad", "-1"))


def test_the_owner_gets_the_csv(h: Harness) -> None:
    _failed(h)
    result = h.call("GET", "/api/imports/shipment-b-err/rejections.csv")
    assert result.status == 200
    assert result.header("Content-Type") == "text/csv; charset=utf-8; header=present"
    assert result.header("Content-Disposition") == 'attachment; filename="shipment-b-err-rejections.csv"'
    assert result.header("Cache-Control") == "no-store"
    assert rows_of(result.body) == [list(HEADER), ["2", "2", "csv.bad_quantity", "bad", "'-1"]]


def test_the_job_record_links_to_its_report(h: Harness) -> None:
    _failed(h)
    error = h.get_job("shipment-b-err").json()["error"]
    assert error["rejections"] == {
        "found": 1, "listed": 1, "truncated": False, "url": "/api/imports/shipment-b-err/rejections.csv",
    }
    assert error["issues"] == [{"line": 2, "column": 2, "code": "csv.bad_quantity", "message": "bad"}]


def test_another_owner_gets_the_same_404_as_a_missing_job(h: Harness) -> None:
    _failed(h)
    foreign = h.call("GET", "/api/imports/shipment-b-err/rejections.csv", key=KEY_B)
    missing = h.call("GET", "/api/imports/shipment-b-none/rejections.csv", key=KEY_B)
    status_404 = h.get_job("shipment-b-none", key=KEY_B)
    assert_problem(foreign, 404, "job.not_found")
    assert foreign.body == missing.body == status_404.body


def test_a_job_without_rejections_is_404_rejections_not_found(h: Harness) -> None:
    h.store.jobs["shipment-b-ok"] = record(id="shipment-b-ok")
    h.store.jobs["shipment-b-wait"] = record(id="shipment-b-wait", state="waiting", result=None, progress=None)
    for job_id in ("shipment-b-ok", "shipment-b-wait"):
        assert_problem(h.call("GET", f"/api/imports/{job_id}/rejections.csv"), 404, "rejections.not_found")


def test_the_dot_of_the_path_is_literal(h: Harness) -> None:
    _failed(h)
    assert h.call("GET", "/api/imports/shipment-b-err/rejectionsXcsv").status == 404
    assert h.call("HEAD", "/api/imports/shipment-b-err/rejections.csv").status == 200
