"""Property tests of the pure core: the validator never raises, the hash is
order-independent, and the apply rule keeps its invariants."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from importer.domain.errors import EXPLANATIONS, CsvInvalid
from importer.domain.shipment import (
    MAX_ISSUES,
    MAX_QUANTITY,
    SKU_PATTERN,
    Row,
    Shipment,
    parse_shipment,
)
from importer.domain.stock import MAX_STOCK, StockState, apply_shipment

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SKU_RE = re.compile(SKU_PATTERN)
BOM = "\ufeff"

ALNUM = string.ascii_letters + string.digits
skus = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(ALNUM),
    st.text(alphabet=ALNUM + "._-", max_size=63),
)
quantities = st.integers(min_value=1, max_value=MAX_QUANTITY)
valid_rows = st.dictionaries(skus, quantities, min_size=1, max_size=30).map(
    lambda d: [Row(s, q) for s, q in d.items()]
)

CSVISH = st.sampled_from(
    [",", ",", '"', "\n", "\n", "\r", "\r\n", BOM, " ", "\t", "0", "1", "5", "9", "0000000", "1000001",
     "a", "Z", "-", ".", "_", "+", "é", "\x00", "\u00a0", "sku", "quantity", "SKU", "A-1", "B.2"]
)
csvish_text = st.lists(CSVISH, max_size=120).map("".join)


def check_result(result: Shipment | CsvInvalid, max_rows: int | None = None) -> None:
    """What must hold for any result, whatever the input."""
    if isinstance(result, Shipment):
        assert result.row_count >= 1
        if max_rows is not None:
            assert result.row_count <= max_rows
        assert len({r.sku for r in result.rows}) == result.row_count
        for row in result.rows:
            assert SKU_RE.fullmatch(row.sku), row
            assert type(row.quantity) is int and 1 <= row.quantity <= MAX_QUANTITY, row
        assert re.fullmatch(r"[0-9a-f]{64}", result.content_sha256)
    else:
        assert isinstance(result, CsvInvalid)
        assert 1 <= len(result.issues) <= MAX_ISSUES
        assert result.code == result.issues[0].code
        assert isinstance(result.truncated, bool)
        for issue in result.issues:
            assert issue.code in EXPLANATIONS and issue.code.startswith("csv.")
            assert issue.line >= 1
            assert issue.column in (None, 1, 2)


# --------------------------------------------------------------------------
# The validator never raises


@SETTINGS
@given(st.binary(max_size=1500))
def test_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    check_result(parse_shipment(data))


@SETTINGS
@given(st.sampled_from([b"", b"sku,quantity\n", b"\xef\xbb\xbfsku,quantity\r\n"]), st.binary(max_size=800))
def test_never_raises_on_bytes_after_a_header(prefix: bytes, data: bytes) -> None:
    check_result(parse_shipment(prefix + data))


@SETTINGS
@given(st.sampled_from(["", "sku,quantity\n", BOM + "SKU,Quantity\r\n", '"sku","quantity"\n']), csvish_text,
       st.integers(min_value=0, max_value=5) | st.none())
def test_never_raises_on_csvish_text(prefix: str, text: str, max_rows: int | None) -> None:
    data = (prefix + text).encode("utf-8")
    if max_rows is None:
        result = parse_shipment(data)
        check_result(result)
    else:
        result = parse_shipment(data, max_rows=max_rows)
        check_result(result, max_rows)
    event(result.code if isinstance(result, CsvInvalid) else "valid")


FIELD_CHARS = "aZ09-._ \t\"+é,\r"
fields = st.text(alphabet=FIELD_CHARS, max_size=6) | st.sampled_from(["A-1", "b.2", "7", " 7 ", '"C"', '"5"', "0"])
csvish_rows = st.lists(
    st.tuples(fields, fields, st.sampled_from(["\n", "\r\n", "\n\n", "\r"])),
    max_size=15,
).map(lambda rows: "".join(f"{a},{b}{end}" for a, b, end in rows))


@SETTINGS
@given(st.sampled_from(["sku,quantity\n", BOM + "Sku , Quantity\r\n", "\n\"sku\",quantity\n"]), csvish_rows)
def test_never_raises_on_csvish_rows(header: str, body: str) -> None:
    result = parse_shipment((header + body).encode("utf-8"))
    check_result(result)
    event(result.code if isinstance(result, CsvInvalid) else "valid")


@SETTINGS
@given(st.text(max_size=300))
def test_never_raises_on_any_unicode_after_a_header(text: str) -> None:
    check_result(parse_shipment(("sku,quantity\n" + text).encode("utf-8", "surrogatepass")))


# --------------------------------------------------------------------------
# Valid shipments: rendering variants parse back to the same rows and hash


def render(rows: list[Row], *, newline: str = "\n", bom: bool = False, quote: bool = False) -> bytes:
    q = '"' if quote else ""
    lines = [f"{q}sku{q},{q}quantity{q}"] + [f"{q}{r.sku}{q},{q}{r.quantity}{q}" for r in rows]
    return ((BOM if bom else "") + newline.join(lines) + newline).encode()


@SETTINGS
@given(valid_rows, st.data())
def test_valid_rows_round_trip_and_permutations_keep_the_hash(rows: list[Row], data: st.DataObject) -> None:
    reference = parse_shipment(render(rows))
    assert isinstance(reference, Shipment)
    assert list(reference.rows) == rows

    permuted = data.draw(st.permutations(rows))
    variant = parse_shipment(
        render(
            permuted,
            newline=data.draw(st.sampled_from(["\n", "\r\n"])),
            bom=data.draw(st.booleans()),
            quote=data.draw(st.booleans()),
        )
    )
    assert isinstance(variant, Shipment)
    assert list(variant.rows) == permuted
    assert variant.content_sha256 == reference.content_sha256


@SETTINGS
@given(valid_rows, st.data())
def test_changing_one_quantity_changes_the_hash(rows: list[Row], data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
    new_quantity = data.draw(quantities.filter(lambda q: q != rows[index].quantity))
    changed = list(rows)
    changed[index] = Row(rows[index].sku, new_quantity)
    assert Shipment(tuple(changed)).content_sha256 != Shipment(tuple(rows)).content_sha256


@SETTINGS
@given(valid_rows, st.booleans(), st.data())
def test_not_utf8_line_is_the_line_of_the_bad_byte(rows: list[Row], bom: bool, data: st.DataObject) -> None:
    good = render(rows, newline=data.draw(st.sampled_from(["\n", "\r\n"])), bom=bom)
    start = 3 if bom else 0
    position = data.draw(st.integers(min_value=start, max_value=len(good)))
    bad = good[:position] + data.draw(st.sampled_from([b"\xff", b"\xfe", b"\x80", b"\xc3("])) + good[position:]
    result = parse_shipment(bad)
    assert isinstance(result, CsvInvalid)
    (issue,) = result.issues
    assert (issue.code, issue.column) == ("csv.not_utf8", None)
    assert issue.line == bad.count(b"\n", 0, position) + 1


# --------------------------------------------------------------------------
# The apply rule keeps its invariants over random sequences

POOL_SKUS = ["A", "B", "C", "D"]
near_max_quantity = st.integers(min_value=1, max_value=10) | st.integers(min_value=MAX_QUANTITY - 10, max_value=MAX_QUANTITY)
pool_shipments = st.lists(
    st.dictionaries(st.sampled_from(POOL_SKUS), near_max_quantity, min_size=1, max_size=4).map(
        lambda d: Shipment(tuple(Row(s, q) for s, q in d.items()))
    ),
    min_size=1,
    max_size=4,
)
initial_stock = st.dictionaries(
    st.sampled_from(POOL_SKUS),
    st.integers(min_value=0, max_value=100) | st.integers(min_value=MAX_STOCK - 3 * MAX_QUANTITY, max_value=MAX_STOCK),
)
operations = st.lists(
    st.tuples(st.sampled_from(["b0", "b1", "b2", "b3"]), st.integers(min_value=0, max_value=3)),
    min_size=1,
    max_size=25,
)


@SETTINGS
@given(initial_stock, pool_shipments, operations)
def test_apply_sequence_keeps_invariants(
    initial: dict[str, int], pool: list[Shipment], ops: list[tuple[str, int]]
) -> None:
    initial_copy = dict(initial)
    state = StockState(stock=initial)
    applied: dict[str, Shipment] = {}  # batch id -> shipment that was applied under it
    order: list[str] = []

    for now_ms, (batch_id, pick) in enumerate(ops):
        shipment = pool[pick % len(pool)]
        before = state
        state, outcome = apply_shipment(state, batch_id, shipment, owner="w", job_id=f"shipment-{batch_id}", now_ms=now_ms)
        event(outcome.kind)

        if batch_id in applied:
            if applied[batch_id].content_sha256 == shipment.content_sha256:
                assert outcome.kind == "replayed"
                assert outcome.result is not None and outcome.result.replay is True
                assert outcome.result.imported == applied[batch_id].row_count
                assert outcome.result.to_dict()["replay"] is True
            else:
                assert outcome.kind == "conflict" and outcome.result is None
            assert state is before
        elif any(before.stock.get(r.sku, 0) + r.quantity > MAX_STOCK for r in shipment.rows):
            assert outcome.kind == "overflow"
            assert outcome.overflow_sku in {r.sku for r in shipment.rows}
            assert before.stock.get(outcome.overflow_sku, 0) + dict(
                (r.sku, r.quantity) for r in shipment.rows
            )[outcome.overflow_sku] > MAX_STOCK
            assert state is before
        else:
            assert outcome.kind == "applied"
            assert outcome.result is not None and outcome.result.replay is False
            assert outcome.result.imported == shipment.row_count
            applied[batch_id] = shipment
            order.append(batch_id)

        # Invariants after every step.
        for sku in set(POOL_SKUS) | set(state.stock):
            expected = initial.get(sku, 0) + sum(
                r.quantity for s in applied.values() for r in s.rows if r.sku == sku
            )
            assert state.stock.get(sku, 0) == expected, sku
            assert state.stock.get(sku, 0) <= MAX_STOCK
        assert state.generation == len(applied)
        assert state.journal == tuple(order)
        assert set(state.done) == set(applied)
        for batch, marker in state.done.items():
            assert marker.content_sha256 == applied[batch].content_sha256
            assert marker.result.replay is False

    # The dict of the first state was never mutated (every step copies).
    assert initial == initial_copy


# -- content_key: the plain-form fast path agrees with the full parse ----------------


def _full_parse_key(data: bytes, max_rows: int) -> str:
    import hashlib

    parsed = parse_shipment(data, max_rows=max_rows)
    if isinstance(parsed, CsvInvalid):
        return "bytes:" + hashlib.sha256(data).hexdigest()
    return parsed.content_sha256


PLAINISH = st.sampled_from(
    ["sku,quantity\n", "sku,quantity\r\n", ",", "\n", "\n", "\r\n", "\r", "A", "b", "A-1", "B.2", "_", "0", "1",
     "7", "1000000", "999999", "1000001", "0007", " ", '"', BOM, "é", "SKU,QUANTITY\n"]
)


@SETTINGS
@given(st.lists(PLAINISH, max_size=60).map("".join), st.integers(min_value=1, max_value=8))
def test_content_key_equals_the_full_parse_on_any_input(text: str, max_rows: int) -> None:
    from importer.domain.shipment import content_key

    data = text.encode()
    assert content_key(data, max_rows) == _full_parse_key(data, max_rows)


@SETTINGS
@given(valid_rows, st.randoms(use_true_random=False), st.sampled_from(["\n", "\r\n"]), st.booleans(), st.booleans())
def test_content_key_of_valid_files_in_any_order_is_the_canonical_hash(
    rows: list[Row], rnd: object, eol: str, bom: bool, final_eol: bool
) -> None:
    from importer.domain.shipment import _plain_content_sha256, content_key, content_sha256

    shuffled = list(rows)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    text = ("\ufeff" if bom else "") + "sku,quantity" + eol + eol.join(f"{r.sku},{r.quantity}" for r in shuffled)
    data = (text + (eol if final_eol else "")).encode()
    assert content_key(data, 100) == content_sha256(rows)
    assert _plain_content_sha256(data, 100) == content_sha256(rows)  # without the full parse


@SETTINGS
@given(st.lists(PLAINISH, max_size=60).map("".join), st.integers(min_value=1, max_value=8))
def test_the_plain_parse_equals_the_full_parse_on_any_input(text: str, max_rows: int) -> None:
    """parse_shipment's fast path for small plain files (_plain_rows) reads
    exactly the rows the line-by-line parse reads, and takes no file that
    parse would turn down."""
    from importer.domain import shipment

    data = text.encode()
    plain = shipment._plain_rows(data, max_rows)
    if plain is None:
        return
    event("plain path taken")
    full = shipment._parse_lines(data, max_rows)
    assert isinstance(full, shipment.Shipment), full
    assert full.rows == plain


@SETTINGS
@given(valid_rows)
def test_valid_plain_files_take_the_plain_parse(rows: list[Row]) -> None:
    from importer.domain import shipment

    data = ("sku,quantity\n" + "".join(f"{r.sku},{r.quantity}\n" for r in rows)).encode()
    if len(data) <= shipment._PLAIN_PARSE_MAX_BYTES:
        assert shipment._plain_rows(data, 100_000) == tuple(rows)
    assert parse_shipment(data) == shipment._parse_lines(data, 100_000) == shipment.Shipment(tuple(rows))


@pytest.mark.parametrize("data, max_rows", [
    (b"sku,quantity\nA,1\nB,2\nA,3\n", 10),  # a duplicate SKU
    (b"sku,quantity\n", 10),  # no rows
    (b"sku,quantity\nA,01\n", 10),  # a leading zero
    (b"sku,quantity\nA,1000001\n", 10),  # above the maximum
    (b"sku,quantity\nA,1\nB,2\nC,3\n", 2),  # more rows than allowed
    (b"sku,quantity\nA,1", 10),  # no final newline (plain for the full parse, not for the fast path)
    (b"sku,quantity\r\nA,1\r\n", 10),
    (b"\xef\xbb\xbfsku,quantity\nA,1\n", 10),
    (b"sku,quantity\n\nA,1\n", 10),
    (b'sku,quantity\n"A",1\n', 10),
])
def test_the_plain_parse_leaves_every_other_shape_to_the_full_parse(data: bytes, max_rows: int) -> None:
    from importer.domain import shipment

    assert shipment._plain_rows(data, max_rows) is None
    got, full = parse_shipment(data, max_rows=max_rows), shipment._parse_lines(data, max_rows)
    if isinstance(full, CsvInvalid):
        assert isinstance(got, CsvInvalid) and (got.issues, got.found) == (full.issues, full.found)
    else:
        assert got == full
