"""The stock history, read from the ledger (PostgreSQL): the caller's applied
shipments (``GET /api/shipments``), stock movements (``GET
/api/stock-movements``, JSON pages or the whole result as CSV), and stock
levels now or as of a time (``GET /api/stock``, ``/api/stock/{sku}``: keys
with the ``stock:read`` scope only; stock belongs to the business).

The ledger holds what the exporter has copied: a shipment applied a moment
ago shows here once exported (the export lag, about a second under load).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from importer.domain.ledger import History, LedgerMovement, MovementFilter, Position, is_valid_sku
from importer.domain.shipment import is_valid_batch_id
from importer.handlers.answers import RETRY_AFTER_UNAVAILABLE_S, retry_after
from importer.domain.shipment import BATCH_ID_PATTERN, SKU_PATTERN
from importer.handlers.api import Api, request_location
from importer.handlers.downloads import RETRY_AFTER_DOWNLOAD_S, Downloads, DownloadStalled
from importer.handlers.http import Request, Response, json_response
from importer.handlers.problems import ApiError
from importer.handlers import query
from importer.handlers.query import BATCH_ID, LINE, LOCATION, MILLIS, SCAN, SKU, encode_cursor
from importer.handlers.schemas import (
    LOCATION_PARAMETER, MovementListSchema, ShipmentListSchema, SkuStockSchema, StockSchema,
)

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_SHIPMENTS = ShipmentListSchema()
_MOVEMENTS = MovementListSchema()
_STOCK = StockSchema()
_SKU_STOCK = SkuStockSchema()
log = logging.getLogger("importer.http")
CSV_HEADER = b"location,batchId,line,sku,before,quantity,after,appliedAt,owner\n"


def _invalid(req: Request, errors: dict[str, list[str]]) -> ApiError:
    return ApiError("request.invalid", instance=req.path, extra={"fields": errors})


def _history(api: Api) -> History:
    if api.history is None:
        raise ApiError("ledger.unavailable", retry_after(RETRY_AFTER_UNAVAILABLE_S))
    return api.history


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _locations(api: Api, req: Request) -> frozenset[str] | None:
    """?location= (one), else the key's locations (None: every one). A location the key does
    not reach lists nothing, as a location without shipments."""
    allowed = req.principal.locations if req.principal is not None else None
    if "location" in req.query:
        location = request_location(api, req)
        return frozenset({location}) if allowed is None or location in allowed else frozenset()
    return allowed


def list_shipments(api: Api, req: Request) -> Response:
    """GET /api/shipments: the caller's applied shipments, newest first."""
    errors: dict[str, list[str]] = {}
    limit = query.limit(req.query, errors, default=DEFAULT_LIMIT, most=MAX_LIMIT)
    from_ms, to_ms = query.instant(req.query, "from", errors), query.instant(req.query, "to", errors)
    after = query.cursor(req.query, errors, (MILLIS, LOCATION, BATCH_ID))
    if errors:
        raise _invalid(req, errors)
    locations = _locations(api, req)
    history = _history(api)
    items: list[Any] = []
    if locations != frozenset():
        page = history.list_shipments(
                req.owner or "", locations=locations, from_ms=from_ms, to_ms=to_ms, limit=limit + 1,
                after=(after[0], after[1], after[2], 0) if after else None,
            )
        items = page[:limit]
    more = len(items) == limit and locations != frozenset() and len(page) > limit
    payload = {
        "items": [{
            "batchId": s.batch_id, "location": s.location, "state": "applied", "appliedAt": _time(s.applied_at_ms),
            "result": json.loads(s.result), "contentSha256": s.content_sha256,
        } for s in items],
        "nextCursor": encode_cursor([items[-1].applied_at_ms, items[-1].location, items[-1].batch_id]) if more else None,
    }
    return json_response(200, _SHIPMENTS.dump(payload), (("Cache-Control", "no-store"),))


def _movement(m: LedgerMovement) -> dict[str, Any]:
    return {
        "location": m.location, "batchId": m.batch_id, "line": m.line, "sku": m.sku, "before": m.before,
        "quantity": m.quantity, "after": m.after, "appliedAt": _time(m.applied_at_ms), "owner": m.owner,
    }


class MovementsCsv:
    """The whole result as CSV, read a page at a time (handlers/downloads.py): each page one
    short query on a pooled connection, given back before the page is sent, so a client that
    reads slowly, or stops, holds no connection and no transaction, only its download slot.
    Pages follow each other by position, as the JSON pages do: a shipment exported while
    the download runs shows when it sorts below the page sent last."""

    PAGE = 2000

    def __init__(self, history: History, where: MovementFilter, first: list[LedgerMovement],
                 downloads: Downloads, owner: str) -> None:
        self.history, self.where, self.first = history, where, first
        self.downloads, self.owner = downloads, owner
        self._released = False

    def __iter__(self) -> Iterator[bytes]:
        clock, stall_s = self.downloads.clock, self.downloads.stall_s
        yield CSV_HEADER
        page, taken = self.first, clock()
        while page:
            for start in range(0, len(page), 1000):
                # SKUs, batchIds, locations and owners hold no comma, quote or newline (their patterns).
                yield "".join(
                    f"{m.location},{m.batch_id},{m.line},{m.sku},{m.before},{m.quantity},{m.after},"
                    f"{_time(m.applied_at_ms).isoformat()},{m.owner}\n" for m in page[start:start + 1000]
                ).encode()
                now = clock()
                if now - taken > stall_s:
                    log.warning("download stalled", extra={"event": "http.download_stalled", "owner": self.owner})
                    raise DownloadStalled()
                taken = now
            if len(page) < self.PAGE:
                return
            page = self.history.list_movements(self.where, limit=self.PAGE, after=_key(page[-1]))

    def close(self) -> None:
        if not self._released:
            self._released = True
            self.downloads.slots.release(self.owner)


def list_movements(api: Api, req: Request) -> Response:
    """GET /api/stock-movements: movements newest first; every owner's with stock:read, else the caller's."""
    errors: dict[str, list[str]] = {}
    accept = (req.headers.get("accept") or "").lower()
    as_csv = "text/csv" in accept
    limit = query.limit(req.query, errors, default=DEFAULT_LIMIT, most=MAX_LIMIT)
    from_ms, to_ms = query.instant(req.query, "from", errors), query.instant(req.query, "to", errors)
    after = query.cursor(req.query, errors, (MILLIS, LOCATION, BATCH_ID, LINE))
    sku, batch_id = req.query.get("sku"), req.query.get("batchId")
    if sku is not None and not is_valid_sku(sku):
        errors["sku"] = ["Must be a SKU: 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit."]
    if batch_id is not None and not is_valid_batch_id(batch_id):
        errors["batchId"] = ["Must be a batchId."]
    if errors:
        raise _invalid(req, errors)
    locations = _locations(api, req)
    history = _history(api)
    reads_all = req.principal is not None and req.principal.reads_stock
    where = MovementFilter(
        owner=None if reads_all else (req.owner or ""), locations=locations, sku=sku, batch_id=batch_id,
        from_ms=from_ms, to_ms=to_ms,
    )
    if as_csv:
        owner = req.owner or ""
        if not api.downloads.slots.try_acquire(owner):
            log.warning("download slots busy", extra={"event": "http.downloads_busy", "owner": owner})
            raise ApiError("request.rate_limited", retry_after(RETRY_AFTER_DOWNLOAD_S))
        try:
            # The first page before the 200: an unreachable ledger answers 503.
            first = [] if locations == frozenset() else history.list_movements(where, limit=MovementsCsv.PAGE, after=None)
        except BaseException:
            api.downloads.slots.release(owner)
            raise
        stream = MovementsCsv(history, where, first, api.downloads, owner)
        headers = (("Content-Type", "text/csv; charset=utf-8"), ("Vary", "Accept"), ("Cache-Control", "no-store"))
        return Response(200, b"", headers, stream=stream, download=True)
    items: list[LedgerMovement] = []
    if locations != frozenset():
        items = list(history.list_movements(where, limit=limit + 1, after=tuple(after) if after else None))
    more = len(items) > limit
    items = items[:limit]
    payload = {
        "items": [_movement(m) for m in items],
        "nextCursor": encode_cursor(_key(items[-1])) if more else None,
    }
    return json_response(200, _MOVEMENTS.dump(payload), (("Cache-Control", "no-store"), ("Vary", "Accept")))


def _key(m: LedgerMovement) -> Position:
    return (m.applied_at_ms, m.location, m.batch_id, m.line)


def _stock_reader(api: Api, req: Request) -> str:
    """The location a stock read is for; 403 auth.scope_required without stock:read."""
    if req.principal is None or not req.principal.reads_stock:
        raise ApiError("auth.scope_required")
    location = request_location(api, req)
    if not req.principal.may_use(location):
        raise ApiError("location.not_found")
    return location


def get_stock(api: Api, req: Request) -> Response:
    """GET /api/stock: a location's stock levels now (the live store) or as of a time (the ledger)."""
    location = _stock_reader(api, req)
    errors: dict[str, list[str]] = {}
    limit = query.limit(req.query, errors, default=DEFAULT_LIMIT, most=MAX_LIMIT)
    as_of = query.instant(req.query, "asOf", errors)
    cursor = query.cursor(req.query, errors, (SCAN,) if as_of is None else (SKU,))
    if errors:
        raise _invalid(req, errors)
    if as_of is None:
        levels, next_cursor = api.store.stock_now(location, limit=limit, cursor=cursor[0] if cursor else 0)
        nxt = encode_cursor([next_cursor]) if next_cursor else None
    else:
        history = _history(api)
        levels = history.stock_as_of(location, as_of, limit=limit + 1, after_sku=cursor[0] if cursor else None)
        nxt = encode_cursor([levels[limit - 1][0]]) if len(levels) > limit else None
        levels = levels[:limit]
    payload = {
        "location": location, "asOf": _time(as_of) if as_of is not None else None,
        "items": [{"sku": sku, "units": units} for sku, units in levels], "nextCursor": nxt,
    }
    return json_response(200, _STOCK.dump(payload), (("Cache-Control", "no-store"),))


def get_sku_stock(api: Api, req: Request) -> Response:
    """GET /api/stock/{sku}: one SKU's units at a location, now or as of a time."""
    location = _stock_reader(api, req)
    sku = req.path_params["sku"]
    errors: dict[str, list[str]] = {}
    as_of = query.instant(req.query, "asOf", errors)
    if not is_valid_sku(sku):
        errors["sku"] = ["Must be a SKU: 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit."]
    if errors:
        raise _invalid(req, errors)
    if as_of is None:
        units = api.store.sku_now(location, sku)
    else:
        history = _history(api)
        units = history.sku_as_of(location, sku, as_of)
    payload = {"location": location, "sku": sku, "asOf": _time(as_of) if as_of is not None else None, "units": units or 0}
    return json_response(200, _SKU_STOCK.dump(payload), (("Cache-Control", "no-store"),))


# -- the routes' OpenAPI operations (handlers/routes.py adds them to its table) --

_NOTES = {
    "request.invalid": "A filter, limit or cursor is not valid (see fields)",
    "ledger.unavailable": "The ledger (PostgreSQL) cannot be read now, or this deployment keeps none",
}
_STOCK_NOTES = {
    **_NOTES,
    "auth.scope_required": "The API key lacks the stock:read scope",
    "location.not_found": "The API key names its stock locations, not this one",
}
_FROM = query.instant_parameter("from", "Applied at or after this time.")
_TO = query.instant_parameter("to", "Applied before this time.")
_AS_OF = query.instant_parameter("asOf", "The stock after every shipment applied before this time; default: now.")
_LIMIT = query.limit_parameter(DEFAULT_LIMIT, MAX_LIMIT)
_CURSOR = query.CURSOR_PARAMETER

#: keyword arguments of handlers/routes.py's Route, one per route of this module.
ROUTE_SPECS: tuple[dict[str, Any], ...] = (
    dict(method="GET", template="/api/shipments", handler=list_shipments, operation={
        "operationId": "listShipments",
        "summary": "List your applied shipments, newest first (the ledger)",
        "description": (
            "One page of the caller's applied shipments as the ledger (PostgreSQL) holds them, newest first by "
            "appliedAt; each as GET /api/shipments/{batchId} answers it. A shipment shows once the exporter "
            "copied it (about a second). Pass nextCursor as ?cursor= for the next page."
        ),
        "parameters": [
            {**LOCATION_PARAMETER, "description": "Only shipments at this stock location (default: every location the API key allows)."},
            _FROM, _TO, _LIMIT, _CURSOR,
        ],
        "responses": {"200": {"description": "One page.", "content": {"application/json": {"schema": "ShipmentList"}}}},
    }, errors=("auth.required", "auth.invalid", "service.unavailable", "request.invalid", "ledger.unavailable"), error_notes=_NOTES),
    dict(method="GET", template="/api/stock-movements", handler=list_movements, operation={
        "operationId": "listStockMovements",
        "summary": "Stock movements (one per line of an applied shipment), newest first",
        "description": (
            "The ledger's movements: each line of an applied shipment with the SKU's units before and after. "
            "A key with the stock:read scope reads every producer's; any other key its own. `Accept: text/csv` "
            "streams the whole result (no paging) with the header "
            "`location,batchId,line,sku,before,quantity,after,appliedAt,owner`."
        ),
        "parameters": [
            {"name": "sku", "in": "query", "required": False, "schema": {"type": "string", "pattern": SKU_PATTERN}},
            {**LOCATION_PARAMETER, "description": "Only movements at this stock location (default: every location the API key allows)."},
            {"name": "batchId", "in": "query", "required": False, "schema": {"type": "string", "pattern": BATCH_ID_PATTERN}},
            _FROM, _TO, _LIMIT, _CURSOR,
        ],
        "responses": {"200": {"description": "One page, or the whole result as CSV.", "content": {
            "application/json": {"schema": "MovementList"},
            "text/csv": {"schema": {"type": "string"}},
        }}},
    }, errors=("auth.required", "auth.invalid", "service.unavailable", "request.invalid", "ledger.unavailable"), error_notes=_NOTES),
    dict(method="GET", template="/api/stock", handler=get_stock, operation={
        "operationId": "getStock",
        "summary": "A location's stock levels, now or as of a time (keys with stock:read)",
        "description": (
            "Without asOf: the live stock (units on hand now, from the store). With asOf: the units after every "
            "shipment applied before that time, from the ledger. Needs a key with the stock:read scope."
        ),
        "parameters": [LOCATION_PARAMETER, _AS_OF, _LIMIT, _CURSOR],
        "responses": {"200": {"description": "One page.", "content": {"application/json": {"schema": "Stock"}}}},
    }, errors=("auth.required", "auth.invalid", "service.unavailable", "request.invalid", "auth.scope_required", "location.not_found", "ledger.unavailable"),
        error_notes=_STOCK_NOTES),
    dict(method="GET", template="/api/stock/{sku}", handler=get_sku_stock, operation={
        "operationId": "getSkuStock",
        "summary": "One SKU's units at a location, now or as of a time (keys with stock:read)",
        "parameters": [
            {"name": "sku", "in": "path", "required": True, "schema": {"type": "string", "pattern": SKU_PATTERN}},
            LOCATION_PARAMETER, _AS_OF,
        ],
        "responses": {"200": {"description": "The units (0 for a SKU never received).", "content": {"application/json": {"schema": "SkuStock"}}}},
    }, errors=("auth.required", "auth.invalid", "service.unavailable", "request.invalid", "auth.scope_required", "location.not_found", "ledger.unavailable"),
        error_notes=_STOCK_NOTES),
)
