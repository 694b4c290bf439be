"""Baseline for the drain scenario: a no-op dramatiq actor, no middleware.

Loaded by the plain ``dramatiq`` CLI (``python -m dramatiq bench.suite.noop_actor``)
with the same --processes/--threads/prefetch as ``importer worker``. It uses
dramatiq's RedisBroker on the bench's own server, like Importer, but with
``middleware=[]`` and dramatiq's defaults for everything else. The actor does
nothing at all: completion is observed from outside (the queue's ``.msgs``
hash becomes empty once every message is acknowledged).
"""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(
    url=os.environ["BENCH_REDIS_URL"],
    namespace=os.environ.get("BENCH_NAMESPACE", "dramatiq"),
    middleware=[],
)
dramatiq.set_broker(broker)


@dramatiq.actor(broker=broker, actor_name="noop", queue_name=os.environ.get("BENCH_QUEUE", "imports"))
def noop(body):  # type: ignore[no-untyped-def]
    return None
