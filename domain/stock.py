"""The apply rule: how a shipment changes stock, as a pure function.

This is the reference the Redis Lua script (adapters/lua/apply.lua) must
agree with; a property test runs both on the same sequences.

Rule (README, "Exactly once"):
1. If the batch was applied before (a done marker exists): same content hash
   -> a replay that returns the stored result and changes nothing; another
   hash -> a conflict that changes nothing.
2. Otherwise check every row first: no SKU may go above MAX_STOCK.
3. Then add every quantity, bump the generation, write the done marker and
   its receipt (every row's stock before and after, domain/receipt.py) and
   append to the journal. All rows or none. A replay returns the stored
   receipt of the original application, never a recomputed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from importer.domain.receipt import ReceiptLine
from importer.domain.shipment import Shipment

#: Upper bound of units per SKU. Far below 2**53 so that Lua's double
#: arithmetic in the Redis script stays exact.
MAX_STOCK = 10**15


@dataclass(frozen=True)
class ImportResult:
    imported: int
    batch_id: str
    replay: bool = False

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"imported": self.imported, "batchId": self.batch_id}
        if self.replay:
            out["replay"] = True
        return out


@dataclass(frozen=True)
class DoneMarker:
    """The durable record that a batch was applied. Never removed by retention."""

    batch_id: str
    content_sha256: str
    result: ImportResult
    owner: str
    applied_at_ms: int
    job_id: str
    #: What the application changed, in the file's row order (kept with the marker, forever).
    receipt: tuple[ReceiptLine, ...] = ()


@dataclass(frozen=True)
class StockState:
    stock: dict[str, int] = field(default_factory=dict)
    generation: int = 0
    done: dict[str, DoneMarker] = field(default_factory=dict)
    journal: tuple[str, ...] = ()


Outcome = Literal["applied", "replayed", "conflict", "overflow"]


@dataclass(frozen=True)
class ApplyOutcome:
    kind: Outcome
    result: ImportResult | None = None
    overflow_sku: str | None = None
    #: applied: what this application changed; replayed: the original application's receipt.
    receipt: tuple[ReceiptLine, ...] | None = None


def apply_shipment(
    state: StockState,
    batch_id: str,
    shipment: Shipment,
    *,
    owner: str,
    job_id: str,
    now_ms: int,
) -> tuple[StockState, ApplyOutcome]:
    """Apply a shipment to an in-memory state. Returns the new state and what happened."""
    sha = shipment.content_sha256
    marker = state.done.get(batch_id)
    if marker is not None:
        if marker.content_sha256 != sha:
            return state, ApplyOutcome("conflict")
        return state, ApplyOutcome("replayed", replace(marker.result, replay=True), receipt=marker.receipt)

    for row in shipment.rows:
        if state.stock.get(row.sku, 0) + row.quantity > MAX_STOCK:
            return state, ApplyOutcome("overflow", overflow_sku=row.sku)

    stock = dict(state.stock)
    receipt = []
    for row in shipment.rows:
        before = stock.get(row.sku, 0)
        stock[row.sku] = before + row.quantity
        receipt.append(ReceiptLine(row.sku, before, before + row.quantity))
    result = ImportResult(imported=shipment.row_count, batch_id=batch_id)
    done = dict(state.done)
    done[batch_id] = DoneMarker(batch_id, sha, result, owner, now_ms, job_id, tuple(receipt))
    new_state = StockState(stock, state.generation + 1, done, state.journal + (batch_id,))
    return new_state, ApplyOutcome("applied", result, receipt=tuple(receipt))
