"""Receipts through the real processes (`importer serve` + `importer worker` on
Redis): what a shipment changed, checked against the stock read directly; the
same bytes again after its job record was removed by retention and the batch
was sent again (a replay); another producer sees the 404 of a missing batch."""

from __future__ import annotations

import json

import pytest

from importer.domain.shipment import job_id_for
from tests.integration.support import System, wait_for

pytestmark = pytest.mark.integration

#: Each owner keeps only its newest completed job record: the next import removes the one before.
KEEP_ONE = {"IMPORTER_KEEP_COMPLETED_COUNT": "1", "IMPORTER_KEEP_COMPLETED_AGE": "3600"}


def import_and_wait(system: System, batch_id: str, data: bytes, key: str | None = None) -> dict:
    kw = {"key": key} if key else {}
    status, accepted = system.post_csv(batch_id, data, **kw)
    assert status == 202, accepted

    def finished() -> dict | None:
        code, record = system.get_job(job_id_for(batch_id), **kw)
        return record if code == 200 and record["state"] in ("completed", "failed") else None

    record = wait_for(finished, 60, 0.05, message=f"{batch_id} finished")
    assert record["state"] == "completed", record
    return record


def receipt(system: System, batch_id: str, accept: str | None = None, key: str | None = None) -> tuple[int, dict, bytes]:
    headers = {"Accept": accept} if accept else {}
    kw = {"key": key} if key else {}
    return system.request("GET", f"/api/shipments/{batch_id}/receipt", headers=headers, **kw)


def test_receipt_is_what_the_shipment_changed_and_a_replay_after_retention_gives_the_same_bytes(make_system: object) -> None:
    system = make_system(**KEEP_ONE)  # type: ignore[operator]
    system.start_worker()
    system.start_http()
    store = system.store()

    import_and_wait(system, "rc-base", b"sku,quantity\nBOLT-M8,100\nNUT-M8,7\n")
    skus = ["NUT-M8", "WASHER-M8", "BOLT-M8"]
    before = store.stock_of(skus)
    assert before == {"NUT-M8": 7, "WASHER-M8": 0, "BOLT-M8": 100}
    import_and_wait(system, "rc-1", b"sku,quantity\nNUT-M8,5\nWASHER-M8,40\nBOLT-M8,1\n")
    after = store.stock_of(skus)

    status, headers, as_json = receipt(system, "rc-1")
    assert status == 200 and headers["Content-Type"] == "application/json"
    first = json.loads(as_json)
    assert (first["batchId"], first["jobId"], first["rows"]) == ("rc-1", "shipment-rc-1", 3)
    # Each row, in the file's order: the stock read directly just before and just after.
    assert first["items"] == [{"sku": s, "before": before[s], "after": after[s]} for s in skus]
    status, _, shipment_body = system.request("GET", "/api/shipments/rc-1")
    assert json.loads(shipment_body)["appliedAt"] == first["appliedAt"]

    status, headers, as_csv = receipt(system, "rc-1", "text/csv")
    assert status == 200 and headers["Content-Type"] == "text/csv; charset=utf-8"
    assert as_csv == b"sku,before,after\nNUT-M8,7,12\nWASHER-M8,0,40\nBOLT-M8,100,101\n"

    # Another import of this owner: retention (keep 1) removes rc-1's job record.
    import_and_wait(system, "rc-2", b"sku,quantity\nNUT-M8,1000\nBOLT-M8,1000\n")
    wait_for(lambda: system.get_job(job_id_for("rc-1"))[0] == 404, 10, message="rc-1's record removed by retention")
    assert store.client.exists(store.keys.done("rc-1")) and store.client.exists(store.keys.receipt("rc-1"))

    # The same batch again (same rows, other order and line endings): a new job, a replay.
    replayed = import_and_wait(system, "rc-1", b"sku,quantity\r\nBOLT-M8,1\r\nWASHER-M8,40\r\nNUT-M8,5\r\n")
    assert replayed["result"] == {"imported": 3, "batchId": "rc-1", "replay": True}
    assert store.stock_of(skus) == {"NUT-M8": 1012, "WASHER-M8": 40, "BOLT-M8": 1101}  # nothing added again

    # The receipt of the original application, byte for byte, in both renderings; never recomputed.
    assert receipt(system, "rc-1")[2] == as_json
    assert receipt(system, "rc-1", "text/csv")[2] == as_csv
    assert receipt(system, "rc-1", "application/json")[2] == as_json


def test_another_producer_gets_the_404_of_a_missing_batch(system: System) -> None:
    import_and_wait(system, "rc-own", b"sku,quantity\nOWN-1,3\n")
    for accept in (None, "text/csv"):
        theirs = receipt(system, "rc-own", accept, key=system.other_key)
        missing = receipt(system, "rc-never-sent", accept, key=system.other_key)
        assert theirs[0] == missing[0] == 404
        assert theirs[2] == missing[2]
        assert json.loads(theirs[2])["code"] == "shipment.not_found"
        # The same bytes as the shipment route gives for it.
        assert system.request("GET", "/api/shipments/rc-own", key=system.other_key)[2] == theirs[2]
    assert receipt(system, "rc-own")[0] == 200


def test_csv_on_request_and_406_for_other_media_types(system: System) -> None:
    import_and_wait(system, "rc-csv", b"sku,quantity\nCSV-1,3\nCSV-2,4\n")
    status, headers, body = receipt(system, "rc-csv", "text/csv")
    assert status == 200 and body == b"sku,before,after\nCSV-1,0,3\nCSV-2,0,4\n"
    assert headers["Content-Disposition"] == 'attachment; filename="receipt-rc-csv.csv"'
    status, headers, body = receipt(system, "rc-csv", "application/xml")
    assert status == 406 and headers["Content-Type"] == "application/problem+json"
    assert json.loads(body)["code"] == "request.not_acceptable"


def test_a_large_receipt_is_streamed_over_http(system: System) -> None:
    rows = 20_000
    data = "sku,quantity\n" + "".join(f"LARGE-{i:06d},{i % 97 + 1}\n" for i in range(rows))
    import_and_wait(system, "rc-large", data.encode())
    status, headers, as_csv = receipt(system, "rc-large", "text/csv")
    assert status == 200 and "Content-Length" not in headers  # streamed, chunk by chunk
    assert as_csv == b"sku,before,after\n" + "".join(f"LARGE-{i:06d},0,{i % 97 + 1}\n" for i in range(rows)).encode()
    store = system.store()
    stored = store.client.get(store.keys.receipt("rc-large"))
    assert stored == "".join(f"LARGE-{i:06d},0,{i % 97 + 1}\n" for i in range(rows)).encode()  # sku,before,quantity
    status, _, as_json = receipt(system, "rc-large")
    items = json.loads(as_json)["items"]
    assert len(items) == rows and items[-1] == {"sku": "LARGE-019999", "before": 0, "after": 19999 % 97 + 1}
