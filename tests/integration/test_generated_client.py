"""A client generated from the committed openapi.yaml by a standard generator
(openapi-python-client) drives a full import against the running server.

Nothing generated is committed: the client is generated and installed (pip,
into a temporary target) by this test. If the generator rejects or mistypes
something, the spec is what must change."""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import FIXTURES, ROOT, System

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_text()


@pytest.fixture(scope="module")
def importer_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("generated")
    generator = Path(sys.executable).parent / "openapi-python-client"
    out = subprocess.run(
        [str(generator), "generate", "--path", str(ROOT / "openapi.yaml"), "--meta", "setup", "--output-path",
         str(work / "importer-client")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # The only warnings allowed are what the generator cannot express:
    # raw text/csv request bodies and YAML responses.
    for line in out.stdout.splitlines():
        if line.startswith("WARNING"):
            assert line in ("WARNING parsing POST /api/imports within default.", "WARNING parsing GET /openapi.yaml within default."), out.stdout
    site = work / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(work / "importer-client")],
        capture_output=True, text=True, timeout=300,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    sys.path.insert(0, str(site))
    try:
        yield importlib.import_module("importer_client")
    finally:
        sys.path.remove(str(site))
        for name in [m for m in sys.modules if m == "importer_client" or m.startswith("importer_client.")]:
            del sys.modules[name]


def test_the_generated_client_drives_a_full_import(system: System, importer_client: Any) -> None:
    from importer_client.api.default import (  # type: ignore[import-not-found]
        enqueue_import, get_import, get_shipment, get_shipment_receipt, health, list_imports, stream_import_events,
    )
    from importer_client.models import (  # type: ignore[import-not-found]
        EnqueueRequest, JobAccepted, JobList, JobStatus, ListImportsState, Problem, Receipt, Shipment,
    )

    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.api_key) as client:
        assert health.sync(client=client).status.value == "ok"
        accepted = enqueue_import.sync(client=client, body=EnqueueRequest(batch_id="gen-1", csv=SEED))
        assert isinstance(accepted, JobAccepted) and accepted.job_id == "shipment-gen-1"

        deadline = time.monotonic() + 30
        status = get_import.sync(client=client, job_id=accepted.job_id)
        while isinstance(status, JobStatus) and status.state.value not in ("completed", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
            status = get_import.sync(client=client, job_id=accepted.job_id)
        assert isinstance(status, JobStatus)
        assert status.state.value == "completed"
        assert (status.progress.phase.value, status.progress.rows) == ("committed", 3)
        assert (status.result.imported, status.result.batch_id) == (3, "gen-1")
        assert status.error is None and status.attempt == 1

        page = list_imports.sync(client=client, limit=10)
        assert isinstance(page, JobList) and [item.id for item in page.items] == ["shipment-gen-1"]
        assert page.items[0].state.value == "completed" and page.next_cursor is None
        failed_only = list_imports.sync(client=client, state=ListImportsState.FAILED)
        assert isinstance(failed_only, JobList) and failed_only.items == []

        # The job is finished: its stream holds every event and ends after the final one.
        stream = stream_import_events.sync(client=client, job_id=accepted.job_id)
        assert isinstance(stream, str)
        assert [line for line in stream.splitlines() if line.startswith("event: ")] == [
            "event: waiting", "event: active", "event: progress", "event: progress", "event: completed",
        ]

        shipment = get_shipment.sync(client=client, batch_id="gen-1")
        assert isinstance(shipment, Shipment) and shipment.state.value == "applied"
        assert shipment.result.imported == 3 and len(shipment.content_sha_256) == 64

        receipt = get_shipment_receipt.sync(client=client, batch_id="gen-1")
        assert isinstance(receipt, Receipt) and (receipt.batch_id, receipt.job_id, receipt.rows) == ("gen-1", "shipment-gen-1", 3)
        assert receipt.applied_at == shipment.applied_at
        assert [(i.sku, i.before, i.after) for i in receipt.items] == [
            (row.split(",")[0], 0, int(row.split(",")[1])) for row in SEED.strip().splitlines()[1:]
        ]
        no_receipt = get_shipment_receipt.sync_detailed(client=client, batch_id="gen-never")
        assert no_receipt.status_code == 404 and isinstance(no_receipt.parsed, Problem)
        assert no_receipt.parsed.code == "shipment.not_found"

        missing = get_import.sync_detailed(client=client, job_id="shipment-nope")
        assert missing.status_code == 404 and isinstance(missing.parsed, Problem)
        assert missing.parsed.code == "job.not_found"

        conflict = enqueue_import.sync_detailed(
            client=client, body=EnqueueRequest(batch_id="gen-1", csv="sku,quantity\nOTHER,1\n")
        )
        assert conflict.status_code == 409 and isinstance(conflict.parsed, Problem)
        assert conflict.parsed.code == "batch.conflict"

        invalid = enqueue_import.sync_detailed(client=client, body=EnqueueRequest(batch_id="-bad-", csv=SEED))
        assert invalid.status_code == 422 and isinstance(invalid.parsed, Problem)
        assert invalid.parsed.code == "request.invalid"
        assert "batchId" in invalid.parsed.fields.additional_properties

    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.other_key) as other:
        theirs = list_imports.sync(client=other)
        assert isinstance(theirs, JobList) and theirs.items == []
        hidden = stream_import_events.sync_detailed(client=other, job_id="shipment-gen-1")
        assert hidden.status_code == 404 and isinstance(hidden.parsed, Problem) and hidden.parsed.code == "job.not_found"
        not_theirs = get_shipment_receipt.sync_detailed(client=other, batch_id="gen-1")
        assert not_theirs.status_code == 404 and isinstance(not_theirs.parsed, Problem)
        assert not_theirs.parsed.code == "shipment.not_found"

    with importer_client.Client(base_url=system.base_url) as anonymous:
        unauthorized = get_import.sync_detailed(client=anonymous, job_id="shipment-gen-1")
        assert unauthorized.status_code == 401 and unauthorized.parsed.code == "auth.required"


def test_the_generated_client_reads_the_door_check(make_system: Any, importer_client: Any) -> None:
    """[door] /health's workers and the 503 contract.no_worker problem, typed by the generated client."""
    from importer_client.api.default import enqueue_import, health  # type: ignore[import-not-found]
    from importer_client.models import EnqueueRequest, Problem  # type: ignore[import-not-found]

    system: System = make_system()
    system.start_worker(IMPORTER_ACCEPTED_VERSIONS="1")
    system.start_http(IMPORTER_PRODUCER_VERSION="2")
    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.api_key) as client:
        workers = health.sync(client=client).workers
        assert (workers.alive, workers.accepted_versions, workers.producer_version, workers.accepts_imports) == (1, [1], 2, False)
        refused = enqueue_import.sync_detailed(client=client, body=EnqueueRequest(batch_id="gen-door", csv=SEED))
        assert refused.status_code == 503 and isinstance(refused.parsed, Problem)
        assert refused.parsed.code == "contract.no_worker"
        assert (refused.parsed.producer_version, refused.parsed.accepted_versions) == (2, [1])
        assert refused.headers["Retry-After"] == "5"


def test_the_generated_client_reads_a_rejection_report(system: System, importer_client: Any) -> None:
    from importer_client.api.default import enqueue_import, get_import, get_import_rejections  # type: ignore[import-not-found]
    from importer_client.models import EnqueueRequest, JobStatus, Problem  # type: ignore[import-not-found]

    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.api_key) as client:
        enqueue_import.sync(client=client, body=EnqueueRequest(batch_id="gen-bad", csv="sku,quantity\nA,0\n=B,1\n"))
        deadline = time.monotonic() + 30
        status = get_import.sync(client=client, job_id="shipment-gen-bad")
        while isinstance(status, JobStatus) and status.state.value != "failed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
            status = get_import.sync(client=client, job_id="shipment-gen-bad")
        rejections = status.error.rejections
        assert (rejections.found, rejections.listed, rejections.truncated) == (2, 2, False)
        assert rejections.url == "/api/imports/shipment-gen-bad/rejections.csv"
        assert [issue.line for issue in status.error.issues] == [2, 3]

        report = get_import_rejections.sync_detailed(client=client, job_id="shipment-gen-bad")
        assert report.status_code == 200
        assert report.content.decode().splitlines() == [
            "line,column,code,message,value",
            "2,2,csv.bad_quantity,quantity '0' is not a whole number from 1 to 1000000,0",
            "3,1,csv.bad_sku,SKU '=B' is not valid,'=B",
        ]
        missing = get_import_rejections.sync_detailed(client=client, job_id="shipment-nope")
        assert missing.status_code == 404 and isinstance(missing.parsed, Problem) and missing.parsed.code == "job.not_found"


def test_the_generated_client_reads_the_history_from_the_ledger(make_system: Any, make_database: Any, importer_client: Any) -> None:
    """[ledger] GET /api/shipments, /api/stock-movements and /api/stock, typed by the generated client."""
    from importer_client.api.default import (  # type: ignore[import-not-found]
        enqueue_import, get_import, get_stock, list_shipments, list_stock_movements,
    )
    from importer_client.models import EnqueueRequest, Problem  # type: ignore[import-not-found]

    system: System = make_system(IMPORTER_DATABASE_URL=make_database(), IMPORTER_LEDGER_INTERVAL="0.05")
    system.start_worker()
    system.start_http()
    system.start_ledger()
    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.api_key) as client:
        assert enqueue_import.sync_detailed(client=client, body=EnqueueRequest(batch_id="gen-ledger", csv=SEED)).status_code == 202
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            page = list_shipments.sync(client=client)
            if page.items:
                break
            time.sleep(0.1)
        assert get_import.sync(client=client, job_id="shipment-gen-ledger").state == "completed"
        assert [s.batch_id for s in page.items] == ["gen-ledger"] and page.next_cursor is None
        moves = list_stock_movements.sync(client=client, batch_id="gen-ledger")
        assert [(m.line, m.sku, m.before, m.after) for m in reversed(moves.items)] == [
            (1, "WIDGET-RED-01", 0, 10), (2, "GADGET-BLU-02", 0, 25), (3, "SPROCKET-07", 0, 5)]
        refused = get_stock.sync_detailed(client=client)
        assert refused.status_code == 403 and isinstance(refused.parsed, Problem)
        assert refused.parsed.code == "auth.scope_required"


def test_the_generated_client_sends_shipments_in_bulk(system: System, importer_client: Any) -> None:
    """POST /api/imports/bulk's JSON form ({"shipments": [...]}), typed by the generated client."""
    from importer_client.api.default import enqueue_imports_bulk  # type: ignore[import-not-found]
    from importer_client.models import BulkRequest, BulkResults, EnqueueRequest  # type: ignore[import-not-found]

    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.api_key) as client:
        answer = enqueue_imports_bulk.sync(client=client, body=BulkRequest(shipments=[
            EnqueueRequest(batch_id="gen-bulk-1", csv=SEED), EnqueueRequest(batch_id="gen-bulk-2", csv=SEED),
            EnqueueRequest(batch_id="gen-bulk-1", csv="sku,quantity\nOTHER-1,1\n"),
        ]))
        assert isinstance(answer, BulkResults)
        assert [r.status for r in answer.results] == [202, 202, 409]
        assert answer.results[0].body["jobId"] == "shipment-gen-bulk-1"
        assert answer.results[2].body["code"] == "batch.conflict"
    for job in ("shipment-gen-bulk-1", "shipment-gen-bulk-2"):
        assert system.wait_state(job, ("completed",))["state"] == "completed"


def test_the_generated_client_uploads_csv_files_in_bulk(system: System, importer_client: Any) -> None:
    """POST /api/imports/bulk's multipart/form-data form: CSV files, each named after its file, at ?location=."""
    from importer_client.api.default import enqueue_imports_bulk  # type: ignore[import-not-found]
    from importer_client.models import BulkResults, EnqueueImportsBulkFilesBody  # type: ignore[import-not-found]
    from importer_client.types import File  # type: ignore[import-not-found]

    files = [File(payload=io.BytesIO(SEED.encode()), file_name=f"gen-file-{n}.csv", mime_type="text/csv") for n in (1, 2)]
    with importer_client.AuthenticatedClient(base_url=system.base_url, token=system.api_key) as client:
        answer = enqueue_imports_bulk.sync(client=client, body=EnqueueImportsBulkFilesBody(file=files), location="paris")
        assert isinstance(answer, BulkResults)
        assert [(r.status, r.body["jobId"]) for r in answer.results] == [
            (202, "shipment-gen-file-1@paris"), (202, "shipment-gen-file-2@paris")]
    for job in ("shipment-gen-file-1@paris", "shipment-gen-file-2@paris"):
        assert system.wait_state(job, ("completed",))["state"] == "completed"
