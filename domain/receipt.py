"""The receipt of an applied shipment: what it changed, SKU by SKU.

When a shipment is applied, the apply script (adapters/lua/apply.lua) writes,
in the same atomic step as the stock change, one line per row of the
shipment, in the file's row order (``\\n`` is the line feed)::

    sku,before,quantity\\n

``before`` is the SKU's units on hand just before this shipment (the stock
hash's value as Redis returned it, ``0`` for a new SKU) and ``quantity`` the
row's quantity, so the stock just after is ``before + quantity``. (The
script keeps both as the strings it already has: formatting numbers in Lua
would add about half again to the time the apply script blocks Redis; see
bench/receipt_cost.py.) These stored bytes are the receipt: written once
with the done marker, kept forever like it, never recomputed. A replay of
the batch answers the same bytes, and every rendering of them (JSON, CSV;
handlers/receipts.py) is a pure function of them and of the done marker, so
two reads are byte-identical.

This module is the one definition of that stored form; domain/stock.py's
apply rule produces the lines the script must produce (a property test runs
both on the same sequences).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from importer.domain.jobs import ShipmentRecord


@dataclass(frozen=True, slots=True)
class ReceiptLine:
    """One row of a receipt: the SKU's stock just before and just after the shipment."""

    sku: str
    before: int
    after: int


#: One stored line, ``sku,before,quantity\n`` (SKUs are validated by
#: domain/shipment.py: no comma, quote or newline; stock stays below 10^16).
STORED_LINE = re.compile(rb"([A-Za-z0-9][A-Za-z0-9._-]{0,63}),(0|[1-9][0-9]{0,15}),([1-9][0-9]{0,15})\n")


def encode_receipt(lines: Iterable[ReceiptLine]) -> bytes:
    """The stored form of a receipt (what apply.lua writes)."""
    return "".join(f"{line.sku},{line.before},{line.after - line.before}\n" for line in lines).encode()


_STORED_LINES = re.compile(rb"(?:" + STORED_LINE.pattern + rb")*")


def stored_lines(data: bytes) -> list[tuple[bytes, int, int]]:
    """(sku, before, after) of each stored line of whole lines; ValueError on anything else."""
    if _STORED_LINES.fullmatch(data) is None:
        raise ValueError("not a stored receipt: a line is not 'sku,before,quantity'")
    return [(sku, before, before + int(quantity)) for sku, before_text, quantity in STORED_LINE.findall(data)
            for before in (int(before_text),)]


def decode_receipt(data: bytes) -> tuple[ReceiptLine, ...]:
    """The lines of a stored receipt (whole lines only; raises ValueError on anything else)."""
    return tuple(ReceiptLine(sku.decode(), before, after) for sku, before, after in stored_lines(data))


def whole_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Re-cut a stored receipt read in arbitrary pieces into pieces of whole lines.

    Each piece yielded ends with a newline; a receipt that does not end with
    one (never written by apply.lua) raises ValueError at its end."""
    rest = b""
    for chunk in chunks:
        data = rest + chunk if rest else chunk
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            yield data[:cut]
    if rest:
        raise ValueError("the stored receipt ends inside a line")


@dataclass(frozen=True)
class StoredReceipt:
    """A receipt as read for its owner: the done marker it belongs to, its
    size in bytes (0: the batch was applied before receipts were recorded),
    and its first bytes (the whole of it when ``len(head) == size``)."""

    shipment: ShipmentRecord
    size: int
    head: bytes
