"""The composition root: builds clients, store, broker and app from Settings.

Nothing in the code base connects at import time; everything is built here,
once per process (each gunicorn worker, each dramatiq worker process).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import dramatiq
import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode
from redis.exceptions import DataError
from redis.retry import Retry

from importer.adapters import tracing
from importer.adapters.logs import log_event
from importer.adapters.metrics import HttpMetrics
from importer.adapters.dramatiq.broker import build_broker
from importer.adapters.dramatiq.middleware import AttemptRecorder, CloseConnections, LocationConsumers, Reconciler, StartAtBoot
from importer.adapters.dramatiq.producer import ImportQueue
from importer.adapters.dramatiq.rabbitmq import BoundedRabbitmqBroker
from importer.adapters.dramatiq.runner import ImportRunner, declare_import_actor
from importer.adapters.redis.client import ImporterRedis, ImporterRedisCluster, RedisClient
from importer.adapters.redis.errors import StoreUnavailable
from importer.adapters.postgres.errors import LedgerUnavailable
from importer.adapters.postgres.ledger import PostgresLedger, ProducerArchive
from importer.adapters.processes.ledger import LedgerStatus
from importer.adapters.processes.ledger_sync import SyncWatch
from importer.adapters.redis.store import RedisStore
from importer.adapters.settings import Settings, SettingsError
from importer.adapters.dramatiq.presence import WorkerPresence
from importer.domain.ports import AttemptStore, MessageSender
from importer.handlers.api import Api
from importer.handlers.auth import KeyRing
from importer.handlers.downloads import Downloads
from importer.handlers.event_stream import EventStreams
from importer.domain.ids import random_hex, random_uuid, request_id_var
from importer.handlers.openapi import spec_yaml
from importer.handlers.wsgi import WsgiApp, create_app

log = logging.getLogger("importer")


def clock_ms() -> int:
    return int(time.time() * 1000)


class LargeValuePacker:
    """The command packer of every Importer client: hiredis's (fast) for
    ordinary commands, redis-py's own for a command carrying a large value
    (an upload, in enqueue.lua's arguments). hiredis packs every argument
    into one new bytes object, a copy of the upload; redis-py's own packer
    sends a large value as its own buffer. An ordinary command goes to
    hiredis without redis-py's two passes over its arguments (the worker's
    one-step script has about 60)."""

    LARGE = 64 * 1024

    def __init__(self) -> None:
        from redis._parsers.encoders import Encoder
        from redis.connection import HiredisRespSerializer, PythonRespSerializer
        from redis.utils import HIREDIS_AVAILABLE

        self.plain = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
        self.fast = HiredisRespSerializer() if HIREDIS_AVAILABLE else self.plain
        self._hiredis: Any = None
        if HIREDIS_AVAILABLE:
            import hiredis

            self._hiredis = hiredis

    def pack(self, *args: Any) -> list[Any]:
        plain = True  # only str, bytes and numbers, none of them large: hiredis as it is
        for arg in args:
            kind = type(arg)
            if kind is bytes or kind is bytearray or kind is memoryview:
                if len(arg) > self.LARGE:
                    return self.plain.pack(*args)  # type: ignore[no-any-return]
                plain = plain and kind is bytes
        first = args[0]
        if plain and self._hiredis is not None and type(first) is str and " " not in first:
            # What HiredisRespSerializer.pack does for such a command, without its two
            # passes over the arguments (15 us of an EVALSHA of ~37 arguments).
            try:
                return [self._hiredis.pack_command(args)]
            except TypeError as exc:
                raise DataError(exc) from exc
        return self.fast.pack(*args)  # type: ignore[no-any-return]


def redis_client(settings: Settings) -> RedisClient:
    """A client whose every call waits at most IMPORTER_REDIS_SOCKET_TIMEOUT.

    A paused Redis must not hang a request or a worker thread (dramatiq's
    TimeLimit cannot interrupt a blocked socket call). redis-py 8 retries a
    ConnectionError *or TimeoutError* up to 10 times by default, so a request
    on a stopped Redis used to wait a multiple of the socket timeout (20.1 s
    measured with a 10 s timeout); and health_check_interval added a PING,
    with its own wait, before the command on an idle connection. Here: one
    retry, on ConnectionError only (a pooled connection that a restarted Redis
    closed fails at once and is reopened); a timeout is never retried; no
    health-check PING. Commands are packed by LargeValuePacker.
    """
    if not settings.redis_url:
        raise SettingsError("IMPORTER_REDIS_URL is not set (only `importer dev` starts an embedded server)")
    timeout = settings.redis_socket_timeout_s
    if settings.redis_cluster:
        # MOVED/ASK are followed inside one call; a node that is down or a slot
        # without a master (CLUSTERDOWN, TRYAGAIN, a failover in progress) is
        # asked again after a fresh look at the slots, 2 more times within
        # ~0.3 s, then the call fails as StoreUnavailable (503, an outage).
        # A timeout is a timeout: the bound of one call stays the socket timeout.
        # IMPORTER_REDIS_URL names one node, or several (comma-separated): a
        # process that starts while the one named is down finds the cluster
        # through the others (a running process knows every node already).
        first, *more = [u.strip() for u in settings.redis_url.split(",") if u.strip()]
        extra = {"startup_nodes": [ClusterNode(u.hostname or "127.0.0.1", u.port or 6379) for u in map(urlparse, more)]}
        return ImporterRedisCluster.from_url(
            first,
            socket_timeout=timeout,
            socket_connect_timeout=min(timeout, 5.0),
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 2),
            health_check_interval=0,
            **(extra if more else {}),
        )
    return ImporterRedis.from_url(
        settings.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=min(timeout, 5.0),
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        health_check_interval=0,
        command_packer=LargeValuePacker(),
    )


#: glibc mallopt parameter: allocations at least this large get their own mmap.
_M_MMAP_THRESHOLD = -3


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc's malloc_trim), so an HTTP
    process does not keep the peak of its last large upload. No-op elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def bound_large_allocations() -> None:
    """Let every allocation of 1 MiB or more (an upload's buffers) be its own
    mmap, returned to the OS when freed. glibc otherwise raises this threshold
    to the largest block freed so far (up to 32 MiB), after which such blocks
    come from the heap and stay with the process. No-op outside glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 1024 * 1024)


@functools.cache
def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc (Linux); not found elsewhere
        libc.malloc_trim, libc.mallopt  # noqa: B018 - both must exist
        return libc
    except (OSError, AttributeError):
        return None


@dataclass
class HttpSide:
    settings: Settings
    client: RedisClient
    store: RedisStore
    broker: dramatiq.Broker
    api: Api
    app: WsgiApp

    def close(self) -> None:
        """Close the broker and Redis connections (after in-flight requests finished)."""
        self.broker.close()
        self.client.close()


def fault_points(spec: str) -> Callable[[str], None]:
    """Test-only (IMPORTER_FAULT): a process's named points, to sleep or die at (adapters/faults.py)."""
    from importer.adapters.faults import Faults

    return Faults(spec).at


def open_ledger(settings: Settings, *, max_size: int = 4) -> PostgresLedger | None:
    """[ledger] The ledger's connection pool when IMPORTER_DATABASE_URL is set (opened
    in the background: a ledger down at start-up is a late history, not a failed start)."""
    if not settings.database_url:
        return None
    ledger = PostgresLedger(settings.database_url, max_size=max_size).open(wait=False)
    try:
        ledger.migrate()  # under an advisory lock: the processes starting together apply each migration once
    except LedgerUnavailable as exc:
        log_event(log, "ledger.unavailable", logging.WARNING, detail=str(exc)[:300], hint="the exporter migrates once it answers")
    return ledger


def build_http(settings: Settings) -> HttpSide:
    bound_large_allocations()
    traced = tracing.setup(settings, "importer-http")
    client = redis_client(settings)
    broker = build_broker(settings, client)
    queue = ImportQueue(broker, settings, request_id=request_id_var.get, new_id=random_uuid)
    # On the Redis transport the message is written with the job record, in
    # one script (one round trip per POST, no unsent window).
    writes = queue.writes_to(client)
    store = RedisStore(
        client, settings, clock_ms=clock_ms, messages=queue.redis_message if writes else None,
        groups=queue.redis_group_message if writes else None,
    )
    store.history = ledger = open_ledger(settings)
    watch = SyncWatch(store, ledger) if ledger is not None else None
    if watch is not None:
        store.behind = watch.is_behind
    metrics = HttpMetrics(store, ledger)
    sender: MessageSender = queue
    ledger_status = LedgerStatus(store, ledger, on_start=watch.start if watch is not None else None) if ledger is not None else None
    if settings.fault:
        from importer.adapters.faults import Faults, FaultySender  # tests only

        sender = FaultySender(sender, Faults(settings.fault))
    api = Api(
        store=store,
        sender=sender,
        max_upload_bytes=settings.max_upload_bytes,
        max_rows=settings.max_rows,
        openapi_yaml=spec_yaml,
        uuidgen=random_hex,
        # The store's Redis or the message broker unreachable: 503, retry later.
        unavailable_errors=(StoreUnavailable, dramatiq.errors.BrokerError),
        # /health's probe of RabbitMQ (a publish confirmed within the bound); Redis is the store's own.
        broker_sickness=broker.sickness if isinstance(broker, BoundedRabbitmqBroker) else lambda: "",
        metrics=metrics.render,
        metrics_token=settings.metrics_token,
        on_store_error=metrics.redis_errors.inc,
        event_streams=EventStreams(
            limit=settings.max_event_streams,
            heartbeat_s=settings.event_stream_heartbeat_s,
            max_duration_s=settings.event_stream_max_duration_s,
            # A blocking read must end before the socket timeout cuts it.
            block_s=max(0.1, min(5.0, settings.redis_socket_timeout_s / 2)),
        ),
        downloads=Downloads(
            limit=settings.max_downloads, per_owner=settings.max_downloads_per_owner, stall_s=settings.download_stall_s,
        ),
        max_concurrent_uploads=settings.max_concurrent_uploads,
        # A bulk request's small shipments travel as group messages (the worker reads their uploads).
        group_max_bytes=settings.one_step_max_bytes,
        max_body_reads=settings.max_body_reads,
        body_timeout_s=settings.http_body_timeout_s,
        release_memory=release_free_memory,
        producer_version=settings.producer_version,
        default_location=settings.default_location,
        history=ledger,
        archive=ProducerArchive(ledger) if ledger is not None else None,
        ledger_status=ledger_status or (lambda: None),
        operations=store,
        trace_request=tracing.traced_request if traced else None,
        ledger_lags=ledger_status.by_location if ledger_status is not None else (lambda: None),
    )
    keys = KeyRing.parse(settings.api_keys)
    if not keys.entries:
        log_event(log, "http.no_api_keys", logging.WARNING, hint="set IMPORTER_API_KEYS or IMPORTER_API_KEYS_FILE")
    return HttpSide(settings, client, store, broker, api, create_app(api, keys))


def build_worker(settings: Settings) -> dramatiq.Broker:
    """The broker of a worker process, with the import actor declared on it."""
    tracing.setup(settings, "importer-worker")
    client = redis_client(settings)
    store = RedisStore(client, settings, clock_ms=clock_ms)
    store.archive = ledger = open_ledger(settings)
    watch = SyncWatch(store, ledger) if ledger is not None else None
    if watch is not None:
        store.behind = watch.is_behind
    attempts: AttemptStore = store
    if settings.fault:
        from importer.adapters.faults import Faults, FaultyAttemptStore  # tests only

        attempts = FaultyAttemptStore(store, Faults(settings.fault))
    runner = ImportRunner(attempts, settings)
    middleware = [
        Reconciler(store, runner, settings), WorkerPresence(store, settings), LocationConsumers(store), CloseConnections(client),
        # the worker checks its Redis against the ledger before it consumes (5 s at most)
        *([StartAtBoot(lambda: watch.start(wait_s=5.0))] if watch is not None else []),
    ]
    if settings.worker_metrics_port:
        from importer.adapters.processes.worker_metrics import WorkerPrometheus

        middleware.append(WorkerPrometheus())
    broker = build_broker(settings, client, worker_middleware=middleware, recorder=AttemptRecorder(runner, settings))
    declare_import_actor(broker, runner, settings)
    return broker
