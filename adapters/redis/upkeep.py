"""Upkeep of the store: the reconciler's sweep and lease renewal, worker presence, queue numbers, health."""

from __future__ import annotations

import logging
from typing import Any

from importer.adapters.logs import log_event
from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.errors import StoreUnavailable, store_errors
from importer.adapters.redis.keys import Keys
from importer.adapters.settings import Settings
from importer.adapters.redis.records import QueueStats, error_json, format_versions, text_of
from importer.domain.contract import KNOWN_VERSIONS


log = logging.getLogger("importer.worker")


def outage_gap_ms(settings: Settings) -> int:
    """A reconciler pass this long after the previous one means the store was
    away (or no worker ran): expired leases then blame nobody (reconcile.lua)."""
    return int((2 * settings.reconcile_interval_s + 2) * 1000)


class StoreUpkeep(RedisStoreBase):
    """What the reconciler, worker presence, /metrics and /health call."""


    def reconcile(self, limit: int = 500) -> list[tuple[str, str, str]]:
        """One reconciler pass over every location (reconcile_due.lua, then
        reconcile.lua, per partition): the (jobId, batchId, uploadId) of every
        job past its deadline that must be sent again; jobs whose attempts are
        used up are failed with import.attempts_exhausted. Then that
        partition's retention (:meth:`retain`). A partition whose node cannot
        be reached is skipped this pass, never the ones after it; the pass
        then raises StoreUnavailable once the others are done."""
        resend: list[tuple[str, str, str]] = []
        sick: StoreUnavailable | None = None
        for location in self.locations():
            try:
                k = self.partition(location)
                resend += self._reconcile_partition(k, limit)
                self.retain(k)
            except StoreUnavailable as exc:
                log_event(log, "reconciler.partition_unavailable", logging.WARNING, location=location)
                sick = exc
        if sick is not None and not resend:
            raise sick
        return resend

    def _reconcile_partition(self, k: Keys, limit: int) -> list[tuple[str, str, str]]:
        """Two script calls: which jobs are due (reconcile_due.lua), then the
        due ones, each job's keys declared (reconcile.lua); one when none is due."""
        s = self.settings
        grace = int(s.waiting_grace_s * 1000)
        with store_errors():
            after_outage, unsent, due = self._script("reconcile_due",
                keys=[k.unsent, k.deadline, k.reconciler_pass], args=[grace, limit, outage_gap_ms(s)],
            )
        job_ids = [text_of(v) for v in [*unsent, *due]]
        if not job_ids:
            return []
        keys = [k.unsent, k.deadline, k.active, k.failed, k.events, k.stats, k.finished_new]
        for job_id in job_ids:
            keys += [k.job(job_id), k.job_events(job_id)]
        with store_errors():
            reply = self._script("reconcile",
                keys=keys,
                args=[
                    grace, s.max_attempts, s.events_maxlen,
                    error_json("import.attempts_exhausted"), error_json("import.worker_lost"),
                    int(s.attempt_lease_s * 1000), s.max_stalls, error_json("import.stalled"),
                    int(after_outage), len(unsent), *job_ids,
                ],
            )
        flat = [text_of(v) for v in reply]
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    def retain(self, k: Keys, batch: int = 500) -> int:
        """One retention pass over a partition; returns how many job records it removed.

        Finished records are removed after their age (all owners), and all but
        each owner's newest ``keep_*_count`` (IMPORTER_KEEP_*), with their
        uploads, rejection reports, event streams and index entries. The job
        steps only mark a job final (P:jobs:finished:new): which owner's index
        it enters, and which records go, is only known after a read, so it is
        done here, every key of each script call declared (Redis Cluster's
        rule): a plain read of the newly finished jobs and their owners, one
        call that indexes them and picks what to remove (retain_index.lua), a
        plain read of those records, and one call per 100 of them (retain_drop.lua)."""
        s = self.settings
        with store_errors():
            new = [text_of(v) for v in self.client.zrange(k.finished_new, 0, batch - 1)]  # type: ignore[arg-type]
            owners = self._read_fields(k, new, "state", "owner")
        keys = [k.finished_new, k.completed, k.failed]
        args: list[Any] = [
            s.keep_completed_age_s * 1000, s.keep_completed_count, s.keep_failed_age_s * 1000, s.keep_failed_count,
        ]
        for job_id, (state, owner) in zip(new, owners):
            owner = owner if state is not None and owner is not None else ""
            keys += [k.job(job_id), k.completed_of(owner), k.failed_of(owner)]
            args += [job_id, owner]
        with store_errors():
            flat = [text_of(v) for v in self._script("retain_index", keys=keys, args=args)]
        picked: dict[str, tuple[str, str]] = {}
        for i in range(0, len(flat), 3):
            picked.setdefault(flat[i], (flat[i + 1], flat[i + 2]))
        if not picked:
            return 0
        ids = list(picked)
        with store_errors():
            records = self._read_fields(k, ids, "uploadId", "owner")
        removed = 0
        for start in range(0, len(ids), 100):
            keys = [k.completed, k.failed, k.finished_new]
            args = []
            for job_id, (upload_id, owner) in zip(ids[start:start + 100], records[start:start + 100]):
                kind, score = picked[job_id]
                upload_id, owner = upload_id or "", owner or ""
                keys += [
                    k.job(job_id), k.job_events(job_id), k.rejections(job_id),
                    k.upload(upload_id) if upload_id else k.job(job_id),
                    k.owner_jobs(owner), k.completed_of(owner), k.failed_of(owner),
                ]
                args += [job_id, kind, score, upload_id, owner]
            with store_errors():
                removed += int(self._script("retain_drop", keys=keys, args=args))
        return removed

    def _read_fields(self, k: Keys, job_ids: list[str], *fields: str) -> list[list[str | None]]:
        """Fields of job records, as plain reads in one pipeline (one round trip per node)."""
        if not job_ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(k.job(job_id), list(fields))
        return [[text_of(v) if v is not None else None for v in reply] for reply in pipe.execute()]

    def renew(self, attempts: list[tuple[str, str]]) -> int:
        """Renew the lease of running attempts [(jobId, token)] in one round trip
        (one per node on a cluster); returns how many still hold their job."""
        if not attempts:
            return 0
        lease = int(self.settings.attempt_lease_s * 1000)
        calls: list[tuple[str, list[Any], list[Any]]] = []
        for job_id, token in attempts:
            k = self.partition_of(job_id)
            calls.append(("renew", [k.job(job_id), k.deadline], [job_id, token, lease]))
        with store_errors():
            replies = self._pipelined(calls)
        return sum(int(r) for r in replies)

    def queue_stats(self) -> QueueStats:
        """The queue's numbers summed over every location (one pipeline: one round trip per node)."""
        locations = self.locations()
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for location in locations:
                k = self.partition(location)
                pipe.zcard(k.waiting)
                pipe.zrange(k.waiting, 0, 0, withscores=True)
                pipe.zcard(k.active)
                pipe.hgetall(k.stats)
            replies = pipe.execute()
        waiting = active = 0
        oldest: float | None = None
        stats: dict[str, int] = {}
        for i in range(0, len(replies), 4):
            w, first, a, raw = replies[i:i + 4]
            waiting, active = waiting + int(w), active + int(a)
            if first and (oldest is None or first[0][1] < oldest):
                oldest = first[0][1]
            for key, v in raw.items():
                if not text_of(key).startswith("ledger:"):  # the ledger's gate (ledger_verified.lua), no count
                    stats[text_of(key)] = stats.get(text_of(key), 0) + int(v)
        age = max(0.0, (self._now() - oldest) / 1000) if oldest is not None else 0.0
        return QueueStats(waiting, age, active, stats)

    def announce_worker(self, worker_id: str, accepts: frozenset[int], window_ms: int, info: str = "{}") -> int:
        """This worker is alive for ``window_ms`` more (server clock) and accepts
        these contract versions (presence.lua), with ``info`` (JSON) for the
        operators' view; returns how many workers are live."""
        with store_errors():
            return int(self._script("presence", **self._presence(worker_id, format_versions(accepts), window_ms, accepts, info)))

    def remove_worker(self, worker_id: str) -> None:
        """A worker that stops says so: the door stops counting it at once."""
        with store_errors():
            self._script("presence", **self._presence(worker_id, "", 0, frozenset(), ""))

    def _presence(
        self, worker_id: str, versions: str, window_ms: int, accepts: frozenset[int], info: str,
    ) -> dict[str, list[Any]]:
        """presence.lua's KEYS and ARGV: the per-version zsets of every version
        this code knows and ``accepts`` are declared."""
        known = sorted(KNOWN_VERSIONS | accepts)
        k = self.keys
        return {
            "keys": [k.workers, k.workers_accepts, k.workers_info, *(k.workers_accepting(v) for v in known)],
            "args": [worker_id, versions, window_ms, ",".join(map(str, known)), info],
        }

    def ping(self) -> bool:
        """True when Redis answers and accepts writes (a tiny expiring write
        probe: PING alone says yes to a full or read-only Redis). Raises
        StoreUnavailable with reason redis_unreachable or redis_refuses_writes."""
        with store_errors():
            return bool(self.client.set(self.keys.health, "1", px=60_000))
