"""The Redis store: stock, done markers, journal, job records, uploads, events.

Every state change is one Lua script (adapters/lua/), so a record, its index
entries and the event that reports it change together or not at all. The
scripts are registered once per client (``register_script``: EVALSHA with a
fallback to EVAL when the server lost its script cache).
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from functools import cache
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from importer.adapters.scripts import SCRIPT_NAMES, lua_source
from importer.adapters.settings import Settings
from importer.domain.errors import CsvIssue, PublicError
from importer.domain.jobs import JobRecord, JobState, RejectionReport, ShipmentRecord
from importer.domain.ports import ApplyResult, EnqueueOutcome, StartedAttempt, StartOutcome
from importer.domain.receipt import StoredReceipt
from importer.domain.shipment import Shipment
from importer.domain.stock import MAX_STOCK


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


def unavailable(exc: BaseException) -> StoreUnavailable | None:
    """The StoreUnavailable a Redis error means, or None for a real bug (WRONGTYPE, a script error...)."""
    if isinstance(exc, StoreUnavailable):
        return exc
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


class ImporterRedis(redis.Redis):
    """The client of the store and of dramatiq's Redis broker: a sick server's
    refusals are ConnectionErrors; the store's scripts run on a connection of
    the calling thread's own (:meth:`run_script`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._own = threading.local()
        self._own_lock = threading.Lock()
        self._own_connections: list[Any] = []
        _FORKED_CLIENTS.add(self)  # forgets its threads' connections in a forked child

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
        a fifth of a POST's CPU (docs/performance.md). The rules are the
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
        connection = getattr(self._own, "connection", None)
        if connection is None:
            pool = self.connection_pool
            connection = pool.connection_class(**pool.connection_kwargs)  # connects on first use
            with self._own_lock:
                self._own_connections.append(connection)
            self._own.connection = connection
        return connection

    def close(self) -> None:
        """Also closes every thread's own connection (after the threads stopped calling)."""
        with self._own_lock:
            connections, self._own_connections = self._own_connections, []
        for connection in connections:
            connection.disconnect()
        super().close()

    def _forget_own_connections(self) -> None:
        """In a forked child: the parent's sockets are the parent's."""
        self._own = threading.local()
        self._own_lock = threading.Lock()
        self._own_connections = []


_FORKED_CLIENTS: "weakref.WeakSet[ImporterRedis]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for client in list(_FORKED_CLIENTS):
        client._forget_own_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def _translate() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as exc:
        translated = unavailable(exc)
        if translated is None:
            raise
        raise translated from exc


#: For adapters that call Redis themselves (the reconciler): the same translation.
store_errors = _translate


class Keys:
    """Every key name, under one hash-tagged prefix: the one place they are made.

    The Lua scripts get them as KEYS, or as name prefixes in ARGV for keys they
    only discover inside (see the layout in adapters/lua/common.lua).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.stock = f"{prefix}stock"
        self.generation = f"{prefix}generation"
        self.journal = f"{prefix}journal"
        self.events = f"{prefix}events"
        self.stats = f"{prefix}stats"
        # The job indexes (zsets of jobId), P:jobs:<name>.
        self.unsent, self.waiting, self.active, self.completed, self.failed = (
            f"{prefix}jobs:{name}" for name in ("unsent", "waiting", "active", "completed", "failed")
        )
        #: dramatiq's Redis broker namespace (its queues).
        self.dramatiq = f"{prefix}dramatiq"
        #: /health's write probe (a tiny expiring string).
        self.health = f"{prefix}health"
        #: Reconciler: P:jobs:deadline (jobId -> deadline ms of every sent, non-final job),
        #: P:fence (the attempts' fencing tokens), its lock.
        self.deadline = f"{prefix}jobs:deadline"
        self.fence = f"{prefix}fence"
        self.reconciler_lock = f"{prefix}reconciler:lock"
        #: [door] live workers: P:workers (id -> expiry ms), P:workers:accepts (id -> "1,2").
        self.workers = f"{prefix}workers"
        self.workers_accepts = f"{prefix}workers:accepts"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def rejections(self, job_id: str) -> str:
        """string: a failed validation's rejection report (JSON), removed with the
        record; common.lua's rejections_key makes the same name from the record's."""
        return f"{self.job(job_id)}:rejections"

    def upload(self, upload_id: str) -> str:
        return f"{self.prefix}upload:{upload_id}"

    def done(self, batch_id: str) -> str:
        return f"{self.prefix}done:{batch_id}"

    def receipt(self, batch_id: str) -> str:
        """string: what the batch's application changed ('sku,before,quantity\\n' per row, domain/receipt.py),
        written with the done marker and kept forever like it."""
        return f"{self.prefix}receipt:{batch_id}"

    def owner_jobs(self, owner: str) -> str:
        """zset jobId -> createdAt: one owner's job records (GET /api/imports)."""
        return f"{self.prefix}jobs:owner:{owner}"

    def job_events(self, job_id: str) -> str:
        """stream: one job's events, under the same ids as in P:events."""
        return f"{self.events}:{job_id}"

    def workers_accepting(self, version: int | str) -> str:
        """[door] zset worker id -> expiry ms of the workers that accept ``version`` ('' = the name prefix)."""
        return f"{self.workers}:v{version}"

    def rate(self, owner: str, window: int) -> str:
        return f"{self.prefix}rate:{owner}:{window}"

    def completed_of(self, owner: str) -> str:
        """One owner's completed records (retention counts per owner)."""
        return f"{self.completed}:{owner}"

    def failed_of(self, owner: str) -> str:
        """One owner's failed records (retention counts per owner)."""
        return f"{self.failed}:{owner}"


class QueueStats(NamedTuple):
    """Queue-wide numbers for /metrics, read from Redis at scrape time."""

    waiting: int
    oldest_waiting_age_s: float
    active: int
    counters: dict[str, int]


def _s(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _int_or_none(value: bytes | None) -> int | None:
    return int(value) if value not in (None, b"") else None


def _json_or_none(value: bytes | None) -> Any:
    return json.loads(value) if value not in (None, b"") else None


def format_versions(versions: frozenset[int]) -> str:
    """Contract versions as presence.lua stores them: "1,2"."""
    return ",".join(str(v) for v in sorted(versions))


def parse_versions(text: str) -> frozenset[int]:
    return frozenset(int(v) for v in text.split(",") if v.strip().isdigit())


@cache
def _error_json(code: str) -> str:
    return json.dumps(PublicError.from_code(code).to_dict(), separators=(",", ":"))


def _job_record(raw: dict[Any, Any]) -> JobRecord:
    f = {_s(key): value for key, value in raw.items()}
    state = JobState(_s(f.get("state")))
    return JobRecord(
        id=_s(f.get("id")),
        batch_id=_s(f.get("batchId")),
        owner=_s(f.get("owner")),
        state=state,
        attempt=int(f.get("attempt") or 0),
        progress=_json_or_none(f.get("progress")),
        result=_json_or_none(f.get("result")),
        error=_json_or_none(f.get("error")),
        created_at_ms=int(f.get("createdAt") or 0),
        updated_at_ms=int(f.get("updatedAt") or 0),
        started_at_ms=_int_or_none(f.get("startedAt")),
        finished_at_ms=_int_or_none(f.get("finishedAt")),
        next_attempt_at_ms=_int_or_none(f.get("nextAttemptAt")) if state is JobState.RETRYING else None,
        content_sha256=_s(f.get("contentSha256")),
        upload_id=_s(f.get("uploadId")),
    )


def _shipment_record(raw: dict[Any, Any]) -> ShipmentRecord:
    f = {_s(key): value for key, value in raw.items()}
    return ShipmentRecord(
        batch_id=_s(f.get("batchId")),
        owner=_s(f.get("owner")),
        applied_at_ms=int(f.get("appliedAt") or 0),
        result=json.loads(f["result"]),
        content_sha256=_s(f.get("contentSha256")),
        job_id=_s(f.get("jobId")),
    )


def _report_json(error: PublicError) -> str:
    """The rejection report as stored: {"found": n, "issues": [[line, column, code, message, value], ...]}."""
    if not error.issues:
        return ""
    issues = [[i.line, i.column, i.code, i.message, i.value] for i in error.issues]
    return json.dumps({"found": error.issues_found, "issues": issues}, separators=(",", ":"), ensure_ascii=False)


def _report(job_id: str, raw: bytes) -> RejectionReport:
    data = json.loads(raw)
    issues = tuple(CsvIssue(int(i[0]), i[1], str(i[2]), str(i[3]), str(i[4])) for i in data["issues"])
    return RejectionReport(job_id, issues, int(data["found"]))


@dataclass(frozen=True)
class OutgoingMessage:
    """A job's dramatiq message, encoded, with the keys dramatiq's Redis broker
    keeps it under (see adapters/queue.py ImportQueue.redis_message)."""

    queue_key: str
    messages_key: str
    redis_message_id: str
    data: bytes


#: (jobId, batchId, uploadId) -> the message to write with the job record.
MessageWriter = Callable[[str, str, str], OutgoingMessage]


@dataclass(frozen=True)
class QueueAck:
    """dramatiq's acknowledgement of one fetched message, made by start_apply.lua
    in the step that ends the attempt (see adapters/queue.py, MessageHandover):
    the keys dramatiq's Redis broker keeps it under, and what to call once done."""

    acks_key: str
    messages_key: str
    heartbeats_key: str
    redis_message_id: str
    worker_id: str
    #: Called when the script acknowledged the message (dramatiq's consumer then skips its own ack).
    acknowledged: Callable[[], None]


class RedisStore:
    """All of Importer's Redis state behind one object; built by the composition root.

    With ``messages`` (the producer on the Redis transport, when the broker
    uses this very Redis), :meth:`enqueue` writes the job's dramatiq message in
    the same script as its record: one round trip, no unsent window.
    """

    def __init__(
        self, client: redis.Redis, settings: Settings, *, clock_ms: Callable[[], int], messages: MessageWriter | None = None
    ) -> None:
        self.client = client
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self._now = clock_ms
        self.messages = messages
        self._scripts = {name: client.register_script(lua_source(name)) for name in SCRIPT_NAMES}

    def _script(self, name: str, *, keys: list[Any], args: list[Any]) -> Any:
        """One script call: on the calling thread's own connection when the
        client is Importer's (ImporterRedis.run_script), else as redis-py's Script."""
        script = self._scripts[name]
        if isinstance(self.client, ImporterRedis):
            return self.client.run_script(script, keys, args)
        return script(keys=keys, args=args)

    def _pipelined(self, calls: list[tuple[str, list[Any], list[Any]]]) -> list[Any]:
        """Run several scripts in one round trip, by EVALSHA.

        redis-py's Script objects in a pipeline first ask SCRIPT EXISTS, which
        costs a round trip per pipeline. Here a script the server has
        forgotten (restart, SCRIPT FLUSH) fails with NOSCRIPT and only the
        calls that failed are loaded and run again, in order.
        """
        pending = list(range(len(calls)))
        results: list[Any] = [None] * len(calls)
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            for i in pending:
                name, keys, args = calls[i]
                pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
            missing = []
            for i, reply in zip(pending, replies):
                if isinstance(reply, redis.exceptions.NoScriptError):
                    missing.append(i)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    results[i] = reply
            if not missing:
                return results
            for i in missing:
                self.client.script_load(self._scripts[calls[i][0]].script)
            pending = missing
        raise redis.exceptions.NoScriptError("scripts could not be loaded")

    # -- producer side -------------------------------------------------

    def enqueue(
        self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes,
        raw_sha256: str = "", stored_content: tuple[str, str] | None = None, rate_token: bool = False,
    ) -> EnqueueOutcome:
        k, s = self.keys, self.settings
        now = self._now()
        # The owner's rate-limit token, in the script's first step (rate_token), as take_rate_token takes it.
        window_ms = max(1, int(s.rate_window_s * 1000))
        rate_limit = s.rate_limit if rate_token and s.rate_limit > 0 else 0
        keys = [
            k.job(job_id), k.upload(upload_id), k.done(batch_id), k.unsent, k.waiting, k.events, k.owner_jobs(owner),
            k.workers, k.workers_accepts, k.workers_accepting(s.producer_version), k.rate(owner, now // window_ms),
        ]
        args: list[Any] = [
            job_id, batch_id, owner, content_sha256, upload_id, now, csv, s.events_maxlen, s.producer_version,
            rate_limit, window_ms * 2, raw_sha256, *(stored_content or ("", "")),
        ]
        if self.messages is not None:
            message = self.messages(job_id, batch_id, upload_id)
            keys += [message.queue_key, message.messages_key, k.deadline]
            args += [message.redis_message_id, message.data, int(s.waiting_grace_s * 1000)]
        with _translate():
            reply = self._script("enqueue", keys=keys, args=args)
        kind = _s(reply[0])
        if kind == "created":
            return EnqueueOutcome("created", JobState.WAITING, sent=bool(int(reply[1])))
        if kind == "exists":
            return EnqueueOutcome("exists", _s(reply[1]))
        if kind == "no_worker":
            return EnqueueOutcome(
                "no_worker", producer_version=s.producer_version, workers_accept=parse_versions(_s(reply[1]))
            )
        if kind == "rate_limited":
            return EnqueueOutcome("rate_limited", retry_after_ms=window_ms - now % window_ms)
        if kind == "content_needed":
            return EnqueueOutcome("content_needed", stored_upload_id=_s(reply[1]))
        return EnqueueOutcome("conflict")

    def read_upload(self, upload_id: str) -> bytes | None:
        """A stored upload (None once retention removed it with its job)."""
        with _translate():
            data = self.client.get(self.keys.upload(upload_id))
        return bytes(data) if data is not None else None

    def take_rate_token(self, owner: str) -> int:
        """One POST of ``owner``'s fixed-window rate limit (IMPORTER_RATE_LIMIT per
        IMPORTER_RATE_WINDOW, kept in Redis so it holds across every HTTP process).

        Returns 0 when the POST may go on, else the milliseconds until the
        window ends. One round trip (INCR and PEXPIRE pipelined), taken before
        the body is read."""
        s = self.settings
        if s.rate_limit <= 0:
            return 0
        window_ms = max(1, int(s.rate_window_s * 1000))
        now = self._now()
        key = self.keys.rate(owner, now // window_ms)
        with _translate():
            pipe = self.client.pipeline(transaction=False)
            pipe.incr(key)
            pipe.pexpire(key, window_ms * 2)  # outlives its window, whenever in it it is set
            used, _ = pipe.execute()
        return 0 if int(used) <= s.rate_limit else window_ms - now % window_ms

    def mark_sent(self, job_id: str) -> None:
        """The message of this job is in the broker: it now has until sentAt +
        grace to start (the reconciler sends it again otherwise: a message can
        still be lost after the send, e.g. fetched by a worker whose reply the
        network dropped). NX: an attempt that already started keeps its deadline."""
        k = self.keys
        deadline = self._now() + int(self.settings.waiting_grace_s * 1000)
        with _translate():
            pipe = self.client.pipeline(transaction=True)
            pipe.zrem(k.unsent, job_id)
            pipe.zadd(k.deadline, {job_id: deadline}, nx=True)
            pipe.execute()

    # -- reconciler ------------------------------------------------------

    def reconcile(self, limit: int = 500) -> list[tuple[str, str, str]]:
        """One reconciler pass (reconcile.lua): the (jobId, batchId, uploadId)
        of every job past its deadline that must be sent again; jobs whose
        attempts are used up are failed with import.attempts_exhausted."""
        k, s = self.keys, self.settings
        with _translate():
            reply = self._script("reconcile",
                keys=[k.unsent, k.deadline, k.active, k.failed, k.events, k.stats],
                args=[
                    int(s.waiting_grace_s * 1000), limit, s.max_attempts, s.events_maxlen,
                    k.job(""), k.upload(""), k.owner_jobs(""), k.failed_of(""),
                    s.keep_failed_age_s * 1000, s.keep_failed_count,
                    _error_json("import.attempts_exhausted"), _error_json("import.worker_lost"),
                ],
            )
        flat = [_s(v) for v in reply]
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    def renew(self, attempts: list[tuple[str, str]]) -> int:
        """Renew the lease of running attempts [(jobId, token)] in one round trip;
        returns how many still hold their job."""
        if not attempts:
            return 0
        k, lease = self.keys, int(self.settings.attempt_lease_s * 1000)
        with _translate():
            replies = self._pipelined([
                ("renew", [k.job(job_id), k.deadline], [job_id, token, lease]) for job_id, token in attempts
            ])
        return sum(int(r) for r in replies)

    # -- worker side ---------------------------------------------------

    def _job_step(self, job_id: str) -> tuple[list[Any], list[Any]]:
        """The KEYS and ARGV that start, apply and fail share (common.lua, "Job steps")."""
        k, s = self.keys, self.settings
        return (
            [k.job(job_id), k.events, k.active, k.failed, k.stats],
            [
                job_id, s.events_maxlen, k.job(""), k.upload(""), k.owner_jobs(""), k.failed_of(""),
                s.keep_failed_age_s * 1000, s.keep_failed_count,
            ],
        )

    def _start_args(self, job_id: str, upload_id: str) -> tuple[list[Any], list[Any]]:
        """start.lua's KEYS and ARGV."""
        k, s = self.keys, self.settings
        keys, args = self._job_step(job_id)
        keys += [k.upload(upload_id), k.waiting, k.unsent, k.deadline, k.fence]
        args += [
            upload_id, s.max_attempts, _error_json("import.attempts_exhausted"),
            int(s.attempt_lease_s * 1000), int((s.time_limit_s + s.stall_margin_s) * 1000),
            _error_json("import.upload_missing"), _error_json("import.worker_lost"),
        ]
        return keys, args

    @staticmethod
    def _start_outcome(reply: list[Any]) -> StartOutcome:
        kind = _s(reply[0])
        if kind == "started":
            started = StartedAttempt(
                int(reply[1]), _s(reply[2]), _s(reply[3]), _s(reply[4]), bytes(reply[5]), token=_s(reply[6])
            )
            return StartOutcome("started", started.attempt, started)
        if kind == "finished":
            return StartOutcome("finished", state=_s(reply[1]))
        if kind in ("exhausted", "upload_missing", "busy"):
            return StartOutcome(kind, int(reply[1] or 0), state="active" if kind == "busy" else "")
        return StartOutcome(kind)  # type: ignore[arg-type]

    def start_attempt(self, job_id: str, upload_id: str) -> StartOutcome:
        keys, args = self._start_args(job_id, upload_id)
        with _translate():
            reply = self._script("start", keys=keys, args=args)
        return self._start_outcome(reply)

    def _apply_args(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment, token: str,
    ) -> tuple[list[Any], list[Any]]:
        """apply.lua's KEYS and ARGV."""
        k, s = self.keys, self.settings
        progress = '{"phase":"validated","rows":%d}' % shipment.row_count
        keys, args = self._job_step(job_id)
        keys += [
            k.stock, k.generation, k.done(batch_id), k.journal, k.completed, k.upload(upload_id), k.deadline,
            k.receipt(batch_id),
        ]
        args += [
            batch_id, shipment.content_sha256, owner, attempt, MAX_STOCK,
            k.completed_of(""), s.keep_completed_age_s * 1000, s.keep_completed_count,
            _error_json("batch.conflict"), _error_json("stock.overflow"), token, progress,
        ]
        for row in shipment.rows:
            args.append(row.sku)
            args.append(row.quantity)
        return keys, args

    @staticmethod
    def _apply_result(reply: list[Any]) -> ApplyResult:
        kind = _s(reply[0])
        if kind in ("applied", "replayed"):
            return ApplyResult(kind, json.loads(reply[1]))
        return ApplyResult(kind, None, _s(reply[1]) if len(reply) > 1 else "")  # type: ignore[arg-type]

    def validated_and_apply(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment,
        token: str = "",
    ) -> ApplyResult:
        """Record progress 'validated' and apply, in one script call (apply.lua).

        Both take effect only while the job is active under this attempt's
        fencing token (``stale`` otherwise: a newer attempt holds the job).

        The progress event is a real milestone (validation finished before this
        call); apply.lua emits it before 'committed', so one round trip and one
        script call per import.
        """
        keys, args = self._apply_args(
            job_id=job_id, upload_id=upload_id, attempt=attempt, batch_id=batch_id, owner=owner,
            shipment=shipment, token=token,
        )
        with _translate():
            (reply,) = self._pipelined([("apply", keys, args)])
        return self._apply_result(reply)

    def start_and_apply(
        self, *, job_id: str, upload_id: str, batch_id: str, shipment: Shipment, ack: QueueAck | None = None,
    ) -> tuple[StartOutcome, ApplyResult | None]:
        """start.lua and apply.lua in one script call (start_apply.lua), for a
        shipment the worker validated from the upload that came with its
        message; with ``ack``, the message is acknowledged in the same step
        (for every outcome after which the actor returns normally)."""
        start_keys, start_args = self._start_args(job_id, upload_id)
        # The owner, attempt and token of the apply come from the start, inside the script.
        apply_keys, apply_args = self._apply_args(
            job_id=job_id, upload_id=upload_id, attempt=0, batch_id=batch_id, owner="", shipment=shipment, token="",
        )
        k = self.keys
        keys = [*start_keys, *apply_keys[5:]]
        if ack is not None:
            keys += [ack.acks_key, ack.messages_key, ack.heartbeats_key]
            args = [*start_args, ack.redis_message_id, ack.worker_id, int(time.time() * 1000), *apply_args[8:]]
        else:
            keys += [k.dramatiq, k.dramatiq, k.dramatiq]  # not touched
            args = [*start_args, "", "", 0, *apply_args[8:]]
        with _translate():
            started_reply, applied_reply, acked = self._script("start_apply", keys=keys, args=args)
        outcome = self._start_outcome(started_reply)
        if ack is not None and int(acked):
            ack.acknowledged()
        return outcome, (self._apply_result(applied_reply) if outcome.kind == "started" else None)

    def record_failure(
        self, *, job_id: str, attempt: int | None, final: bool, error: PublicError, diagnostic: str,
        next_attempt_at_ms: int | None, token: str = "",
    ) -> str:
        """Record a failed attempt ('retrying' or 'failed'). Takes effect only
        while the job is active under ``token`` ('' = no attempt started: only
        while the job is not active); returns 'stale' otherwise."""
        keys, args = self._job_step(job_id)
        with _translate():
            reply = self._script("fail",
                keys=[*keys, self.keys.deadline, self.keys.rejections(job_id)],
                args=[
                    *args, "" if attempt is None else attempt, "1" if final else "0",
                    json.dumps(error.to_dict(), separators=(",", ":")), diagnostic[:4000],
                    next_attempt_at_ms if next_attempt_at_ms is not None else "",
                    token, int(self.settings.waiting_grace_s * 1000), _report_json(error),
                ],
            )
        return _s(reply[0])

    # -- reads -----------------------------------------------------------

    def _owned(self, key: str, owner: str) -> dict[bytes, bytes]:
        """The hash at key when its owner field is owner, else {} (read_owned.lua)."""
        with _translate():
            flat = self._script("read_owned", keys=[key], args=[owner])
        return dict(zip(flat[::2], flat[1::2]))

    def get_owned_job(self, job_id: str, owner: str) -> JobRecord | None:
        """The job record, or None when it is missing or another owner's (the same work for both)."""
        raw = self._owned(self.keys.job(job_id), owner)
        return _job_record(raw) if raw else None

    def get_owned_shipment(self, batch_id: str, owner: str) -> ShipmentRecord | None:
        """The done marker, or None when the batch was never applied or is another owner's."""
        raw = self._owned(self.keys.done(batch_id), owner)
        return _shipment_record(raw) if raw else None

    def get_owned_receipt(self, batch_id: str, owner: str, head_bytes: int) -> StoredReceipt | None:
        """The batch's receipt with its done marker and first ``head_bytes`` bytes, or None when the
        batch was never applied or is another owner's (read_receipt.lua: the same work for both)."""
        k = self.keys
        with _translate():
            reply = self._script("read_receipt", keys=[k.done(batch_id), k.receipt(batch_id)], args=[owner, max(1, head_bytes)])
        if not reply:
            return None
        flat, size, head = reply
        return StoredReceipt(_shipment_record(dict(zip(flat[::2], flat[1::2]))), int(size), bytes(head))

    def read_receipt(self, batch_id: str, start: int, length: int) -> bytes:
        """Bytes ``start`` to ``start + length`` of a receipt (GETRANGE), after get_owned_receipt
        answered it for its owner: a receipt is written once with its done marker and never rewritten."""
        with _translate():
            return bytes(self.client.getrange(self.keys.receipt(batch_id), start, start + length - 1))

    def get_owned_rejections(self, job_id: str, owner: str) -> tuple[str, RejectionReport | None] | None:
        """The job's state and rejection report (None: it has none), or None when
        the record is missing or another owner's (read_rejections.lua: the same work for both).

        A report exists only for a job that failed CSV validation: its error
        names the report (``rejections``) and fail.lua wrote it in the same step."""
        k = self.keys
        with _translate():
            reply = self._script("read_rejections", keys=[k.job(job_id), k.rejections(job_id)], args=[owner])
        if not reply:
            return None
        state, error, raw = _s(reply[0]), _json_or_none(reply[1]), reply[2]
        if state != JobState.FAILED or not raw or not isinstance(error, dict) or "rejections" not in error:
            return state, None
        return state, _report(job_id, raw)

    def get_job(self, job_id: str) -> JobRecord | None:
        """Whoever owns it: for operators (``importer inspect``). The API reads get_owned_job."""
        with _translate():
            raw = self.client.hgetall(self.keys.job(job_id))
        return _job_record(raw) if raw else None

    def list_jobs(
        self, owner: str, *, limit: int, state: str | None = None, after: tuple[int, str] | None = None,
        scan_limit: int = 1000,
    ) -> tuple[list[JobRecord], tuple[int, str] | None]:
        """One page of the owner's job records, newest first (createdAt, then jobId, descending).

        ``after`` is the position (createdAt ms, jobId) the previous page ended
        on. Returns the records and the position to continue after, or None at
        the end. At most ``scan_limit`` index entries are read per call, so a
        filter by state that matches few records may return a short (even
        empty) page with a position to continue from.
        """
        key = self.keys.owner_jobs(owner)
        chunk = min(max(limit * 2, 50), scan_limit)
        max_score: int | str = "+inf" if after is None else after[0]
        records: list[JobRecord] = []
        offset = scanned = 0
        last = after
        with _translate():
            while True:
                batch = self.client.zrevrangebyscore(key, max_score, "-inf", start=offset, num=chunk, withscores=True)
                offset += len(batch)
                entries = [(_s(m), int(sc)) for m, sc in batch]
                if after is not None:
                    entries = [(m, sc) for m, sc in entries if sc < after[0] or (sc == after[0] and m < after[1])]
                pipe = self.client.pipeline(transaction=False)
                for job_id, _ in entries:
                    pipe.hgetall(self.keys.job(job_id))
                raws = pipe.execute() if entries else []
                for i, ((job_id, score), raw) in enumerate(zip(entries, raws)):
                    scanned += 1
                    last = (score, job_id)
                    record = _job_record(raw) if raw else None
                    if record is None or record.owner != owner or (state and record.state != state):
                        continue
                    records.append(record)
                    if len(records) == limit:
                        more = i + 1 < len(entries) or len(batch) == chunk
                        return records, (last if more else None)
                if len(batch) < chunk:
                    return records, None
                if scanned >= scan_limit:
                    return records, last

    def job_events(self, job_id: str, after_id: str, block_ms: int | None) -> list[dict[str, Any]]:
        """The job's events after a stream id ('0-0': all), waiting up to block_ms for one.

        Reads the job's own stream (P:events:<jobId>, written with P:events
        in the same Lua step), so the cost is that job's events only. block_ms
        must stay below the client's socket timeout (10 s).
        """
        from importer.adapters.observer import event_dict

        key = self.keys.job_events(job_id)
        with _translate():
            if block_ms:
                reply = self.client.xread({key: after_id}, count=100, block=block_ms)
            else:
                reply = self.client.xread({key: after_id}, count=100)
        return [event_dict(_s(raw_id), fields) for _stream, entries in reply or [] for raw_id, fields in entries]

    def get_diagnostic(self, job_id: str) -> str:
        """Operators only (``importer inspect``): never shown by the API."""
        with _translate():
            return _s(self.client.hget(self.keys.job(job_id), "diagnostic"))

    def queue_stats(self) -> QueueStats:
        k = self.keys
        with _translate():
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(k.waiting)
            pipe.zrange(k.waiting, 0, 0, withscores=True)
            pipe.zcard(k.active)
            pipe.hgetall(k.stats)
            waiting, oldest, active, raw = pipe.execute()
        age = max(0.0, (self._now() - oldest[0][1]) / 1000) if oldest else 0.0
        return QueueStats(int(waiting), age, int(active), {_s(key): int(v) for key, v in raw.items()})

    # -- [door] worker presence ---------------------------------------------

    def announce_worker(self, worker_id: str, accepts: frozenset[int], window_ms: int) -> int:
        """This worker is alive for ``window_ms`` more (server clock) and accepts
        these contract versions (presence.lua); returns how many workers are live."""
        with _translate():
            return int(self._script("presence",
                keys=[self.keys.workers, self.keys.workers_accepts],
                args=[worker_id, format_versions(accepts), window_ms, self.keys.workers_accepting("")],
            ))

    def remove_worker(self, worker_id: str) -> None:
        """A worker that stops says so: the door stops counting it at once."""
        with _translate():
            self._script("presence",
                keys=[self.keys.workers, self.keys.workers_accepts],
                args=[worker_id, "", 0, self.keys.workers_accepting("")],
            )

    def live_workers(self) -> dict[str, frozenset[int]]:
        """Worker id -> accepted versions of every live worker (expiry not past
        on the server's clock), as enqueue.lua's door check sees them. One round trip."""
        with _translate():
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.zrange(self.keys.workers, 0, -1, withscores=True)
            pipe.hgetall(self.keys.workers_accepts)
            (seconds, micros), entries, accepts = pipe.execute()
        now_ms = seconds * 1000 + micros // 1000
        by_id = {_s(k): _s(v) for k, v in accepts.items()}
        return {
            _s(worker): parse_versions(by_id[_s(worker)])
            for worker, expiry in entries
            if expiry >= now_ms and _s(worker) in by_id
        }

    def ping(self) -> bool:
        """True when Redis answers and accepts writes (a tiny expiring write
        probe: PING alone says yes to a full or read-only Redis). Raises
        StoreUnavailable with reason redis_unreachable or redis_refuses_writes."""
        with _translate():
            return bool(self.client.set(self.keys.health, "1", px=60_000))
