"""The worker's side of the store: start an attempt, apply, fail, under the attempt's fencing token."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import SpanKind

from importer.adapters import tracing
from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.errors import StoreUnavailable, store_errors
from importer.adapters.redis.records import QueueAck, error_json, report_json, text_of
from importer.domain.errors import PublicError
from importer.domain.locations import MAIN, location_of_job
from importer.domain.ports import ApplyResult, OneStepImport, StartedAttempt, StartOutcome
from importer.domain.shipment import Shipment
from importer.domain.stock import MAX_STOCK


#: start_apply.lua's layout: how many shared KEYS, KEYS per import, and shared ARGV.
TOGETHER_LAYOUT = (18, 5, 13)

#: The ledger's word on a batch, as apply.lua takes it (ARGV[14..16]): not asked.
NOT_ASKED = ("", "", "")

#: [ledger] How many times one apply asks the ledger before it gives up as an
#: outage (each ask follows a pruning that happened while the previous one ran).
LEDGER_ASKS = 4

#: How many KEYS the job-step header has (common.lua, "Job steps"): each step's own follow.
JOB_STEP_KEYS = 7


class AttemptSteps(RedisStoreBase):
    """Implements :class:`importer.domain.ports.AttemptStore`: start.lua, apply.lua, start_apply.lua, fail.lua."""


    def read_small_uploads(self, jobs: Sequence[tuple[str, str]], max_bytes: int) -> list[bytes | None]:
        """Each (jobId, uploadId)'s upload when it is at most ``max_bytes`` (None
        when larger or gone), in one round trip: what fetch.lua brings beside a
        single message, for the imports a group message carries."""
        if max_bytes <= 0 or not jobs:
            return [None] * len(jobs)
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for job_id, upload_id in jobs:
                # One byte more than the bound tells it is larger (uploads are never empty).
                pipe.getrange(self.partition_of(job_id).upload(upload_id), 0, max_bytes)
            read = pipe.execute()
        return [bytes(csv) if csv and len(csv) <= max_bytes else None for csv in read]

    def _job_step(self, job_id: str) -> tuple[list[Any], list[Any]]:
        """The KEYS and ARGV that start, apply and fail share (common.lua, "Job steps";
        ARGV[3..8] are not read: '')."""
        k, s = self.partition_of(job_id), self.settings
        keys = [k.job(job_id), k.events, k.active, k.failed, k.stats, k.job_events(job_id), k.finished_new]
        assert len(keys) == JOB_STEP_KEYS
        return keys, [job_id, s.events_maxlen, "", "", "", "", "", ""]

    def _start_args(self, job_id: str, upload_id: str) -> tuple[list[Any], list[Any]]:
        """start.lua's KEYS and ARGV."""
        k, s = self.partition_of(job_id), self.settings
        keys, args = self._job_step(job_id)
        args[2] = self._gate
        keys += [k.upload(upload_id), k.waiting, k.unsent, k.deadline, k.fence]
        args += [
            upload_id, s.max_attempts, error_json("import.attempts_exhausted"),
            int(s.attempt_lease_s * 1000), int((s.time_limit_s + s.stall_margin_s) * 1000),
            error_json("import.upload_missing"),
        ]
        return keys, args

    @staticmethod
    def _start_outcome(reply: list[Any]) -> StartOutcome:
        match kind := text_of(reply[0]):
            case "started":
                started = StartedAttempt(
                    int(reply[1]), text_of(reply[2]), text_of(reply[3]), text_of(reply[4]), bytes(reply[5]),
                    token=text_of(reply[6]),
                )
                return StartOutcome("started", started.attempt, started)
            case "finished":
                return StartOutcome("finished", state=text_of(reply[1]))
            case "exhausted" | "upload_missing" | "busy":
                return StartOutcome(kind, int(reply[1] or 0), state="active" if kind == "busy" else "")
            case "missing" | "stale":
                return StartOutcome(kind)
            case "behind":  # [ledger] not verified against the ledger lately: an outage, retried
                raise StoreUnavailable("this location's Redis was not verified against the ledger lately", "behind_ledger")
        raise ValueError(f"start.lua replied {kind!r}")  # none of its replies: a bug

    @property
    def _gate(self) -> str:
        """[ledger] start.lua's gate: on ('1') wherever a ledger is configured."""
        return "1" if self.settings.database_url else ""

    def _refuse_behind(self, job_id: str) -> None:
        """[ledger] No attempt starts or applies at a location whose Redis is behind the
        ledger: an outage (retried, never counted) until the restore brings it forward."""
        location = location_of_job(job_id)
        if self.behind(location):
            raise StoreUnavailable(f"location {location} is behind the ledger: waiting for its restore", "behind_ledger")

    def start_attempt(self, job_id: str, upload_id: str) -> StartOutcome:
        self._refuse_behind(job_id)
        keys, args = self._start_args(job_id, upload_id)
        with store_errors():
            reply = self._script("start", keys=keys, args=args)
        return self._start_outcome(reply)

    def _apply_args(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment, token: str,
        ledger: tuple[str, str, str] = NOT_ASKED,
    ) -> tuple[list[Any], list[Any]]:
        """apply.lua's KEYS and ARGV."""
        k, s = self.partition_of(job_id), self.settings
        progress = '{"phase":"validated","rows":%d}' % shipment.row_count
        keys, args = self._job_step(job_id)
        keys += [
            k.stock, k.generation, k.done(batch_id), k.journal, k.completed, k.upload(upload_id), k.deadline,
            k.receipt(batch_id), k.ledger_pruned, k.ledger_pruned_filter,
        ]
        args += [
            batch_id, shipment.content_sha256, owner, attempt, MAX_STOCK, *ledger,
            error_json("batch.conflict"), error_json("stock.overflow"), token, progress,
        ]
        for row in shipment.rows:
            args.append(row.sku)
            args.append(row.quantity)
        return keys, args

    @staticmethod
    def _apply_result(reply: list[Any]) -> ApplyResult:
        match kind := text_of(reply[0]):
            case "applied" | "replayed":
                return ApplyResult(kind, json.loads(reply[1]))
            case "conflict" | "overflow" | "finished" | "missing" | "stale":
                return ApplyResult(kind, None, text_of(reply[1]) if len(reply) > 1 else "")
        raise ValueError(f"apply.lua replied {kind!r}")  # none of its replies: a bug

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
        with tracing.span("apply.lua", SpanKind.CLIENT, attributes={"db.system.name": "redis", "importer.job_id": job_id}):
            return self._validated_and_apply(
                job_id=job_id, upload_id=upload_id, attempt=attempt, batch_id=batch_id, owner=owner, shipment=shipment,
                token=token,
            )

    def _validated_and_apply(
        self, *, job_id: str, upload_id: str, attempt: int, batch_id: str, owner: str, shipment: Shipment, token: str,
    ) -> ApplyResult:
        self._refuse_behind(job_id)
        ledger = NOT_ASKED
        for _ in range(LEDGER_ASKS):
            keys, args = self._apply_args(
                job_id=job_id, upload_id=upload_id, attempt=attempt, batch_id=batch_id, owner=owner,
                shipment=shipment, token=token, ledger=ledger,
            )
            with store_errors():
                (reply,) = self._pipelined([("apply", keys, args)])
            if text_of(reply[0]) != "ask_ledger":
                return self._apply_result(reply)
            location = location_of_job(job_id)
            ledger = self._ledger_word(location, [batch_id], text_of(reply[1]))[batch_id]
        raise StoreUnavailable("the done markers were pruned again while the ledger was asked", "ledger_busy")

    def start_and_apply(
        self, *, job_id: str, upload_id: str, batch_id: str, shipment: Shipment, ack: QueueAck | None = None,
    ) -> tuple[StartOutcome, ApplyResult | None]:
        """start.lua and apply.lua in one script call (start_apply.lua), for a
        shipment the worker validated from the upload that came with its
        message; with ``ack``, the message is acknowledged in the same step
        (for every outcome after which the actor returns normally)."""
        (outcome,) = self.start_and_apply_together([OneStepImport(job_id, upload_id, batch_id, shipment, ack)])
        return outcome

    def start_and_apply_together(
        self, imports: Sequence[OneStepImport],
    ) -> list[tuple[StartOutcome, ApplyResult | None]]:
        """:meth:`start_and_apply` for several imports of one partition in one
        script call: each has its own outcome, in order; the writes they share
        a key for are made once per key (start_apply.lua)."""
        if not imports:
            return []
        attributes = {"db.system.name": "redis", "importer.job_id": imports[0].job_id, "importer.imports": len(imports)}
        with tracing.span("start_apply.lua", SpanKind.CLIENT, attributes=attributes):
            return self._start_and_apply_together(imports)

    def _start_and_apply_together(
        self, imports: Sequence[OneStepImport],
    ) -> list[tuple[StartOutcome, ApplyResult | None]]:
        self._refuse_behind(imports[0].job_id)  # one partition per call
        outcomes: list[tuple[StartOutcome, ApplyResult | None] | None] = [None] * len(imports)
        words: dict[str, tuple[str, str, str]] = {}
        pending = list(range(len(imports)))
        for _ in range(LEDGER_ASKS):
            replies = self._start_apply([imports[i] for i in pending], words)
            asked: list[int] = []
            pruned = ""
            for i, reply in zip(pending, replies):
                if isinstance(reply, str):
                    asked.append(i)
                    pruned = reply
                else:
                    outcomes[i] = reply
            if not asked:
                return [o for o in outcomes if o is not None]
            location = location_of_job(imports[0].job_id)
            words.update(self._ledger_word(location, [imports[i].batch_id for i in asked], pruned))
            pending = asked
        raise StoreUnavailable("the done markers were pruned again while the ledger was asked", "ledger_busy")

    def _ledger_word(self, location: str, batch_ids: list[str], pruned: str) -> dict[str, tuple[str, str, str]]:
        """[ledger] What the ledger holds of these batches, as apply.lua takes it, asked
        after reading ``pruned`` (the door: docs/reliability.md, "The ledger").
        No ledger configured while markers were pruned (a misconfigured worker):
        StoreUnavailable, never a guess."""
        if self.archive is None:
            raise StoreUnavailable(
                "done markers were pruned at this location but this worker has no ledger (IMPORTER_DATABASE_URL)",
                "ledger_unreachable",
            )
        try:
            found = self.archive.archived(location, batch_ids)
        except Exception as exc:  # the ledger's own errors, whatever the adapter
            raise StoreUnavailable(f"the ledger did not answer: {exc}", "ledger_unreachable") from exc
        return {
            b: (pruned, found[b].content_sha256, found[b].result) if b in found else (pruned, "", "")
            for b in batch_ids
        }

    def _start_apply(
        self, imports: Sequence[OneStepImport], words: dict[str, tuple[str, str, str]],
    ) -> list[tuple[StartOutcome, ApplyResult | None] | str]:
        """One start_apply.lua call: per import its outcome, or the pruned count when it must ask the ledger."""
        k, s = self.partition_of(imports[0].job_id), self.settings
        acks = [i.ack for i in imports if i.ack is not None]
        # The ack's keys are the job's location's queue's (LocationQueues): in the job's slot on a cluster.
        ack_keys = [acks[0].acks_key, acks[0].messages_key, acks[0].heartbeats_key] if acks else [k.fence] * 3
        keys = [
            k.events, k.active, k.failed, k.stats, k.finished_new, k.waiting, k.unsent, k.deadline, k.fence,
            k.stock, k.generation, k.journal, k.completed, *ack_keys, k.ledger_pruned, k.ledger_pruned_filter,
        ]
        args: list[Any] = [
            s.events_maxlen, s.max_attempts, error_json("import.attempts_exhausted"),
            int(s.attempt_lease_s * 1000), int((s.time_limit_s + s.stall_margin_s) * 1000),
            error_json("import.upload_missing"), MAX_STOCK, error_json("batch.conflict"), error_json("stock.overflow"),
            acks[0].worker_id if acks else "", int(time.time() * 1000), self._gate, len(imports),
        ]
        assert (len(keys), len(args)) == (TOGETHER_LAYOUT[0], TOGETHER_LAYOUT[2])
        for one in imports:
            if self.partition_of(one.job_id) != k or (one.ack is not None and one.ack.acks_key != ack_keys[0]):
                raise ValueError("imports applied together must share one partition and one queue")
            keys += [k.job(one.job_id), k.job_events(one.job_id), k.upload(one.upload_id), k.done(one.batch_id),
                     k.receipt(one.batch_id)]
            args += [one.job_id, one.upload_id, one.batch_id, one.shipment.content_sha256,
                     one.ack.redis_message_id if one.ack is not None else "", *words.get(one.batch_id, NOT_ASKED),
                     one.shipment.row_count]
            for row in one.shipment.rows:
                args.append(row.sku)
                args.append(row.quantity)
        with store_errors():
            replies = self._script("start_apply", keys=keys, args=args)
        outcomes: list[tuple[StartOutcome, ApplyResult | None] | str] = []
        for one, (started_reply, applied_reply, acked) in zip(imports, replies):
            if text_of(started_reply[0]) == "ask_ledger":
                outcomes.append(text_of(started_reply[1]))
                continue
            outcome = self._start_outcome(started_reply)
            if one.ack is not None and int(acked):
                one.ack.acknowledged()
            outcomes.append((outcome, self._apply_result(applied_reply) if outcome.kind == "started" else None))
        return outcomes

    def record_failure(
        self, *, job_id: str, attempt: int | None, final: bool | None, error: PublicError, diagnostic: str,
        next_attempt_at_ms: int | None, token: str = "", outage: bool = False,
    ) -> str:
        """Record a failed attempt ('retrying' or 'failed'). Takes effect only
        while the job is active under ``token`` ('' = no attempt started: only
        while the job is not active); returns 'stale' otherwise. ``final``
        None: final when the attempts counted reach the maximum; ``outage``:
        the store was away, so the attempt is not counted and never final."""
        keys, args = self._job_step(job_id)
        k = self.partition_of(job_id)
        with store_errors():
            reply = self._script("fail",
                keys=[*keys, k.deadline, k.rejections(job_id), k.waiting, k.unsent],
                args=[
                    *args, "" if attempt is None else attempt, "auto" if final is None else ("1" if final else "0"),
                    json.dumps(error.to_dict(), separators=(",", ":")), diagnostic[:4000],
                    next_attempt_at_ms if next_attempt_at_ms is not None else "",
                    token, int(self.settings.waiting_grace_s * 1000), report_json(error),
                    "1" if outage else "0", self.settings.max_attempts,
                ],
            )
        return text_of(reply[0])
