"""[ledger] The Redis side of the ledger: the journal and receipts (the
outbox the apply script writes), read in order by the exporter, then trimmed
once the ledger holds them; and the done markers pruned past the horizon.

Nothing leaves Redis before PostgreSQL has committed it: :meth:`trim_exported`
is given the cursor the ledger committed, and only markers that it indexed
are ever pruned (:meth:`prune_markers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from importer.adapters.redis.base import RedisStoreBase
from importer.adapters.redis.errors import store_errors
from importer.adapters.redis.records import bytes_of, text_of
from importer.domain.ledger import (
    JournalEntry, ReceiptSource, StreamId, ZERO, format_stream_id, parse_stream_id,
)
from importer.domain.shipment import job_id_for

#: Bytes of a receipt read per GETRANGE: a 100,000-row receipt streams through
#: the exporter in ~3 such pieces, never whole in memory with others.
RECEIPT_PIECE = 1 << 20
#: Bytes of receipts' first pieces read ahead for a batch of journal entries in
#: one call (receipt_heads.lua): a batch of small receipts comes whole, and a
#: batch of large ones never holds more than about this much at once.
READ_AHEAD = 8 * RECEIPT_PIECE


class LedgerOutbox(RedisStoreBase):
    """Implements :class:`importer.domain.ledger.LedgerOutbox` and the trimming."""

    def read_journal(self, location: str, after: StreamId, count: int) -> list[JournalEntry]:
        key = self.partition(location).journal
        with store_errors():
            raw: list[Any] = list(self.client.xrange(key, min="(" + format_stream_id(after), max="+", count=count) or [])
        entries = []
        for entry_id, fields in raw:
            f = {text_of(k): text_of(v) for k, v in (fields or {}).items()}
            entries.append(JournalEntry(
                location=location, stream_id=parse_stream_id(text_of(entry_id)), batch_id=f.get("batchId", ""),
                job_id=f.get("jobId", ""), owner=f.get("owner", ""), content_sha256=f.get("contentSha256", ""),
                applied_at_ms=int(f.get("appliedAt") or 0), result=f.get("result", ""),
            ))
        return entries

    def journal_head(self, location: str) -> tuple[StreamId, int]:
        key = self.partition(location).journal
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.xrevrange(key, count=1)
            pipe.xlen(key)
            last, length = pipe.execute()
        return (parse_stream_id(text_of(last[0][0])) if last else ZERO), int(length)

    def receipt_source(
        self, location: str, entries: list[JournalEntry] | None = None, *, read_ahead: int = READ_AHEAD,
    ) -> ReceiptSource:
        """Each entry's receipt in pieces of at most RECEIPT_PIECE bytes; the
        first pieces of the entries given are read ahead in one call, up to
        about ``read_ahead`` bytes in all (the rest when they are reached)."""
        k = self.partition(location)
        first: dict[str, bytes] = {}
        if entries:
            with store_errors():
                heads = self._script("receipt_heads", keys=[k.receipt(e.batch_id) for e in entries],
                                     args=[RECEIPT_PIECE, read_ahead])
            first = {e.batch_id: bytes_of(v) for e, v in zip(entries, heads)}

        def source(entry: JournalEntry) -> Iterable[bytes] | None:
            key = k.receipt(entry.batch_id)
            head = first.pop(entry.batch_id, None)
            if head is None:
                with store_errors():
                    head = bytes_of(self.client.getrange(key, 0, RECEIPT_PIECE - 1))
            if not head:
                return None

            def pieces() -> Iterator[bytes]:
                piece, start = head, 0
                while True:
                    yield piece
                    if len(piece) < RECEIPT_PIECE:
                        return
                    start += RECEIPT_PIECE
                    with store_errors():
                        piece = bytes_of(self.client.getrange(key, start, start + RECEIPT_PIECE - 1))
                    if not piece:
                        return

            return pieces()

        return source

    def trim_exported(self, location: str, committed: StreamId, older_than_ms: int, count: int = 500) -> int:
        """Drop the journal entries (and their receipts) the ledger committed
        (up to ``committed``) that were applied before ``older_than_ms``."""
        if committed == ZERO:
            return 0
        k = self.partition(location)
        upper = min(committed, (older_than_ms, 1 << 62))
        with store_errors():
            raw: list[Any] = list(self.client.xrange(k.journal, min="-", max=format_stream_id(upper), count=count) or [])
        if not raw:
            return 0
        keys = [k.journal, k.ledger_markers]
        args: list[str] = [format_stream_id(committed)]
        for entry_id, fields in raw:
            fields = fields or {}
            batch_id = text_of(fields.get(b"batchId", b""))
            keys.append(k.receipt(batch_id))
            args += [text_of(entry_id), batch_id, text_of(fields.get(b"appliedAt", b"0"))]
        with store_errors():
            return int(self._script("ledger_trim", keys=keys, args=args))

    def prune_markers(self, location: str, cutoff_ms: int, *, recheck_ms: int, count: int = 200) -> int:
        """Drop the indexed done markers applied at or before ``cutoff_ms``
        whose batch has no job record left (ledger_prune.lua)."""
        k = self.partition(location)
        with store_errors():
            found: list[Any] = list(self.client.zrangebyscore(k.ledger_markers, "-inf", cutoff_ms, start=0, num=count))
        batch_ids = [text_of(b) for b in found]
        if not batch_ids:
            return 0
        keys = [k.ledger_markers, k.ledger_pruned, k.ledger_pruned_filter]
        for batch_id in batch_ids:
            keys += [k.done(batch_id), k.job(job_id_for(batch_id, location))]
        with store_errors():
            return int(self._script("ledger_prune", keys=keys, args=[cutoff_ms, recheck_ms, *batch_ids]))

    def journal_progress(self, location: str, after: StreamId) -> tuple[int, int | None]:
        """(entries the journal ever received, the ms of its oldest entry after ``after``, None: none)."""
        key = self.partition(location).journal
        with store_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("XINFO", "STREAM", key)
            pipe.xrange(key, min="(" + format_stream_id(after), max="+", count=1)
            try:
                info, oldest = pipe.execute()
            except Exception as exc:  # no journal yet: XINFO answers "no such key"
                if "no such key" not in str(exc).lower():
                    raise
                return 0, None
        fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else dict(info)
        fields = {text_of(k): v for k, v in fields.items()}
        appended = int(fields.get("entries-added") or fields.get("length") or 0)
        first: list[Any] = list(oldest or [])
        return appended, (parse_stream_id(text_of(first[0][0]))[0] if first else None)
