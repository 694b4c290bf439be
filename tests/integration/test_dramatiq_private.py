"""dramatiq's private API, as adapters/dramatiq/private.py uses it, against
dramatiq's own Redis broker on a real server: when an upgrade changes one of
these shapes, this fails before anything else does."""

from __future__ import annotations

import uuid

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from importer.adapters.dramatiq import private

pytestmark = pytest.mark.integration


def test_the_private_shapes_importer_relies_on_hold(redis_url: str) -> None:
    namespace = "{priv" + uuid.uuid4().hex[:8] + "}:dramatiq"
    client = redis.Redis.from_url(redis_url)
    broker = RedisBroker(client=client, namespace=namespace, middleware=[])
    queue = "q" + uuid.uuid4().hex[:6]
    try:
        broker.declare_queue(queue)
        message = broker.enqueue(dramatiq.Message(queue_name=queue, actor_name="a", args=(1,), kwargs={}, options={}))
        rid = message.options["redis_message_id"]
        # Where RedisBroker.enqueue writes a message: enqueue.lua writes it there too.
        assert client.lrange(private.queue_key(namespace, queue), 0, -1) == [rid.encode()]
        assert client.hexists(private.messages_key(namespace, queue), rid)
        second = broker.enqueue(dramatiq.Message(queue_name=queue, actor_name="a", args=(2,), kwargs={}, options={}))
        # The consumer class, and where a fetched message waits for its ack.
        consumer = broker.consume(queue, prefetch=2, timeout=1000)
        assert isinstance(consumer, private.RedisConsumer)
        fetched = next(m for m in consumer if m is not None)
        assert fetched.options["redis_message_id"] == rid
        # What the consumer holds (broker.py _SafeRequeueConsumer and MessageHandover read
        # and change it): the fetched messages not yielded yet, raw, in its cache; the
        # yielded ones' ids until their ack; both counted against the prefetch.
        assert [dramatiq.Message.decode(raw).message_id for raw in consumer.message_cache] == [second.message_id]
        assert consumer.queued_message_ids == {fetched.message_id}
        assert consumer.outstanding_message_count == 2
        assert next(consumer).message_id == second.message_id and consumer.message_cache == []
        consumer.queued_message_ids.discard(second.message_id)
        assert client.sismember(private.acks_key(namespace, broker.broker_id, queue), rid)
        assert client.zscore(private.heartbeats_key(namespace), broker.broker_id) is not None
        # The private calls the fetch makes, with the shapes it passes on.
        assert private.should_do_maintenance(broker, "fetch") in (0, 1)
        assert private.max_unpack_size(broker) > 0
        assert callable(private.dispatch(broker, "fetch"))
        # Every do_<command> call goes through _dispatch(command) (ImporterRedisBroker overrides it).
        seen: list[str] = []

        class Probe(RedisBroker):
            def _dispatch(self, command: str):  # type: ignore[no-untyped-def]
                seen.append(command)
                return super()._dispatch(command)

        probe = Probe(client=client, namespace=namespace, middleware=[])
        probe.do_qsize(queue)
        assert seen == ["qsize"]
        probe.close()
        assert "local command" in private.dispatch_script() or "ARGV[1]" in private.dispatch_script()
        consumer.ack(fetched)
        assert not client.sismember(private.acks_key(namespace, broker.broker_id, queue), rid)
        consumer.close()
    finally:
        for key in client.scan_iter(match=namespace.replace("{", "\\{").replace("}", "\\}") + "*"):
            client.delete(key)
        broker.close()
