"""``GET /api/shipments/{batchId}/receipt``: what one of the caller's
shipments changed, SKU by SKU, as JSON (the default) or CSV (``Accept: text/csv``).

The answer is rendered from the receipt's stored bytes (domain/receipt.py),
written once by the apply script with the done marker, and from the done
marker itself; both are never rewritten, so every read, before or after a
replay of the batch, answers the same bytes.

Owner first: one script (read_receipt.lua) reads the done marker's owner
before anything else, so another owner's batch answers the same 404 bytes as
a missing one. A receipt larger than :data:`RECEIPT_CHUNK` is streamed: read
in ranges of that size and rendered range by range while it is sent, so an
HTTP process holds a few chunks of it, never the whole.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from importer.domain.shipment import is_valid_batch_id
from importer.domain.locations import location_of_job
from importer.domain.ports import ReceiptStore
from importer.domain.receipt import StoredReceipt, stored_lines, whole_lines
from importer.handlers.api import Api, request_location
from importer.handlers.http import Request, Response
from importer.handlers.problems import ApiError
from importer.handlers.schemas import ReceiptSchema

log = logging.getLogger("importer.http")

#: Bytes of the stored receipt read per Redis call (the first one comes with the owner check).
RECEIPT_CHUNK = 128 * 1024

JSON, CSV = "application/json", "text/csv"
CSV_HEADER = b"sku,before,after\n"

_RECEIPT_HEAD = ReceiptSchema(exclude=("items",))


# -- content negotiation ---------------------------------------------------------


def negotiate(accept: str | None) -> str | None:
    """The media type to answer for an Accept header: JSON, CSV, or None (406).

    No Accept (or an empty one) means JSON. Otherwise each offer gets the
    q of the most specific range that names it (``text/csv`` over ``text/*``
    over ``*/*``); the highest q wins, then the more specific match, then JSON.
    """
    if accept is None or not accept.strip():
        return JSON
    best: dict[str, tuple[float, int]] = {}
    for offer in (JSON, CSV):
        kind = offer.split("/")[0]
        for media_range in accept.split(","):
            parts = [p.strip() for p in media_range.split(";")]
            name = parts[0].lower()
            q = 1.0
            for param in parts[1:]:
                key, _, value = param.partition("=")
                if key.strip().lower() == "q":
                    try:
                        q = float(value.strip())
                    except ValueError:
                        q = 0.0
                    if not 0.0 <= q <= 1.0:
                        q = 0.0
            specificity = 2 if name == offer else 1 if name == f"{kind}/*" else 0 if name == "*/*" else -1
            if specificity < 0:
                continue
            if offer not in best or specificity > best[offer][1]:
                best[offer] = (q, specificity)
    ranked = sorted(
        ((q, specificity, offer == JSON, offer) for offer, (q, specificity) in best.items() if q > 0), reverse=True
    )
    return ranked[0][3] if ranked else None


# -- rendering (pure: the same stored bytes always give the same answer bytes) -------


def render_csv(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """``sku,before,after`` then one line per stored line."""
    yield CSV_HEADER
    for piece in whole_lines(pieces):
        yield b"".join(b"%s,%d,%d\n" % line for line in stored_lines(piece))


def render_json(stored: StoredReceipt, pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The Receipt schema's object; ``items`` last, written piece by piece."""
    shipment = stored.shipment
    head = _RECEIPT_HEAD.dump({
        "batchId": shipment.batch_id,
        "jobId": shipment.job_id,
        "appliedAt": datetime.fromtimestamp(shipment.applied_at_ms / 1000, tz=timezone.utc),
        "rows": int(str(shipment.result.get("imported", 0))),
    })
    yield json.dumps(head, separators=(",", ":")).encode()[:-1] + b',"items":['
    separator = b""
    for piece in whole_lines(pieces):
        # SKUs hold no character JSON escapes (domain/receipt.py STORED_LINE).
        yield separator + b",".join(b'{"sku":"%s","before":%d,"after":%d}' % line for line in stored_lines(piece))
        separator = b","
    yield b"]}"


# -- the handler ------------------------------------------------------------------


class ReceiptStream:
    """The body of a receipt larger than one chunk: read and rendered while it is sent.

    A store error in the middle cannot become an error answer any more (the
    status line is sent): the transfer is cut (the exception goes to the
    WSGI server, which drops the connection without the last chunk), so a
    client never mistakes a partial receipt for a whole one."""

    def __init__(
        self, store: ReceiptStore, stored: StoredReceipt, media_type: str, *,
        unavailable_errors: tuple[type[BaseException], ...], on_store_error: Callable[[], None],
    ) -> None:
        self.store = store
        self.stored = stored
        self.media_type = media_type
        self.unavailable_errors = unavailable_errors
        self.on_store_error = on_store_error

    def _stored_pieces(self) -> Iterator[bytes]:
        stored = self.stored
        yield stored.head
        position = len(stored.head)
        while position < stored.size:
            piece = self.store.read_receipt(
                stored.shipment.batch_id, position, min(RECEIPT_CHUNK, stored.size - position),
                location_of_job(stored.shipment.job_id),
            )
            if not piece:
                raise ValueError("the stored receipt is shorter than its length")
            position += len(piece)
            yield piece

    def __iter__(self) -> Iterator[bytes]:
        pieces = self._stored_pieces()
        rendered = render_csv(pieces) if self.media_type == CSV else render_json(self.stored, pieces)
        try:
            yield from rendered
        except self.unavailable_errors:
            self.on_store_error()
            log.warning("store unavailable: receipt cut", extra={
                "event": "http.receipt_store_unavailable", "batchId": self.stored.shipment.batch_id,
            })
            raise

    def close(self) -> None:
        pass


def get_receipt(api: Api, req: Request) -> Response:
    """GET /api/shipments/{batchId}/receipt: the receipt of one of the caller's applied batches."""
    media_type = negotiate(req.headers.get("accept"))
    if media_type is None:
        raise ApiError("request.not_acceptable")
    batch_id = req.path_params["batchId"]
    location = request_location(api, req)
    owner = req.owner_at(location)
    # A batchId no batch can have was never applied: the same 404, without asking the stores.
    stored = api.store.get_owned_receipt(batch_id, owner, RECEIPT_CHUNK, location) if owner and is_valid_batch_id(batch_id) else None
    if stored is None:
        raise ApiError("shipment.not_found")  # the same bytes as GET /api/shipments/{batchId}
    if stored.size == 0:
        raise ApiError("receipt.not_recorded")
    headers: tuple[tuple[str, str], ...] = (("Vary", "Accept"),)
    if media_type == CSV:
        headers += (
            ("Content-Type", "text/csv; charset=utf-8"),
            ("Content-Disposition", f'attachment; filename="receipt-{stored.shipment.batch_id}.csv"'),
        )
    else:
        headers += (("Content-Type", "application/json"),)
    if len(stored.head) >= stored.size:  # the whole receipt came with the owner check
        pieces = iter((stored.head,))
        body = b"".join(render_csv(pieces) if media_type == CSV else render_json(stored, pieces))
        return Response(200, body, headers)
    stream = ReceiptStream(
        api.store, stored, media_type, unavailable_errors=api.unavailable_errors, on_store_error=api.on_store_error,
    )
    return Response(200, b"", headers, stream=stream, download=True)
