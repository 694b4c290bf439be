"""POST /api/imports/bulk through the real processes: each line gets what a
single POST of it would get, in order; every rule holds per shipment (the
key's locations, declared locations, the rate limit, the size); one bad line
never blocks the others; the same body sent again records nothing twice;
`importer submit` sends a folder with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from importer.handlers.auth import hash_key, new_key
from tests.integration.support import ROOT, System

pytestmark = pytest.mark.integration


def line(batch: str, rows: dict[str, int], location: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"batchId": batch, "csv": "sku,quantity\n" + "".join(f"{s},{q}\n" for s, q in rows.items())}
    if location:
        body["location"] = location
    return body


def bulk(system: System, lines: list[Any], key: str | None = None) -> tuple[int, Any]:
    raw = b"".join((json.dumps(item) if not isinstance(item, bytes) else item.decode()).encode() + b"\n" for item in lines)
    status, _, body = system.request("POST", "/api/imports/bulk", body=raw, ctype="application/x-ndjson",
                                     key=key or system.api_key)
    return status, json.loads(body)


def multipart_body(files: list[tuple[str | None, bytes]], boundary: str = "importer-test-boundary") -> tuple[bytes, str]:
    """A multipart/form-data body of ``files`` ((file name or None, bytes), one part each, as `curl -F
    file=@NAME` writes them) and its Content-Type."""
    out = b""
    for name, data in files:
        disposition = 'form-data; name="file"' + (f'; filename="{name}"' if name is not None else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: text/csv\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def single(system: System, item: dict[str, Any], key: str | None = None) -> tuple[int, Any]:
    status, _, body = system.request("POST", "/api/imports", body=json.dumps(item).encode(), ctype="application/json",
                                     key=key or system.api_key)
    return status, json.loads(body)


def test_each_line_gets_what_a_single_post_would_and_nothing_applies_twice(make_system: Any) -> None:
    system: System = make_system()
    paris_only = new_key()
    system.env_overrides["IMPORTER_API_KEYS"] = (
        f"owner-a:{hash_key(system.api_key)},owner-b:{hash_key(system.other_key)},"
        f"paris-desk:{hash_key(paris_only)} locations=paris"
    )
    system.start_http()
    system.start_worker()
    assert single(system, line("b-taken", {"X-1": 1}), key=system.other_key)[0] == 202
    lines: list[Any] = [
        line("b-1", {"BULK-A": 1, "BULK-B": 2}),
        line("b-2", {"BULK-A": 10}, "paris"),
        line("b-taken", {"X-1": 1}),                # another producer's batchId
        line("b-1", {"BULK-A": 1, "BULK-B": 2}),    # the same line again in one bulk: the same job
        line("b-far", {"BULK-A": 1}, "atlantis"),   # no operator declared it
        {"batchId": "bad id", "csv": "sku,quantity\nA,1\n"},
        b"{not json",
        line("b-3", {"BULK-C": 3}),
    ]
    status, answer = bulk(system, lines)
    assert status == 200
    got = [(r["status"], r["body"].get("code") or r["body"]["jobId"]) for r in answer["results"]]
    assert got == [
        (202, "shipment-b-1"), (202, "shipment-b-2@paris"), (409, "batch.conflict"), (202, "shipment-b-1"),
        (404, "location.not_found"), (422, "request.invalid"), (400, "request.bad_json"), (202, "shipment-b-3"),
    ]
    # Exactly a single POST's bodies (a known job's 202, a refusal's problem); a job's state may have moved on.
    def same(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != "state"}

    for item, result in zip(lines, answer["results"]):
        if isinstance(item, dict) and item["batchId"] != "bad id":
            status, body = single(system, item)
            assert (status, same(body)) == (result["status"], same(result["body"])), item
    for job in ("shipment-b-1", "shipment-b-2@paris", "shipment-b-3"):
        assert system.wait_state(job, ("completed",))["state"] == "completed"

    # Sent again whole (a client that lost the answer): every shipment once.
    again = bulk(system, lines)[1]["results"]
    assert [r["status"] for r in again] == [r["status"] for r in answer["results"]]
    store = system.store()
    assert store.stock_of(["BULK-A", "BULK-B", "BULK-C"]) == {"BULK-A": 1, "BULK-B": 2, "BULK-C": 3}
    assert store.stock_of(["BULK-A"], location="paris") == {"BULK-A": 10}

    # A key for paris only: its lines elsewhere are refused, its paris line taken.
    results = bulk(system, [line("p-1", {"P": 1}, "paris"), line("p-2", {"P": 1})], key=paris_only)[1]["results"]
    assert [(r["status"], r["body"].get("code")) for r in results] == [(202, None), (404, "location.not_found")]


def test_a_multipart_bulk_names_each_file_s_shipment_after_the_file(make_system: Any) -> None:
    """`curl -F file=@a.csv -F file=@b.csv .../api/imports/bulk`: each file is a
    single text/csv POST of it, under its file name's batchId and the bulk's
    ?location=; one bad part never blocks the others; the same body again
    records nothing twice; a body without its closing delimiter records nothing."""
    system: System = make_system()
    system.start_http()
    system.start_worker()
    files: list[tuple[str | None, bytes]] = [
        ("mp-1.csv", b"sku,quantity\nMP-A,1\nMP-B,2\n"),
        ("C:\\exports\\mp-2.csv", b"sku,quantity\nMP-A,10\n"),  # a client that sends the whole path
        ("bad id.csv", b"sku,quantity\nMP-A,100\n"),
        (None, b"sku,quantity\nMP-A,1000\n"),                      # a form field, not a file
        ("mp-1.csv", b"sku,quantity\nMP-A,1\nMP-B,2\n"),          # the same file twice: the same job
        ("mp-1.csv", b"sku,quantity\nMP-A,5\n"),                   # its name, other content: a conflict
    ]
    body, ctype = multipart_body(files)
    status, _, raw = system.request("POST", "/api/imports/bulk", body=body, ctype=ctype)
    assert status == 200, raw
    results = json.loads(raw)["results"]
    got = [(r["status"], r["body"].get("code") or r["body"]["jobId"]) for r in results]
    assert got == [
        (202, "shipment-mp-1"), (202, "shipment-mp-2"), (422, "request.invalid"), (422, "request.invalid"),
        (202, "shipment-mp-1"), (409, "batch.conflict"),
    ]
    assert set(results[2]["body"]["fields"]) == {"batchId"} and set(results[3]["body"]["fields"]) == {"filename"}
    # Exactly what a single text/csv POST of the file answers.
    status, _, single_raw = system.request("POST", "/api/imports?batchId=mp-1", body=files[5][1], ctype="text/csv")
    assert (status, json.loads(single_raw)) == (results[5]["status"], results[5]["body"])
    for job in ("shipment-mp-1", "shipment-mp-2"):
        assert system.wait_state(job, ("completed",))["state"] == "completed"
    status, _, raw = system.request("POST", "/api/imports/bulk", body=body, ctype=ctype)  # the answer was lost: again
    assert [r["status"] for r in json.loads(raw)["results"]] == [r["status"] for r in results]
    # ?location= names every file's location.
    paris, ctype = multipart_body([("mp-3.csv", b"sku,quantity\nMP-A,7\n")])
    status, _, raw = system.request("POST", "/api/imports/bulk?location=paris", body=paris, ctype=ctype)
    assert [r["body"]["jobId"] for r in json.loads(raw)["results"]] == ["shipment-mp-3@paris"]
    assert system.wait_state("shipment-mp-3@paris", ("completed",))["state"] == "completed"
    store = system.store()
    assert store.stock_of(["MP-A", "MP-B"]) == {"MP-A": 11, "MP-B": 2}
    assert store.stock_of(["MP-A"], location="paris") == {"MP-A": 7}
    assert store.generation() == 2  # at main: mp-1 and mp-2, each applied once

    # A body cut at a part's end, its Content-Length honest: no closing delimiter, nothing recorded.
    whole, ctype = multipart_body([("mp-cut-1.csv", b"sku,quantity\nMP-C,1\n"), ("mp-cut-2.csv", b"sku,quantity\nMP-C,2\n")])
    cut = whole[:whole.index(b"--importer-test-boundary", 10)]
    status, _, raw = system.request("POST", "/api/imports/bulk", body=cut, ctype=ctype)
    assert status == 422 and set(json.loads(raw)["fields"]) == {"body"}, raw
    assert system.get_job("shipment-mp-cut-1")[0] == 404
    # No boundary, or more parts than a bulk takes: the whole request is refused, clearly.
    status, _, raw = system.request("POST", "/api/imports/bulk", body=whole, ctype="multipart/form-data")
    assert status == 422 and json.loads(raw)["code"] == "request.invalid"
    many, ctype = multipart_body([(f"mp-many-{n}.csv", b"sku,quantity\nMP-D,1\n") for n in range(1001)])
    status, _, raw = system.request("POST", "/api/imports/bulk", body=many, ctype=ctype)
    assert status == 422 and "1000" in json.loads(raw)["fields"]["body"][0]
    assert system.get_job("shipment-mp-many-0")[0] == 404
    # ?batchId= would name one shipment of many: the whole request is refused, saying why, for every body kind.
    for kind_body, kind in ((paris, ctype), (json.dumps(line("q-1", {"Q": 1})).encode() + b"\n", "application/x-ndjson")):
        status, _, raw = system.request("POST", "/api/imports/bulk?batchId=mp-4", body=kind_body, ctype=kind)
        assert status == 422 and set(json.loads(raw)["fields"]) == {"batchId"}, raw
    assert system.get_job("shipment-mp-3")[0] == 404 and system.get_job("shipment-q-1")[0] == 404  # mp-3 is at paris only


def test_the_rate_limit_counts_each_shipment_and_the_bounds_are_clear(make_system: Any) -> None:
    system: System = make_system(IMPORTER_RATE_LIMIT="3", IMPORTER_RATE_WINDOW="60")
    system.start_http()
    status, answer = bulk(system, [line(f"r-{n}", {"R": 1}) for n in range(5)])
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [202, 202, 202, 429, 429]
    assert all(r["retryAfter"] >= 1 for r in answer["results"][3:])

    status, problem = bulk(system, [])
    assert status == 422 and problem["code"] == "request.invalid"
    # The cut-body proof is the whole request's: a body that does not match its digest records nothing.
    raw = json.dumps(line("d-1", {"D": 1})).encode() + b"\n"
    status, _, answer = system.request("POST", "/api/imports/bulk", body=raw, ctype="application/x-ndjson",
                                       headers={"Content-Digest": "sha-256=:" + "A" * 43 + "=:"})
    assert status == 400 and json.loads(answer)["code"] == "request.digest_mismatch"
    assert system.get_job("shipment-d-1")[0] == 404
    # The contract door, per shipment: live workers none of which reads this server's version.
    doored: System = make_system()
    doored.start_worker(IMPORTER_ACCEPTED_VERSIONS="2")
    doored.start_http()
    status, answer = bulk(doored, [line(f"v-{n}", {"V": 1}) for n in range(2)])
    assert [(r["status"], r["body"]["code"]) for r in answer["results"]] == [(503, "contract.no_worker")] * 2
    status, _, raw = system.request("POST", "/api/imports/bulk", body=b'{"batchId": "x", "csv": "a"}\n', ctype="application/json")
    assert status == 422 and "shipments" in json.loads(raw)["fields"]  # the JSON form is {"shipments": [...]}
    status, _, raw = system.request("POST", "/api/imports/bulk", body=b"sku,quantity\nA,1\n", ctype="text/csv")
    assert status == 415 and json.loads(raw)["code"] == "request.unsupported_media_type"


def test_importer_submit_sends_a_folder_in_one_bulk_request(make_system: Any, tmp_path: Path) -> None:
    system: System = make_system()
    system.start_http()
    system.start_worker()
    folder = tmp_path / "day-close"
    folder.mkdir()
    for n in range(3):
        (folder / f"close-{n}.csv").write_text(f"sku,quantity\nCLOSE-{n},{n + 1}\n")
    (folder / "notes.txt").write_text("not a shipment")
    done = _submit_and_wait(system, folder)
    assert done.returncode == 0, done.stdout + done.stderr
    for n in range(3):
        assert f"shipment-close-{n}" in done.stdout
    assert system.store().stock_of([f"CLOSE-{n}" for n in range(3)]) == {f"CLOSE-{n}": n + 1 for n in range(3)}

    # A file that is not UTF-8 never stops the others: it goes on its own, as its bytes, and fails
    # on the server with its own code; the others are accepted and applied; the exit code says one failed.
    (folder / "latin1.csv").write_bytes("sku,quantity\nCAFÉ,1\n".encode("latin-1"))
    (folder / "close-3.csv").write_text("sku,quantity\nCLOSE-3,4\n")
    done = _submit_and_wait(system, folder)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "shipment-close-3" in done.stdout and "shipment-latin1" in done.stdout
    assert system.wait_state("shipment-latin1")["error"]["code"].startswith("csv.")
    assert system.store().stock_of(["CLOSE-3"]) == {"CLOSE-3": 4}


def _submit_and_wait(system: System, folder: Path) -> subprocess.CompletedProcess[str]:
    """`importer submit FOLDER --wait`, as a producer runs it."""
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", "submit", str(folder), "--wait"],
        env={**system.env, "IMPORTER_URL": system.base_url, "IMPORTER_API_KEY": system.api_key},
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_a_bulk_records_its_shipments_in_a_few_round_trips_not_one_each(make_system: Any) -> None:
    """200 new small shipments: their enqueue steps travel pipelined and their
    messages as group messages, written by the same script calls on the Redis
    transport: the server reads a few requests from the HTTP process, not one
    or more per shipment (before: 200+).
    Each is still its own step: every one recorded once, in order."""
    system: System = make_system(IMPORTER_RATE_LIMIT="0")
    system.start_http()
    admin = system.store().client
    lines = [line(f"rt-{n}", {f"RT-{n % 7}": n % 5 + 1}) for n in range(200)]
    bulk(system, lines[:1])  # the server's connections are open and its scripts loaded
    before = int(admin.info("stats")["total_reads_processed"])
    scripts_before = admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    status, answer = bulk(system, lines)
    reads = int(admin.info("stats")["total_reads_processed"]) - before
    scripts = admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) - scripts_before
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [202] * 200
    assert [r["body"]["jobId"] for r in answer["results"]] == [f"shipment-rt-{n}" for n in range(200)]
    waiting = admin.zrange(system.prefix + "jobs:waiting", 0, -1)
    assert len(waiting) == 200 and len(set(waiting)) == 200
    if system.transport == "redis":
        # The live workers read, then one pipeline of 4 enqueue_many.lua calls (64 jobs each
        # at most) that write their group messages themselves: no send, no mark afterwards.
        assert scripts == 1 + 4, scripts
        assert reads < 20, reads  # valkey reads a pipeline of ~40 KB in 16 KB pieces
        queue = f"{system.prefix}dramatiq:{system.queue_name}"
        assert admin.llen(queue) == 1 + 4  # rt-0's, sent before; then the 199 new ones: 64 + 64 + 64 + 7
        assert admin.zcard(system.prefix + "jobs:unsent") == 0  # never recorded without its message
    else:
        # 2 enqueue pipelines, the live workers, 4 group publishes and their marks, + the INFO
        assert reads < 40, reads
