"""Query parameters, parsed once and strictly, for every route.

Every value a client puts in a query string is checked here before it
reaches Redis or PostgreSQL; a bad one is a ``422 request.invalid`` whose
``fields`` name the parameter, never a ``500`` from a driver:

* whole numbers (``limit``): ASCII digits only (``str.isdigit()`` also takes
  ``²`` and ``١٠``), at most :data:`MAX_DIGITS` of them, within the route's bounds;
* instants (``from``, ``to``, ``asOf``): RFC 3339 date-times with a ``Z`` or
  ``±hh:mm`` offset (section 5.6: ``2026-12-01T00:00:00Z``, ``...T01:00:00.5+01:00``),
  from :data:`EARLIEST` to :data:`LATEST`; no other ISO 8601 form (``2026-12-01``,
  ``2026-W49-1``, ``20261201T000000Z``), no leap second;
* cursors: the ``nextCursor`` of an earlier page, at most :data:`MAX_CURSOR_CHARS`
  characters of URL-safe base64 around a flat JSON array ``["v1", ...]``, each
  field checked for its type, range and characters by a :class:`Field`.

The OpenAPI parameters below (:data:`LIMIT_SCHEMA`, :func:`instant_parameter`,
:data:`CURSOR_PARAMETER`) say the same to clients.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from importer.domain.ledger import is_valid_sku
from importer.domain.locations import is_valid_location
from importer.domain.shipment import batch_id_of, is_valid_batch_id

#: Digits a whole number of a query (or a header such as Content-Length) may have.
MAX_DIGITS = 18
#: The characters of a cursor, at most; every cursor this API hands out is far shorter.
MAX_CURSOR_CHARS = 512
#: The instants a query may name: from the Unix epoch (no shipment is older) to
#: the last day of year 9999 in every offset, so every one can be echoed back.
EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999000, tzinfo=timezone.utc)

_EPOCH = EARLIEST
_ASCII_DIGITS = re.compile(r"[0-9]{1,%d}" % MAX_DIGITS)
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_BASE64URL = re.compile(r"[A-Za-z0-9_-]{1,%d}" % MAX_CURSOR_CHARS)
_STREAM_ID = re.compile(r"[0-9]{1,15}-[0-9]{1,15}")
INSTANT_RULE = "Must be an RFC 3339 date-time with an offset, e.g. 2026-12-01T00:00:00Z, from 1970-01-01 to 9999-12-30."
CURSOR_RULE = "Not a cursor from a previous page's nextCursor."

Errors = dict[str, list[str]]


def whole_number(text: str | None) -> int | None:
    """``text`` as a whole number when it is 1 to :data:`MAX_DIGITS` ASCII digits, else None."""
    if text is None or _ASCII_DIGITS.fullmatch(text) is None:
        return None
    return int(text)


def limit(query: Mapping[str, str], errors: Errors, *, default: int, most: int, name: str = "limit") -> int:
    """``?limit=``: 1 to ``most`` (``default`` when absent)."""
    text = query.get(name)
    if text is None:
        return default
    value = whole_number(text)
    if value is None or not 1 <= value <= most:
        errors[name] = [f"Must be a whole number from 1 to {most}."]
        return default
    return value


def parse_instant(text: str) -> int | None:
    """An RFC 3339 date-time with an offset as epoch milliseconds, or None when it is not one
    or lies outside :data:`EARLIEST`..:data:`LATEST`."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    try:
        offset = timedelta(0) if zulu else (1 if sign == "+" else -1) * timedelta(hours=int(off_h), minutes=int(off_m))
        if abs(offset) >= timedelta(hours=24) or (not zulu and int(off_m) > 59):
            return None
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                         int((fraction or "0").ljust(6, "0")[:6]), tzinfo=timezone(offset))
    except ValueError:
        return None
    # Subtraction, not astimezone(): an instant near year 1 or 9999 in a far offset stays a timedelta.
    since_epoch = local - _EPOCH
    if not EARLIEST - _EPOCH <= since_epoch <= LATEST - _EPOCH:
        return None
    return since_epoch // timedelta(milliseconds=1)


def instant(query: Mapping[str, str], name: str, errors: Errors) -> int | None:
    """``?from=``, ``?to=``, ``?asOf=`` as epoch milliseconds (None when absent)."""
    text = query.get(name)
    if text is None:
        return None
    ms = parse_instant(text)
    if ms is None:
        errors[name] = [INSTANT_RULE]
    return ms


@dataclass(frozen=True)
class Field:
    """One field of a cursor: its JSON type and what it may hold."""

    kind: type
    valid: Callable[[Any], bool]


def _whole(most: int) -> Field:
    return Field(int, lambda v: 0 <= v <= most)


#: Epoch milliseconds (appliedAt, createdAt, a failure's time): JSON's safe integers.
MILLIS = _whole(2**53 - 1)
#: A line of a shipment.
LINE = _whole(2**31 - 1)
#: A Redis SCAN cursor: what HSCAN answered, below 2^63.
SCAN = _whole(2**63 - 1)
LOCATION = Field(str, is_valid_location)
BATCH_ID = Field(str, is_valid_batch_id)
SKU = Field(str, is_valid_sku)
JOB_ID = Field(str, lambda v: batch_id_of(v) is not None)
STREAM_ID = Field(str, lambda v: _STREAM_ID.fullmatch(v) is not None)


def encode_cursor(position: Sequence[Any]) -> str:
    """The ``nextCursor`` of a page that ends at ``position``."""
    text = json.dumps(["v1", *position], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(text: str, shape: Sequence[Field]) -> list[Any] | None:
    """The position a cursor names when every field fits ``shape``, else None."""
    if _BASE64URL.fullmatch(text) is None:
        return None
    try:
        raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not (isinstance(raw, list) and len(raw) == len(shape) + 1 and raw[0] == "v1"):
        return None
    fields = raw[1:]
    if all(type(value) is field.kind and field.valid(value) for value, field in zip(fields, shape)):
        return fields
    return None


def cursor(query: Mapping[str, str], errors: Errors, shape: Sequence[Field], name: str = "cursor") -> list[Any] | None:
    """``?cursor=`` decoded to a position of ``shape`` (None when absent or empty)."""
    text = query.get(name)
    if not text:
        return None
    position = decode_cursor(text, shape)
    if position is None:
        errors[name] = [CURSOR_RULE]
    return position


# -- the same rules, as OpenAPI parameters ---------------------------------------

def limit_parameter(default: int, most: int) -> dict[str, Any]:
    return {"name": "limit", "in": "query", "required": False, "description": f"Items per page (default {default}).",
            "schema": {"type": "integer", "minimum": 1, "maximum": most, "default": default}}


def instant_parameter(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": f"{description} {INSTANT_RULE}",
            "schema": {"type": "string", "format": "date-time", "pattern": f"^{_RFC3339.pattern}$"}}


CURSOR_PARAMETER: dict[str, Any] = {
    "name": "cursor", "in": "query", "required": False,
    "description": "The nextCursor of the previous page (opaque).",
    "schema": {"type": "string", "pattern": f"^[A-Za-z0-9_-]{{0,{MAX_CURSOR_CHARS}}}$"},
}
