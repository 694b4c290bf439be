"""The shipment value and the CSV validator that produces it.

CSV format (documented in docs/csv.md):

* UTF-8, an optional BOM, LF or CRLF line endings, blank lines ignored.
* First non-blank line: the header ``sku,quantity`` (case-insensitive,
  spaces around names ignored).
* Each row: ``sku,quantity``. A field may be wrapped in double quotes, as
  spreadsheets do; quotes inside a field are not supported (no SKU needs one).
* SKU: trimmed, 1-64 characters from ``A-Z a-z 0-9 . _ -``, starting with a
  letter or digit.
* quantity: digits only, 1 to :data:`MAX_QUANTITY`.
* A SKU appears at most once per file.
* At most ``max_rows`` rows (default :data:`DEFAULT_MAX_ROWS`).

The validator never raises on any input: it returns a :class:`Shipment` or
a :class:`~importer.domain.errors.CsvInvalid` carrying every located issue (capped at
:data:`MAX_ISSUES`, with the number found beyond it), each with the offending
cell's raw text (at most :data:`MAX_VALUE_CHARS` characters).
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_right
from collections.abc import Iterator
from itertools import chain
from dataclasses import dataclass

from importer.domain.errors import CsvInvalid, CsvIssue
from importer.domain.locations import MAIN, split_job_id

#: The one definition of a batchId; the HTTP schemas, routes and openapi.yaml take it from here.
BATCH_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
BATCH_ID_RULE = "Must be 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit."
SKU_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_QUANTITY = 1_000_000
DEFAULT_MAX_ROWS = 100_000
#: The located issues a failed validation keeps: its rejection report
#: (GET /api/imports/{jobId}/rejections.csv). A 100,000-row file can hold
#: 200,000 issues (two per row); 10,000 keeps the report at about 1 MB
#: (6.3 MB at worst: every cell 100 four-byte characters) in Redis next to the upload
#: that failed, while any systematic mistake (a wrong column, a wrong
#: separator) shows thousands of times over. Issues beyond it are counted.
MAX_ISSUES = 10_000
#: An issue's value (the offending cell) is cut to this many characters: a
#: valid SKU (64) or quantity (7) always fits whole.
MAX_VALUE_CHARS = 100

_BATCH_ID = re.compile(BATCH_ID_PATTERN)
_SKU = re.compile(SKU_PATTERN)
_DIGITS = re.compile(r"^[0-9]{1,7}$")  # 7 digits is enough for MAX_QUANTITY


def is_valid_batch_id(value: object) -> bool:
    return isinstance(value, str) and _BATCH_ID.fullmatch(value) is not None


def job_id_for(batch_id: str, location: str = MAIN) -> str:
    """The job id of a batch at a location, as in the seed: batch ``x`` -> job
    ``shipment-x`` at the default partition, ``shipment-x@paris`` at location paris."""
    return f"shipment-{batch_id}" if location == MAIN else f"shipment-{batch_id}@{location}"


def batch_id_of(job_id: str) -> str | None:
    """The batchId whose job id this is (job_id_for's inverse), or None when no batch has it."""
    head, _ = split_job_id(job_id)
    batch_id = head.removeprefix("shipment-")
    return batch_id if batch_id != head and is_valid_batch_id(batch_id) else None


@dataclass(frozen=True, slots=True)
class Row:
    sku: str
    quantity: int


@dataclass(frozen=True)
class Shipment:
    """A validated shipment: its rows in file order and the hash of its content."""

    rows: tuple[Row, ...]

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def content_sha256(self) -> str:
        """Hash of the canonical form: rows sorted by SKU, ``sku,quantity\\n`` each.

        The same rows in another order, with other line endings, quotes or a
        BOM hash the same, so re-sending an equivalent file is not a conflict.
        """
        return content_sha256(self.rows)


def content_sha256(rows: tuple[Row, ...] | list[Row]) -> str:
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: r.sku):
        digest.update(f"{row.sku},{row.quantity}\n".encode())
    return digest.hexdigest()


# One row in its plain form: a SKU, a comma, a quantity from 1 to MAX_QUANTITY
# without leading zeros. The header "sku,quantity" is checked apart.
_PLAIN_ROWS = re.compile(rb"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,63},(?:[1-9][0-9]{0,5}|1000000)\n)*")
# In sorted plain rows, a SKU repeated: a line and the next start with the same
# "SKU,". Anchored on a newline (a literal), so the search jumps from line to
# line instead of trying every byte; the first line is compared apart.
_REPEATED_SKU = re.compile(rb"\n([^,\n]*,)[^\n]*\n\1")
_BLANK_LINES = re.compile(rb"\n\n+")
_PLAIN_HEADER = b"sku,quantity\n"


def _plain_content_sha256(data: bytes, max_rows: int) -> str | None:
    """The canonical hash of a file in plain form, without building rows.

    Plain form: ASCII, an optional BOM, the header ``sku,quantity`` exactly,
    rows ``SKU,quantity`` with no quotes, spaces or leading zeros, LF or CRLF
    line endings, blank lines allowed, distinct SKUs, 1 to ``max_rows`` rows.
    Such a line *is* its canonical form ``sku,quantity``; and ``,`` sorts
    before every SKU character, so sorting the lines sorts the rows by SKU.
    Anything else returns None and the full parse decides.

    Memory stays a small multiple of the file whatever its shape: no list is
    built before the rows are known to be plain and at most ``max_rows``
    (a file of newlines or of commas is turned down by the checks first).
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.isascii():
        return None
    if b"\r" in data:
        if data.endswith(b"\r"):
            data = data[:-1]
        data = data.replace(b"\r\n", b"\n")
        if b"\r" in data:
            return None
    if b"\n\n" in data or data.startswith(b"\n"):
        data = _BLANK_LINES.sub(b"\n", data).lstrip(b"\n")
    if not data.startswith(_PLAIN_HEADER) or len(data) == len(_PLAIN_HEADER):
        return None
    if not data.endswith(b"\n"):
        data += b"\n"  # copies: only files without a final newline pay it
    rows = data.count(b"\n") - 1
    if rows > max_rows:
        return None
    lines: list[bytes] = []
    for start, end in _blocks(data, len(_PLAIN_HEADER)):
        if _PLAIN_ROWS.fullmatch(data, start, end) is None:
            return None
        lines += data[start:end - 1].split(b"\n")
    del data
    lines = _sorted_in_steps(lines)
    # The canonical form, hashed a step at a time (a duplicate SKU, in the
    # sorted lines, is a line and the next starting with the same "SKU,";
    # each step's text begins with the previous step's last line).
    digest = hashlib.sha256()
    previous = b""
    for start in range(0, len(lines), _STEP_LINES):
        piece = b"\n".join(lines[start:start + _STEP_LINES]) + b"\n"
        if _REPEATED_SKU.search(b"\n" + previous + piece) is not None:
            return None  # a duplicate SKU: invalid, the full parse reports it
        digest.update(piece)
        previous = lines[min(len(lines), start + _STEP_LINES) - 1] + b"\n"
    return digest.hexdigest()


#: The plain path works in steps of about this many bytes or lines: each
#: step is one C call that holds the GIL (a 10 MiB regex match or sort in one
#: call held it for 50-150 ms, and every other request of the process waited).
_STEP_BYTES = 256 * 1024
_STEP_LINES = 4096


def _blocks(data: bytes, start: int) -> Iterator[tuple[int, int]]:
    """(start, end) of about _STEP_BYTES each, every end just after a newline
    (``data`` ends with one)."""
    while start < len(data):
        end = data.find(b"\n", min(start + _STEP_BYTES, len(data) - 1)) + 1
        yield start, end
        start = end


def _sorted_in_steps(items: list[bytes]) -> list[bytes]:
    """``sorted(items)``, in calls of a few milliseconds each: blocks of
    _STEP_LINES sorted, then merged two by two, each merge in steps."""
    runs = [sorted(items[i:i + _STEP_LINES]) for i in range(0, len(items), _STEP_LINES)]
    while len(runs) > 1:
        merged = [_merged_in_steps(left, right) for left, right in zip(runs[0::2], runs[1::2])]
        if len(runs) % 2:
            merged.append(runs[-1])
        runs = merged
    return runs[0] if runs else []


def _merged_in_steps(left: list[bytes], right: list[bytes]) -> list[bytes]:
    """Two sorted lists merged, at most _STEP_LINES of each per step: the next
    lines of one and those of the other that sort before the last of them,
    sorted together (two sorted runs laid end to end: one linear merge)."""
    out: list[bytes] = []
    i = j = 0
    while i < len(left) and j < len(right):
        i_end = min(i + _STEP_LINES, len(left))
        j_limit = min(j + _STEP_LINES, len(right))
        j_end = bisect_right(right, left[i_end - 1], j, j_limit)
        if j_end == j_limit < len(right):
            # right's step ends below left's: cut left at right's last line instead
            i_end = bisect_right(left, right[j_end - 1], i, i_end)
        step = left[i:i_end] + right[j:j_end]
        step.sort()
        out += step
        i, j = i_end, j_end
    out += left[i:]
    out += right[j:]
    return out


def could_be_valid(data: bytes, max_rows: int) -> bool:
    """False when the file cannot be valid, decided by counting two bytes
    (fast, whatever the file's shape; no copy, no parse).

    In a valid file every comma is on its own line: the header and each row
    have exactly one comma (a line with more is a bad header or a bad row;
    quotes cannot hide one), blank lines have none, and there are 1 to
    ``max_rows`` rows. So its commas number 2 to ``max_rows`` + 1 and at
    most its lines. (No multi-byte UTF-8 sequence holds the byte of ``,``.)
    A file of commas, of blank lines or one long line fails this at once.
    """
    commas = data.count(b",")
    return 2 <= commas <= max_rows + 1 and commas <= data.count(b"\n") + 1


def bytes_sha256(data: bytes) -> str:
    """The hash of an upload's bytes as sent: the same bytes are the same
    content, whatever their shape (hashlib lets other threads run meanwhile)."""
    return hashlib.sha256(data).hexdigest()


def content_key(data: bytes, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """What identifies a batch's content: the canonical hash when the CSV is valid.

    An invalid file cannot be canonicalised; its raw bytes identify it (the
    worker will fail it with its located issues). A file in plain form (the
    usual case) is hashed without being parsed into rows; the result is the
    same as the full parse's (a property test checks it).
    """
    if not could_be_valid(data, max_rows):
        return "bytes:" + hashlib.sha256(data).hexdigest()
    plain = _plain_content_sha256(data, max_rows)
    if plain is not None:
        return plain
    parsed = parse_shipment(data, max_rows=max_rows)
    if isinstance(parsed, CsvInvalid):
        return "bytes:" + hashlib.sha256(data).hexdigest()
    return parsed.content_sha256


def _cell(value: str) -> str:
    """The raw text of a cell as an issue shows it: at most MAX_VALUE_CHARS characters."""
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1] + "\u2026"


class _Issues:
    """Keeps the first MAX_ISSUES issues and counts every one found."""

    __slots__ = ("items", "found")

    def __init__(self) -> None:
        self.items: list[CsvIssue] = []
        self.found = 0

    def add(self, line: int, column: int | None, code: str, message: str, value: str = "") -> None:
        self.found += 1
        if len(self.items) < MAX_ISSUES:
            self.items.append(CsvIssue(line, column, code, message, _cell(value)))

    def add_last(self, line: int, column: int | None, code: str, message: str) -> None:
        """An issue that ends the validation (too many rows): always kept, in
        place of the last one kept when the list is full."""
        self.found += 1
        if len(self.items) >= MAX_ISSUES:
            del self.items[MAX_ISSUES - 1:]
        self.items.append(CsvIssue(line, column, code, message))

    def invalid(self) -> CsvInvalid:
        return CsvInvalid(tuple(self.items), found=self.found)


def _unquote(field: str) -> str:
    field = field.strip()
    if len(field) >= 2 and field[0] == '"' and field[-1] == '"':
        return field[1:-1].strip()
    return field


def _printable(value: str, limit: int = 40) -> str:
    shown = value if len(value) <= limit else value[:limit] + "..."
    return repr(shown)


def _lines(text: str, block: int = 1 << 16) -> Iterator[str]:
    """``text.split("\n")``, a block of about 64 Ki characters at a time:
    as fast as one split, but a file of ten million blank lines never becomes
    a list of ten million strings."""
    return chain.from_iterable(_split_blocks(text, block))


def _split_blocks(text: str, block: int) -> Iterator[list[str]]:
    start = 0
    while True:
        end = text.find("\n", start + block) if start + block < len(text) else -1
        if end < 0:
            yield (text[start:] if start else text).split("\n")
            return
        yield text[start:end].split("\n")
        start = end + 1


#: Files up to this size in plain form are parsed by :func:`_plain_rows` (the small imports' usual case).
_PLAIN_PARSE_MAX_BYTES = 16 * 1024


def _plain_rows(data: bytes, max_rows: int) -> tuple[Row, ...] | None:
    """The rows of a small file in the strictest plain form, else None (the
    full parse decides): ASCII, the header ``sku,quantity`` exactly, then
    1 to ``max_rows`` rows ``SKU,quantity`` with no quotes, spaces, blank
    lines, CR or leading zeros, each ending with LF, distinct SKUs. Such a file
    is valid and its rows are read as the full parse reads them (a property
    test holds the two to the same result)."""
    if len(data) > _PLAIN_PARSE_MAX_BYTES or len(data) == len(_PLAIN_HEADER) or not data.startswith(_PLAIN_HEADER) \
            or not data.isascii() or _PLAIN_ROWS.fullmatch(data, len(_PLAIN_HEADER)) is None:
        return None
    lines = data[len(_PLAIN_HEADER):-1].decode().split("\n")
    if len(lines) > max_rows:
        return None
    rows = tuple(Row(sku, int(quantity)) for sku, quantity in (line.split(",") for line in lines))
    if len({row.sku for row in rows}) != len(rows):
        return None
    return rows


def parse_shipment(data: bytes, *, max_rows: int = DEFAULT_MAX_ROWS) -> Shipment | CsvInvalid:
    """Validate CSV bytes. Returns the shipment, or CsvInvalid with every located issue."""
    plain = _plain_rows(data, max_rows)
    if plain is not None:
        return Shipment(plain)
    return _parse_lines(data, max_rows)


def _parse_lines(data: bytes, max_rows: int) -> Shipment | CsvInvalid:
    """The full parse, line by line: every shape the CSV rules allow, and every located issue."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        # utf-8-sig reports err.start relative to the bytes after a BOM.
        start = err.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        bad_line = data.count(b"\n", 0, start) + 1
        return CsvInvalid((CsvIssue(bad_line, None, "csv.not_utf8", f"byte {start} is not valid UTF-8"),))

    issues = _Issues()
    lines = _lines(text)
    header_seen = False
    rows: list[Row] = []
    seen: dict[str, int] = {}
    row_count = 0

    for index, raw in enumerate(lines):
        line_no = index + 1
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip():
            continue
        # Split only a line of two fields: a line of a million commas is one
        # bad row, not a list of a million strings.
        commas = line.count(",")
        fields = line.split(",") if commas == 1 else []
        if not header_seen:
            header_seen = True
            names = [_unquote(f).lower() for f in fields]
            if names != ["sku", "quantity"]:
                issues.add(line_no, None, "csv.bad_header", f"header is {_printable(line)}, expected 'sku,quantity'", line)
                # Without a header we cannot trust any column: stop here.
                return issues.invalid()
            continue

        row_count += 1
        if row_count > max_rows:
            issues.add_last(line_no, None, "csv.too_many_rows", f"more than {max_rows} rows")
            break
        if commas != 1:
            issues.add(line_no, None, "csv.bad_row", f"{commas + 1} columns, expected 2", line)
            continue
        sku = _unquote(fields[0])
        qty_text = _unquote(fields[1])
        ok = True
        if not _SKU.fullmatch(sku):
            ok = False
            issues.add(line_no, 1, "csv.bad_sku", f"SKU {_printable(sku)} is not valid", fields[0])
        if not _DIGITS.fullmatch(qty_text) or not (1 <= int(qty_text) <= MAX_QUANTITY):
            ok = False
            issues.add(line_no, 2, "csv.bad_quantity", f"quantity {_printable(qty_text)} is not a whole number from 1 to {MAX_QUANTITY}", fields[1])
        if not ok:
            continue
        first = seen.get(sku)
        if first is not None:
            issues.add(line_no, 1, "csv.duplicate_sku", f"SKU {sku} already on line {first}", fields[0])
            continue
        seen[sku] = line_no
        if not issues.found:  # an invalid file's rows are never used
            rows.append(Row(sku, int(qty_text)))

    if not header_seen:
        return CsvInvalid((CsvIssue(1, None, "csv.empty", "the file has no header and no rows"),))
    if issues.items:
        return issues.invalid()
    if not rows:
        return CsvInvalid((CsvIssue(1, None, "csv.no_rows", "the file has a header but no rows"),))
    return Shipment(tuple(rows))
