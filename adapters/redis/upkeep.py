"""Upkeep of the store: the reconciler's sweep and lease renewal, worker presence, queue numbers, health."""

from __future__ import annotations

import logging
from typing import Any

from importer.adapters.logs import log_event
from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.client import StoreUnavailable, store_errors
from importer.adapters.redis.keys import Keys
from importer.adapters.settings import Settings
from importer.adapters.redis.records import QueueStats, error_json, format_versions, parse_versions, text_of


log = logging.getLogger("importer.worker")


def outage_gap_ms(settings: Settings) -> int:
    """A reconciler pass this long after the previous one means the store was
    away (or no worker ran): expired leases then blame nobody (reconcile.lua)."""
    return int((2 * settings.reconcile_interval_s + 2) * 1000)


class StoreUpkeep(RedisStoreBase):
    """What the reconciler, worker presence, /metrics and /health call."""


    def reconcile(self, limit: int = 500) -> list[tuple[str, str, str]]:
        """One reconciler pass over every location (reconcile.lua, once per
        partition): the (jobId, batchId, uploadId) of every job past its
        deadline that must be sent again; jobs whose attempts are used up are
        failed with import.attempts_exhausted. A partition whose node cannot
        be reached is skipped this pass, never the ones after it; the pass
        then raises StoreUnavailable once the others are done."""
        resend: list[tuple[str, str, str]] = []
        sick: StoreUnavailable | None = None
        for location in self.locations():
            try:
                resend += self._reconcile_partition(self.partition(location), limit)
            except StoreUnavailable as exc:
                log_event(log, "reconciler.partition_unavailable", logging.WARNING, location=location)
                sick = exc
        if sick is not None and not resend:
            raise sick
        return resend

    def _reconcile_partition(self, k: Keys, limit: int) -> list[tuple[str, str, str]]:
        s = self.settings
        with store_errors():
            reply = self._script("reconcile",
                keys=[k.unsent, k.deadline, k.active, k.failed, k.events, k.stats, k.reconciler_pass],
                args=[
                    int(s.waiting_grace_s * 1000), limit, s.max_attempts, s.events_maxlen,
                    k.job(""), k.upload(""), k.owner_jobs(""), k.failed_of(""),
                    s.keep_failed_age_s * 1000, s.keep_failed_count,
                    error_json("import.attempts_exhausted"), error_json("import.worker_lost"),
                    outage_gap_ms(s), int(s.attempt_lease_s * 1000), s.max_stalls, error_json("import.stalled"),
                ],
            )
        flat = [text_of(v) for v in reply]
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

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
                stats[text_of(key)] = stats.get(text_of(key), 0) + int(v)
        age = max(0.0, (self._now() - oldest) / 1000) if oldest is not None else 0.0
        return QueueStats(waiting, age, active, stats)

    def announce_worker(self, worker_id: str, accepts: frozenset[int], window_ms: int) -> int:
        """This worker is alive for ``window_ms`` more (server clock) and accepts
        these contract versions (presence.lua); returns how many workers are live."""
        with store_errors():
            return int(self._script("presence",
                keys=[self.keys.workers, self.keys.workers_accepts],
                args=[worker_id, format_versions(accepts), window_ms, self.keys.workers_accepting("")],
            ))

    def remove_worker(self, worker_id: str) -> None:
        """A worker that stops says so: the door stops counting it at once."""
        with store_errors():
            self._script("presence",
                keys=[self.keys.workers, self.keys.workers_accepts],
                args=[worker_id, "", 0, self.keys.workers_accepting("")],
            )

    def live_workers(self) -> dict[str, frozenset[int]]:
        """Worker id -> accepted versions of every live worker (expiry not past
        on the server's clock), as enqueue.lua's door check sees them (live_workers.lua)."""
        with store_errors():
            flat = self._script("live_workers", keys=[self.keys.workers, self.keys.workers_accepts], args=[])
        return {text_of(flat[i]): parse_versions(text_of(flat[i + 1])) for i in range(0, len(flat), 2)}

    def ping(self) -> bool:
        """True when Redis answers and accepts writes (a tiny expiring write
        probe: PING alone says yes to a full or read-only Redis). Raises
        StoreUnavailable with reason redis_unreachable or redis_refuses_writes."""
        with store_errors():
            return bool(self.client.set(self.keys.health, "1", px=60_000))
