"""Retrying a failed import, for real: `importer serve`, `importer worker`,
Redis (and RabbitMQ), over HTTP and from the CLI.

An import is made to fail for a reason a retry can change, from outside: it
is posted while no worker runs, then a worker that accepts only contract
version 2 takes its version 1 message and fails it with
contract.unsupported_version (as a rolling upgrade done in the wrong order
would). Once that worker is gone and a right one runs, the owner retries it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from importer.adapters.redis.records import error_json
from tests.integration.support import FIXTURES, ROOT, System, queued_messages, wait_for

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()
SEED_SKUS = {"WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5}


def retry(system: System, job_id: str, **kw: Any) -> tuple[int, Any, bytes]:
    status, headers, body = system.request("POST", f"/api/imports/{job_id}/retry", **kw)
    return status, headers, body


def fail_for_a_contract_version(system: System, *batches: str) -> list[str]:
    """Post the batches (SEED) while no worker runs, let a worker that accepts
    only version 2 fail them (contract.unsupported_version), then stop that worker."""
    job_ids = [f"shipment-{batch}" for batch in batches]
    for batch in batches:
        assert system.post_csv(batch, SEED)[0] == 202
    odd = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="2")
    for job_id in job_ids:
        assert system.wait_state(job_id, ("failed",))["error"]["code"] == "contract.unsupported_version"
    assert odd.stop() == 0
    return job_ids


def events_of(system: System, job_id: str) -> list[dict[str, Any]]:
    """The job's whole event stream (it ends after its final event)."""
    status, _, body = system.request("GET", f"/api/imports/{job_id}/events")
    assert status == 200
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("transport", ["redis", "rabbitmq"])
def test_the_owner_retries_a_failed_import_and_it_is_applied_once(make_system: Any, transport: str) -> None:
    system: System = make_system()
    system.start_http()
    assert system.transport == transport
    (job_id,) = fail_for_a_contract_version(system, "retry-1")
    status, failed = system.get_job(job_id)
    assert status == 200 and (failed["retryable"], failed["retries"], failed["attempt"]) == (True, 0, 1)

    # Another producer: the same 404 bytes as a job that does not exist (POST and GET alike).
    foreign = retry(system, job_id, key=system.other_key)
    missing = retry(system, "shipment-never-sent", key=system.other_key)
    get_missing = system.request("GET", "/api/imports/shipment-never-sent", key=system.other_key)
    assert foreign[0] == missing[0] == get_missing[0] == 404
    assert foreign[2] == missing[2] == get_missing[2]
    assert json.loads(foreign[2])["code"] == "job.not_found"

    # While only workers that cannot read this server's messages run: refused at the door, as a new import.
    odd = system.start_worker(IMPORTER_ACCEPTED_VERSIONS="2")
    status, _, body = retry(system, job_id)
    assert status == 503 and json.loads(body)["code"] == "contract.no_worker"
    assert system.get_job(job_id)[1]["state"] == "failed"
    odd.stop()

    system.start_worker()
    status, headers, body = retry(system, job_id)
    assert status == 202, body
    assert json.loads(body) == {"jobId": job_id, "batchId": "retry-1", "location": "main", "state": "waiting"}
    assert headers["Location"] == f"/api/imports/{job_id}"

    record = system.wait_state(job_id, ("completed",))
    assert (record["attempt"], record["retries"], record["error"], record["retryable"]) == (1, 1, None, False)
    assert record["result"] == {"imported": 3, "batchId": "retry-1"}
    store = system.store()
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1

    # The history: the first chain's failure, the retry, the new chain to its end.
    kinds = [(e["event"], e["attempt"], e["data"].get("retry")) for e in events_of(system, job_id)]
    assert kinds[:2] == [("waiting", 0, None), ("failed", 1, None)]
    assert kinds[2] == ("waiting", 0, 1)
    assert kinds[3] == ("active", 1, None) and kinds[-1] == ("completed", 1, None)

    # Completed: nothing to retry.
    status, _, body = retry(system, job_id)
    problem = json.loads(body)
    assert status == 409 and problem["code"] == "job.not_retryable" and problem["state"] == "completed"
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS


def test_validation_failures_and_imports_not_failed_are_not_retried(make_system: Any) -> None:
    system: System = make_system()
    system.start_http()
    assert system.post_csv("waits-1", SEED)[0] == 202  # no worker: it waits
    status, _, body = retry(system, "shipment-waits-1")
    problem = json.loads(body)
    assert status == 409 and problem["code"] == "job.not_retryable" and problem["state"] == "waiting"
    assert "errorCode" not in problem

    assert system.post_csv("bad-1", (FIXTURES / "invalid-bad-quantity.csv").read_bytes())[0] == 202
    system.start_worker()
    assert system.wait_state("shipment-bad-1")["error"]["code"] == "csv.bad_quantity"
    assert system.get_job("shipment-bad-1")[1]["retryable"] is False
    status, _, body = retry(system, "shipment-bad-1")
    problem = json.loads(body)
    assert status == 409 and problem["code"] == "job.not_retryable"
    assert (problem["state"], problem["errorCode"]) == ("failed", "csv.bad_quantity")
    assert "the same bytes give the same issues" in problem["detail"] and "new batchId" in problem["detail"]
    record = system.get_job("shipment-bad-1")[1]
    assert (record["state"], record["retries"]) == ("failed", 0)
    assert system.request("GET", "/api/imports/shipment-bad-1/rejections.csv")[0] == 200  # untouched
    assert system.wait_state("shipment-waits-1")["state"] == "completed"


def test_two_retries_at_once_start_one_chain(make_system: Any) -> None:
    system: System = make_system()
    system.start_http(workers=2)
    (job_id,) = fail_for_a_contract_version(system, "twice-1")
    assert queued_messages(system) == 0

    answers: list[int] = []
    start = threading.Barrier(8)

    def one() -> None:
        start.wait()
        answers.append(retry(system, job_id)[0])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == [202] + [409] * 7
    assert queued_messages(system) == 1  # one message for the one new chain
    assert system.get_job(job_id)[1]["retries"] == 1

    system.start_worker()
    record = system.wait_state(job_id, ("completed",))
    assert (record["retries"], record["attempt"]) == (1, 1)
    assert system.store().stock_of(list(SEED_SKUS)) == SEED_SKUS


def test_a_retry_of_a_batch_that_was_applied_after_all_replays_it(system: System) -> None:
    """The done marker decides: a record failed after its batch was applied
    (written here by hand: the apply script never leaves one) completes as a
    replay, and stock does not move."""
    assert system.post_csv("applied-1", SEED)[0] == 202
    assert system.wait_state("shipment-applied-1")["state"] == "completed"
    store = system.store()
    k = store.keys
    upload_id = "f" * 32
    store.client.hset(k.job("shipment-applied-1"), mapping={
        "state": "failed", "error": error_json("import.worker_lost"), "uploadId": upload_id, "attempt": 3,
    })
    store.client.set(k.upload(upload_id), SEED)
    store.client.zadd(k.failed, {"shipment-applied-1": 1})
    store.client.zadd(k.failed_of("owner-a"), {"shipment-applied-1": 1})

    assert retry(system, "shipment-applied-1")[0] == 202
    record = system.wait_state("shipment-applied-1", ("completed",))
    assert record["result"] == {"imported": 3, "batchId": "applied-1", "replay": True}
    assert store.stock_of(list(SEED_SKUS)) == SEED_SKUS
    assert store.generation() == 1
    assert store.client.zscore(k.failed, "shipment-applied-1") is None


def importer(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**system.env, "IMPORTER_API_KEY": system.api_key, "IMPORTER_URL": system.base_url}
    return subprocess.run(
        [sys.executable, "-m", "importer.adapters.processes.cli", *args], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=120,
    )


def test_importer_retry_wait_follows_the_new_chain_and_refusals_exit_non_zero(make_system: Any) -> None:
    system: System = make_system()
    system.start_http()
    (job_id,) = fail_for_a_contract_version(system, "cli-retry")
    events = system._spawn("events", ["events", "--from", "0"], system.env)
    system.start_worker()
    failed = importer(system, "status", job_id)
    assert "retry it: importer retry shipment-cli-retry --wait" in failed.stdout

    out = importer(system, "retry", job_id, "--wait")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "retrying shipment-cli-retry (batch cli-retry, waiting)"
    assert lines[-1] == 'completed shipment-cli-retry: {"imported": 3, "batchId": "cli-retry"}'
    assert not any(line.startswith("failed") for line in lines), lines  # the earlier chain is not replayed
    assert any(line.startswith("completed phase=committed rows=3 attempt=1") for line in lines), lines
    assert importer(system, "status", job_id).stdout.startswith("shipment-cli-retry: completed (attempt 1, retry 1, ")
    wait_for(lambda: f"waiting {job_id} retry=1" in events.log(), 10, message="importer events shows the retry")
    events.stop()

    again = importer(system, "retry", job_id)
    assert again.returncode == 1 and "refused: 409 job.not_retryable: " in again.stderr
    missing = importer(system, "retry", "shipment-nope")
    assert missing.returncode == 1 and "refused: 404 job.not_found" in missing.stderr
    assert system.post_csv("cli-bad", (FIXTURES / "invalid-bad-quantity.csv").read_bytes())[0] == 202
    system.wait_state("shipment-cli-bad")
    bad = importer(system, "retry", "shipment-cli-bad", "--wait")
    assert bad.returncode == 1 and "the same bytes give the same issues" in bad.stderr
    assert system.store().stock_of(list(SEED_SKUS)) == SEED_SKUS
