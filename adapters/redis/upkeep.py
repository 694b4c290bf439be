"""Upkeep of the store: the reconciler's sweep and lease renewal, worker presence, queue numbers, health."""

from __future__ import annotations


from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.settings import Settings
from importer.adapters.redis.client import store_errors
from importer.adapters.redis.records import QueueStats, error_json, format_versions, parse_versions, text_of


def outage_gap_ms(settings: Settings) -> int:
    """A reconciler pass this long after the previous one means the store was
    away (or no worker ran): expired leases then blame nobody (reconcile.lua)."""
    return int((2 * settings.reconcile_interval_s + 2) * 1000)


class StoreUpkeep(RedisStoreBase):
    """What the reconciler, worker presence, /metrics and /health call."""


    def reconcile(self, limit: int = 500) -> list[tuple[str, str, str]]:
        """One reconciler pass (reconcile.lua): the (jobId, batchId, uploadId)
        of every job past its deadline that must be sent again; jobs whose
        attempts are used up are failed with import.attempts_exhausted."""
        k, s = self.keys, self.settings
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
        """Renew the lease of running attempts [(jobId, token)] in one round trip;
        returns how many still hold their job."""
        if not attempts:
            return 0
        k, lease = self.keys, int(self.settings.attempt_lease_s * 1000)
        with store_errors():
            replies = self._pipelined([
                ("renew", [k.job(job_id), k.deadline], [job_id, token, lease]) for job_id, token in attempts
            ])
        return sum(int(r) for r in replies)

    def queue_stats(self) -> QueueStats:
        k = self.keys
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(k.waiting)
            pipe.zrange(k.waiting, 0, 0, withscores=True)
            pipe.zcard(k.active)
            pipe.hgetall(k.stats)
            waiting, oldest, active, raw = pipe.execute()
        age = max(0.0, (self._now() - oldest[0][1]) / 1000) if oldest else 0.0
        return QueueStats(int(waiting), age, int(active), {text_of(key): int(v) for key, v in raw.items()})


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
        on the server's clock), as enqueue.lua's door check sees them. One round trip."""
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.zrange(self.keys.workers, 0, -1, withscores=True)
            pipe.hgetall(self.keys.workers_accepts)
            (seconds, micros), entries, accepts = pipe.execute()
        now_ms = seconds * 1000 + micros // 1000
        by_id = {text_of(k): text_of(v) for k, v in accepts.items()}
        return {
            text_of(worker): parse_versions(by_id[text_of(worker)])
            for worker, expiry in entries
            if expiry >= now_ms and text_of(worker) in by_id
        }

    def ping(self) -> bool:
        """True when Redis answers and accepts writes (a tiny expiring write
        probe: PING alone says yes to a full or read-only Redis). Raises
        StoreUnavailable with reason redis_unreachable or redis_refuses_writes."""
        with store_errors():
            return bool(self.client.set(self.keys.health, "1", px=60_000))
