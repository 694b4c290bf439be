"""A cut upload is never applied, on every server and at every cut point;
nor is any shipment of a cut bulk request (NDJSON cut inside a line or on a
line boundary).

Raw sockets against real servers (granian through ``importer serve``, the
default; gunicorn; waitress through the documented factory) with a real worker
and Redis, and the Lambda handler through its real composition root. Each
request is cut at one point of its framing and the client then half-closes
(shuts its write side and reads the answer) or closes at once. Afterwards no
cut batch has a record, the stock is untouched, and the whole file sent again
is applied once, with every row.

granian's WSGI body reader cannot tell a cut chunked body from a whole one
(docs/granian-chunked-body.md): there a chunked POST is refused before its
body is read (``411 request.length_required``) unless it carries a
``Content-Digest``, which then proves it whole or refuses it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.support import System, wait_for
from tests.integration.test_bulk import multipart_body

pytestmark = pytest.mark.integration

ROWS = 100
FULL = b"sku,quantity\n" + b"".join(f"CUT-{n:03d},{100 + n}\n".encode() for n in range(ROWS))
SKUS = [f"CUT-{n:03d}" for n in range(ROWS)]
HALF = len(FULL) // 2
REST = len(FULL) - HALF
IN_A_NUMBER = FULL.index(b"CUT-050,150") + len(b"CUT-050,1")  # "...CUT-050,1" then nothing


def digest_of(data: bytes) -> str:
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


#: name -> (framing header, the bytes sent after the header block). Every one
#: is cut: the request as sent never ends.
CUTS: dict[str, tuple[str, bytes]] = {
    "length-short": (f"Content-Length: {len(FULL)}", FULL[:HALF]),
    "length-in-a-number": (f"Content-Length: {len(FULL)}", FULL[:IN_A_NUMBER]),
    "chunk-mid-chunk": ("Transfer-Encoding: chunked", f"{len(FULL):x}\r\n".encode() + FULL[:HALF]),
    "chunk-between-chunks": ("Transfer-Encoding: chunked", _chunk(FULL[:HALF])),
    "chunk-after-size-line": ("Transfer-Encoding: chunked", _chunk(FULL[:HALF]) + f"{REST:x}\r\n".encode()),
    "chunk-no-last-chunk": ("Transfer-Encoding: chunked", _chunk(FULL[:HALF]) + _chunk(FULL[HALF:])),
    "chunk-in-last-chunk": ("Transfer-Encoding: chunked", _chunk(FULL) + b"0\r\n"),
    "chunk-in-trailer": ("Transfer-Encoding: chunked", _chunk(FULL) + b"0\r\nX-Shipment-Checksum: ab"),
}

#: What each server answers to each cut, half-closed (None: it closes without
#: an answer, having never called the app).
def expected(server: str, name: str) -> tuple[int, str] | None:
    chunked = name.startswith("chunk")
    if server == "granian":
        return (411, "request.length_required") if chunked else (400, "request.incomplete")
    if server == "waitress":
        return None
    return (400, "request.incomplete")


def _port(system: System) -> int:
    return int(system.base_url.rsplit(":", 1)[1])


def _head(system: System, batch_id: str, framing: str, extra: str = "") -> bytes:
    return (
        f"POST /api/imports?batchId={batch_id} HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
        f"Authorization: Bearer {system.api_key}\r\n{framing}\r\n{extra}\r\n"
    ).encode()


def _answer(sock: socket.socket, timeout: float = 15) -> bytes:
    """What the server sends until it closes, goes silent, or one answer is whole."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            piece = sock.recv(65536)
            if not piece:
                return data
            data += piece
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                if lengths and len(rest) >= lengths[0]:
                    return data
    except (TimeoutError, ConnectionResetError):
        return data


def send_cut(system: System, request: bytes, mode: str) -> tuple[int, str] | None:
    """Send ``request`` and end the connection: ``half-close`` reads the answer
    (status, code), ``close`` gives none; ``open`` (for a whole request) reads
    the answer with the connection left open (granian's hyper drops the answer
    to a whole request whose client half-closed: it does not support half-closes)."""
    with socket.create_connection(("127.0.0.1", _port(system)), timeout=30) as sock:
        sock.sendall(request)
        if mode == "close":
            return None
        if mode == "half-close":
            sock.shutdown(socket.SHUT_WR)
        answer = _answer(sock)
    if not answer:
        return None
    status = int(answer.split(b" ", 2)[1])
    body = answer.partition(b"\r\n\r\n")[2]
    code = json.loads(body).get("code", "") if body.startswith(b"{") else ""
    return status, code


def assert_applied_once_in_full(system: System, batch_ids: list[str], whole_batch: str) -> None:
    """No cut batch recorded, stock untouched; then the whole file, once."""
    time.sleep(1.0)  # a server still busy with a closed connection would record now
    for batch in batch_ids:
        assert system.request("GET", f"/api/imports/shipment-{batch}")[0] == 404, batch
    assert system.store().generation() == 0
    assert system.store().stock_of(SKUS) == {sku: 0 for sku in SKUS}
    assert system.post_csv(whole_batch, FULL)[0] == 202
    record = system.wait_state(f"shipment-{whole_batch}")
    assert (record["state"], record["result"]["imported"]) == ("completed", ROWS), record
    time.sleep(0.5)
    assert system.store().stock_of(SKUS) == {sku: 100 + n for n, sku in enumerate(SKUS)}
    assert system.store().generation() == 1


@pytest.fixture(params=["granian", "gunicorn", "waitress"])
def server(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def served(make_system: Any, server: str) -> System:
    system: System = make_system(IMPORTER_RATE_LIMIT="0")
    system.start_worker()
    system.start_http(server=server)
    return system


@pytest.mark.parametrize("mode", ["half-close", "close"])
def test_no_cut_upload_is_applied_and_the_whole_file_then_applies_once(served: System, server: str, mode: str) -> None:
    s = served
    answers: dict[str, tuple[int, str] | None] = {}
    for name, (framing, sent) in CUTS.items():
        answers[name] = send_cut(s, _head(s, name, framing) + sent, mode)
    print(f"[cut] {server} {mode}: {answers}")
    if mode == "half-close":
        wanted = {name: expected(server, name) for name in CUTS}
        assert {name: answers[name] for name in CUTS} == wanted
    assert_applied_once_in_full(s, list(CUTS), "length-short")
    if mode == "half-close" and server != "waitress":
        http = next(p for p in s.procs if p.name == "http")
        assert "http.body_incomplete" in http.log()


def test_a_whole_chunked_body_with_a_malformed_trailer_is_refused_or_applied_whole(served: System, server: str) -> None:
    """All its data chunks and its last chunk arrived; only the trailer section
    is malformed. gunicorn refuses it (400), granian refuses every chunked body
    without a digest (411), waitress ignores trailers and takes it: whole."""
    s = served
    request = _head(s, "bad-trailer", "Transfer-Encoding: chunked") + _chunk(FULL) + b"0\r\nnot a trailer line\r\n\r\n"
    answer = send_cut(s, request, "half-close")
    print(f"[cut] {server} bad trailer: {answer}")
    assert answer in {"granian": [(411, "request.length_required")], "gunicorn": [(400, "request.incomplete")],
                      "waitress": [(202, ""), None]}[server]
    time.sleep(1.0)
    if answer is None or answer[0] != 202:
        assert s.request("GET", "/api/imports/shipment-bad-trailer")[0] == 404
        assert s.store().generation() == 0
        return
    record = s.wait_state("shipment-bad-trailer")
    assert (record["state"], record["result"]["imported"]) == ("completed", ROWS), record
    assert s.store().stock_of(SKUS) == {sku: 100 + n for n, sku in enumerate(SKUS)}
    assert s.store().generation() == 1


def test_granian_takes_a_chunked_upload_its_content_digest_proves_whole(make_system: Any) -> None:
    s: System = make_system(IMPORTER_RATE_LIMIT="0")
    s.start_worker()
    s.start_http(server="granian")
    digest = f"Content-Digest: {digest_of(FULL)}\r\n"
    cut = {
        "digest-mid-chunk": f"{len(FULL):x}\r\n".encode() + FULL[:HALF],
        "digest-between-chunks": _chunk(FULL[:HALF]),
        "digest-after-size-line": _chunk(FULL[:HALF]) + f"{REST:x}\r\n".encode(),
    }
    for name, sent in cut.items():
        for mode in ("half-close", "close"):
            answer = send_cut(s, _head(s, name, "Transfer-Encoding: chunked", digest) + sent, mode)
            if mode == "half-close":
                assert answer == (400, "request.digest_mismatch"), (name, answer)
    assert send_cut(s, _head(s, "digest-bad", "Transfer-Encoding: chunked", "Content-Digest: md5=:abc=:\r\n")
                    + _chunk(FULL) + b"0\r\n\r\n", "open") == (400, "request.bad_digest")
    assert_applied_once_in_full(s, [*cut, "digest-bad"], "digest-mid-chunk")
    # Every byte arrived and the digest proves it, whether or not the last
    # chunk did: taken, and it is the same shipment again (nothing added).
    for sent, mode in ((_chunk(FULL[:HALF]) + _chunk(FULL[HALF:]) + b"0\r\n\r\n", "open"),
                       (_chunk(FULL[:HALF]) + _chunk(FULL[HALF:]), "half-close")):
        answer = send_cut(s, _head(s, "digest-mid-chunk", "Transfer-Encoding: chunked", digest) + sent, mode)
        assert answer == (202, ""), (mode, answer)
    time.sleep(0.5)
    assert s.store().generation() == 1
    assert s.store().stock_of(SKUS) == {sku: 100 + n for n, sku in enumerate(SKUS)}


# -- the Lambda handler, through its real composition root ------------------------------


@pytest.fixture
def lambda_handler(make_system: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[System, Any]]:
    from importer.adapters.processes import aws_lambda as lambda_entry

    system: System = make_system(IMPORTER_RATE_LIMIT="0")
    for name in list(os.environ):
        if name.startswith("IMPORTER_"):
            monkeypatch.delenv(name)
    for name, value in system.env.items():
        if name.startswith("IMPORTER_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(lambda_entry, "_deployed", None)
    try:
        yield system, lambda_entry.handler
    finally:
        deployed = lambda_entry._deployed
        if deployed is not None:
            deployed.side.close()


def _event(system: System, batch_id: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "version": "2.0", "rawPath": "/api/imports", "rawQueryString": f"batchId={batch_id}",
        "headers": {"content-type": "text/csv", "authorization": f"Bearer {system.api_key}", **headers},
        "requestContext": {"http": {"method": "POST", "path": "/api/imports"}},
        "body": base64.b64encode(body).decode(), "isBase64Encoded": True,
    }


def test_the_lambda_handler_refuses_a_body_it_cannot_prove_whole(lambda_handler: tuple[System, Any]) -> None:
    s, handler = lambda_handler
    cases = {
        "lambda-length-short": (FULL[:HALF], {"content-length": str(len(FULL))}),
        "lambda-length-in-a-number": (FULL[:IN_A_NUMBER], {"content-length": str(len(FULL))}),
        "lambda-digest-short": (FULL[:HALF], {"content-digest": digest_of(FULL)}),
        "lambda-digest-chunked": (FULL[:HALF], {"content-digest": digest_of(FULL), "transfer-encoding": "chunked"}),
    }
    answers = {}
    for name, (body, headers) in cases.items():
        out = handler(_event(s, name, body, headers), None)
        answers[name] = (out["statusCode"], json.loads(out["body"])["code"])
    assert answers == {
        "lambda-length-short": (400, "request.incomplete"),
        "lambda-length-in-a-number": (400, "request.incomplete"),
        "lambda-digest-short": (400, "request.digest_mismatch"),
        "lambda-digest-chunked": (400, "request.digest_mismatch"),
    }
    s.start_worker()
    s.start_http()
    for name in cases:
        assert s.request("GET", f"/api/imports/shipment-{name}")[0] == 404
    out = handler(_event(s, "lambda-length-short", FULL, {"content-length": str(len(FULL)), "content-digest": digest_of(FULL)}), None)
    assert out["statusCode"] == 202, out
    record = s.wait_state("shipment-lambda-length-short")
    assert (record["state"], record["result"]["imported"]) == ("completed", ROWS)
    assert s.store().stock_of(SKUS) == {sku: 100 + n for n, sku in enumerate(SKUS)}
    wait_for(lambda: s.store().generation() == 1, 5, message="one application")


#: A bulk request (NDJSON) of 5 shipments; each cut below is on a line boundary
#: or inside a line: a body that ends at a line boundary is still cut.
BULK_LINES = [json.dumps({"batchId": f"bulk-cut-{n}", "csv": f"sku,quantity\nCUT-{n:03d},{n + 1}\n"}).encode() + b"\n"
              for n in range(5)]
#: The same 5 shipments as multipart/form-data files (`curl -F file=@bulk-cut-0.csv ...`), cut at a part's end or inside one.
BULK_FILES = [(f"bulk-cut-{n}.csv", f"sku,quantity\nCUT-{n:03d},{n + 1}\n".encode()) for n in range(5)]
#: kind -> (the whole body, its Content-Type, the offset after its second shipment)
BULK_BODIES: dict[str, tuple[bytes, str, int]] = {
    "ndjson": (b"".join(BULK_LINES), "application/x-ndjson", len(BULK_LINES[0]) + len(BULK_LINES[1])),
}
_MULTIPART, _MULTIPART_TYPE = multipart_body(BULK_FILES)
BULK_BODIES["multipart"] = (_MULTIPART, _MULTIPART_TYPE, _MULTIPART.index(b"--importer-test-boundary", 10))


def bulk_cuts(body: bytes, after_two: int) -> dict[str, tuple[str, bytes]]:
    return {
        "length-mid-line": (f"Content-Length: {len(body)}", body[:after_two + 10]),
        "length-between-lines": (f"Content-Length: {len(body)}", body[:after_two]),
        "chunk-between-lines": ("Transfer-Encoding: chunked", _chunk(body[:after_two])),
        "chunk-no-last-chunk": ("Transfer-Encoding: chunked", _chunk(body[:after_two]) + _chunk(body[after_two:])),
    }


@pytest.mark.parametrize("kind", sorted(BULK_BODIES))
@pytest.mark.parametrize("mode", ["half-close", "close"])
def test_no_cut_bulk_records_a_shipment_and_the_whole_bulk_then_applies_once(
    served: System, server: str, mode: str, kind: str,
) -> None:
    s = served
    body, ctype, after_two = BULK_BODIES[kind]
    cuts = bulk_cuts(body, after_two)
    answers = {}
    for name, (framing, sent) in cuts.items():
        head = (f"POST /api/imports/bulk HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
                f"Authorization: Bearer {s.api_key}\r\n{framing}\r\n\r\n").encode()
        answers[name] = send_cut(s, head + sent, mode)
    print(f"[cut] bulk {kind} {server} {mode}: {answers}")
    if mode == "half-close":
        assert answers == {name: expected(server, name) for name in cuts}
    time.sleep(1.0)  # a server still busy with a closed connection would record now
    for n in range(len(BULK_LINES)):
        assert s.request("GET", f"/api/imports/shipment-bulk-cut-{n}")[0] == 404, n
    assert s.store().generation() == 0
    status, _, raw = s.request("POST", "/api/imports/bulk", body=body, ctype=ctype,
                               headers={"Content-Digest": digest_of(body)})
    assert status == 200 and [r["status"] for r in json.loads(raw)["results"]] == [202] * len(BULK_LINES), raw
    for n in range(len(BULK_LINES)):
        assert s.wait_state(f"shipment-bulk-cut-{n}")["state"] == "completed"
    assert s.store().stock_of([f"CUT-{n:03d}" for n in range(5)]) == {f"CUT-{n:03d}": n + 1 for n in range(5)}
    assert s.store().generation() == len(BULK_LINES)
