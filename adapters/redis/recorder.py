"""The producer's side of the store: a job recorded once, with its upload, event and message."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from opentelemetry.trace import SpanKind

from importer.adapters import tracing
from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.client import ThreadConnections
from importer.adapters.redis.errors import store_errors
from importer.adapters.redis.keys import Keys
from importer.adapters.redis.records import bytes_of, group_entry, parse_versions, text_of
from importer.domain.contract import every_live_worker_reads_groups
from importer.domain.jobs import JobState
from importer.domain.ports import EnqueueCall, EnqueueOutcome, RetryOutcome
from importer.domain.locations import MAIN
from importer.domain.shipment import batch_id_of


#: Jobs per enqueue_many.lua call at most (JobRecorder.enqueue_many): a call
#: holds the server for about their enqueue.lua calls' time.
JOBS_PER_CALL = 64

#: enqueue_many.lua's template: enqueue.lua's first KEYS and ARGV (those of
#: every call), of which each job gives only the holes, its own (0-based): its
#: job, upload, done marker, rate window and event stream keys; its jobId,
#: batchId, uploadId, clock, CSV and bytes' hash. The call sends the rest once.
TEMPLATE_KEYS, TEMPLATE_ARGS = 14, 15
KEY_HOLES, ARG_HOLES = (0, 1, 2, 10, 11), (0, 1, 4, 5, 6, 11)
_own_keys, _own_args = itemgetter(*KEY_HOLES), itemgetter(*ARG_HOLES)
_shared_keys = itemgetter(*(i for i in range(TEMPLATE_KEYS) if i not in KEY_HOLES))
_shared_args = itemgetter(*(i for i in range(TEMPLATE_ARGS) if i not in ARG_HOLES))
_TEMPLATE = (",".join(str(i + 1) for i in KEY_HOLES), TEMPLATE_KEYS, ",".join(str(i + 1) for i in ARG_HOLES), TEMPLATE_ARGS)


class JobRecorder(RedisStoreBase):
    """Implements :class:`importer.domain.ports.JobRecorder` (enqueue.lua, one round trip per POST, shared
    with the POSTs of other threads of the process that meet it)
    and :class:`importer.domain.ports.RetryStore` (retry.lua)."""


    def enqueue(
        self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes,
        raw_sha256: str = "", stored_content: tuple[str, str] | None = None, rate_token: bool = False,
        ledger_asked: bool = False, send_later: bool = False,
    ) -> EnqueueOutcome:
        now = self._now()
        # [trace] the message carries this span's context (the worker's attempt is its child)
        with tracing.span("enqueue.lua", SpanKind.CLIENT, attributes={"db.system.name": "redis", "importer.job_id": job_id}):
            call = self._enqueue_call(
                job_id=job_id, batch_id=batch_id, owner=owner, content_sha256=content_sha256, upload_id=upload_id,
                csv=csv, raw_sha256=raw_sha256, stored_content=stored_content, rate_token=rate_token,
                ledger_asked=ledger_asked, send_later=send_later, now=now,
            )
            if isinstance(call, EnqueueOutcome):
                return call
            keys, args = call
            with store_errors():
                reply = self._script_shared("enqueue", keys=keys, args=args)
        return self._enqueued(job_id, reply, now)

    def enqueue_many(self, calls: Sequence[EnqueueCall]) -> list[EnqueueOutcome]:
        """Each :meth:`enqueue` (its first call), in order: the calls of
        consecutive jobs of one partition (location) in one enqueue_many.lua
        call of up to :data:`JOBS_PER_CALL` (enqueue.lua's step for each, as if
        called one after the other), and those script calls pipelined, one
        round trip for the whole bulk (on a Redis Cluster one round trip per
        script call, routed by slot). At a location but main, admit.lua runs
        first for that job alone (its own round trip)."""
        outcomes: list[EnqueueOutcome | None] = [None] * len(calls)
        # location, the values its jobs share (enqueue_many.lua's template), its jobs
        runs: list[tuple[str, tuple[Any, Any], list[tuple[int, list[Any], list[Any], int]]]] = []
        with tracing.span("enqueue.lua", SpanKind.CLIENT, attributes={"db.system.name": "redis", "importer.jobs": len(calls)}):
            grouped = self._may_group(calls)
            for position, c in enumerate(calls):
                now = self._now()
                prepared = self._enqueue_call(
                    job_id=c.job_id, batch_id=c.batch_id, owner=c.owner, content_sha256="", upload_id=c.upload_id,
                    csv=c.csv, raw_sha256=c.raw_sha256, rate_token=c.rate_token, send_later=c.send_later, now=now,
                )
                if isinstance(prepared, EnqueueOutcome):
                    outcomes[position] = prepared
                    continue
                location = self.partition_of(c.job_id).location
                shared = (_shared_keys(prepared[0]), _shared_args(prepared[1]))
                if not runs or runs[-1][0] != location or runs[-1][1] != shared or len(runs[-1][2]) >= JOBS_PER_CALL:
                    runs.append((location, shared, []))
                runs[-1][2].append((position, prepared[0], prepared[1], now))
            script_calls: list[tuple[str, list[Any], list[Any]]] = []
            parent = tracing.traceparent()
            for _, (shared_keys, shared_args), jobs in runs:
                # [Redis transport] the small new jobs of the call in one group message (enqueue_many.lua)
                group = self.groups(calls[jobs[0][0]].job_id, parent) if grouped and self.groups is not None and any(
                    calls[position].send_later for position, _, _, _ in jobs) else None
                keys: list[Any] = []
                args: list[Any] = [len(jobs), "", "", "", ""]
                if group is not None:
                    keys += [group.queue_key, group.messages_key, self.partition_of(calls[jobs[0][0]].job_id).deadline]
                    args[1:] = [group.redis_message_id, group.head, group.tail, int(self.settings.waiting_grace_s * 1000)]
                keys += shared_keys
                args += [*_TEMPLATE, *shared_args]
                for position, job_keys, job_args, _ in jobs:
                    c = calls[position]
                    entry = group_entry(c.job_id, c.batch_id, c.upload_id) if group is not None and c.send_later else ""
                    keys += _own_keys(job_keys)
                    keys += job_keys[TEMPLATE_KEYS:]
                    args += [len(job_keys) - TEMPLATE_KEYS, len(job_args) - TEMPLATE_ARGS, entry, *_own_args(job_args)]
                    args += job_args[TEMPLATE_ARGS:]
                script_calls.append(("enqueue_many", keys, args))
            with store_errors():
                replies = self._pipelined(script_calls) if script_calls else []
            written: dict[str, Keys] = {}
            for (location, _, jobs), reply in zip(runs, replies):
                for (position, _, _, now), job_reply in zip(jobs, reply):
                    outcomes[position] = self._enqueued(calls[position].job_id, job_reply, now, replicated=False)
                    if text_of(job_reply[0]) in ("created", "exists"):
                        written.setdefault(location, self.partition_of(calls[position].job_id))
            # Before the 202s: one wait per partition written, not one per job (its SET
            # moves the offset past every earlier write of that master).
            for k in written.values():
                self._replicated(k)
        return [o for o in outcomes if o is not None]

    def _may_group(self, calls: Sequence[EnqueueCall]) -> bool:
        """Whether the small new jobs of :meth:`enqueue_many` may travel in group
        messages written by its script: on the Redis transport, while every
        live worker reads them (as :func:`importer.domain.submit_import.send_recorded`
        decides; one read, only when a call asks to be sent later). Otherwise
        they are recorded unsent, and the caller sends them."""
        if self.groups is None or not any(c.send_later for c in calls):
            return False
        return every_live_worker_reads_groups(self.live_workers().values())

    def _enqueue_call(
        self, *, job_id: str, batch_id: str, owner: str, content_sha256: str, upload_id: str, csv: bytes,
        raw_sha256: str, now: int, stored_content: tuple[str, str] | None = None, rate_token: bool = False,
        ledger_asked: bool = False, send_later: bool = False,
    ) -> tuple[list[Any], list[Any]] | EnqueueOutcome:
        """enqueue.lua's keys and arguments for one job, or the refusal of
        admit.lua at a location but main (its own round trip, first)."""
        k, s = self.partition_of(job_id), self.settings
        if self.behind(k.location):  # [ledger] nothing is taken where Redis lacks what the ledger holds
            return EnqueueOutcome("behind")
        # The owner's rate-limit token, in the script's first step (rate_token), as take_rate_token takes it.
        window_ms = max(1, int(s.rate_window_s * 1000))
        rate_limit = s.rate_limit if rate_token and s.rate_limit > 0 else 0
        if k.location != MAIN:
            # Another partition: the rate token and the door check first, in the control partition's step.
            refused = self._admit(owner, k.location, rate_limit, window_ms, now, new_upload=True)
            if refused is not None:
                return refused
            rate_limit = 0
        # At a location but main, the door keys below are the partition's own,
        # where no worker announces itself: enqueue.lua's door stays open.
        keys = [
            k.job(job_id), k.upload(upload_id), k.done(batch_id), k.unsent, k.waiting, k.events, k.owner_jobs(owner),
            k.workers, k.workers_accepts, k.workers_accepting(s.producer_version), k.rate(owner, now // window_ms),
            k.job_events(job_id),  # KEYS[12], always: the job's own event stream
            k.ledger_pruned_filter,  # KEYS[13] [ledger]
            k.intake_paused,  # KEYS[14] [ops] (at main the control partition's)
        ]
        args: list[Any] = [
            job_id, batch_id, owner, content_sha256, upload_id, now, csv, s.events_maxlen, s.producer_version,
            rate_limit, window_ms * 2, raw_sha256, *(stored_content or ("", "")), "1" if ledger_asked else "",
        ]
        parent = tracing.traceparent()  # [trace] '' when off
        if self.messages is not None and not send_later:  # the location's queue: in its slot on a cluster (LocationQueues)
            message = self.messages(job_id, batch_id, upload_id, parent)
            keys += [message.queue_key, message.messages_key, k.deadline]
            args += [message.redis_message_id, message.data, int(s.waiting_grace_s * 1000), parent]
        elif parent:
            args += ["", "", "", parent]
        return keys, args

    def _enqueued(self, job_id: str, reply: Any, now: int, *, replicated: bool = True) -> EnqueueOutcome:
        """What enqueue.lua's reply says (the replicas waited for, for a job that
        exists, unless ``replicated`` is False: the caller waits once for many)."""
        s = self.settings
        kind = text_of(reply[0])
        if replicated and kind in ("created", "exists"):
            self._replicated(self.partition_of(job_id))
        if kind == "created":
            return EnqueueOutcome("created", JobState.WAITING, sent=bool(int(reply[1])))
        if kind == "exists":
            return EnqueueOutcome("exists", text_of(reply[1]))
        if kind == "no_worker":
            return EnqueueOutcome(
                "no_worker", producer_version=s.producer_version, workers_accept=parse_versions(text_of(reply[1]))
            )
        if kind == "rate_limited":
            window_ms = max(1, int(s.rate_window_s * 1000))
            return EnqueueOutcome("rate_limited", retry_after_ms=window_ms - now % window_ms)
        if kind == "content_needed":
            return EnqueueOutcome("content_needed", stored_upload_id=text_of(reply[1]))
        if kind == "ask_ledger":
            return EnqueueOutcome("ask_ledger")
        if kind == "paused":
            return EnqueueOutcome("paused")
        return EnqueueOutcome("conflict")

    def _replicated(self, k: Keys) -> None:
        """Before a 202: the partition master's replicas have the record (IMPORTER_REDIS_WAIT_REPLICAS)."""
        s = self.settings
        if s.redis_wait_replicas > 0 and isinstance(self.client, ThreadConnections):
            with store_errors():
                self.client.wait_replicated(k.replicated, s.redis_wait_replicas, s.redis_wait_replicas_ms)

    def _admit(
        self, owner: str, location: str, rate_limit: int, window_ms: int, now: int, *, new_upload: bool = False,
    ) -> EnqueueOutcome | None:
        """admit.lua in the control partition: the location declared, intake not paused (a
        ``new_upload`` only), the owner's rate token, the door check and the owner's registry;
        None when the POST may go on."""
        k, s = self.keys, self.settings
        with store_errors():
            reply = self._script_shared("admit",
                keys=[
                    k.rate(owner, now // window_ms), k.workers, k.workers_accepts,
                    k.workers_accepting(s.producer_version), k.locations, k.owner_locations(owner), k.intake_paused,
                ],
                args=[rate_limit, window_ms * 2, s.producer_version, location, "1" if new_upload else ""],
            )
        kind = text_of(reply[0])
        if kind == "undeclared":
            return EnqueueOutcome("undeclared")
        if kind == "paused":
            return EnqueueOutcome("paused")
        if kind == "rate_limited":
            return EnqueueOutcome("rate_limited", retry_after_ms=window_ms - now % window_ms)
        if kind == "no_worker":
            return EnqueueOutcome(
                "no_worker", producer_version=s.producer_version, workers_accept=parse_versions(text_of(reply[1]))
            )
        return None

    def retry_job(self, *, job_id: str, owner: str, upload_id: str, retryable: frozenset[str]) -> RetryOutcome:
        """Retry the owner's failed job in one script call (retry.lua); on the
        Redis transport its message is written in the same call.

        The upload the record names is renamed in that call, so its key is read
        just before (HGET: one more round trip) and declared; a record that
        named another one by then ('changed') is read again."""
        batch_id = batch_id_of(job_id)
        if batch_id is None:
            return RetryOutcome("missing")  # no batch has this job id: no record can have it
        k, s = self.partition_of(job_id), self.settings
        if k.location != MAIN:
            refused = self._admit(owner, k.location, 0, 1, self._now())
            if refused is not None and refused.kind == "undeclared":
                return RetryOutcome("missing")  # no job can be at a location nobody declared
            if refused is not None:
                return RetryOutcome(
                    "no_worker", producer_version=refused.producer_version, workers_accept=refused.workers_accept,
                )
        message = None
        for _ in range(3):
            with store_errors():
                current, stored_trace = self.client.hmget(k.job(job_id), ["uploadId", "traceparent"])
            current_upload = text_of(current) if current is not None else ""
            if self.messages is not None and message is None:
                # [trace] the import's own trace goes on: its new attempts are spans of the first POST's trace
                message = self.messages(job_id, batch_id, upload_id, text_of(stored_trace) if stored_trace else tracing.traceparent())
            keys = [
                k.job(job_id), k.upload(upload_id), k.failed, k.failed_of(owner), k.waiting, k.unsent, k.events,
                k.deadline, k.workers, k.workers_accepts, k.workers_accepting(s.producer_version),
                k.job_events(job_id), k.upload(current_upload),
            ]
            args: list[Any] = [
                job_id, owner, batch_id, upload_id, current_upload, s.events_maxlen, ",".join(sorted(retryable)),
                self._now(), int(s.waiting_grace_s * 1000), s.producer_version,
            ]
            if message is not None:
                keys += [message.queue_key, message.messages_key]
                args += [message.redis_message_id, message.data]
            with store_errors():
                reply = self._script("retry", keys=keys, args=args)
            kind = text_of(reply[0])
            if kind != "changed":
                break
        else:
            kind = "missing"  # the record kept changing under three reads: not a failed record to retry
        if kind == "retried":
            self._replicated(k)
            return RetryOutcome("retried", batch_id=batch_id, sent=bool(int(reply[1])), retries=int(reply[2]))
        if kind == "no_worker":
            return RetryOutcome(
                "no_worker", producer_version=s.producer_version, workers_accept=parse_versions(text_of(reply[1])),
            )
        if kind == "not_retryable":
            return RetryOutcome(
                "not_retryable", reason=text_of(reply[1]), state=text_of(reply[2]), error_code=text_of(reply[3]),
            )
        return RetryOutcome("missing")

    def read_upload(self, upload_id: str, location: str = MAIN) -> bytes | None:
        """A stored upload at a location (None once retention removed it with its job)."""
        with store_errors():
            data = self.client.get(self.partition(location).upload(upload_id))
        return bytes_of(data) if data is not None else None

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
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.incr(key)
            pipe.pexpire(key, window_ms * 2)  # outlives its window, whenever in it it is set
            used, _ = pipe.execute()
        return 0 if int(used) <= s.rate_limit else window_ms - now % window_ms

    def mark_sent(self, job_id: str) -> None:
        """The message of this job is in the broker: it now has until sentAt +
        grace to start (the reconciler sends it again otherwise: a message can
        still be lost after the send, e.g. fetched by a worker whose reply the
        network dropped). NX: an attempt that already started keeps its deadline.
        One script call (mark_sent.lua), not a MULTI/EXEC: on a Redis Cluster a
        transaction that meets a moving slot fails, a script is redirected."""
        self.mark_sent_many([job_id])

    def mark_sent_many(self, job_ids: list[str]) -> None:
        """:meth:`mark_sent` for the jobs of one location (one partition), in one script call."""
        k = self.partition_of(job_ids[0])
        deadline = self._now() + int(self.settings.waiting_grace_s * 1000)
        with store_errors():
            self._script("mark_sent", keys=[k.unsent, k.deadline], args=[deadline, *job_ids])
