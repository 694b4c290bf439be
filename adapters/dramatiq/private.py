"""Every use of dramatiq's private API, in one place.

Checked against dramatiq 2.2.1 (pinned in pyproject.toml). On an upgrade,
tests/integration/test_dramatiq_private.py fails when one of these shapes
changed: run it first.

* Redis broker's key layout under its namespace: the queue list, its message
  hash, each worker's acks set, the heartbeats sorted set. enqueue.lua writes
  a message where ``RedisBroker.enqueue`` would, start_apply.lua acknowledges
  it where the consumer's ``ack`` would, and the reconciler reads the acks
  sets of every worker.
* ``_RedisConsumer``: the consumer ``RedisBroker.consume`` builds; Importer's
  consumer subclasses it (consumer_class), and reads and changes its state:
  ``message_cache`` (the fetched raw messages not yielded yet: leaders take
  riders from there, and a closing consumer requeues them) and
  ``queued_message_ids`` (the yielded ones' ids until their ack).
* dramatiq's ``Worker.worker_threads`` (read once the worker boots).
* ``RedisBroker._dispatch``, ``_should_do_maintenance`` and
  ``_max_unpack_size``, and the broker's script text (``_scripts``): the fetch
  brings small uploads with their messages by running dramatiq's own dispatch
  script with the arguments dramatiq passes; ImporterRedisBroker overrides
  ``_dispatch`` (which every ``do_<command>`` call goes through, by the
  broker's ``__getattr__``) to pass the namespace of the queue's location.
* ``dramatiq.middleware.prometheus._run_exposition_server``: ``importer
  worker``'s metrics exporter is dramatiq's, in a process of its own.
"""

from __future__ import annotations

from typing import Any

from dramatiq.brokers.redis import RedisBroker, _RedisConsumer, _scripts

#: The consumer class dramatiq's Redis broker builds for each queue.
RedisConsumer = _RedisConsumer


def queue_key(namespace: str, queue: str) -> str:
    return f"{namespace}:{queue}"


def messages_key(namespace: str, queue: str) -> str:
    return f"{namespace}:{queue}.msgs"


def acks_key(namespace: str, worker_id: str, queue: str) -> str:
    return f"{namespace}:__acks__.{worker_id}.{queue}"


def heartbeats_key(namespace: str) -> str:
    return f"{namespace}:__heartbeats__"


def dispatch(broker: RedisBroker, command: str) -> Any:
    """dramatiq's call of its dispatch script for ``command`` (e.g. "fetch"), through ``broker._dispatch``."""
    return broker._dispatch(command)


def should_do_maintenance(broker: RedisBroker, command: str) -> int:
    """1 when this call should also requeue dead workers' messages (dramatiq's dice)."""
    return int(broker._should_do_maintenance(command))


def dispatch_script() -> str:
    """The text of dramatiq's Redis broker script (its dispatch.lua)."""
    source = _scripts["dispatch"]
    return source.decode("utf-8") if isinstance(source, bytes) else str(source)


def run_exposition_server() -> Any:
    """dramatiq's Prometheus exposition server (runs until its process is stopped)."""
    from dramatiq.middleware.prometheus import _run_exposition_server

    return _run_exposition_server()


def max_unpack_size(broker: RedisBroker) -> int:
    """The bound dramatiq gives its dispatch script for unpacking message ids."""
    return int(broker._max_unpack_size())
