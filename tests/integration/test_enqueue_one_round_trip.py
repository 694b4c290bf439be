"""The Redis transport: the enqueue script writes the job record and its
dramatiq message in one atomic step, exactly as dramatiq's RedisBroker.enqueue
would have written the message, and a stock dramatiq consumer takes it."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import dramatiq
import pytest
import redis

from importer.adapters.bootstrap import clock_ms
from importer.adapters.dramatiq.broker import ACTOR_NAME, build_broker
from importer.adapters.dramatiq.producer import ImportQueue
from importer.adapters.redis.store import RedisStore
from importer.domain.contract import GROUP_VERSION, decode_group, encode_message
from importer.domain.ports import EnqueueCall
from importer.domain.shipment import bytes_sha256, job_id_for
from importer.domain.submit_import import Upload, submit_import, submit_imports
from tests.integration.support import FIXTURES, System

pytestmark = pytest.mark.integration

SEED = (FIXTURES / "shipment-a-2026.csv").read_bytes()


def _producer(system: System) -> tuple[RedisStore, ImportQueue, redis.Redis]:
    settings = system.settings
    client = redis.Redis.from_url(system.redis_url)
    queue = ImportQueue(build_broker(settings, client), settings)
    system.brokers.append(queue.broker)
    assert queue.writes_to(client)
    store = RedisStore(client, settings, clock_ms=clock_ms, messages=queue.redis_message, groups=queue.redis_group_message)
    return store, queue, client


def _stored(client: redis.Redis, system: System) -> list[dict[str, Any]]:
    ns = f"{system.prefix}dramatiq:{system.queue_name}"
    ids = [i.decode() for i in client.lrange(ns, 0, -1)]
    return [{"id": i, **json.loads(client.hget(ns + ".msgs", i))} for i in ids]  # type: ignore[arg-type]


def test_the_script_writes_what_broker_enqueue_writes(make_system: object) -> None:
    system: System = make_system()  # type: ignore[operator]
    store, queue, client = _producer(system)
    upload_id = uuid.uuid4().hex

    accepted = submit_import(
        store, queue, owner="owner-a", batch_id="fused-1", csv=SEED, upload_id=upload_id, max_rows=100
    )
    assert accepted.state == "waiting"
    assert client.zcard(store.keys.unsent) == 0  # nothing to send again: the message is there
    # ... and the reconciler's deadline of a sent message, as mark_sent sets it.
    record = store.get_job("shipment-fused-1")
    assert record is not None
    grace_ms = int(system.settings.waiting_grace_s * 1000)
    assert client.zscore(store.keys.deadline, "shipment-fused-1") == record.created_at_ms + grace_ms
    [ours] = _stored(client, system)

    # The same body through dramatiq's own RedisBroker.enqueue.
    body = encode_message("shipment-fused-1", "fused-1", upload_id, version=system.settings.producer_version)
    queue.send_raw(body)
    theirs = _stored(client, system)[1]

    assert set(ours) == set(theirs)
    # Every field of dramatiq's Message, in its order (a dramatiq upgrade that adds one fails here).
    assert [name for name in ours if name != "id"] == [f.name for f in dataclasses.fields(dramatiq.Message)]
    for field in ("queue_name", "actor_name", "args", "kwargs"):
        assert ours[field] == theirs[field], field
    assert ours["args"] == [body] and ours["actor_name"] == ACTOR_NAME
    assert set(ours["options"]) == set(theirs["options"]) == {"redis_message_id"}
    assert ours["options"]["redis_message_id"] == ours["id"]  # the list entry is the hash field
    assert isinstance(ours["message_timestamp"], int) and abs(ours["message_timestamp"] - theirs["message_timestamp"]) < 60_000
    uuid.UUID(ours["message_id"])

    # Posting the batch again writes neither a record nor a message.
    again = submit_import(store, queue, owner="owner-a", batch_id="fused-1", csv=SEED, upload_id=uuid.uuid4().hex, max_rows=100)
    assert again.job_id == accepted.job_id
    assert len(_stored(client, system)) == 2


def test_a_stock_dramatiq_consumer_takes_the_message(make_system: object) -> None:
    system: System = make_system()  # type: ignore[operator]
    store, queue, _ = _producer(system)
    upload_id = uuid.uuid4().hex
    submit_import(store, queue, owner="owner-a", batch_id="fused-2", csv=SEED, upload_id=upload_id, max_rows=100)

    broker = queue.broker
    broker.declare_queue(system.queue_name)
    consumer = broker.consume(system.queue_name, prefetch=1, timeout=1000)
    try:
        message = next(m for m in consumer if m is not None)
        assert isinstance(message, dramatiq.broker.MessageProxy)
        assert message.actor_name == ACTOR_NAME and message.queue_name == system.queue_name
        assert message.args == (encode_message("shipment-fused-2", "fused-2", upload_id, version=system.settings.producer_version),)
        consumer.ack(message)
    finally:
        consumer.close()


def test_end_to_end_with_a_real_worker_and_no_unsent_index(system: System) -> None:
    assert system.post_csv("fused-3", SEED)[0] == 202
    assert system.wait_state("shipment-fused-3")["state"] == "completed"
    store = system.store()
    assert store.client.zcard(store.keys.unsent) == 0


def test_a_bulk_call_writes_its_group_message_as_send_group_writes_it(make_system: object) -> None:
    """enqueue_many.lua fills the group message with the jobs it created (not
    the one that exists already, nor a large one, which gets its own): the
    same message as dramatiq's RedisBroker.enqueue of send_group's body, and
    each job gets the deadline of a sent message."""
    system: System = make_system()  # type: ignore[operator]
    store, queue, client = _producer(system)
    submit_import(store, queue, owner="owner-a", batch_id="g-known", csv=SEED, upload_id=uuid.uuid4().hex, max_rows=100)
    uploads = [
        Upload("g-1", SEED, uuid.uuid4().hex, send_later=True),
        Upload("g-known", SEED, uuid.uuid4().hex, send_later=True),  # exists: not in the group
        Upload("g-large", SEED, uuid.uuid4().hex, send_later=False),  # its own message, in the script
        Upload("g-2", SEED, uuid.uuid4().hex, send_later=True),
    ]
    later: list[tuple[str, str, str]] = []
    accepted = submit_imports(store, queue, uploads, owner="owner-a", max_rows=100, send_later=later)
    assert [a.job_id for a in accepted] == ["shipment-g-1", "shipment-g-known", "shipment-g-large", "shipment-g-2"]  # type: ignore[union-attr]
    assert later == []  # every one sent by the script itself
    assert client.zcard(store.keys.unsent) == 0
    stored = _stored(client, system)
    version = system.settings.producer_version
    assert [m["args"][0].get("version") for m in stored] == [version, version, GROUP_VERSION]  # g-known's, g-large's, the group
    ours = stored[2]
    group = [(u.batch_id, u.upload_id) for u in (uploads[0], uploads[3])]
    assert [(m.batch_id, m.upload_id) for m in decode_group(ours["args"][0], frozenset({GROUP_VERSION}))] == group
    for batch_id in ("g-1", "g-2"):
        record = store.get_job(f"shipment-{batch_id}")
        assert record is not None
        deadline = client.zscore(store.keys.deadline, f"shipment-{batch_id}")
        assert deadline == record.created_at_ms + int(system.settings.waiting_grace_s * 1000)

    queue.send_group([(f"shipment-{b}", b, u) for b, u in group])
    theirs = _stored(client, system)[3]
    assert [name for name in ours if name != "id"] == [f.name for f in dataclasses.fields(dramatiq.Message)]
    for field in ("queue_name", "actor_name", "args", "kwargs"):
        assert ours[field] == theirs[field], field
    assert set(ours["options"]) == set(theirs["options"]) == {"redis_message_id"}
    assert ours["options"]["redis_message_id"] == ours["id"]


def test_a_bulk_call_sends_shared_values_once_and_never_lends_them_to_a_job_that_differs(make_system: object) -> None:
    """enqueue_many.lua gets the values its jobs share once (its template) and
    each job's own values; a job whose 'shared' values differ (here, another
    owner: the port allows it, the HTTP bulk never sends it) starts another
    call with its own template, so every job is recorded with its own. And the
    jobs of one call send less than half the arguments they would whole."""
    system: System = make_system()  # type: ignore[operator]
    store, _, client = _producer(system)
    calls = [EnqueueCall(job_id_for(b, "main"), b, owner, uuid.uuid4().hex, SEED, bytes_sha256(SEED),
                         rate_token=True, send_later=True)
             for b, owner in (("t-1", "owner-a"), ("t-2", "owner-a"), ("t-3", "owner-b"), ("t-4", "owner-a"))]
    before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert [o.kind for o in store.enqueue_many(calls)] == ["created"] * 4
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] - before == 3 + 1  # t-1 and t-2 together; the live workers
    for c in calls:
        record = store.get_job(c.job_id)
        assert record is not None and record.owner == c.owner and record.upload_id == c.upload_id, c
    assert [j.decode() for j in client.zrange(f"{system.prefix}jobs:owner:owner-b", 0, -1)] == ["shipment-t-3"]

    many = [EnqueueCall(job_id_for(f"t-many-{n}", "main"), f"t-many-{n}", "owner-a", uuid.uuid4().hex, SEED,
                        bytes_sha256(SEED), rate_token=True, send_later=True) for n in range(40)]
    sent: list[tuple[str, list[Any], list[Any]]] = []
    pipelined = store._pipelined
    store._pipelined = lambda calls: sent.extend(calls) or pipelined(calls)  # type: ignore[method-assign]
    assert [o.kind for o in store.enqueue_many(many)] == ["created"] * 40
    ((name, keys, args),) = sent
    assert name == "enqueue_many" and args[0] == 40
    assert (len(keys) + len(args)) / 40 < 16, (len(keys), len(args))  # each job whole: 14 keys, 15 arguments, 3 to frame it
