"""The service's settings, read from the environment: ``Settings.from_env``,
and the log format, read on its own first. The commands' own settings are in
command_settings.py, the only other module that reads the environment.

Every variable is documented in README.md ("Configuration").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from importer.domain.contract import CURRENT_VERSION, DEFAULT_ACCEPTED_VERSIONS, GROUP_VERSION, KNOWN_VERSIONS
from importer.domain.locations import LOCATION_PATTERN, MAIN, is_valid_location
from importer.domain.shipment import DEFAULT_MAX_ROWS


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None


def _versions(env: Mapping[str, str], name: str, default: frozenset[int]) -> frozenset[int]:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return frozenset(int(v) for v in raw.split(",") if v.strip())
    except ValueError:
        raise SettingsError(f"{name} must be a comma-separated list of integers, got {raw!r}") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").lower() in ("1", "true", "yes")


#: IMPORTER_LOG_FORMAT: "json" (one JSON object per line, for services and
#: log collectors) or "text" (one short readable line, for a terminal).
LOG_FORMATS = ("json", "text")
#: IMPORTER_LOG_LEVEL: the level of Importer's own loggers ("importer.*").
LOG_LEVELS = ("debug", "info", "warning", "error")


def _one_of(env: Mapping[str, str] | None, name: str, choices: tuple[str, ...], default: str) -> str:
    """The variable, lower case, or ``default`` when it is unset or empty; else refused by name."""
    env = os.environ if env is None else env
    value = (env.get(name) or default).strip().lower()
    if value not in choices:
        raise SettingsError(f"{name} must be {', '.join(choices[:-1])} or {choices[-1]}, got {env.get(name)!r}")
    return value


def log_format(env: Mapping[str, str] | None = None, default: str = "json") -> str:
    """IMPORTER_LOG_FORMAT. Read on its own (not only through ``Settings``), as
    log_level is: logging is configured first, before the other settings."""
    return _one_of(env, "IMPORTER_LOG_FORMAT", LOG_FORMATS, default)


def log_level(env: Mapping[str, str] | None = None) -> str:
    """IMPORTER_LOG_LEVEL, the level of Importer's own loggers. Read by
    configure_logging as the first step of every process, not kept in ``Settings``."""
    return _one_of(env, "IMPORTER_LOG_LEVEL", LOG_LEVELS, "info")


def _api_keys(env: Mapping[str, str]) -> str:
    parts = [env.get("IMPORTER_API_KEYS", "")]
    path = env.get("IMPORTER_API_KEYS_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                parts.append(handle.read())
        except OSError as exc:
            raise SettingsError(f"IMPORTER_API_KEYS_FILE cannot be read: {exc.strerror}") from None
    return "\n".join(p for p in parts if p)


_HASH_TAGGED = re.compile(r"^[^{}]*\{[^{}]+\}[^{}]*$")


@dataclass(frozen=True)
class Settings:
    #: None means: start the embedded server (``importer dev``, tests).
    redis_url: str | None = None
    #: The message transport: None = IMPORTER_REDIS_URL's; "redis://..."; "amqp://..." RabbitMQ (confirms on).
    broker_url: str | None = None
    #: Every key lives under this prefix. It must hold a hash tag ({...}) so
    #: that a Redis Cluster keeps all keys one Lua script touches in one slot.
    key_prefix: str = "{importer}:"
    #: IMPORTER_REDIS_CLUSTER=1: IMPORTER_REDIS_URL names any node of a Redis
    #: Cluster; the client finds the rest (redis-py's RedisCluster).
    redis_cluster: bool = False
    #: The stock location of a request that names none (domain/locations.py).
    default_location: str = MAIN
    #: IMPORTER_LOCATIONS: stock locations `importer serve` and `importer worker` declare at
    #: start (comma-separated), besides main and the default location; operators add
    #: more with `importer locations add`. An undeclared location is refused (404).
    locations: tuple[str, ...] = ()
    queue_name: str = "imports"
    #: Seconds; dramatiq's TimeLimit for one attempt.
    time_limit_s: float = 60.0
    #: Attempts that count: those that failed for the import's own reasons
    #: (the store being away never counts; a stalled worker counts apart).
    max_attempts: int = 3
    #: Stalls (an attempt whose worker vanished while the store answered: its
    #: lease ran out) an import survives; one more fails it with import.stalled.
    max_stalls: int = 2
    min_backoff_ms: int = 1000
    max_backoff_ms: int = 30_000
    #: Seconds without a heartbeat before a dead worker's messages are redelivered.
    heartbeat_timeout_s: float = 15.0
    #: Per million broker commands: how often dramatiq's Redis broker looks for
    #: dead workers to redeliver their messages. dramatiq's 1,000 means ~500 s
    #: between checks on an idle queue; 50,000 brings it to ~10-20 s.
    maintenance_chance: int = 50_000
    #: Seconds an HTTP worker keeps serving (with /health at 503) after SIGTERM
    #: before it stops accepting, so load balancers take it out first.
    http_drain_delay_s: float = 2.0
    #: Seconds a worker waits for in-flight imports when asked to stop.
    worker_shutdown_timeout_s: float = 30.0
    #: Reconciler (README, "Every accepted import ends"): seconds a job may stay
    #: waiting (or retrying past its nextAttemptAt) before its message is sent again.
    waiting_grace_s: float = 15.0
    #: Seconds an attempt holds its job without renewal: a running attempt's
    #: worker renews it every reconcile interval; a dead or stopped one does not.
    attempt_lease_s: float = 15.0
    #: Seconds beyond the time limit after which an attempt is stalled even if
    #: its worker still renews the lease (a thread blocked where TimeLimit cannot reach).
    stall_margin_s: float = 15.0
    #: Seconds between reconciler passes (one pass at a time cluster-wide).
    reconcile_interval_s: float = 5.0
    #: Seconds any single Redis call may wait (read and connect): bounds every
    #: HTTP request and worker step when Redis is stopped or paused.
    redis_socket_timeout_s: float = 10.0
    #: Before a POST (or a retry) answers 202, this many replicas of its
    #: partition's master (at most as many as are connected) must have its
    #: record, so a failover cannot lose an accepted import (Redis replicates
    #: asynchronously). A master with no replica online is not waited for.
    #: 0 = answer as soon as the master has it.
    redis_wait_replicas: int = 1
    #: Milliseconds a POST waits for those replicas before answering 503 (a safe retry).
    redis_wait_replicas_ms: int = 1000
    max_rows: int = DEFAULT_MAX_ROWS
    max_upload_bytes: int = 10 * 1024 * 1024
    #: Uploads up to this many bytes (about 1,000 rows) come to the worker with
    #: their queue message and run as one script call (start, validated, apply,
    #: completed, ack); larger ones keep the separate steps, so 'validated' shows
    #: before a long apply. 0 = always the separate steps. See docs/performance.md.
    one_step_max_bytes: int = 16 * 1024
    #: At most this many such small imports of one location that a worker
    #: process fetched together run in one script call (each with its own
    #: outcome); 1 = one call per import. See docs/performance.md.
    apply_together_max: int = 16
    #: 1: the enqueue calls that threads of one HTTP process make at the same
    #: time share one Redis round trip (each its own script run and answer);
    #: 0 = one round trip per POST. See docs/reliability.md.
    share_round_trips: int = 1
    accepted_versions: frozenset[int] = DEFAULT_ACCEPTED_VERSIONS
    producer_version: int = CURRENT_VERSION
    keep_completed_age_s: int = 3600
    keep_completed_count: int = 100
    keep_failed_age_s: int = 86400
    keep_failed_count: int = 100
    events_maxlen: int = 10_000
    #: "owner:sha256hex" entries (IMPORTER_API_KEYS, and/or the lines of IMPORTER_API_KEYS_FILE).
    api_keys: str = ""
    #: POSTs allowed per owner per rate window (0 = no limit), across all HTTP processes.
    rate_limit: int = 50
    rate_window_s: float = 1.0
    #: Large uploads (over 1 MiB) one HTTP process reads and handles at once;
    #: one more gets 503 service.busy with Retry-After (0 = no bound).
    max_concurrent_uploads: int = 1
    #: Request bodies one HTTP process reads at once (a slow body holds its
    #: slot until it arrived, or its timeout and the client left); one more
    #: POST gets 503 service.busy, so slow bodies never hold every thread (0 = no bound).
    max_body_reads: int = 2
    #: Seconds a request body may take to arrive whole; then 408 request.timeout.
    http_body_timeout_s: float = 60.0
    #: Refuse to start unless Redis has maxmemory-policy noeviction (override: loud warning).
    allow_eviction: bool = False
    #: Bearer token that GET /metrics requires; unset = nobody can read /metrics (401).
    metrics_token: str = ""
    #: Port of dramatiq's Prometheus exporter in `importer worker` (0 = off).
    worker_metrics_port: int = 0
    #: Address `importer serve` listens on unless --bind says otherwise.
    http_bind: str = "127.0.0.1:8080"
    #: Live event streams (GET /api/imports/{jobId}/events) one HTTP process holds at once; one more gets 503
    #: (clients then poll). Each holds a server thread: 4, not 32, because granian's p99 on ordinary
    #: requests grows with its thread count (docs/performance.md, "HTTP: threads per process").
    max_event_streams: int = 4
    #: Long downloads (GET /api/stock-movements as CSV) one HTTP process serves at once, and of them
    #: per owner; one more gets 429 (handlers/downloads.py). Each holds a server thread, added like the streams'.
    max_downloads: int = 2
    max_downloads_per_owner: int = 1
    #: Seconds a download's client may take nothing before the download ends, cut.
    download_stall_s: float = 30.0
    #: Seconds between heartbeat comments on a quiet event stream.
    event_stream_heartbeat_s: float = 15.0
    #: Seconds after which the server ends an event stream (the client reconnects with Last-Event-ID).
    event_stream_max_duration_s: float = 300.0
    #: The HTTP server of `importer serve`: granian (default) or gunicorn.
    http_server: str = "granian"
    #: granian: seconds a client has to send its whole header block.
    http_header_timeout_s: float = 10.0
    #: Log lines: "json" (default) or "text" (``importer dev``'s default); see log_format.
    log_format: str = "json"
    #: [ledger] PostgreSQL URL of the ledger (IMPORTER_DATABASE_URL); None: the ledger is off
    #: (``importer dev`` starts an embedded server instead).
    database_url: str | None = None
    #: [ledger] Seconds a shipment's receipt and journal entry stay in Redis once the ledger holds them.
    ledger_hot_window_s: float = 3600.0
    #: [ledger] Seconds a done marker stays in Redis (then only if its batch has no job record left);
    #: past it the ledger answers for the batch. Safety never rests on its length.
    idempotency_horizon_s: float = 7 * 86400.0
    #: [ledger] Seconds the exporter sleeps when it found nothing to export.
    ledger_interval_s: float = 0.2
    #: [ledger] Journal entries per export transaction.
    ledger_batch: int = 500
    #: [ledger] The exporter brings a location's Redis forward from the ledger by itself as soon
    #: as it finds it behind (adapters/processes/ledger_sync.py); off: `importer ledger restore` by hand.
    ledger_auto_restore: bool = True
    #: [trace] OTEL_TRACES_EXPORTER "console" or "otlp": tracing on (the otel extra); "none" (default): off, at no cost.
    traces_exporter: str = "none"
    otel_service_name: str = ""  #: [trace] OTEL_SERVICE_NAME (else importer-http, importer-worker)
    #: Test-only fault injection, e.g. "after_apply:5" (sleep 5 s there) or
    #: "before_send:crash" (kill the process there). Never set in production.
    fault: str = ""

    @property
    def declared_locations(self) -> list[str]:  # IMPORTER_LOCATIONS and the default, main aside
        return sorted({*self.locations, self.default_location} - {MAIN})

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        settings = cls(
            redis_url=env.get("IMPORTER_REDIS_URL") or None,
            broker_url=env.get("IMPORTER_BROKER_URL") or None,
            key_prefix=env.get("IMPORTER_KEY_PREFIX") or cls.key_prefix,
            redis_cluster=_flag(env, "IMPORTER_REDIS_CLUSTER"),
            default_location=env.get("IMPORTER_DEFAULT_LOCATION") or cls.default_location,
            locations=tuple(n.strip() for n in env.get("IMPORTER_LOCATIONS", "").split(",") if n.strip()),
            queue_name=env.get("IMPORTER_QUEUE") or cls.queue_name,
            time_limit_s=_float(env, "IMPORTER_TIME_LIMIT", cls.time_limit_s),
            heartbeat_timeout_s=_float(env, "IMPORTER_HEARTBEAT_TIMEOUT", cls.heartbeat_timeout_s),
            maintenance_chance=_int(env, "IMPORTER_BROKER_MAINTENANCE_CHANCE", cls.maintenance_chance),
            http_drain_delay_s=_float(env, "IMPORTER_HTTP_DRAIN_DELAY", cls.http_drain_delay_s),
            worker_shutdown_timeout_s=_float(env, "IMPORTER_WORKER_SHUTDOWN_TIMEOUT", cls.worker_shutdown_timeout_s),
            waiting_grace_s=_float(env, "IMPORTER_WAITING_GRACE", cls.waiting_grace_s),
            attempt_lease_s=_float(env, "IMPORTER_ATTEMPT_LEASE", cls.attempt_lease_s),
            max_stalls=_int(env, "IMPORTER_MAX_STALLS", cls.max_stalls),
            stall_margin_s=_float(env, "IMPORTER_STALL_MARGIN", cls.stall_margin_s),
            reconcile_interval_s=_float(env, "IMPORTER_RECONCILE_INTERVAL", cls.reconcile_interval_s),
            redis_socket_timeout_s=_float(env, "IMPORTER_REDIS_SOCKET_TIMEOUT", cls.redis_socket_timeout_s),
            redis_wait_replicas=_int(env, "IMPORTER_REDIS_WAIT_REPLICAS", cls.redis_wait_replicas),
            redis_wait_replicas_ms=_int(env, "IMPORTER_REDIS_WAIT_REPLICAS_MS", cls.redis_wait_replicas_ms, minimum=1),
            max_rows=_int(env, "IMPORTER_MAX_ROWS", cls.max_rows, minimum=1),
            max_upload_bytes=_int(env, "IMPORTER_MAX_UPLOAD_BYTES", cls.max_upload_bytes, minimum=1),
            one_step_max_bytes=_int(env, "IMPORTER_ONE_STEP_MAX_BYTES", cls.one_step_max_bytes),
            apply_together_max=_int(env, "IMPORTER_APPLY_TOGETHER_MAX", cls.apply_together_max),
            share_round_trips=_int(env, "IMPORTER_SHARE_ROUND_TRIPS", cls.share_round_trips),
            accepted_versions=_versions(env, "IMPORTER_ACCEPTED_VERSIONS", DEFAULT_ACCEPTED_VERSIONS),
            producer_version=_int(env, "IMPORTER_PRODUCER_VERSION", CURRENT_VERSION, minimum=1),
            keep_completed_age_s=_int(env, "IMPORTER_KEEP_COMPLETED_AGE", cls.keep_completed_age_s),
            keep_completed_count=_int(env, "IMPORTER_KEEP_COMPLETED_COUNT", cls.keep_completed_count),
            keep_failed_age_s=_int(env, "IMPORTER_KEEP_FAILED_AGE", cls.keep_failed_age_s),
            keep_failed_count=_int(env, "IMPORTER_KEEP_FAILED_COUNT", cls.keep_failed_count),
            events_maxlen=_int(env, "IMPORTER_EVENTS_MAXLEN", cls.events_maxlen, minimum=1),
            fault=env.get("IMPORTER_FAULT", ""),
            traces_exporter=(env.get("OTEL_TRACES_EXPORTER") or "none").strip().lower(),
            otel_service_name=env.get("OTEL_SERVICE_NAME", ""),
            database_url=env.get("IMPORTER_DATABASE_URL") or None,
            ledger_hot_window_s=_float(env, "IMPORTER_LEDGER_HOT_WINDOW", cls.ledger_hot_window_s),
            idempotency_horizon_s=_float(env, "IMPORTER_IDEMPOTENCY_HORIZON", cls.idempotency_horizon_s),
            ledger_interval_s=_float(env, "IMPORTER_LEDGER_INTERVAL", cls.ledger_interval_s),
            ledger_batch=_int(env, "IMPORTER_LEDGER_BATCH", cls.ledger_batch, minimum=1),
            ledger_auto_restore=env.get("IMPORTER_LEDGER_AUTO_RESTORE", "1") != "0",
            api_keys=_api_keys(env),
            rate_limit=_int(env, "IMPORTER_RATE_LIMIT", cls.rate_limit),
            rate_window_s=_float(env, "IMPORTER_RATE_WINDOW", cls.rate_window_s),
            max_concurrent_uploads=_int(env, "IMPORTER_MAX_CONCURRENT_UPLOADS", cls.max_concurrent_uploads),
            max_body_reads=_int(env, "IMPORTER_MAX_BODY_READS", cls.max_body_reads),
            http_body_timeout_s=_float(env, "IMPORTER_HTTP_BODY_TIMEOUT", cls.http_body_timeout_s),
            allow_eviction=_flag(env, "IMPORTER_ALLOW_EVICTION"),
            metrics_token=env.get("IMPORTER_METRICS_TOKEN", ""),
            worker_metrics_port=_int(env, "IMPORTER_WORKER_METRICS_PORT", 0),
            http_bind=env.get("IMPORTER_HTTP_BIND") or cls.http_bind,
            max_event_streams=_int(env, "IMPORTER_MAX_EVENT_STREAMS", cls.max_event_streams),
            max_downloads=_int(env, "IMPORTER_MAX_DOWNLOADS", cls.max_downloads),
            max_downloads_per_owner=_int(env, "IMPORTER_MAX_DOWNLOADS_PER_OWNER", cls.max_downloads_per_owner),
            download_stall_s=_float(env, "IMPORTER_DOWNLOAD_STALL", cls.download_stall_s),
            event_stream_heartbeat_s=_float(env, "IMPORTER_EVENT_STREAM_HEARTBEAT", cls.event_stream_heartbeat_s),
            event_stream_max_duration_s=_float(env, "IMPORTER_EVENT_STREAM_MAX_DURATION", cls.event_stream_max_duration_s),
            http_server=env.get("IMPORTER_HTTP_SERVER") or cls.http_server,
            http_header_timeout_s=_float(env, "IMPORTER_HTTP_HEADER_TIMEOUT", cls.http_header_timeout_s),
            log_format=log_format(env),
        )
        settings.check()
        return settings

    def check(self) -> None:
        if not _HASH_TAGGED.match(self.key_prefix):
            raise SettingsError(
                f"IMPORTER_KEY_PREFIX must contain exactly one hash tag like '{{importer}}:', got {self.key_prefix!r}"
            )
        if not is_valid_location(self.default_location):
            raise SettingsError(f"IMPORTER_DEFAULT_LOCATION must match {LOCATION_PATTERN}, got {self.default_location!r}")
        bad = [n for n in self.locations if not is_valid_location(n)]
        if bad:
            raise SettingsError(f"IMPORTER_LOCATIONS: each location must match {LOCATION_PATTERN}, got {bad[0]!r}")
        unknown = self.accepted_versions - KNOWN_VERSIONS
        if unknown or not self.accepted_versions:
            raise SettingsError(f"IMPORTER_ACCEPTED_VERSIONS must be a non-empty subset of {sorted(KNOWN_VERSIONS)}")
        if self.producer_version not in KNOWN_VERSIONS - {GROUP_VERSION}:  # a group is sent by bulk requests only
            raise SettingsError(f"IMPORTER_PRODUCER_VERSION must be one of {sorted(KNOWN_VERSIONS - {GROUP_VERSION})}")
        if self.broker_url and not self.broker_url.startswith(("redis://", "rediss://", "unix://", "amqp://", "amqps://")):
            raise SettingsError("IMPORTER_BROKER_URL must be a redis://, rediss://, unix://, amqp:// or amqps:// URL")
        if self.event_stream_heartbeat_s <= 0 or self.event_stream_max_duration_s <= 0:
            raise SettingsError("IMPORTER_EVENT_STREAM_HEARTBEAT and IMPORTER_EVENT_STREAM_MAX_DURATION must be > 0")
        if self.redis_socket_timeout_s <= 0 or self.reconcile_interval_s <= 0 or self.attempt_lease_s <= 0:
            raise SettingsError("IMPORTER_REDIS_SOCKET_TIMEOUT, IMPORTER_RECONCILE_INTERVAL and IMPORTER_ATTEMPT_LEASE must be > 0")
        if self.redis_wait_replicas and self.redis_wait_replicas_ms >= self.redis_socket_timeout_s * 1000:
            raise SettingsError("IMPORTER_REDIS_WAIT_REPLICAS_MS must be below IMPORTER_REDIS_SOCKET_TIMEOUT")
        if self.http_body_timeout_s <= 0:
            raise SettingsError("IMPORTER_HTTP_BODY_TIMEOUT must be > 0")
        if self.http_server not in ("granian", "gunicorn"):
            raise SettingsError("IMPORTER_HTTP_SERVER must be granian or gunicorn")
        if self.log_format not in LOG_FORMATS:
            raise SettingsError("IMPORTER_LOG_FORMAT must be json or text")
        if self.max_attempts < 1:
            raise SettingsError("max_attempts must be >= 1")
        if not 1 <= self.apply_together_max <= 64:
            raise SettingsError("IMPORTER_APPLY_TOGETHER_MAX must be between 1 and 64")
        if self.ledger_hot_window_s < 0 or self.idempotency_horizon_s < self.ledger_hot_window_s:
            raise SettingsError("IMPORTER_IDEMPOTENCY_HORIZON must be >= IMPORTER_LEDGER_HOT_WINDOW >= 0")
        if self.ledger_interval_s <= 0:
            raise SettingsError("IMPORTER_LEDGER_INTERVAL must be > 0")
        if self.database_url and not self.database_url.startswith(("postgresql://", "postgres://")):
            raise SettingsError("IMPORTER_DATABASE_URL must be a postgresql:// URL")
        if self.traces_exporter not in ("none", "console", "otlp"):
            raise SettingsError("OTEL_TRACES_EXPORTER must be console, otlp or none")
        if self.share_round_trips not in (0, 1):
            raise SettingsError("IMPORTER_SHARE_ROUND_TRIPS must be 0 or 1")
