"""The stock history, read from the ledger (PostgreSQL): the caller's applied
shipments (``GET /api/shipments``), stock movements (``GET
/api/stock-movements``, JSON pages or the whole result as CSV), and stock
levels now or as of a time (``GET /api/stock``, ``/api/stock/{sku}``: keys
with the ``stock:read`` scope only; stock belongs to the business).

The ledger holds what the exporter has copied: a shipment applied a moment
ago shows here once exported (the export lag, about a second under load).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from importer.domain.ledger import History, LedgerMovement, MovementFilter, Position, is_valid_sku
from importer.domain.shipment import is_valid_batch_id
from importer.handlers.answers import RETRY_AFTER_UNAVAILABLE_S, retry_after
from importer.domain.shipment import BATCH_ID_PATTERN, SKU_PATTERN
from importer.handlers.api import Api, request_location
from importer.handlers.http import Request, Response, json_response
from importer.handlers.problems import ApiError
from importer.handlers.schemas import (
    LOCATION_PARAMETER, MovementListSchema, ShipmentListSchema, SkuStockSchema, StockSchema,
)

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_SHIPMENTS = ShipmentListSchema()
_MOVEMENTS = MovementListSchema()
_STOCK = StockSchema()
_SKU_STOCK = SkuStockSchema()
CSV_HEADER = b"location,batchId,line,sku,before,quantity,after,appliedAt,owner\n"


def _invalid(req: Request, errors: dict[str, list[str]]) -> ApiError:
    return ApiError("request.invalid", instance=req.path, extra={"fields": errors})


def _history(api: Api) -> History:
    if api.history is None:
        raise ApiError("ledger.unavailable", retry_after(RETRY_AFTER_UNAVAILABLE_S))
    return api.history


@contextmanager
def _ledger(api: Api) -> Iterator[None]:
    """The ledger unreachable: 503 ledger.unavailable (imports are not affected)."""
    try:
        yield
    except api.ledger_errors:
        raise ApiError("ledger.unavailable", retry_after(RETRY_AFTER_UNAVAILABLE_S)) from None


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _instant(req: Request, name: str, errors: dict[str, list[str]]) -> int | None:
    """?from=, ?to=, ?asOf=: an RFC 3339 date-time (no zone: UTC) as epoch ms."""
    text = req.query.get(name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        errors[name] = ["Must be an RFC 3339 date-time, e.g. 2026-12-01T00:00:00Z."]
        return None


def _limit(req: Request, errors: dict[str, list[str]]) -> int:
    text = req.query.get("limit")
    if text is None:
        return DEFAULT_LIMIT
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        errors["limit"] = [f"Must be a whole number from 1 to {MAX_LIMIT}."]
        return DEFAULT_LIMIT
    return int(text)


def encode_position(position: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(["v1", *position], separators=(",", ":")).encode()).decode().rstrip("=")


def decode_position(req: Request, errors: dict[str, list[str]], shape: tuple[type, ...]) -> list[Any] | None:
    text = req.query.get("cursor")
    if not text:
        return None
    try:
        raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if (isinstance(raw, list) and len(raw) == len(shape) + 1 and raw[0] == "v1"
                and all(type(v) is t for v, t in zip(raw[1:], shape))):
            return raw[1:]
    except (binascii.Error, ValueError, UnicodeDecodeError):
        pass
    errors["cursor"] = ["Not a cursor from a previous page's nextCursor."]
    return None


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
    limit = _limit(req, errors)
    from_ms, to_ms = _instant(req, "from", errors), _instant(req, "to", errors)
    after = decode_position(req, errors, (int, str, str))
    if errors:
        raise _invalid(req, errors)
    locations = _locations(api, req)
    history = _history(api)
    items: list[Any] = []
    if locations != frozenset():
        with _ledger(api):
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
        "nextCursor": encode_position([items[-1].applied_at_ms, items[-1].location, items[-1].batch_id]) if more else None,
    }
    return json_response(200, _SHIPMENTS.dump(payload), (("Cache-Control", "no-store"),))


def _movement(m: LedgerMovement) -> dict[str, Any]:
    return {
        "location": m.location, "batchId": m.batch_id, "line": m.line, "sku": m.sku, "before": m.before,
        "quantity": m.quantity, "after": m.after, "appliedAt": _time(m.applied_at_ms), "owner": m.owner,
    }


class MovementsCsv:
    """The whole result as CSV, streamed from a server-side cursor."""

    def __init__(self, rows: Iterator[LedgerMovement]) -> None:
        self.rows = rows

    def __iter__(self) -> Iterator[bytes]:
        yield CSV_HEADER
        lines: list[str] = []
        for m in self.rows:
            # SKUs, batchIds, locations and owners hold no comma, quote or newline (their patterns).
            lines.append(f"{m.location},{m.batch_id},{m.line},{m.sku},{m.before},{m.quantity},{m.after},"
                         f"{_time(m.applied_at_ms).isoformat()},{m.owner}\n")
            if len(lines) == 1000:
                yield "".join(lines).encode()
                lines = []
        if lines:
            yield "".join(lines).encode()

    def close(self) -> None:
        close = getattr(self.rows, "close", None)
        if close is not None:
            close()


def list_movements(api: Api, req: Request) -> Response:
    """GET /api/stock-movements: movements newest first; every owner's with stock:read, else the caller's."""
    errors: dict[str, list[str]] = {}
    accept = (req.headers.get("accept") or "").lower()
    as_csv = "text/csv" in accept
    limit = _limit(req, errors)
    from_ms, to_ms = _instant(req, "from", errors), _instant(req, "to", errors)
    after = decode_position(req, errors, (int, str, str, int))
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
        rows: Iterator[LedgerMovement] = iter(()) if locations == frozenset() else history.list_movements(where, limit=None, after=None)
        with _ledger(api):
            first = next(rows, None)  # an unreachable ledger answers 503 before the 200 is sent
        stream = MovementsCsv(_chain(first, rows))
        headers = (("Content-Type", "text/csv; charset=utf-8"), ("Vary", "Accept"), ("Cache-Control", "no-store"))
        return Response(200, b"", headers, stream=stream, download=True)
    items: list[LedgerMovement] = []
    if locations != frozenset():
        with _ledger(api):
            items = list(history.list_movements(where, limit=limit + 1, after=tuple(after) if after else None))
    more = len(items) > limit
    items = items[:limit]
    payload = {
        "items": [_movement(m) for m in items],
        "nextCursor": encode_position(_key(items[-1])) if more else None,
    }
    return json_response(200, _MOVEMENTS.dump(payload), (("Cache-Control", "no-store"), ("Vary", "Accept")))


def _key(m: LedgerMovement) -> Position:
    return (m.applied_at_ms, m.location, m.batch_id, m.line)


def _chain(first: LedgerMovement | None, rest: Iterator[LedgerMovement]) -> Iterator[LedgerMovement]:
    if first is not None:
        yield first
        yield from rest


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
    limit = _limit(req, errors)
    as_of = _instant(req, "asOf", errors)
    cursor = decode_position(req, errors, (int,) if as_of is None else (str,))
    if errors:
        raise _invalid(req, errors)
    if as_of is None:
        levels, next_cursor = api.store.stock_now(location, limit=limit, cursor=cursor[0] if cursor else 0)
        nxt = encode_position([next_cursor]) if next_cursor else None
    else:
        history = _history(api)
        with _ledger(api):
            levels = history.stock_as_of(location, as_of, limit=limit + 1, after_sku=cursor[0] if cursor else None)
        nxt = encode_position([levels[limit - 1][0]]) if len(levels) > limit else None
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
    as_of = _instant(req, "asOf", errors)
    if not is_valid_sku(sku):
        errors["sku"] = ["Must be a SKU: 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit."]
    if errors:
        raise _invalid(req, errors)
    if as_of is None:
        units = api.store.sku_now(location, sku)
    else:
        history = _history(api)
        with _ledger(api):
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
_FROM = {"name": "from", "in": "query", "required": False, "description": "Applied at or after this time (RFC 3339).",
         "schema": {"type": "string", "format": "date-time"}}
_TO = {"name": "to", "in": "query", "required": False, "description": "Applied before this time (RFC 3339).",
       "schema": {"type": "string", "format": "date-time"}}
_AS_OF = {"name": "asOf", "in": "query", "required": False,
          "description": "The stock after every shipment applied before this time (RFC 3339); default: now.",
          "schema": {"type": "string", "format": "date-time"}}
_LIMIT = {"name": "limit", "in": "query", "required": False, "description": "Items per page (default 50).",
          "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}}
_CURSOR = {"name": "cursor", "in": "query", "required": False,
           "description": "The nextCursor of the previous page (opaque).", "schema": {"type": "string"}}

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
