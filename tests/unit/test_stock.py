"""The pure apply rule (domain/stock.py)."""

from __future__ import annotations

import pytest

from importer.domain.receipt import ReceiptLine, decode_receipt, encode_receipt
from importer.domain.shipment import Row, Shipment, parse_shipment
from importer.domain.stock import MAX_STOCK, ApplyOutcome, DoneMarker, ImportResult, StockState, apply_shipment


def shipment(text: str) -> Shipment:
    result = parse_shipment(text.encode())
    assert isinstance(result, Shipment), result
    return result


A = shipment("sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\n")
A_REORDERED = shipment('sku,quantity\r\n"SPROCKET-07",5\r\nGADGET-BLU-02,25\r\nWIDGET-RED-01,10\r\n')
B = shipment("sku,quantity\nWIDGET-RED-01,1\nNEW-SKU-9,4\n")
A_OTHER = shipment("sku,quantity\nWIDGET-RED-01,11\nGADGET-BLU-02,25\nSPROCKET-07,5\n")


def apply(state: StockState, batch_id: str, s: Shipment, now_ms: int = 1_000) -> tuple[StockState, ApplyOutcome]:
    return apply_shipment(state, batch_id, s, owner="worker-1", job_id=f"shipment-{batch_id}", now_ms=now_ms)


def test_applied_on_empty_state() -> None:
    empty = StockState()
    state, outcome = apply(empty, "batch-a", A, now_ms=42)
    receipt = (ReceiptLine("WIDGET-RED-01", 0, 10), ReceiptLine("GADGET-BLU-02", 0, 25), ReceiptLine("SPROCKET-07", 0, 5))
    assert outcome == ApplyOutcome("applied", ImportResult(imported=3, batch_id="batch-a"), receipt=receipt)
    assert state.stock == {"WIDGET-RED-01": 10, "GADGET-BLU-02": 25, "SPROCKET-07": 5}
    assert state.generation == 1
    assert state.journal == ("batch-a",)
    assert state.done == {
        "batch-a": DoneMarker(
            "batch-a", A.content_sha256, ImportResult(3, "batch-a"), "worker-1", 42, "shipment-batch-a", receipt
        )
    }
    # The input state is never mutated.
    assert empty == StockState()


def test_second_batch_adds_and_bumps_generation() -> None:
    state, _ = apply(StockState(), "batch-a", A)
    state, outcome = apply(state, "batch-b", B)
    assert outcome.kind == "applied"
    assert outcome.result == ImportResult(2, "batch-b")
    assert state.stock == {"WIDGET-RED-01": 11, "GADGET-BLU-02": 25, "SPROCKET-07": 5, "NEW-SKU-9": 4}
    assert state.generation == 2
    assert state.journal == ("batch-a", "batch-b")
    assert set(state.done) == {"batch-a", "batch-b"}
    # Each row's stock just before and just after, in the file's row order.
    assert outcome.receipt == (ReceiptLine("WIDGET-RED-01", 10, 11), ReceiptLine("NEW-SKU-9", 0, 4))


def test_same_content_under_another_batch_id_is_applied_again() -> None:
    state, _ = apply(StockState(), "batch-a", A)
    state, outcome = apply(state, "batch-a2", A)
    assert outcome.kind == "applied"
    assert state.stock["WIDGET-RED-01"] == 20
    assert state.generation == 2


@pytest.mark.parametrize("again", [A, A_REORDERED], ids=["same-bytes", "equivalent-file"])
def test_replay_returns_the_stored_result_and_changes_nothing(again: Shipment) -> None:
    applied, first = apply(StockState(), "batch-a", A, now_ms=1)
    state, outcome = apply(applied, "batch-a", again, now_ms=2)
    assert outcome.kind == "replayed"
    assert outcome.result == ImportResult(imported=3, batch_id="batch-a", replay=True)
    assert first.result is not None and first.result.replay is False
    assert state is applied
    assert state.generation == 1
    assert state.done["batch-a"].applied_at_ms == 1
    assert state.done["batch-a"].result.replay is False
    # The receipt of the original application, not one recomputed from today's stock.
    assert outcome.receipt == first.receipt == state.done["batch-a"].receipt


def test_a_replay_after_later_shipments_returns_the_original_receipt() -> None:
    state, first = apply(StockState(), "batch-a", A)
    state, _ = apply(state, "batch-b", B)
    _, again = apply(state, "batch-a", A_REORDERED)
    assert again.kind == "replayed"
    assert again.receipt == first.receipt
    assert again.receipt is not None and again.receipt[0] == ReceiptLine("WIDGET-RED-01", 0, 10)


def test_conflict_changes_nothing() -> None:
    applied, _ = apply(StockState(), "batch-a", A)
    snapshot = (dict(applied.stock), applied.generation, dict(applied.done), applied.journal)
    state, outcome = apply(applied, "batch-a", A_OTHER)
    assert outcome == ApplyOutcome("conflict")
    assert outcome.result is None
    assert state is applied
    assert (state.stock, state.generation, state.done, state.journal) == snapshot


def test_overflow_changes_nothing_and_applies_no_row() -> None:
    # The first row fits; the second would overflow: neither is applied.
    start = StockState(stock={"A": 5, "B": MAX_STOCK - 3}, generation=7)
    overflowing = Shipment((Row("A", 1), Row("B", 4), Row("C", 1)))
    state, outcome = apply(start, "batch-x", overflowing)
    assert outcome == ApplyOutcome("overflow", overflow_sku="B")
    assert outcome.receipt is None
    assert state is start
    assert state.stock == {"A": 5, "B": MAX_STOCK - 3}
    assert state.generation == 7
    assert state.done == {} and state.journal == ()


def test_overflow_is_not_recorded_so_the_batch_can_be_retried() -> None:
    start = StockState(stock={"B": MAX_STOCK})
    state, outcome = apply(start, "batch-x", Shipment((Row("B", 1),)))
    assert outcome.kind == "overflow"
    state, outcome = apply(state, "batch-x", Shipment((Row("C", 1),)))
    assert outcome.kind == "applied"


def test_exactly_max_stock_is_allowed() -> None:
    start = StockState(stock={"B": MAX_STOCK - 4})
    state, outcome = apply(start, "batch-x", Shipment((Row("B", 4),)))
    assert outcome.kind == "applied"
    assert state.stock["B"] == MAX_STOCK


def test_max_stock_stays_exact_in_double_precision() -> None:
    assert MAX_STOCK + 1_000_000 < 2**53


def test_import_result_to_dict() -> None:
    assert ImportResult(3, "batch-a").to_dict() == {"imported": 3, "batchId": "batch-a"}
    assert "replay" not in ImportResult(3, "batch-a", replay=False).to_dict()
    assert ImportResult(3, "batch-a", replay=True).to_dict() == {"imported": 3, "batchId": "batch-a", "replay": True}


def test_stored_receipt_form_round_trips() -> None:
    lines = (ReceiptLine("WIDGET-RED-01", 0, 10), ReceiptLine("b.2_x-Y", MAX_STOCK - 1, MAX_STOCK))
    data = encode_receipt(lines)
    # sku,before,quantity: what apply.lua has as strings (after = before + quantity).
    assert data == b"WIDGET-RED-01,0,10\nb.2_x-Y,999999999999999,1\n"
    assert decode_receipt(data) == lines
    assert decode_receipt(b"") == ()


@pytest.mark.parametrize("bad", [b"A,1,2", b"A,1,2\nB,1\n", b"-A,1,2\n", b"A,1,2\n\n", b'"A",1,2\n', b"A,1e3,2\n", b"A,01,2\n", b"A,1,0\n"])
def test_anything_else_is_not_a_stored_receipt(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_receipt(bad)
