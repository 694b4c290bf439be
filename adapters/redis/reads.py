"""Owner-scoped reads of the store: job records, shipments, receipts, rejection reports, lists and events."""

from __future__ import annotations

from typing import Any

from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.errors import store_errors
from importer.adapters.redis.records import (
    bytes_of, events_after, job_record, json_or_none, rejection_report, scored_members, shipment_record,
    text_of, xread_entries,
)
from importer.adapters.redis.keys import Keys
from importer.domain.jobs import JobRecord, JobState, RejectionReport, ShipmentRecord
from importer.domain.locations import MAIN
from importer.domain.receipt import StoredReceipt


class JobReads(RedisStoreBase):
    """Implements the read ports of handlers/ (JobStore, ReceiptStore, JobEventSource): one script or one pipeline per read."""


    def _owned(self, key: str, owner: str) -> dict[bytes, bytes]:
        """The hash at key when its owner field is owner, else {} (read_owned.lua)."""
        with store_errors():
            flat = self._script("read_owned", keys=[key], args=[owner])
        return dict(zip(flat[::2], flat[1::2]))

    def get_owned_job(self, job_id: str, owner: str) -> JobRecord | None:
        """The job record, or None when it is missing or another owner's (the same work for both)."""
        raw = self._owned(self.partition_of(job_id).job(job_id), owner)
        return job_record(raw) if raw else None

    def get_owned_shipment(self, batch_id: str, owner: str, location: str = MAIN) -> ShipmentRecord | None:
        """The done marker, or None when the batch was never applied at the location or is another owner's."""
        raw = self._owned(self.partition(location).done(batch_id), owner)
        if raw:
            return shipment_record(raw)
        archived = self._archived(location, batch_id, owner)
        return archived[0] if archived else None

    def _archived(self, location: str, batch_id: str, owner: str) -> tuple[ShipmentRecord, bool] | None:
        """[ledger] The shipment as the ledger holds it, for its owner only (None otherwise,
        or without a ledger). The ledger's errors are its own (ShipmentHistory): unreachable
        is ``503 ledger.unavailable``, never the store's (Redis's) error."""
        if self.history is None:
            return None
        found = self.history.shipment(location, batch_id)
        return found if found is not None and found[0].owner == owner else None

    def get_owned_receipt(self, batch_id: str, owner: str, head_bytes: int, location: str = MAIN) -> StoredReceipt | None:
        """The batch's receipt with its done marker and first ``head_bytes`` bytes, or None when the
        batch was never applied or is another owner's (read_receipt.lua: the same work for both)."""
        k = self.partition(location)
        with store_errors():
            reply = self._script("read_receipt", keys=[k.done(batch_id), k.receipt(batch_id)], args=[owner, max(1, head_bytes)])
        if reply and int(reply[1]) > 0:
            flat, size, head = reply
            return StoredReceipt(shipment_record(dict(zip(flat[::2], flat[1::2]))), int(size), bytes(head))
        # [ledger] Not in Redis, or its receipt dropped past the hot window: the ledger's, whole.
        archived = self._archived(location, batch_id, owner)
        if archived is None:
            if not reply:
                return None
            flat = reply[0]
            return StoredReceipt(shipment_record(dict(zip(flat[::2], flat[1::2]))), 0, b"")
        record, whole = archived
        if not whole:
            return StoredReceipt(record, 0, b"")
        assert self.history is not None
        data = self.history.stored_receipt(location, batch_id)
        return StoredReceipt(record, len(data), data)

    def read_receipt(self, batch_id: str, start: int, length: int, location: str = MAIN) -> bytes:
        """Bytes ``start`` to ``start + length`` of a receipt (GETRANGE), after get_owned_receipt
        answered it for its owner: a receipt is written once with its done marker and never rewritten."""
        with store_errors():
            return bytes_of(self.client.getrange(self.partition(location).receipt(batch_id), start, start + length - 1))

    def get_owned_rejections(self, job_id: str, owner: str) -> tuple[str, RejectionReport | None] | None:
        """The job's state and rejection report (None: it has none), or None when
        the record is missing or another owner's (read_rejections.lua: the same work for both).

        A report exists only for a job that failed CSV validation: its error
        names the report (``rejections``) and fail.lua wrote it in the same step."""
        k = self.partition_of(job_id)
        with store_errors():
            reply = self._script("read_rejections", keys=[k.job(job_id), k.rejections(job_id)], args=[owner])
        if not reply:
            return None
        state, error, raw = text_of(reply[0]), json_or_none(reply[1]), reply[2]
        if state != JobState.FAILED or not raw or not isinstance(error, dict) or "rejections" not in error:
            return state, None
        return state, rejection_report(job_id, raw)

    def get_job(self, job_id: str) -> JobRecord | None:
        """Whoever owns it: for operators (``importer inspect``). The API reads get_owned_job."""
        with store_errors():
            raw = self.client.hgetall(self.partition_of(job_id).job(job_id))
        return job_record(raw) if raw else None

    def list_jobs(
        self, owner: str, *, limit: int, state: str | None = None, after: tuple[int, str] | None = None,
        scan_limit: int = 1000, location: str | None = None, within: frozenset[str] | None = None,
    ) -> tuple[list[JobRecord], tuple[int, str] | None]:
        """One page of the owner's job records at ``location``, or at every
        location the owner has jobs at (None), newest first (createdAt, then
        jobId, descending); as :meth:`_list_partition` says.

        Across locations: one page is read from each of the owner's partitions
        (main's and those in the owner's locations registry) and merged. A
        partition that stopped early (its scan limit, or its page full) knows
        nothing past where it stopped, so the merged page ends there too (the
        newest such position): no record is ever skipped or shown twice, since
        the position (createdAt, jobId) orders every partition alike.
        ``within`` (a key's locations): only those of them.
        """
        if location is not None:
            return self._list_partition(self.partition(location), owner, limit, state, after, scan_limit)
        with store_errors():
            others = sorted(text_of(v) for v in self.client.smembers(self.keys.owner_locations(owner)))
        if not others and within is None:
            return self._list_partition(self.keys, owner, limit, state, after, scan_limit)
        partitions = [MAIN, *(o for o in others if o != MAIN)]
        if within is not None:
            partitions = [loc for loc in partitions if loc in within]
        pages = [
            self._list_partition(self.partition(loc), owner, limit, state, after, scan_limit) for loc in partitions
        ]
        stops = [stop for _, stop in pages if stop is not None]
        frontier = max(stops) if stops else None
        merged = sorted((r for records, _ in pages for r in records), key=lambda r: (r.created_at_ms, r.id), reverse=True)
        if frontier is not None:
            merged = [r for r in merged if (r.created_at_ms, r.id) >= frontier]
        page = merged[:limit]
        if len(merged) > limit:
            return page, (page[-1].created_at_ms, page[-1].id)
        return page, frontier

    def _list_partition(
        self, k: Keys, owner: str, limit: int, state: str | None, after: tuple[int, str] | None, scan_limit: int,
    ) -> tuple[list[JobRecord], tuple[int, str] | None]:
        """One page of the owner's job records in one partition, newest first (createdAt, then jobId, descending).

        ``after`` is the position (createdAt ms, jobId) the previous page ended
        on. Returns the records and the position to continue after, or None at
        the end. At most ``scan_limit`` index entries are read per call, so a
        filter by state that matches few records may return a short (even
        empty) page with a position to continue from.
        """
        key = k.owner_jobs(owner)
        chunk = min(max(limit * 2, 50), scan_limit)
        max_score: int | str = "+inf" if after is None else after[0]
        records: list[JobRecord] = []
        offset = scanned = 0
        last = after
        with store_errors():
            while True:
                batch = self.client.zrevrangebyscore(key, max_score, "-inf", start=offset, num=chunk, withscores=True)
                offset += len(batch)
                entries = [(m, int(sc)) for m, sc in scored_members(batch)]
                if after is not None:
                    entries = [(m, sc) for m, sc in entries if sc < after[0] or (sc == after[0] and m < after[1])]
                pipe = self.client.pipeline(transaction=False)
                for job_id, _ in entries:
                    pipe.hgetall(k.job(job_id))
                raws = pipe.execute() if entries else []
                for i, ((job_id, score), raw) in enumerate(zip(entries, raws)):
                    scanned += 1
                    last = (score, job_id)
                    record = job_record(raw) if raw else None
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

        key = self.partition_of(job_id).job_events(job_id)
        with store_errors():
            if block_ms:
                reply = self.client.xread({key: after_id}, count=100, block=block_ms)
            else:
                reply = self.client.xread({key: after_id}, count=100)
        return events_after(xread_entries(reply), after_id)

    def get_diagnostic(self, job_id: str) -> str:
        """Operators only (``importer inspect``): never shown by the API."""
        with store_errors():
            return text_of(self.client.hget(self.partition_of(job_id).job(job_id), "diagnostic"))

    def stock_now(self, location: str, *, limit: int, cursor: int) -> tuple[list[tuple[str, int]], int]:
        """[ledger] One page of a location's stock as Redis holds it now (HSCAN: no order;
        the next cursor, 0 at the end)."""
        with store_errors():
            next_cursor, found = self.client.hscan(self.partition(location).stock, cursor, count=limit)
        pairs: dict[Any, Any] = found if isinstance(found, dict) else {}
        return sorted((text_of(sku), int(units)) for sku, units in pairs.items()), int(next_cursor)

    def sku_now(self, location: str, sku: str) -> int | None:
        """[ledger] A SKU's units at a location now (None: it never had any)."""
        with store_errors():
            units = self.client.hget(self.partition(location).stock, sku)
        return int(units) if units is not None else None
