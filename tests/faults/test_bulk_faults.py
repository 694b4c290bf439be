"""A bulk request cut by its HTTP process's death: the process is frozen
(SIGSTOP, the whole group) while it records the bulk's shipments, checked to be
in the middle of them, and SIGKILLed; the client, which got no answer, sends
the same body to a new process. Every shipment is then recorded once and
applied once, every 202 becomes final, and with the ledger on, each is in
PostgreSQL once with its movements (`importer ledger verify` clean)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.integration.support import System, wait_for
from tests.integration.test_ledger import ledger_rows, run_cli

pytestmark = pytest.mark.integration

SHIPMENTS = 1000


def _body() -> bytes:
    lines = []
    for n in range(SHIPMENTS):
        rows = "".join(f"CUT-{(n * 7 + r) % 40:02d},{r + 1}\n" for r in range(20))
        lines.append(json.dumps({"batchId": f"cut-{n:04d}", "csv": "sku,quantity\n" + rows}).encode())
    return b"\n".join(lines) + b"\n"


def _expected_stock() -> dict[str, int]:
    stock: dict[str, int] = {}
    for n in range(SHIPMENTS):
        for r in range(20):
            sku = f"CUT-{(n * 7 + r) % 40:02d}"
            stock[sku] = stock.get(sku, 0) + r + 1
    return stock


def test_an_http_process_killed_mid_bulk_leaves_every_shipment_once(
    make_redis: Any, make_faulty: Any, make_database: Any,
) -> None:
    server = make_redis()
    db = make_database()
    system: System = make_faulty(server, IMPORTER_DATABASE_URL=db)
    http = system.start_http(workers=1)
    body = _body()
    client = server.client()
    owner_jobs = f"{system.prefix}jobs:owner:owner-a"
    answered: list[Any] = []

    def send() -> None:
        try:
            answered.append(system.request("POST", "/api/imports/bulk", body=body, ctype="application/x-ndjson"))
        except OSError as err:  # the connection died with the process
            answered.append(err)

    sender = threading.Thread(target=send)
    sender.start()
    wait_for(lambda: client.zcard(owner_jobs) >= 100, 60, 0.002, message="the bulk under way")
    os.killpg(http.popen.pid, signal.SIGSTOP)  # frozen where it is, mid-bulk
    recorded = client.zcard(owner_jobs)
    assert 100 <= recorded < SHIPMENTS, recorded
    os.killpg(http.popen.pid, signal.SIGKILL)
    http.popen.wait(10)
    sender.join(60)
    assert len(answered) == 1 and (isinstance(answered[0], OSError) or answered[0][0] != 200), answered

    # The client sends the same body again, to a new process; a worker drains.
    system.start_http(workers=1)
    system.start_worker()
    status, _, raw = system.request("POST", "/api/imports/bulk", body=body, ctype="application/x-ndjson")
    assert status == 200
    results = json.loads(raw)["results"]
    assert [r["status"] for r in results] == [202] * SHIPMENTS
    started = time.monotonic()
    stats = f"{system.prefix}stats"
    wait_for(lambda: int(client.hget(stats, "completed") or 0) >= SHIPMENTS, 180, 0.1, message="every import final")
    assert int(client.hget(stats, "completed") or 0) == SHIPMENTS
    assert not any(k.startswith(b"failed:") for k in client.hkeys(stats))
    assert int(client.get(f"{system.prefix}generation") or 0) == SHIPMENTS  # each applied once
    stock = {k.decode(): int(v) for k, v in client.hgetall(f"{system.prefix}stock").items()}
    assert stock == _expected_stock()
    assert client.zcard(owner_jobs) == SHIPMENTS
    # [ledger] every applied shipment exported once, its movements adding up to the stock.
    assert system.start_ledger(once=True).popen.wait(120) == 0
    shipments, _ = ledger_rows(db)
    assert len(shipments) == SHIPMENTS
    with psycopg.connect(db) as conn:
        moved = dict(conn.execute("SELECT sku, sum(quantity) FROM ledger_movements GROUP BY sku").fetchall())
    assert {sku: int(total) for sku, total in moved.items()} == _expected_stock()
    verified = run_cli(system, "ledger", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    print(f"[faults] bulk cut at {recorded}/{SHIPMENTS} recorded; all final {time.monotonic() - started:.1f} s after the resend")
