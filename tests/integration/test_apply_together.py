"""Group commit on the worker: small imports of one location that a worker
process fetched together run in one start_apply.lua call, each with its own
outcome. From the outside: a backlog POSTed while no worker runs, then one
real worker process drains it; counted under MONITOR."""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from typing import Any

import pytest
import redis

from importer.adapters.redis.scripts import lua_source
from importer.domain.receipt import decode_receipt
from importer.domain.shipment import job_id_for
from importer.domain.stock import MAX_STOCK
from tests.integration.support import System, free_port, stored_messages, wait_for
from tests.integration.test_one_script_per_import import Monitor, _events, _script_calls

pytestmark = pytest.mark.integration


def _csv(rows: dict[str, int]) -> bytes:
    return ("sku,quantity\n" + "".join(f"{sku},{qty}\n" for sku, qty in rows.items())).encode()


def test_a_backlog_is_applied_several_imports_per_call_each_with_its_own_outcome(make_system: Any) -> None:
    system: System = make_system(IMPORTER_APPLY_TOGETHER_MAX="16")
    store = system.store()
    system.start_http()

    # A batch applied once already, whose job record is gone: its re-POST is a replay.
    first = system.start_worker(threads=1)
    assert system.post_csv("tg-replay", _csv({"REPLAY-01": 7, "SHARED-01": 1}))[0] == 202
    assert system.wait_state(job_id_for("tg-replay"))["state"] == "completed"
    first.stop()
    store.delete_job_record(job_id_for("tg-replay"))
    store.client.hset(store.partition_of(job_id_for("x")).stock, "NEARLY-FULL-01", MAX_STOCK - 1)

    # The backlog, while no worker runs: 40 valid imports (all adding to one
    # shared SKU, so that imports of one call add to the same stock row), a
    # replay, an overflow, two invalid files, and imports at another location.
    valid = {f"tg-{i}": {f"OWN-{i:03d}": i + 1, "SHARED-01": 1} for i in range(40)}
    for batch_id, rows in valid.items():
        assert system.post_csv(batch_id, _csv(rows))[0] == 202
    assert system.post_csv("tg-replay", _csv({"REPLAY-01": 7, "SHARED-01": 1}))[0] == 202
    assert system.post_csv("tg-overflow", _csv({"NEARLY-FULL-01": 5, "SHARED-01": 1}))[0] == 202
    assert system.post_csv("tg-bad-1", b"sku,quantity\nA-1,many\n")[0] == 202
    assert system.post_csv("tg-bad-2", b"sku,quantity\nB-1,0\n")[0] == 202
    for i in range(6):
        status, _, _ = system.request("POST", f"/api/imports?batchId=tg-paris-{i}&location=paris",
                                      body=_csv({"PARIS-01": 2, f"PARIS-OWN-{i}": 1}), ctype="text/csv")
        assert status == 202

    client = redis.Redis.from_url(system.redis_url)
    for name in ("start", "apply", "start_apply", "fail"):
        client.script_load(lua_source(name))
    monitor = Monitor(system)
    try:
        system.start_worker(threads=2, prefetch=64)
        jobs = [*valid, "tg-replay", "tg-overflow", "tg-bad-1", "tg-bad-2"]
        final = {b: system.wait_state(job_id_for(b), timeout=60) for b in jobs}
        paris = {i: system.wait_state(job_id_for(f"tg-paris-{i}", "paris"), timeout=60) for i in range(6)}
        wait_for(lambda: stored_messages(system) == 0, 20, message="every message acknowledged or rejected")
    finally:
        commands = monitor.stop()

    # Each import's own outcome.
    assert {b: final[b]["state"] for b in valid} == {b: "completed" for b in valid}
    assert all(final[b]["result"] == {"imported": 2, "batchId": b} for b in valid)
    assert final["tg-replay"]["state"] == "completed" and final["tg-replay"]["result"]["replay"] is True
    assert (final["tg-overflow"]["state"], final["tg-overflow"]["error"]["code"]) == ("failed", "stock.overflow")
    assert (final["tg-bad-1"]["error"]["code"], final["tg-bad-2"]["error"]["code"]) == ("csv.bad_quantity", "csv.bad_quantity")
    assert all(p["state"] == "completed" for p in paris.values())

    # The books: every valid import added once, the overflow and the replay nothing.
    stock = store.stock_of(["SHARED-01", "NEARLY-FULL-01", "REPLAY-01", *(f"OWN-{i:03d}" for i in range(40))])
    assert stock["SHARED-01"] == 40 + 1  # the 40, and the replayed batch's first application
    assert stock["NEARLY-FULL-01"] == MAX_STOCK - 1 and stock["REPLAY-01"] == 7
    assert all(stock[f"OWN-{i:03d}"] == i + 1 for i in range(40))
    assert store.generation() == 41
    # Each receipt: the stock just before its own rows, after every import applied before it, in the same call or not.
    receipts = {b: {line.sku: line for line in decode_receipt(store.client.get(store.keys.receipt(b)) or b"")} for b in valid}
    assert all(receipts[b][f"OWN-{i:03d}"].before == 0 for i, b in enumerate(valid))
    assert sorted(r["SHARED-01"].before for r in receipts.values()) == list(range(1, 41))
    assert store.client.get(store.keys.receipt("tg-overflow")) is None
    assert store.stock_of(["PARIS-01"], "paris") == {"PARIS-01": 12}
    assert store.generation("paris") == 6

    # Several imports per call: 40 + 1 + 1 one-step imports at main, 6 at paris, in far fewer calls.
    calls = _script_calls(commands)
    one_step = 40 + 1 + 1 + 6
    assert 0 < calls["start_apply"] <= one_step // 3, calls
    # The invalid files took the separate steps, and were not retried.
    assert (calls["start"], calls["fail"], calls["apply"]) == (2, 2, 0), calls
    assert calls["dramatiq nack"] == 3, calls  # the two invalid files and the overflow
    assert calls["dramatiq ack"] == 0, calls  # every other message acknowledged by its script

    # Every job's events are those of its own attempt, in order.
    for b in valid:
        kinds, entries = _events(system, job_id_for(b))
        assert kinds == [
            "waiting", "active", '{"phase":"validated","rows":2}', '{"phase":"committed","rows":2}', "completed",
        ], b
        assert entries == 2, b  # its own stream: one entry for the POST's call, one for the worker's
    assert _events(system, job_id_for("tg-overflow"))[0][-3:] == ["active", '{"phase":"validated","rows":2}', "failed"]
    tokens = Counter(store.client.hget(store.partition_of(job_id_for(b)).job(job_id_for(b)), "token") for b in valid)
    assert len(tokens) == len(valid), "every attempt has its own fencing token"


def test_a_worker_stopped_mid_backlog_gives_back_what_it_held_at_once(make_system: Any) -> None:
    """A worker holds most of what it fetched back from dramatiq's threads (the
    riders' pool). Stopped (SIGTERM) in the middle of a backlog, it leaves
    nothing in its acks set: what its threads had not started goes back to the
    queue at once, and the next worker runs it without waiting for the dead
    worker's heartbeat to time out. Every import is applied once."""
    system: System = make_system(IMPORTER_APPLY_TOGETHER_MAX="16", IMPORTER_HEARTBEAT_TIMEOUT="60", IMPORTER_RATE_LIMIT="0")
    system.start_http()
    count = 800
    rows = _csv({f"HELD-{n:04d}": 1 for n in range(1000)})  # 1,000 rows: under the one-step bound, slower to apply
    for i in range(count):
        assert system.post_csv(f"held-{i}", rows)[0] == 202
    client = redis.Redis.from_url(system.redis_url)
    stats = f"{system.prefix}stats"
    worker = system.start_worker(threads=1, prefetch=64)
    wait_for(lambda: int(client.hget(stats, "completed") or 0) >= 20, 30, 0.001, message="the worker draining")
    worker.terminate()  # a stop takes about a second to begin: the imports are large enough to outlast it
    assert worker.wait_stopped(30) == 0
    done_at_stop = int(client.hget(stats, "completed") or 0)
    assert done_at_stop < count, "every import was applied before the stop: the scenario tested nothing"
    acks = [k for k in client.scan_iter(match=f"{system.prefix}dramatiq:__acks__.*") if client.scard(k)]
    assert acks == [], "a stopped worker's messages wait in its acks set for its heartbeat to time out"
    assert stored_messages(system) == count - done_at_stop  # every other message back in the queue
    system.start_worker(threads=2, prefetch=64)
    wait_for(lambda: int(client.hget(stats, "completed") or 0) >= count, 20, message="the rest applied by the next worker")
    assert system.store().generation() == count
    assert set(system.store().stock_of([f"HELD-{n:04d}" for n in range(1000)]).values()) == {count}


def _metric_total(text: str, name: str) -> float:
    """The sum of one metric's samples for the import actor, in Prometheus' text format."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and 'actor_name="import_shipment"' in line)


def test_the_worker_metrics_count_every_import_message_riders_included(make_system: Any) -> None:
    """dramatiq's Prometheus metrics (IMPORTER_WORKER_METRICS_PORT) count each
    import message once, also those whose import rode in another delivery's
    call and never went through dramatiq's middleware."""
    system: System = make_system(IMPORTER_APPLY_TOGETHER_MAX="16", IMPORTER_RATE_LIMIT="0")
    system.start_http()
    batches = [f"mt-{i}" for i in range(60)]
    for batch_id in batches:
        assert system.post_csv(batch_id, _csv({f"MT-{batch_id}": 1, "MT-SHARED": 1}))[0] == 202
    port = free_port()
    system.start_worker(threads=2, prefetch=64, IMPORTER_WORKER_METRICS_PORT=str(port))
    assert all(system.wait_state(job_id_for(b), timeout=60)["state"] == "completed" for b in batches)
    assert system.store().stock_of(["MT-SHARED"]) == {"MT-SHARED": 60}

    seen = [0.0]

    def scraped() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            return None
        seen[0] = _metric_total(text, "dramatiq_messages_total")
        return text if seen[0] >= len(batches) else None

    deadline, text = time.monotonic() + 20, scraped()
    while text is None and time.monotonic() < deadline:
        time.sleep(0.2)
        text = scraped()
    assert text is not None, f"the worker's metrics counted {seen[0]:.0f} import messages of {len(batches)}"
    assert _metric_total(text, "dramatiq_messages_total") == len(batches)
    assert _metric_total(text, "dramatiq_message_duration_milliseconds_count") == len(batches)
    assert _metric_total(text, "dramatiq_message_errors_total") == 0
    assert _metric_total(text, "dramatiq_messages_inprogress") == 0
