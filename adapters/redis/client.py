"""The Redis client Importer's store and its broker share.

* :class:`ImporterRedis` (one node) and :class:`ImporterRedisCluster`: a sick
  server's refusals (OOM, BUSY, READONLY...) are ConnectionErrors
  (adapters/redis/errors.py says what each error means); the store's scripts
  run on a connection of the calling thread's own (:meth:`ImporterRedis.run_script`),
  forgotten in a forked child.
* run_script_shared: the calls of a request path that threads of one process
  make at the same time share one round trip (adapters/redis/round_trips.py).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

import redis

from importer.adapters.redis.errors import ClusterUnavailable, NotReplicated, cluster_unavailable, refusal
from importer.adapters.redis.round_trips import SharedRoundTrips


#: The store's client: one node, or a Redis Cluster (IMPORTER_REDIS_CLUSTER).
RedisClient = redis.Redis | redis.RedisCluster


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
        #: node name -> the round trips its calls share (run_script_shared).
        self._sharing: dict[str, SharedRoundTrips] = {}
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

    def run_script(self, script: Any, keys: list[Any], args: list[Any]) -> Any:
        raise NotImplementedError

    def run_script_shared(self, script: Any, keys: list[Any], args: list[Any]) -> Any:
        """As :meth:`run_script`, but calls that several threads of this process
        make at the same time to the same node share one round trip (group
        commit: :class:`SharedRoundTrips`). Each call keeps its own script run,
        reply and error; a lone call is sent at once, as run_script sends it."""
        first = keys[0] if isinstance(keys[0], str) else keys[0].decode()
        name, pool = self._master_of(first)
        sharing = self._sharing.get(name)
        if sharing is None:
            with self._own_lock:
                sharing = self._sharing.setdefault(name, SharedRoundTrips())
        reply = sharing.call((script, keys, args), lambda calls: self._send_together(name, pool, calls))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _send_together(self, name: str, pool: Any, calls: list[tuple[Any, list[Any], list[Any]]]) -> list[Any]:
        """Several script calls pipelined on this thread's connection to one
        node: one reply (or error) per call, in order. A call the node did
        not run (a script it does not know; on a cluster, a redirection) and
        every call of a round trip whose connection broke are sent again on
        their own by run_script, whose rules (one resend on a lost connection,
        redis-py's way for the rest) then apply; a timeout is never sent again."""
        if len(calls) == 1:
            script, keys, args = calls[0]
            try:
                return [self.run_script(script, keys, args)]
            except Exception as exc:  # noqa: BLE001 - handed to its caller, who raises it
                return [exc]
        connection = self._own_connection(name, pool)
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]
        try:
            replies = self._exchange(connection, commands)
        except redis.TimeoutError as exc:
            return [exc] * len(calls)
        except redis.ConnectionError:
            replies = [None] * len(calls)  # each sent again on its own below
        out: list[Any] = []
        for (script, keys, args), reply in zip(calls, replies):
            if reply is None or isinstance(reply, _NOT_RUN):
                try:
                    reply = self.run_script(script, keys, args)
                except Exception as exc:  # noqa: BLE001
                    reply = exc
            elif isinstance(reply, redis.ResponseError):
                reply = refusal(reply)
            out.append(reply)
        return out

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
        self._sharing = {}


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
            refused = refusal(exc)
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
            refused = refusal(exc)
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
            refused = refusal(exc)
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
            refused = refusal(exc)  # an error reply, read whole: the connection is in step
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


_FORKED_CLIENTS: "weakref.WeakSet[ThreadConnections]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_FORKED_CLIENTS):
        client._forget_own_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)
