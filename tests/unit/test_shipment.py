"""CSV validation, the shipment value and its content hash (domain/shipment.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from importer.domain.errors import CsvInvalid, CsvIssue
from importer.domain.shipment import (
    MAX_ISSUES,
    MAX_QUANTITY,
    MAX_VALUE_CHARS,
    Row,
    Shipment,
    content_sha256,
    is_valid_batch_id,
    job_id_for,
    parse_shipment,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BOM = b"\xef\xbb\xbf"

EXPECTED_ROWS = (Row("WIDGET-RED-01", 10), Row("GADGET-BLU-02", 25), Row("SPROCKET-07", 5))


def ok(data: bytes, **kwargs: int) -> Shipment:
    result = parse_shipment(data, **kwargs)
    assert isinstance(result, Shipment), result
    return result


def bad(data: bytes, **kwargs: int) -> CsvInvalid:
    result = parse_shipment(data, **kwargs)
    assert isinstance(result, CsvInvalid), result
    return result


def located(result: CsvInvalid) -> list[tuple[int, int | None, str]]:
    return [(i.line, i.column, i.code) for i in result.issues]


# --------------------------------------------------------------------------
# Accepted variants


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"sku,quantity\nA-1,5\nB-2,7\n", id="plain-lf"),
        pytest.param(b"sku,quantity\nA-1,5\nB-2,7", id="no-trailing-newline"),
        pytest.param(b"sku,quantity\r\nA-1,5\r\nB-2,7\r\n", id="crlf"),
        pytest.param(b"sku,quantity\r\nA-1,5\nB-2,7\r\n", id="mixed-endings"),
        pytest.param(BOM + b"sku,quantity\nA-1,5\nB-2,7\n", id="bom"),
        pytest.param(BOM + b"sku,quantity\r\nA-1,5\r\nB-2,7", id="bom-crlf-no-trailing"),
        pytest.param(b"\n\nsku,quantity\n\nA-1,5\n   \n\r\nB-2,7\n\n\n", id="blank-lines"),
        pytest.param(b'"sku","quantity"\n"A-1","5"\n"B-2",7\n', id="quoted-fields"),
        pytest.param(b'sku,quantity\n" A-1 " , " 5 "\nB-2,7\n', id="quoted-with-spaces"),
        pytest.param(b"SKU,Quantity\nA-1,5\nB-2,7\n", id="header-case"),
        pytest.param(b"  Sku  ,  QUANTITY \nA-1,5\nB-2,7\n", id="header-spaces"),
        pytest.param(b"sku,quantity\n  A-1  ,  5  \nB-2,\t7\t\n", id="trimmed-fields"),
    ],
)
def test_accepted_variants_give_the_same_rows(data: bytes) -> None:
    shipment = ok(data)
    assert shipment.rows == (Row("A-1", 5), Row("B-2", 7))
    assert shipment.row_count == 2


@pytest.mark.parametrize(
    ("text", "quantity"),
    [("1", 1), (str(MAX_QUANTITY), MAX_QUANTITY), (" 7 ", 7), ('"7"', 7), ("0000042", 42)],
)
def test_quantity_accepted(text: str, quantity: int) -> None:
    assert ok(f"sku,quantity\nA,{text}\n".encode()).rows == (Row("A", quantity),)


@pytest.mark.parametrize("sku", ["A", "a", "0", "a.b_c-d", "Z" * 64, "9-._"])
def test_sku_accepted(sku: str) -> None:
    assert ok(f"sku,quantity\n{sku},1\n".encode()).rows == (Row(sku, 1),)


def test_rows_keep_file_order() -> None:
    shipment = ok(b"sku,quantity\nZ,1\nA,2\nM,3\n")
    assert [r.sku for r in shipment.rows] == ["Z", "A", "M"]


def test_sku_is_case_sensitive_for_duplicates() -> None:
    assert ok(b"sku,quantity\nabc,1\nABC,2\n").rows == (Row("abc", 1), Row("ABC", 2))


def test_row_limit_is_inclusive() -> None:
    assert ok(b"sku,quantity\nA,1\nB,1\nC,1\n", max_rows=3).row_count == 3


# --------------------------------------------------------------------------
# Error codes, each with its exact location


@pytest.mark.parametrize(
    ("data", "line"),
    [
        pytest.param(b"\xff", 1, id="first-byte"),
        pytest.param(b"sku,qu\xe9ntity\nA,1\n", 1, id="latin1-header"),
        pytest.param(b"sku,quantity\nA,1\nGADGET-\xff\xfe-02,25\n", 3, id="line-3"),
        pytest.param(b"sku,quantity\r\nA,1\r\nB,2\r\nC\xc3,3\r\n", 4, id="crlf-truncated-sequence"),
        pytest.param(b"sku,quantity\n\n\nA,1\nB\xed\xa0\x80,1\n", 5, id="surrogate-after-blank-lines"),
        pytest.param(BOM + b"sku,quantity\n\xff,1\n", 2, id="bom-line-2"),
        pytest.param(BOM + b"\xff", 1, id="bom-then-bad-byte"),
    ],
)
def test_not_utf8_reports_the_line(data: bytes, line: int) -> None:
    result = bad(data)
    assert located(result) == [(line, None, "csv.not_utf8")]
    assert result.code == "csv.not_utf8"
    assert result.truncated is False


def test_not_utf8_reports_the_byte_offset_in_the_file() -> None:
    data = BOM + b"sku,quantity\n\xff,1\n"
    (issue,) = bad(data).issues
    assert issue.message == "byte 16 is not valid UTF-8"  # counted from the BOM
    (issue,) = bad(data[3:]).issues
    assert issue.message == "byte 13 is not valid UTF-8"


def test_not_utf8_wins_over_other_issues() -> None:
    result = bad(b"product,qty\nA,abc\nB\xff,1\n")
    assert located(result) == [(3, None, "csv.not_utf8")]


@pytest.mark.parametrize("data", [b"", b"\n", b"\r\n\r\n", b"   \n\t\n", BOM, BOM + b"\n\n"])
def test_empty(data: bytes) -> None:
    result = bad(data)
    assert located(result) == [(1, None, "csv.empty")]
    assert result.code == "csv.empty"


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"product,qty\nA,1\n", 1),
        (b"sku\nA\n", 1),
        (b"quantity,sku\n1,A\n", 1),
        (b"sku,quantity,extra\nA,1,x\n", 1),
        (b"sku;quantity\nA;1\n", 1),
        (b"A,1\nB,2\n", 1),
        (b"\n\nproduct,qty\nA,1\n", 3),
        (BOM + BOM + b"sku,quantity\nA,1\n", 1),
    ],
)
def test_bad_header_stops_at_the_header(data: bytes, line: int) -> None:
    result = bad(data)
    # Nothing below a wrong header is checked: exactly one issue.
    assert located(result) == [(line, None, "csv.bad_header")]
    assert result.code == "csv.bad_header"


@pytest.mark.parametrize("data", [b"sku,quantity\n", b"sku,quantity", b"sku,quantity\r\n\r\n\n", BOM + b"SKU,QUANTITY\n"])
def test_no_rows(data: bytes) -> None:
    assert located(bad(data)) == [(1, None, "csv.no_rows")]


@pytest.mark.parametrize("row", [b"A", b"A,1,2", b"A,1,", b",,", b'"A,B",1'])
def test_bad_row(row: bytes) -> None:
    result = bad(b"sku,quantity\nOK-1,1\n" + row + b"\n")
    assert located(result) == [(3, None, "csv.bad_row")]


@pytest.mark.parametrize(
    "sku",
    ["", "-A", ".A", "_A", "A B", "A/B", "É", "A\tB", "Z" * 65, '"', "A'B", "A\u00a0B"],
)
def test_bad_sku(sku: str) -> None:
    result = bad(f"sku,quantity\nOK-1,1\n{sku},5\n".encode())
    assert located(result) == [(3, 1, "csv.bad_sku")]
    assert result.code == "csv.bad_sku"


@pytest.mark.parametrize(
    "quantity",
    ["0", "00", str(MAX_QUANTITY + 1), "9999999", "10000000", "+5", "-3", "1.5", "1e3", "abc", "", '""', "5 5", "\u0663", "0x10", "1_000"],
)
def test_bad_quantity(quantity: str) -> None:
    result = bad(f"sku,quantity\nOK-1,1\nA,{quantity}\n".encode())
    assert located(result) == [(3, 2, "csv.bad_quantity")]
    assert result.code == "csv.bad_quantity"


def test_bad_sku_and_bad_quantity_on_one_row_are_both_reported() -> None:
    assert located(bad(b"sku,quantity\n-bad,0\n")) == [(2, 1, "csv.bad_sku"), (2, 2, "csv.bad_quantity")]


def test_duplicate_sku_points_at_the_second_occurrence() -> None:
    result = bad(b"sku,quantity\nA,1\nB,2\nA,3\n")
    assert located(result) == [(4, 1, "csv.duplicate_sku")]
    assert result.issues[0].message == "SKU A already on line 2"


def test_duplicate_sku_after_trimming_and_quotes() -> None:
    result = bad(b'sku,quantity\nA,1\n" A ",2\n')
    assert located(result) == [(3, 1, "csv.duplicate_sku")]


def test_every_repeat_of_a_sku_is_reported_against_the_first() -> None:
    result = bad(b"sku,quantity\nA,1\nA,2\nA,3\n")
    assert located(result) == [(3, 1, "csv.duplicate_sku"), (4, 1, "csv.duplicate_sku")]
    assert all("line 2" in i.message for i in result.issues)


def test_too_many_rows_with_a_small_limit() -> None:
    result = bad(b"sku,quantity\nA,1\nB,1\n\nC,1\nD,1\nE,1\n", max_rows=3)
    # The 4th row is on physical line 6 (line 4 is blank); checking stops there.
    assert located(result) == [(6, None, "csv.too_many_rows")]
    assert result.code == "csv.too_many_rows"
    assert result.issues[0].message == "more than 3 rows"


def test_too_many_rows_listed_after_earlier_issues() -> None:
    result = bad(b"sku,quantity\nA,0\nB,1\nC,1\n", max_rows=2)
    assert located(result) == [(2, 2, "csv.bad_quantity"), (4, None, "csv.too_many_rows")]
    assert result.code == "csv.bad_quantity"


# --------------------------------------------------------------------------
# Every issue is reported, up to MAX_ISSUES


def test_all_issues_are_reported_in_line_order() -> None:
    data = (
        b"sku,quantity\n"
        b"A,1\n"  # 2 ok
        b"B,abc\n"  # 3 bad quantity
        b"-C,2\n"  # 4 bad sku
        b"D,1,9\n"  # 5 bad row
        b"A,7\n"  # 6 duplicate of line 2
        b"\n"  # 7 blank
        b"E,0\n"  # 8 bad quantity
        b"F G,+1\n"  # 9 bad sku + bad quantity
        b"H,3\n"  # 10 ok
    )
    result = bad(data)
    assert located(result) == [
        (3, 2, "csv.bad_quantity"),
        (4, 1, "csv.bad_sku"),
        (5, None, "csv.bad_row"),
        (6, 1, "csv.duplicate_sku"),
        (8, 2, "csv.bad_quantity"),
        (9, 1, "csv.bad_sku"),
        (9, 2, "csv.bad_quantity"),
    ]
    assert result.code == "csv.bad_quantity"
    assert result.truncated is False


def test_issues_are_capped_and_marked_truncated() -> None:
    data = b"sku,quantity\n" + b"".join(f"S{i},0\n".encode() for i in range(MAX_ISSUES + 50))
    result = bad(data)
    assert len(result.issues) == MAX_ISSUES
    assert result.truncated is True
    assert [i.line for i in result.issues] == list(range(2, MAX_ISSUES + 2))
    assert {i.code for i in result.issues} == {"csv.bad_quantity"}


def test_exactly_max_issues_is_not_truncated() -> None:
    data = b"sku,quantity\n" + b"".join(f"S{i},0\n".encode() for i in range(MAX_ISSUES))
    result = bad(data)
    assert len(result.issues) == MAX_ISSUES
    assert result.truncated is False


def test_cap_reached_in_the_middle_of_a_row() -> None:
    # MAX_ISSUES - 1 one-issue rows, then a row with two issues: the second one is dropped, but counted.
    data = b"sku,quantity\n" + b"".join(f"S{i},0\n".encode() for i in range(MAX_ISSUES - 1)) + b"-x,0\n"
    result = bad(data)
    assert len(result.issues) == MAX_ISSUES
    assert result.issues[-1] == CsvIssue(MAX_ISSUES + 1, 1, "csv.bad_sku", result.issues[-1].message, "-x")
    assert result.truncated is True
    assert result.found == MAX_ISSUES + 1


def test_row_limit_still_applies_after_the_issue_cap() -> None:
    data = b"sku,quantity\n" + b"".join(f"S{i},0\n".encode() for i in range(MAX_ISSUES + 10))
    result = bad(data, max_rows=MAX_ISSUES + 5)
    assert len(result.issues) == MAX_ISSUES
    assert result.truncated is True
    # The row limit is always reported: it takes the last place of a full list.
    assert result.issues[-1] == CsvIssue(MAX_ISSUES + 7, None, "csv.too_many_rows", f"more than {MAX_ISSUES + 5} rows")
    assert result.issues[-2].line == MAX_ISSUES  # lines 2.. MAX_ISSUES kept, then the row limit
    assert result.found == MAX_ISSUES + 5 + 1


def test_issues_beyond_the_cap_are_counted_not_kept() -> None:
    # 3 x MAX_ISSUES bad rows between good ones: every one is found, MAX_ISSUES are kept.
    rows = [f"OK{i},1\n" if i % 4 else f"BAD{i},x\n" for i in range(MAX_ISSUES * 4)]
    result = bad(("sku,quantity\n" + "".join(rows)).encode(), max_rows=MAX_ISSUES * 4)
    assert result.found == MAX_ISSUES
    assert result.truncated is False
    result = bad(("sku,quantity\n" + "".join(rows * 3).replace("OK", "K")).encode(), max_rows=MAX_ISSUES * 12)
    # Repeating the rows repeats the SKUs: every row after the first copy is a duplicate or a bad quantity.
    assert len(result.issues) == MAX_ISSUES and result.truncated is True
    assert result.found == MAX_ISSUES + 2 * MAX_ISSUES * 4


def test_each_issue_carries_the_raw_text_of_its_cell() -> None:
    data = (
        b"sku,quantity\n"
        b'=HYPERLINK("x","y"),5\n'  # 2: three columns: the whole line
        b"-A, 0 \n"  # 3: bad sku '-A' and bad quantity ' 0 ' (raw, spaces kept)
        b'"B",7\n'  # 4: ok
        b'"B",8\n'  # 5: duplicate: the raw cell, quotes kept
    )
    result = bad(data)
    assert [(i.line, i.column, i.code, i.value) for i in result.issues] == [
        (2, None, "csv.bad_row", '=HYPERLINK("x","y"),5'),
        (3, 1, "csv.bad_sku", "-A"),
        (3, 2, "csv.bad_quantity", " 0 "),
        (5, 1, "csv.duplicate_sku", '"B"'),
    ]


def test_a_long_value_is_cut_to_the_bound() -> None:
    long_sku = "S" * 5000
    (issue,) = bad(f"sku,quantity\n{long_sku},1\n".encode()).issues
    assert len(issue.value) == MAX_VALUE_CHARS
    assert issue.value == "S" * (MAX_VALUE_CHARS - 1) + "\u2026"
    (header,) = bad(b"sku;quantity;" + b"x" * 5000 + b"\nA,1\n").issues
    assert header.code == "csv.bad_header" and header.value.startswith("sku;quantity;x") and len(header.value) == MAX_VALUE_CHARS


# --------------------------------------------------------------------------
# Content hash


def _canonical_hash(rows: list[tuple[str, int]]) -> str:
    text = "".join(f"{s},{q}\n" for s, q in sorted(rows))
    return hashlib.sha256(text.encode()).hexdigest()


def test_content_sha256_is_the_hash_of_the_sorted_canonical_form() -> None:
    shipment = ok(b"sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\n")
    assert shipment.content_sha256 == _canonical_hash([("WIDGET-RED-01", 10), ("GADGET-BLU-02", 25), ("SPROCKET-07", 5)])
    assert shipment.content_sha256 == content_sha256(shipment.rows) == content_sha256(list(shipment.rows))


@pytest.mark.parametrize(
    "variant",
    [
        b"sku,quantity\nSPROCKET-07,5\nWIDGET-RED-01,10\nGADGET-BLU-02,25\n",
        b"sku,quantity\r\nWIDGET-RED-01,10\r\nGADGET-BLU-02,25\r\nSPROCKET-07,5\r\n",
        BOM + b"sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\n",
        b'"SKU","Quantity"\n"WIDGET-RED-01","10"\n"GADGET-BLU-02",25\nSPROCKET-07,"5"',
        b"\nsku,quantity\n\nGADGET-BLU-02, 25\n  SPROCKET-07,0000005\nWIDGET-RED-01 ,10\n\n",
    ],
)
def test_content_sha256_ignores_order_line_endings_bom_and_quotes(variant: bytes) -> None:
    reference = ok((FIXTURES / "shipment-a-2026.csv").read_bytes())
    assert ok(variant).content_sha256 == reference.content_sha256


@pytest.mark.parametrize(
    "variant",
    [
        b"sku,quantity\nWIDGET-RED-01,11\nGADGET-BLU-02,25\nSPROCKET-07,5\n",
        b"sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\n",
        b"sku,quantity\nWIDGET-RED-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\nEXTRA-1,1\n",
        b"sku,quantity\nwidget-red-01,10\nGADGET-BLU-02,25\nSPROCKET-07,5\n",
        b"sku,quantity\nWIDGET-RED-01,5\nGADGET-BLU-02,25\nSPROCKET-07,10\n",
    ],
)
def test_content_sha256_differs_for_different_content(variant: bytes) -> None:
    reference = ok((FIXTURES / "shipment-a-2026.csv").read_bytes())
    assert ok(variant).content_sha256 != reference.content_sha256


def test_content_sha256_is_unambiguous_between_sku_and_quantity() -> None:
    # "A1,2" vs "A,12" must not collide.
    assert ok(b"sku,quantity\nA1,2\n").content_sha256 != ok(b"sku,quantity\nA,12\n").content_sha256


# --------------------------------------------------------------------------
# Batch ids and job ids


@pytest.mark.parametrize("value", ["shipment-a-2026", "a", "0", "A" * 64, "1.2_3-x", "x."])
def test_valid_batch_ids(value: str) -> None:
    assert is_valid_batch_id(value) is True


@pytest.mark.parametrize(
    "value",
    ["", "-a", ".a", "_a", "a" * 65, "a b", "a/b", "a:b", "a\n", "\na", "é", "a\x00", None, 5, b"abc", ["a"]],
)
def test_invalid_batch_ids(value: object) -> None:
    assert is_valid_batch_id(value) is False


def test_job_id_for() -> None:
    assert job_id_for("shipment-a-2026") == "shipment-shipment-a-2026"
    assert job_id_for("x") == "shipment-x"


# --------------------------------------------------------------------------
# Fixture files


def test_fixture_valid_shipment() -> None:
    data = (FIXTURES / "shipment-a-2026.csv").read_bytes()
    assert data.startswith(b"sku,quantity\n") and data.endswith(b"\n") and b"\r" not in data
    shipment = ok(data)
    assert shipment.rows == EXPECTED_ROWS
    assert shipment.row_count == 3


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("invalid-bad-header.csv", [(1, None, "csv.bad_header")]),
        ("invalid-bad-quantity.csv", [(2, 2, "csv.bad_quantity"), (3, 2, "csv.bad_quantity")]),
        ("invalid-duplicate-sku.csv", [(4, 1, "csv.duplicate_sku")]),
        ("invalid-not-utf8.csv", [(3, None, "csv.not_utf8")]),
    ],
)
def test_fixture_invalid_files(name: str, expected: list[tuple[int, int | None, str]]) -> None:
    result = bad((FIXTURES / name).read_bytes())
    assert located(result) == expected
    assert result.code == expected[0][2]
    assert result.truncated is False


def test_not_utf8_fixture_has_the_exact_bytes_on_line_3() -> None:
    lines = (FIXTURES / "invalid-not-utf8.csv").read_bytes().split(b"\n")
    assert b"\xff\xfe" in lines[2]
    assert b"\xff" not in lines[0] + lines[1]


@pytest.mark.parametrize("filler", [b",", b"\n", b"\r\n", b"A"])
def test_a_hostile_shape_costs_the_parse_a_small_multiple_of_the_file(filler: bytes) -> None:
    """A file of commas is one bad row (no list of a million fields), a file of
    blank lines is read a block at a time (no list of ten million lines)."""
    import tracemalloc

    size = 4 * 1024 * 1024
    data = b"sku,quantity\n" + filler * ((size - 13) // len(filler))
    tracemalloc.start()
    try:
        parsed = parse_shipment(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(parsed, CsvInvalid)
    assert peak <= 2.5 * size, peak  # the decoded text and one line of it


def test_the_plain_path_in_steps_agrees_with_the_full_parse_on_large_files() -> None:
    """Many blocks, sort runs and hash steps (the plain path works in steps of
    256 KiB / 4096 lines): the same key as the full parse; a duplicate SKU
    anywhere, across a step's edge too, is found."""
    import random

    from importer.domain.shipment import _STEP_LINES, _plain_content_sha256, content_sha256, parse_shipment

    rng = random.Random(5)
    skus = [f"S{n:07d}-{'x' * rng.randint(0, 40)}" for n in range(3 * _STEP_LINES + 17)]
    rng.shuffle(skus)
    lines = [f"{sku},{rng.randint(1, 1_000_000)}" for sku in skus]
    data = ("sku,quantity\n" + "\n".join(lines) + "\n").encode()
    parsed = parse_shipment(data)
    assert not isinstance(parsed, CsvInvalid)
    assert _plain_content_sha256(data, 100_000) == parsed.content_sha256 == content_sha256(parsed.rows)
    ordered = sorted(skus)
    for index in (0, _STEP_LINES - 1, _STEP_LINES, 2 * _STEP_LINES + 3, len(ordered) - 2):
        twice = lines + [f"{ordered[index]},7"]  # the same SKU again: sorts next to the first
        bad = ("sku,quantity\n" + "\n".join(twice) + "\n").encode()
        assert _plain_content_sha256(bad, 100_000) is None, index
        assert isinstance(parse_shipment(bad), CsvInvalid)


def test_sorting_and_merging_in_steps_equal_sorted() -> None:
    """Many equal lines, lists around the step size, one side ending first."""
    import random

    from importer.domain.shipment import _STEP_LINES, _merged_in_steps, _sorted_in_steps

    rng = random.Random(3)
    for n in (0, 1, 5, _STEP_LINES - 1, _STEP_LINES, _STEP_LINES + 1, 3 * _STEP_LINES + 7):
        for alphabet in (b"ab", b"0123456789"):
            items = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(n)]
            assert _sorted_in_steps(list(items)) == sorted(items)
            left, right = sorted(items[: n // 3]), sorted(items[n // 3:])
            assert _merged_in_steps(left, right) == sorted(items)
            assert _merged_in_steps(right, left) == sorted(items)
