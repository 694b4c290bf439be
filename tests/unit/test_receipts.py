"""GET /api/shipments/{batchId}/receipt in process: content negotiation, the
renderings (the same bytes whatever the chunking), owner scoping, streaming,
and the serverless transport's whole-body answer. The store is the dict-backed
fake; the Redis side is tests/integration/test_receipts.py."""

from __future__ import annotations

import io
import json
from typing import Any
from wsgiref.util import setup_testing_defaults
from wsgiref.validate import validator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from importer.domain.receipt import (
    ReceiptLine,
    StoredReceipt,
    encode_receipt,
)
from importer.domain.stock import MAX_STOCK
from importer.handlers import receipts, serverless
from importer.handlers.auth import KeyRing, hash_key
from importer.handlers.receipts import CSV, JSON, negotiate, render_csv, render_json
from importer.handlers.serverless import make_handler

from tests.unit.fakes import StoreDown
from tests.unit.test_http_handlers import (
    KEY_A,
    KEY_B,
    Harness,
    Result,
    assert_problem,
    make_harness,
    shipment,
)

SMALL = encode_receipt([ReceiptLine("WIDGET-RED-01", 0, 10), ReceiptLine("GADGET-BLU-02", 5, 30)])


@pytest.fixture
def h() -> Harness:
    harness = make_harness()
    harness.store.shipments["b-done"] = shipment()
    harness.store.receipts["b-done"] = SMALL
    return harness


def get(h: Harness, batch_id: str = "b-done", *, key: str = KEY_A, accept: str | None = None, method: str = "GET") -> Result:
    """One request through the WSGI app (PEP 3333 validator); a streamed answer has no Content-Length."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": f"/api/shipments/{batch_id}/receipt", "QUERY_STRING": "",
        "wsgi.input": io.BytesIO(b""), "HTTP_AUTHORIZATION": f"Bearer {key}",
    }
    if accept is not None:
        environ["HTTP_ACCEPT"] = accept
    setup_testing_defaults(environ)
    captured: list[Any] = []
    iterable = validator(h.app)(environ, lambda status, headers, exc=None: captured.append((status, headers)))
    try:
        body = b"".join(iterable)
    finally:
        iterable.close()
    status, headers = captured[0]
    result = Result(int(status.split()[0]), tuple(headers), body)
    if method == "GET" and result.header("Content-Length") is not None:
        assert result.header("Content-Length") == str(len(body))
    return result


# -- negotiation ----------------------------------------------------------------------


@pytest.mark.parametrize("accept,chosen", [
    (None, JSON), ("", JSON), ("*/*", JSON), ("application/json", JSON), ("application/*", JSON),
    ("text/csv", CSV), ("text/*", CSV), ("text/csv; charset=utf-8", CSV), ("TEXT/CSV", CSV),
    ("text/csv, */*", CSV), ("application/json, text/csv", JSON), ("text/csv, application/json", JSON),
    ("application/json;q=0.5, text/csv", CSV), ("text/csv;q=0.9, */*;q=1", JSON),
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", JSON),  # a browser
    ("application/xml", None), ("text/html", None), ("application/json;q=0", None),
    ("text/csv;q=0, */*", JSON), ("application/json;q=oops", None), ("text/csv;q=2", None),
])
def test_negotiation(accept: str | None, chosen: str | None) -> None:
    assert negotiate(accept) == chosen


# -- renderings ------------------------------------------------------------------------


receipt_lines = st.lists(
    st.builds(
        lambda sku, before, quantity: ReceiptLine(sku, before, before + quantity),
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", fullmatch=True),
        st.integers(0, MAX_STOCK - 1_000_000),
        st.integers(1, 1_000_000),
    ),
    min_size=1, max_size=60,
)


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, at = [], 0
    for size in sizes:
        pieces.append(data[at:at + size])
        at += size
    return pieces + [data[at:]]


@given(lines=receipt_lines, sizes=st.lists(st.integers(0, 40), max_size=30))
def test_renderings_are_the_same_bytes_whatever_the_chunks(lines: list[ReceiptLine], sizes: list[int]) -> None:
    data = encode_receipt(lines)
    stored = StoredReceipt(shipment(result={"imported": len(lines), "batchId": "b-done"}), len(data), b"")
    whole_json = b"".join(render_json(stored, iter([data])))
    whole_csv = b"".join(render_csv(iter([data])))
    assert b"".join(render_json(stored, iter(cut(data, sizes)))) == whole_json
    assert b"".join(render_csv(iter(cut(data, sizes)))) == whole_csv
    parsed = json.loads(whole_json)
    assert parsed["rows"] == len(lines)
    assert [ReceiptLine(i["sku"], i["before"], i["after"]) for i in parsed["items"]] == lines
    assert whole_csv == b"sku,before,after\n" + "".join(f"{x.sku},{x.before},{x.after}\n" for x in lines).encode()


@pytest.mark.parametrize("bad", [b"A,1,2", b"A,1,2\nB,x,3\n", b'A",1,2\n', b"A,1,0\n", b"#A,1,2\n"])
def test_a_stored_receipt_that_is_not_one_is_never_rendered(bad: bytes) -> None:
    stored = StoredReceipt(shipment(), len(bad), b"")
    with pytest.raises(ValueError):
        b"".join(render_json(stored, iter([bad])))
    with pytest.raises(ValueError):
        b"".join(render_csv(iter([bad])))


# -- through the WSGI app -------------------------------------------------------------


def test_json_by_default(h: Harness) -> None:
    result = get(h)
    assert result.status == 200
    assert result.header("Content-Type") == "application/json"
    assert result.header("Vary") == "Accept"
    assert result.body == (
        b'{"batchId":"b-done","jobId":"shipment-b-done","appliedAt":"2026-01-01T00:00:05+00:00","rows":3,"items":['
        b'{"sku":"WIDGET-RED-01","before":0,"after":10},{"sku":"GADGET-BLU-02","before":5,"after":30}]}'
    )
    assert get(h, accept="*/*").body == result.body == get(h).body


def test_csv_with_accept_text_csv(h: Harness) -> None:
    result = get(h, accept="text/csv")
    assert result.status == 200
    assert result.header("Content-Type") == "text/csv; charset=utf-8"
    assert result.header("Content-Disposition") == 'attachment; filename="receipt-b-done.csv"'
    assert result.body == b"sku,before,after\nWIDGET-RED-01,0,10\nGADGET-BLU-02,5,30\n"


def test_other_media_types_get_406_before_the_store_is_read(h: Harness) -> None:
    body = assert_problem(get(h, accept="application/xml"), 406, "request.not_acceptable")
    assert "text/csv" in body["detail"]
    assert "get_owned_receipt" not in h.store.calls


def test_another_owners_receipt_is_the_same_404_as_a_missing_one(h: Harness) -> None:
    foreign, missing = get(h, key=KEY_B), get(h, "b-never", key=KEY_B)
    assert_problem(foreign, 404, "shipment.not_found")
    assert foreign.body == missing.body
    assert b"b-done" not in foreign.body
    # The same answer as GET /api/shipments/{batchId} for it.
    assert h.call("GET", "/api/shipments/b-done", key=KEY_B).body == foreign.body


def test_a_batch_applied_before_receipts_existed(h: Harness) -> None:
    h.store.shipments["b-old"] = shipment(batch_id="b-old")
    assert_problem(get(h, "b-old"), 404, "receipt.not_recorded")


def test_store_down_is_503(h: Harness) -> None:
    h.store.failure = StoreDown()
    result = get(h)
    assert_problem(result, 503, "service.unavailable")
    assert result.header("Retry-After") == "5"


def large(h: Harness, rows: int = 20_000) -> bytes:
    data = encode_receipt(ReceiptLine(f"SKU-{i:07d}", i, i + 7) for i in range(rows))
    assert len(data) > 2 * receipts.RECEIPT_CHUNK
    h.store.shipments["b-big"] = shipment(batch_id="b-big", result={"imported": rows, "batchId": "b-big"})
    h.store.receipts["b-big"] = data
    return data


def test_a_large_receipt_is_streamed_in_ranges(h: Harness) -> None:
    data = large(h)
    as_json, as_csv = get(h, "b-big"), get(h, "b-big", accept="text/csv")
    assert as_json.status == as_csv.status == 200
    assert as_json.header("Content-Length") is None  # streamed
    assert as_csv.body == b"sku,before,after\n" + "".join(f"SKU-{i:07d},{i},{i + 7}\n" for i in range(20_000)).encode()
    parsed = json.loads(as_json.body)
    assert parsed["rows"] == len(parsed["items"]) == 20_000
    assert parsed["items"][-1] == {"sku": "SKU-0019999", "before": 19999, "after": 20006}
    # Read in ranges of RECEIPT_CHUNK after the first one (which came with the owner check).
    ranges = -(-len(data) // receipts.RECEIPT_CHUNK) - 1
    assert h.store.calls.count("read_receipt") == 2 * ranges
    assert get(h, "b-big").body == as_json.body


def test_head_of_a_streamed_receipt_has_no_body(h: Harness) -> None:
    large(h)
    result = get(h, "b-big", method="HEAD")
    assert result.status == 200 and result.body == b""


def test_a_store_lost_in_mid_stream_cuts_the_transfer(h: Harness) -> None:
    large(h)
    h.store.receipt_failure = (2, StoreDown())
    with pytest.raises(StoreDown):
        get(h, "b-big")


# -- the serverless transport sends it whole --------------------------------------------


def lambda_get(h: Harness, batch_id: str, accept: str = "*/*", method: str = "GET") -> dict[str, Any]:
    keys = KeyRing.parse(f"owner-a:{hash_key(KEY_A)}")
    event = {
        "version": "2.0", "rawPath": f"/api/shipments/{batch_id}/receipt", "rawQueryString": "",
        "headers": {"authorization": f"Bearer {KEY_A}", "accept": accept},
        "requestContext": {"http": {"method": method}}, "isBase64Encoded": False,
    }
    return make_handler(h.api, keys)(event, None)


def test_serverless_collects_a_streamed_receipt_into_one_answer(h: Harness) -> None:
    data = large(h)
    out = lambda_get(h, "b-big", "text/csv")
    assert out["statusCode"] == 200 and out["isBase64Encoded"] is False
    assert out["body"].encode() == get(h, "b-big", accept="text/csv").body
    wsgi = get(h, "b-big")
    assert lambda_get(h, "b-big")["body"].encode() == wsgi.body
    head = lambda_get(h, "b-big", method="HEAD")
    assert head["statusCode"] == 200 and head["body"] == ""


def test_serverless_refuses_a_receipt_over_one_answers_size(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    large(h)
    monkeypatch.setattr(serverless, "MAX_WHOLE_BODY", 100_000)
    out = lambda_get(h, "b-big", "text/csv")
    assert out["statusCode"] == 501 and json.loads(out["body"])["code"] == "response.too_large"


def test_serverless_store_lost_while_collecting_is_503(h: Harness) -> None:
    large(h)
    h.store.receipt_failure = (1, StoreDown())
    out = lambda_get(h, "b-big")
    assert out["statusCode"] == 503 and out["headers"]["Retry-After"] == "5"
    assert json.loads(out["body"])["code"] == "service.unavailable"


def test_a_corrupt_stored_receipt_is_a_500_never_a_wrong_answer(h: Harness) -> None:
    h.store.shipments["b-bad"] = shipment(batch_id="b-bad")
    h.store.receipts["b-bad"] = b"A,1,2\nB,x,3\n"
    assert_problem(get(h, "b-bad"), 500, "internal")
    data = large(h)
    h.store.receipts["b-big"] = data + b"not a line\n"
    out = lambda_get(h, "b-big")
    assert out["statusCode"] == 500 and json.loads(out["body"])["code"] == "internal"
