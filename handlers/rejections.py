"""``GET /api/imports/{jobId}/rejections.csv``: every located issue a failed
validation kept, as CSV a spreadsheet can open safely.

Format: RFC 4180 (CRLF line ends, a field quoted when it holds a comma, a
double quote, CR or LF; quotes doubled), UTF-8 without BOM, the header
``line,column,code,message,value``. ``value`` is the offending cell's raw
text (at most shipment.MAX_VALUE_CHARS characters). A text cell that a
spreadsheet would read as a formula (it starts with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return, or a full-width ``＝ ＋ － ＠``: the OWASP
CSV-injection list) is prefixed with a single quote ``'``. When the report
was cut at shipment.MAX_ISSUES, a last row with code ``report.truncated``
says how many issues were found.

At most 10,000 rows of bounded cells (a few MB at worst): built in memory.
"""

from __future__ import annotations

import csv
import io
import re

from importer.domain.jobs import RejectionReport
from importer.domain.locations import location_of_job
from importer.handlers.api import Api
from importer.handlers.http import Request, Response
from importer.handlers.problems import ApiError

HEADER = ("line", "column", "code", "message", "value")
#: The code of the last row of a report cut at its bound.
TRUNCATED_CODE = "report.truncated"
#: First characters a spreadsheet takes as the start of a formula (OWASP "CSV
#: Injection"), and their full-width forms, which some spreadsheets fold to them.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


def spreadsheet_safe(text: str) -> str:
    """The text a spreadsheet shows as text: a leading formula character is escaped with a single quote."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def rejections_csv(report: RejectionReport) -> bytes:
    """The report as CSV bytes (RFC 4180, every text cell spreadsheet-safe)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(HEADER)
    for issue in report.issues:
        writer.writerow((
            issue.line, "" if issue.column is None else issue.column,
            spreadsheet_safe(issue.code), spreadsheet_safe(issue.message), spreadsheet_safe(issue.value),
        ))
    if report.truncated:
        note = (
            f"{report.found} issues found; this report lists the first {len(report.issues)}. "
            "Fix them and send the file again under a new batchId to see the rest."
        )
        writer.writerow(("", "", TRUNCATED_CODE, note, ""))
    return out.getvalue().encode("utf-8")


def get_rejections(api: Api, req: Request) -> Response:
    """GET /api/imports/{jobId}/rejections.csv: the rejection report of the caller's own job."""
    job_id = req.path_params["jobId"]
    owner = req.owner_at(location_of_job(job_id))
    found = api.store.get_owned_rejections(job_id, owner) if owner else None
    if found is None:
        raise ApiError("job.not_found")  # the same bytes as GET /api/imports/{jobId}
    _state, report = found
    if report is None:
        raise ApiError("rejections.not_found")
    filename = _UNSAFE_FILENAME.sub("_", job_id)[:100] + "-rejections.csv"
    headers = (
        ("Content-Type", "text/csv; charset=utf-8; header=present"),
        ("Content-Disposition", f'attachment; filename="{filename}"'),
        ("Cache-Control", "no-store"),
    )
    return Response(200, rejections_csv(report), headers)
