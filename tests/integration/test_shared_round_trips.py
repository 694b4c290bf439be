"""Group commit on the HTTP side: script calls that threads of one process
make at the same time share one round trip (ThreadConnections.run_script_shared),
against a real Redis-compatible server and a real `importer serve`.

The server is held (CLIENT PAUSE) while the calls arrive, so that they surely
meet: the first is sent at once and waits in Redis, the others queue in the
process and go together in the next round trip. MONITOR shows which
connection carried each call."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from importer.adapters.redis.client import ImporterRedis
from tests.faults.harness import script_sha
from tests.integration.support import FIXTURES, Monitor, System

pytestmark = pytest.mark.integration

#: Fails the call whose argument is "fail", answers the others with their argument.
ECHO_OR_FAIL = "if ARGV[1] == 'fail' then return redis.error_reply('ERR asked to fail') end return ARGV[1]"


def held(url: str, ms: int) -> None:
    """Holds every client of the server for ``ms`` (CLIENT PAUSE ALL)."""
    admin = redis.Redis.from_url(url)
    admin.execute_command("CLIENT", "PAUSE", ms, "ALL")
    admin.close()


def meeting(url: str, held_ms: int, call: Any, args: list[Any], *, gap: float = 0.01,
            meanwhile: Any = None, timeout: float = 10) -> None:
    """``call(arg)`` for each arg from threads started ``gap`` apart while the
    server is held: the first is sent at once and waits in Redis, the others
    meet behind it. ``meanwhile()`` runs once they are all started."""
    held(url, held_ms)
    threads = [threading.Thread(target=call, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
        time.sleep(gap)
    if meanwhile is not None:
        meanwhile()
    for t in threads:
        t.join(timeout)


def test_calls_that_meet_share_a_round_trip_each_with_its_own_reply(redis_url: str) -> None:
    client = ImporterRedis.from_url(redis_url)
    script = client.register_script(ECHO_OR_FAIL)
    marker = uuid.uuid4().hex
    client.run_script(script, [f"{marker}:k"], ["warm"])  # loaded, and this thread's connection open
    monitor = Monitor(redis_url, marker)
    replies: dict[int, Any] = {}

    def call(n: int) -> None:
        try:
            replies[n] = client.run_script_shared(script, [f"{marker}:k"], ["fail" if n == 5 else f"{marker}-{n}"])
        except redis.ResponseError as exc:
            replies[n] = exc

    try:
        meeting(redis_url, 400, call, list(range(8)))
    finally:
        lines = monitor.stop()
        client.close()

    assert {n: r for n, r in replies.items() if n != 5} == {n: f"{marker}-{n}".encode() for n in range(8) if n != 5}
    assert isinstance(replies[5], redis.ResponseError) and "asked to fail" in str(replies[5])
    per_connection = Counter(line.client for line in lines if line.command.startswith("EVALSHA"))
    assert sum(per_connection.values()) == 8, lines
    # One lone call, then the seven that queued behind it in one round trip.
    assert sorted(per_connection.values()) == [1, 7], per_connection
    sharing = next(iter(client._sharing.values()))
    assert (sharing.round_trips, sharing.calls) == (2, 8)


def test_a_lone_call_is_sent_at_once(redis_url: str) -> None:
    client = ImporterRedis.from_url(redis_url)
    script = client.register_script(ECHO_OR_FAIL)
    try:
        assert [client.run_script_shared(script, ["k"], [str(n)]) for n in range(5)] == [str(n).encode() for n in range(5)]
        sharing = next(iter(client._sharing.values()))
        assert (sharing.round_trips, sharing.calls) == (5, 5)  # nobody waited for company
    finally:
        client.close()


def test_a_round_trip_whose_connection_breaks_sends_each_call_again_on_its_own(redis_url: str) -> None:
    client = ImporterRedis.from_url(redis_url, client_name="shared-rt-break")
    script = client.register_script(ECHO_OR_FAIL)
    admin = redis.Redis.from_url(redis_url)
    client.run_script(script, ["k"], ["warm"])
    replies: dict[int, Any] = {}

    def call(n: int) -> None:
        replies[n] = client.run_script_shared(script, ["k"], [f"v{n}"])

    try:
        def cut() -> None:
            # Every connection of this client is cut while the calls wait in Redis or in the queue.
            time.sleep(0.05)
            for c in admin.client_list():
                if c.get("name") == "shared-rt-break":
                    admin.client_kill_filter(_id=c["id"])

        meeting(redis_url, 300, call, list(range(4)), meanwhile=cut)
    finally:
        admin.close()
        client.close()
    assert replies == {n: f"v{n}".encode() for n in range(4)}


@pytest.mark.parametrize("share", ["1", "0"])
def test_concurrent_posts_to_importer_serve_share_round_trips(make_system: Any, share: str) -> None:
    """Eight POSTs at once to one HTTP process: their enqueue calls share round
    trips (not with IMPORTER_SHARE_ROUND_TRIPS=0), and each POST gets its own
    answer: new batches 202 with their own job, a batchId known with other
    content 409, a re-POST the same job."""
    system: System = make_system()
    system.start_worker()
    system.start_http(workers=1, threads=8, IMPORTER_SHARE_ROUND_TRIPS=share)
    seed = (FIXTURES / "shipment-a-2026.csv").read_bytes()
    assert system.post_csv("known", seed)[0] == 202
    assert system.post_csv("again", seed)[0] == 202
    other = b"sku,quantity\nOTHER-1,4\n"
    bodies = {f"b{n}": b"sku,quantity\nSKU-%d,%d\n" % (n, n + 1) for n in range(6)}
    bodies["known"] = other  # the same batchId, other rows: a conflict
    bodies["again"] = seed  # the same batch again: the same job
    answers: dict[str, tuple[int, Any]] = {}
    monitor = Monitor(system.redis_url, system.prefix + "job:")

    def post(batch_id: str) -> None:
        answers[batch_id] = system.post_csv(batch_id, bodies[batch_id])

    try:
        meeting(system.redis_url, 500, post, list(bodies), gap=0.02, timeout=30)
    finally:
        lines = monitor.stop()

    for n in range(6):
        status, body = answers[f"b{n}"]
        assert status == 202 and body["jobId"] == f"shipment-b{n}" and body["state"] == "waiting", answers[f"b{n}"]
    assert answers["known"][0] == 409 and answers["known"][1]["code"] == "batch.conflict"
    assert answers["again"][0] == 202 and answers["again"][1]["jobId"] == "shipment-again"
    enqueue = script_sha("enqueue")
    enqueue_calls = [line.client for line in lines if line.command.split()[:2] == ["EVALSHA", enqueue]]
    assert len(enqueue_calls) >= 8, lines
    busiest = Counter(enqueue_calls).most_common(1)[0][1]
    if share == "1":
        assert busiest >= 4, f"no round trip carried several POSTs' calls: {Counter(enqueue_calls)}"
    else:
        # Each POST on its own thread's connection (the conflict's thread makes two calls: its content is compared).
        assert len(Counter(enqueue_calls)) == 8 and busiest <= 2, Counter(enqueue_calls)
    for n in range(6):
        done = system.wait_state(f"shipment-b{n}")
        assert done["state"] == "completed", done
    assert system.store().stock_of([f"SKU-{n}" for n in range(6)]) == {f"SKU-{n}": n + 1 for n in range(6)}


def test_calls_queued_behind_a_round_trip_the_store_did_not_answer_fail_with_it(redis_url: str) -> None:
    """The store held longer than the socket timeout: the round trip on its
    way times out, and the calls queued behind it fail at once (503 for a
    POST, nothing sent) instead of each waiting a timeout more."""
    client = ImporterRedis.from_url(redis_url, socket_timeout=0.5)
    script = client.register_script(ECHO_OR_FAIL)
    marker = uuid.uuid4().hex
    client.run_script(script, [f"{marker}:k"], ["warm"])
    errors: dict[int, BaseException] = {}

    def call(n: int) -> None:
        try:
            client.run_script_shared(script, [f"{marker}:k"], [f"v{n}"])
        except redis.RedisError as exc:
            errors[n] = exc

    try:
        meeting(redis_url, 1500, call, list(range(4)), gap=0.02)
    finally:
        client.close()
    assert isinstance(errors[0], redis.TimeoutError), errors
    for n in (1, 2, 3):
        assert isinstance(errors[n], redis.ConnectionError) and "round trip ahead" in str(errors[n]), errors
