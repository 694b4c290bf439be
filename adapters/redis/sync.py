"""[ledger] The Redis side of keeping Redis at or ahead of the ledger
(adapters/processes/ledger_sync.py): where a location's Redis stands, the
mark that it is behind, and the writes that bring it forward.

* ``P:ledger:behind``: a location found behind the ledger (a hash: since,
  shipments, seconds, reason). While it exists, intake there answers ``503
  store.behind_ledger``, workers do not apply there and the exporter does
  not export there; the restore deletes it when Redis is brought forward.
* ``P:ledger:restoring``: the restore's lock (a token with a TTL, renewed).

The restore's writes are plain commands, pipelined, each setting a value that
the ledger decides (a marker, a SKU's units, the journal's floor): written
twice they leave the same state, so a restore killed anywhere is run again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.errors import store_errors
from importer.adapters.redis.records import text_of
from importer.domain.ledger import ZERO, Behind, RedisPosition, StreamId, format_stream_id, parse_stream_id

#: Writes per pipelined round trip of a restore.
RESTORE_PIPELINE = 1000


class LedgerSyncSide(RedisStoreBase):
    """The Redis side of the check and of the restore (mixed into RedisStore)."""

    def redis_position(self, location: str, last_batch_id: str) -> RedisPosition:
        k = self.partition(location)
        with store_errors():
            last, known, applies = self._script(
                "sync_position", keys=[k.journal, k.done(last_batch_id or "-"), k.ledger_pruned_filter, k.generation],
                args=[last_batch_id],
            )
        text = text_of(last)
        return RedisPosition(parse_stream_id(text) if text else ZERO, int(known) == 1, int(applies))

    def renew_gate(self, location: str, *, verified: bool, ttl_ms: int) -> bool:
        """Renew start.lua's gate (ledger_verified.lua): ``verified`` after a check found this
        Redis at or ahead of the ledger; else only while the server is the one last verified."""
        with store_errors():
            return int(self._script("ledger_verified", keys=[self.partition(location).stats],
                                    args=["verified" if verified else "steady", ttl_ms])) == 1

    # -- the mark ---------------------------------------------------------------

    def behind_marks(self, locations: Iterable[str]) -> dict[str, dict[str, str]]:
        """The locations marked behind the ledger, with what the mark says."""
        locations = list(locations)
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for location in locations:
                pipe.hgetall(self.partition(location).ledger_behind)
            found = pipe.execute()
        return {loc: {text_of(k): text_of(v) for k, v in raw.items()} for loc, raw in zip(locations, found) if raw}

    def mark_behind(self, behind: Behind, now_ms: int) -> bool:
        """Mark a location behind (True when this call made the mark)."""
        key = self.partition(behind.location).ledger_behind
        with store_errors():
            made = bool(self.client.hsetnx(key, "since", now_ms))
            self.client.hset(key, mapping={"shipments": behind.shipments, "seconds": round(behind.seconds, 3),
                                           "reason": behind.reason})
        return made

    def clear_behind(self, location: str) -> None:
        with store_errors():
            self.client.delete(self.partition(location).ledger_behind)

    def take_restore_lock(self, location: str, token: str, ttl_s: int) -> bool:
        """The restore's lock at a location (renewed by taking it again with the same token)."""
        key = self.partition(location).ledger_restoring
        with store_errors():
            if self.client.set(key, token, nx=True, ex=ttl_s):
                return True
            if text_of(self.client.get(key) or b"") == token:
                self.client.expire(key, ttl_s)
                return True
        return False

    def drop_restore_lock(self, location: str, token: str) -> None:
        key = self.partition(location).ledger_restoring
        with store_errors():
            if text_of(self.client.get(key) or b"") == token:
                self.client.delete(key)

    # -- the restore's writes ------------------------------------------------------

    def restore_markers(self, location: str, markers: list[tuple[str, str, str, str, str, int]]) -> int:
        """Done markers (batchId, owner, jobId, contentSha256, result, appliedAt) as apply.lua
        writes them, for the batches whose marker Redis lacks; each indexed for pruning past the
        idempotency horizon, as a trimmed one is (ledger_trim.lua). Returns how many were written."""
        k = self.partition(location)
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for batch_id, *_ in markers:
                pipe.exists(k.done(batch_id))
            present = pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            written = 0
            for (batch_id, owner, job_id, sha, result, applied_at), there in zip(markers, present):
                if there:
                    continue
                pipe.hset(k.done(batch_id), mapping={"batchId": batch_id, "contentSha256": sha, "result": result,
                                                    "owner": owner, "appliedAt": applied_at, "jobId": job_id})
                pipe.zadd(k.ledger_markers, {batch_id: applied_at})
                written += 1
            if written:
                pipe.execute()
        return written

    def missing_markers(self, location: str, batch_ids: list[str]) -> int:
        """How many of these batches have no done marker here."""
        k = self.partition(location)
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for batch_id in batch_ids:
                pipe.exists(k.done(batch_id))
            return sum(1 for there in pipe.execute() if not there)

    def stock_all(self, location: str) -> dict[str, int]:
        """Every SKU's units at a location, as Redis holds them."""
        k = self.partition(location)
        with store_errors():
            return {text_of(sku): int(units) for sku, units in self.client.hscan_iter(k.stock, count=1000)}

    def restore_stock(self, location: str, stock: dict[str, int], gone: list[str], applies: int) -> None:
        """Each SKU's units as the restore computed them; the SKUs that end at none deleted;
        the location's count of applies (P:generation) at least ``applies``."""
        k = self.partition(location)
        items = list(stock.items())
        with store_errors():
            for start in range(0, len(items), RESTORE_PIPELINE):
                self.client.hset(k.stock, mapping=dict(items[start:start + RESTORE_PIPELINE]))
            for start in range(0, len(gone), RESTORE_PIPELINE):
                self.client.hdel(k.stock, *gone[start:start + RESTORE_PIPELINE])
            current = int(self.client.get(k.generation) or 0)
            if current < applies:
                self.client.set(k.generation, applies)

    def rewrite_receipts(self, location: str, receipts: dict[str, list[tuple[str, int, int]]]) -> None:
        """The receipts of shipments applied since the ledger's cursor, recomputed on the restored stock."""
        k = self.partition(location)
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            for batch_id, lines in receipts.items():
                pipe.set(k.receipt(batch_id), "".join(f"{sku},{before},{quantity}\n" for sku, before, quantity in lines))
            if receipts:
                pipe.execute()

    def drop_journal_entries(self, location: str, ids: list[StreamId]) -> None:
        """Journal entries of second applications: the ledger holds their batches already."""
        if ids:
            with store_errors():
                self.client.xdel(self.partition(location).journal, *[format_stream_id(i) for i in ids])

    def raise_journal_floor(self, location: str, floor: StreamId) -> None:
        """The journal's last generated id at least ``floor`` (the ledger's cursor): its next
        entry is numbered after every entry the ledger holds. XSETID on an empty stream
        creates nothing, so a missing journal gets one entry-less stream by XADD then XDEL."""
        k = self.partition(location)
        with store_errors():
            if not self.client.exists(k.journal):
                first = self.client.xadd(k.journal, {"restored": "1"}, id=format_stream_id(floor))
                self.client.xdel(k.journal, first)
                return
            info: dict[str, Any] = self.client.xinfo_stream(k.journal)
            last = parse_stream_id(text_of(info["last-generated-id"]))
            if last < floor:
                self.client.execute_command("XSETID", k.journal, format_stream_id(floor))
