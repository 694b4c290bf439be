"""What the store's Redis errors mean.

* :class:`StoreUnavailable`: Redis cannot serve us right now (HTTP answers
  503, the attempt is retried); :func:`store_errors` / :func:`unavailable`
  turn a Redis error that means the store is away or refusing writes into
  it, and leave any other error (a bug) what it is.
* :class:`RedisRefusesWrites`, :class:`NotReplicated`, :class:`ClusterUnavailable`:
  a sick server's refusals and a cluster without a master for a slot, raised
  by the store's client (adapters/redis/client.py) as ConnectionErrors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis


class StoreError(Exception):
    """Base of the store's errors."""


class StoreUnavailable(StoreError):
    """Redis cannot serve us right now: unreachable, timed out, or refusing
    writes (out of memory, loading, read-only replica, busy script, master
    down). Transient: HTTP answers 503, the attempt is retried.

    ``reason`` is ``redis_unreachable`` or ``redis_refuses_writes`` (what
    /health says)."""

    def __init__(self, detail: str, reason: str = "redis_unreachable") -> None:
        super().__init__(detail)
        self.reason = reason


#: Error replies of a sick server (the first word of the reply). redis-py maps
#: some to classes (OutOfMemoryError, BusyLoadingError, ReadOnlyError), the
#: rest arrive as a plain ResponseError, also from inside a Lua script.
_REFUSING = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN", "MISCONF")


def cluster_unavailable(exc: BaseException) -> bool:
    """A Redis Cluster without a master for a slot (a failover in progress,
    CLUSTERDOWN), a slot being migrated (TRYAGAIN for a script whose keys are
    split between the two nodes, until the last is moved: redis-py's
    ClusterError "TTL exhausted" once its redirections are used up) or no node answering."""
    if isinstance(exc, (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
                        redis.exceptions.SlotNotCoveredError)):
        return True
    return isinstance(exc, redis.exceptions.RedisClusterException) and "cannot be connected" in str(exc)


def unavailable(exc: BaseException) -> StoreUnavailable | None:
    """The StoreUnavailable a Redis error means, or None for a real bug (WRONGTYPE, a script error, CROSSSLOT...)."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if cluster_unavailable(exc):
        return StoreUnavailable(type(exc).__name__)
    # BusyLoadingError is a ConnectionError in redis-py: test the refusals first.
    if isinstance(exc, (RedisRefusesWrites, redis.exceptions.OutOfMemoryError, redis.exceptions.BusyLoadingError,
                        redis.exceptions.ReadOnlyError)):
        return StoreUnavailable(type(exc).__name__, "redis_refuses_writes")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return StoreUnavailable(type(exc).__name__)
    if isinstance(exc, redis.ResponseError):
        text = str(exc)
        # A script's error reads "... script: ...: OOM command not allowed ..." on some versions.
        first = text.split(" ", 1)[0].upper()
        if first in _REFUSING or "OOM command not allowed" in text or "MASTERDOWN" in text:
            return StoreUnavailable(first, "redis_refuses_writes")
    return None


class RedisRefusesWrites(redis.ConnectionError):
    """A Redis that answers but refuses the command (OOM, BUSY, READONLY...), as a ConnectionError.

    dramatiq's consumer thread survives a ConnectionError (it reconnects a
    second later) but dies on any other Redis error raised while it cleans up:
    after an OOM episode a worker silently stopped fetching for good (seen in
    tests/faults, test_redis_full_then_freed). Raised by :class:`ImporterRedis`.
    """


def refusal(exc: redis.ResponseError) -> BaseException:
    """A sick server's refusal as RedisRefusesWrites; any other error reply as it is."""
    translated = unavailable(exc)
    if translated is not None and translated.reason == "redis_refuses_writes":
        return RedisRefusesWrites(str(exc))
    return exc


class NotReplicated(redis.ConnectionError):
    """Fewer replicas than IMPORTER_REDIS_WAIT_REPLICAS acknowledged a write in time (or the node is no master now)."""


class ClusterUnavailable(redis.ConnectionError):
    """A Redis Cluster that cannot serve a slot now (failover, CLUSTERDOWN, TRYAGAIN, no node answering)."""


@contextmanager
def store_errors() -> Iterator[None]:
    """Redis errors that mean "the store is sick" raised as StoreUnavailable."""
    try:
        yield
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        translated = unavailable(exc)
        if translated is None:
            raise
        raise translated from exc
