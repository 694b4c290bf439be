"""[ops] The operators' side of the store (:class:`importer.domain.operations.OpsStore`):
each location's queue in one script call (ops_overview.lua), the live workers
with what they say of themselves, intake paused and resumed, failed imports by
code, and the log of what operators did (a capped stream)."""

from __future__ import annotations

import json
from typing import Any

from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.errors import store_errors
from importer.adapters.redis.records import parse_versions, scored_members, text_of
from importer.domain.operations import EVERYWHERE, FailedImport, LiveWorker, LocationQueue

#: Actions kept in the operators' log (approximately: XADD MAXLEN ~).
ACTIONS_KEPT = 10_000
#: Failed records read per call of failed_imports, whatever matches: a bounded cost per page.
FAILED_SCAN = 1_000


class OpsReads(RedisStoreBase):
    def location_queue(self, location: str) -> LocationQueue:
        k = self.partition(location)
        with store_errors():
            reply = self._script("ops_overview", keys=[k.waiting, k.unsent, k.active, k.deadline, k.failed, k.stats], args=[])
        now, waiting, oldest, active, retrying, failed, stalls = reply[:7]
        recent = {text_of(reply[i]).removeprefix("recent:"): int(reply[i + 1]) for i in range(7, len(reply), 2)}
        return LocationQueue(
            location=location, now_ms=int(now), waiting=int(waiting),
            oldest_waiting_ms=int(float(text_of(oldest))) if text_of(oldest) else None,
            active=int(active), retrying=int(retrying), failed_kept=int(failed), stalls=int(stalls), recent=recent,
        )

    def workers_now(self) -> list[LiveWorker]:
        """The workers whose presence has not expired (server clock), with their info, oldest beat first."""
        k = self.keys
        now = self.server_time_ms()
        with store_errors():
            entries = self.client.zrangebyscore(k.workers, now, "+inf", withscores=True)
            ids = [member for member, _ in scored_members(entries)]
            accepts = self.client.hmget(k.workers_accepts, ids) if ids else []
            infos = self.client.hmget(k.workers_info, ids) if ids else []
        window_ms = self.settings.heartbeat_timeout_s * 1000
        workers = []
        for (worker_id, expiry), versions, info in zip(scored_members(entries), accepts, infos):
            if versions is None:
                continue  # leaving (as live_workers.lua counts it)
            try:
                said = json.loads(text_of(info)) if info else {}
            except ValueError:
                said = {}
            age = max(0.0, (window_ms - (float(expiry) - now)) / 1000)
            workers.append(LiveWorker(worker_id, parse_versions(text_of(versions)), round(age, 3), said))
        return sorted(workers, key=lambda w: w.id)

    def intake(self) -> dict[str, dict[str, Any]]:
        with store_errors():
            raw = self.client.hgetall(self.keys.intake_paused)
        return {text_of(name): _json(value) for name, value in sorted(raw.items())}

    def set_intake(self, location: str, *, paused: bool, by: str) -> None:
        key = self.keys.intake_paused
        with store_errors():
            if paused:
                self.client.hset(key, location, json.dumps({"by": by, "at": self._now()}))
            elif location == EVERYWHERE:
                self.client.delete(key)
            else:
                self.client.hdel(key, location)

    def failed_imports(
        self, location: str, *, code: str | None, limit: int, after: tuple[int, str] | None = None,
    ) -> tuple[list[FailedImport], tuple[int, str] | None]:
        """Newest first by finishedAt (then jobId), at most FAILED_SCAN records read per call."""
        k = self.partition(location)
        top: int | str = "+inf" if after is None else after[0]
        with store_errors():
            # Entries at the position's own score are read again and skipped by jobId below.
            batch = self.client.zrevrangebyscore(k.failed, top, "-inf", start=0, num=FAILED_SCAN, withscores=True)
            entries = [(m, int(score)) for m, score in scored_members(batch)]
            if after is not None:
                entries = [(m, s) for m, s in entries if s < after[0] or (s == after[0] and m < after[1])]
            pipe = self.client.pipeline(transaction=False)
            for job_id, _ in entries:
                pipe.hmget(k.job(job_id), "state", "owner", "error")
            rows = pipe.execute() if entries else []
        found: list[FailedImport] = []
        last = after
        for (job_id, score), (state, owner, error) in zip(entries, rows):
            last = (score, job_id)
            failure_code = str(_json(error).get("code", "unknown")) if error else "unknown"
            if text_of(state) == "failed" and owner and (code is None or failure_code == code):
                found.append(FailedImport(job_id, text_of(owner), failure_code))
                if len(found) == limit:
                    return found, last
        return found, (last if len(batch) == FAILED_SCAN else None)

    def record_action(self, by: str, action: str, detail: dict[str, Any]) -> str:
        with store_errors():
            entry_id = self.client.xadd(
                self.keys.ops_actions, {"by": by, "action": action, "detail": json.dumps(detail, sort_keys=True)},
                maxlen=ACTIONS_KEPT, approximate=True,
            )
        return text_of(entry_id)

    def actions(self, *, limit: int, before: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """The operators' log, newest first: {id, at (ms), by, action, detail}; the id to go on before."""
        top = f"({before}" if before else "+"
        with store_errors():
            entries = self.client.xrevrange(self.keys.ops_actions, top, "-", count=limit)
        out: list[dict[str, Any]] = []
        for entry_id, fields in entries or []:
            values = {text_of(name): text_of(value) for name, value in (fields or {}).items()}
            eid = text_of(entry_id)
            out.append({"id": eid, "at": int(eid.split("-")[0]), "by": values.get("by", ""),
                        "action": values.get("action", ""), "detail": _json(values.get("detail"))})
        return out, (eid if len(out) == limit else None)


def _json(value: Any) -> dict[str, Any]:
    try:
        found = json.loads(text_of(value)) if value else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
