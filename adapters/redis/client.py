"""The Redis client Importer's store and its broker share, and what its errors mean.

* :class:`ImporterRedis`: a sick server's refusals (OOM, BUSY, READONLY...)
  are ConnectionErrors; the store's scripts run on a connection of the
  calling thread's own (:meth:`ImporterRedis.run_script`), forgotten in a
  forked child.
* :func:`store_errors` / :func:`unavailable`: a Redis error that means the
  store is away or refusing writes becomes :class:`StoreUnavailable` (HTTP
  answers 503, the attempt is retried); any other error is a bug and stays
  what it is.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis


#: The store's client: one node, or a Redis Cluster (IMPORTER_REDIS_CLUSTER).
RedisClient = redis.Redis | redis.RedisCluster


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


def _refusal(exc: redis.ResponseError) -> BaseException:
    """A sick server's refusal as RedisRefusesWrites; any other error reply as it is."""
    translated = unavailable(exc)
    if translated is not None and translated.reason == "redis_refuses_writes":
        return RedisRefusesWrites(str(exc))
    return exc


class ThreadConnections:
    """Connections of each calling thread's own, by a name (one per node),
    outside redis-py's pool: the store's scripts run on them
    (ImporterRedis.run_script, ImporterRedisCluster.run_script). Closed with
    the client; forgotten in a forked child (the parent's sockets are the parent's)."""

    def _init_own(self) -> None:
        self._own = threading.local()
        self._own_lock = threading.Lock()
        self._own_connections: list[Any] = []
        #: node name -> (replicas online, monotonic time asked): wait_replicated's.
        self._replica_counts: dict[str, tuple[int, float]] = {}
        _FORKED_CLIENTS.add(self)

    def _own_connection(self, name: str, pool: Any) -> Any:
        """This thread's connection named ``name``, made from ``pool``'s settings (it connects on first use)."""
        connections = getattr(self._own, "connections", None)
        if connections is None:
            connections = self._own.connections = {}
        connection = connections.get(name)
        if connection is None:
            connection = connections[name] = pool.connection_class(**pool.connection_kwargs)
            with self._own_lock:
                self._own_connections.append(connection)
        return connection

    def wait_replicated(self, key: str, replicas: int, timeout_ms: int) -> None:
        """Returns once ``replicas`` replicas of the master of ``key``'s slot
        (at most as many as it has online) hold every write that master made
        before this call; raises NotReplicated (a ConnectionError: 503, a safe
        retry) when they do not within ``timeout_ms``.

        One round trip: a SET of ``key`` (a tiny expiring mark) moves this
        connection's replication offset past every earlier write of the
        master, whichever connection made it (a replayed POST's record, a
        script that went redis-py's way), then WAIT. How many replicas a master
        has online is asked (ROLE) at most once a second: a master with none
        (a replica just promoted, a cluster without replicas) is not waited
        for, as no failover can take its writes away."""
        name, pool = self._master_of(key)
        connection = self._own_connection(name, pool)
        wanted = min(replicas, self._replicas_online(name, connection))
        if wanted <= 0:
            return
        replies = self._exchange(connection, [("SET", key, "1", "PX", 60_000), ("WAIT", wanted, timeout_ms)])
        error = next((r for r in replies if isinstance(r, Exception)), None)
        if error is not None or int(replies[1]) < wanted:
            self._replica_counts.pop(name, None)  # asked again on the next call
            raise NotReplicated(f"{replies[1] if error is None else error!r}: {wanted} replica(s) wanted")

    def _replicas_online(self, name: str, connection: Any) -> int:
        known = self._replica_counts.get(name)
        now = time.monotonic()
        if known is not None and now - known[1] < 1.0:
            return known[0]
        (role,) = self._exchange(connection, [("ROLE",)])
        if isinstance(role, Exception) or bytes(role[0]) != b"master":
            raise NotReplicated(f"not a master: {role!r}")
        count = len(role[2])
        self._replica_counts[name] = (count, now)
        return count

    @staticmethod
    def _exchange(connection: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Commands pipelined on a connection; an error reply is returned in its place, read whole."""
        replies: list[Any] = []
        try:
            connection.send_packed_command(connection.pack_commands(commands))
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            connection.disconnect()  # a reply may be unread: never read as the next call's
            raise
        return replies

    def _master_of(self, key: str) -> tuple[str, Any]:
        """The name of the node that holds ``key`` (one per node) and its connection pool."""
        raise NotImplementedError

    def _close_own(self) -> None:
        """Closes every thread's own connection (after the threads stopped calling)."""
        with self._own_lock:
            connections, self._own_connections = self._own_connections, []
        for connection in connections:
            connection.disconnect()

    def _forget_own_connections(self) -> None:
        self._own = threading.local()
        self._own_lock = threading.Lock()
        self._own_connections = []


class ImporterRedis(ThreadConnections, redis.Redis):
    """The client of the store and of dramatiq's Redis broker: a sick server's
    refusals are ConnectionErrors; the store's scripts run on a connection of
    the calling thread's own (:meth:`run_script`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_own()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        # Outside redis-py's retry wrapper on purpose: a refused command is not retried here.
        try:
            return super().execute_command(*args, **options)
        except redis.ResponseError as exc:
            refused = _refusal(exc)
            if refused is exc:
                raise
            raise refused from exc

    def run_script(self, script: Any, keys: list[Any], args: list[Any]) -> Any:
        """EVALSHA of a registered script (EVAL when the server lost its script
        cache), on the calling thread's own connection.

        Script.__call__ through redis-py's client costs about 35 us of Python
        per call besides the round trip (the pool's checkout and return under
        its lock with their fork checks, the retry wrapper, metric hooks):
        a fifth of a POST's CPU, measured. The rules are the
        client's (adapters/bootstrap.py redis_client): its connection
        settings (timeouts, command packer); one retry on a ConnectionError
        (a connection a restarted Redis closed; the scripts are safe to run
        again, as under redis-py's own retry), never on a timeout; a refusal
        (OOM, BUSY...) raised as RedisRefusesWrites, never retried. redis-py
        closes the connection on any error while sending or reading, so a
        late reply is never read as the next call's."""
        connection = self._thread_connection()
        try:
            try:
                return self._send_script(connection, script, keys, args)
            except redis.ConnectionError:
                return self._send_script(connection, script, keys, args)  # reconnects
        except redis.ResponseError as exc:
            refused = _refusal(exc)
            if refused is exc:
                raise
            raise refused from exc

    @staticmethod
    def _send_script(connection: Any, script: Any, keys: list[Any], args: list[Any]) -> Any:
        try:
            try:
                connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                return connection.read_response()
            except redis.exceptions.NoScriptError:
                connection.send_command("EVAL", script.script, len(keys), *keys, *args)
                return connection.read_response()
        except redis.ResponseError:
            raise  # an error reply, read whole: the connection is in step
        except BaseException:
            # Anything else between the send and the end of the reply (an
            # asynchronous TimeLimitExceeded, a signal) may leave the reply
            # unread: it must never be read as the next call's.
            connection.disconnect()
            raise

    def _thread_connection(self) -> Any:
        return self._own_connection("", self.connection_pool)

    def _master_of(self, key: str) -> tuple[str, Any]:
        return "", self.connection_pool

    def close(self) -> None:
        """Also closes every thread's own connection (after the threads stopped calling)."""
        self._close_own()
        super().close()


class ImporterRedisCluster(ThreadConnections, redis.RedisCluster):
    """The store's client on a Redis Cluster (IMPORTER_REDIS_CLUSTER=1): redis-py's
    RedisCluster (slots discovered from any one node, MOVED and ASK followed),
    with a sick node's refusals raised as ConnectionErrors, as ImporterRedis does.

    :meth:`run_script` sends a script to the master of its keys' slot on a
    connection of the calling thread's own, as ImporterRedis.run_script does
    on one node: redis-py's Script through RedisCluster costs ~60 us of
    Python per call (slot lookup, node and pool checkout, retry wrapper)
    against ~17 us (measured). Anything but a plain reply (a redirection, a
    slot without a master, a lost connection, a script the node does not
    know) goes the way of redis-py's cluster client, which follows and
    refreshes; a timeout is never sent again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_own()
        self._slots: dict[str, int] = {}

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        # A slot without a master is a ConnectionError too: dramatiq's consumer
        # thread survives those (and reconnects), any other error kills it.
        try:
            return super().execute_command(*args, **kwargs)
        except (redis.ResponseError, redis.exceptions.ClusterError, redis.exceptions.RedisClusterException) as exc:
            if cluster_unavailable(exc):
                raise ClusterUnavailable(f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(exc, redis.ResponseError):
                raise
            refused = _refusal(exc)
            if refused is exc:
                raise
            raise refused from exc

    def _master_of(self, key: str) -> tuple[str, Any]:
        tag = key[: key.find("}") + 1]
        slot = self._slots.get(tag)
        if slot is None:
            slot = self._slots[tag] = self.keyslot(key)
        node = self.nodes_manager.get_node_from_slot(slot)
        return node.name, node.redis_connection.connection_pool

    def run_script(self, script: Any, keys: list[Any], args: list[Any]) -> Any:
        """EVALSHA on the master of the keys' slot (every key of a script is in one slot: one partition)."""
        first = keys[0] if isinstance(keys[0], str) else keys[0].decode()
        name, pool = self._master_of(first)
        connection = self._own_connection(name, pool)
        try:
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return connection.read_response()
        except redis.TimeoutError:
            connection.disconnect()
            raise
        except _NOT_RUN:
            pass  # the script did not run there: redis-py's way below
        except redis.ConnectionError:
            pass  # closed by redis-py; sent again once, as ImporterRedis does (the scripts are safe to run again)
        except redis.ResponseError as exc:
            refused = _refusal(exc)  # an error reply, read whole: the connection is in step
            if refused is exc:
                raise
            raise refused from exc
        except BaseException:
            connection.disconnect()  # the reply may be unread: never read as the next call's
            raise
        # MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT, a closed connection: redis-py's
        # cluster client follows, refreshes its slots and loads the script (EVAL).
        return script(keys=keys, args=args)

    def close(self) -> None:
        self._close_own()
        super().close()


#: Replies after which a script did not run on that node (redirected, no master, unknown script).
_NOT_RUN = (
    redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError, redis.exceptions.NoScriptError,
)


class NotReplicated(redis.ConnectionError):
    """Fewer replicas than IMPORTER_REDIS_WAIT_REPLICAS acknowledged a write in time (or the node is no master now)."""


class ClusterUnavailable(redis.ConnectionError):
    """A Redis Cluster that cannot serve a slot now (failover, CLUSTERDOWN, TRYAGAIN, no node answering)."""


_FORKED_CLIENTS: "weakref.WeakSet[ThreadConnections]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_FORKED_CLIENTS):
        client._forget_own_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
