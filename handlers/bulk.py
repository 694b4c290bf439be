"""POST /api/imports/bulk: many shipments in one authenticated request.

The body is NDJSON (``application/x-ndjson``): one JSON object per line, each
the body a single ``POST /api/imports`` takes (``{batchId, csv, location?}``);
or JSON ``{"shipments": [...]}`` of the same objects (what generated clients send);
or ``multipart/form-data``, one CSV file per part (``curl -F file=@a.csv -F
file=@b.csv``), each file's name without its extension its batchId (as
``importer submit`` names files), ``?location=`` for all of them: each part is
the body of a single ``text/csv`` POST. A multipart body must end with its
closing delimiter: one cut at a part's end, even with a matching
``Content-Length``, is refused whole.
The answer is ``200 {"results": [...]}``, one entry per line (or part), in order, each
``{status, body}``: exactly the status and body a single POST of that line
would get (``202`` and its job, the same job again, ``409 batch.conflict``,
``404 location.not_found``, ``429 request.rate_limited``...), with
``retryAfter`` when that answer has a Retry-After. Every rule of the single
POST holds per shipment: the key's locations, the declared ones, the rate
limit (one token per shipment), the contract door, the upload size. One bad
line never blocks the others.

Every line is checked first (as a single POST checks its body); then the
enqueue step of every valid one goes to the store together
(``submit_imports``: one round trip per 100 on Redis, each line still its own
atomic step, in order). Bounds: at most :data:`MAX_SHIPMENTS` lines, and the whole body within
``IMPORTER_MAX_UPLOAD_BYTES`` (the cut-body proof, ``Content-Length`` or
``Content-Digest``, is the whole request's, as for any POST). When the store
does not answer, every line not yet answered is ``503`` (the store may or
may not have recorded it), and a bulk never waits out the store's timeout
once per line. A client that lost the answer sends the same body again: every
shipment is recorded once (a line already recorded answers its job again).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

import multipart

from importer.domain.contract import every_live_worker_reads_groups
from importer.domain.errors import DomainError
from importer.domain.submit_import import Accepted, Upload, send_recorded, submit_imports
from importer.handlers.answers import answer_for
from importer.domain.shipment import BATCH_ID_PATTERN, is_valid_batch_id
from importer.handlers.api import (
    Api, _content_type, accepted_body, enqueue_request_of, json_of, refuse_operator_key, request_location,
)
from importer.handlers.http import Request, Response, json_response
from importer.handlers.problems import ApiError
from importer.handlers.query import whole_number
from importer.handlers.schemas import LOCATION_PARAMETER

#: Shipments per bulk request at most.
MAX_SHIPMENTS = 1000
NDJSON = "application/x-ndjson"
MULTIPART = "multipart/form-data"
_SHIPMENTS_PER_REQUEST = f"From 1 to {MAX_SHIPMENTS} shipments per request, each {{batchId, csv, location?}}."


@dataclass(frozen=True)
class FilePart:
    """One part of a multipart bulk: a CSV file and the name its client gave it."""

    filename: str | None
    csv: bytes

    @property
    def batch_id(self) -> str:
        """The file's name without its folder and extension, as ``importer submit`` names a file's shipment."""
        return PurePosixPath((self.filename or "").replace("\\", "/")).stem


def enqueue_bulk(api: Api, req: Request) -> Response:
    content_type = _content_type(req)
    if "batchId" in req.query:  # it would name one shipment of many: refused rather than ignored
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"batchId": [
            "A bulk names each shipment in its body (each line's batchId, each file's name): leave ?batchId= out."]}})
    if "location" in req.query:  # the bulk's own location: refused whole, as a single POST would refuse it
        request_location(api, req)
    shipments: list[Any]
    if content_type == NDJSON:
        shipments = [line for line in req.body.split(b"\n") if line.strip()]
    elif content_type == "application/json":
        data = json_of(req, req.body)
        listed = data.get("shipments") if isinstance(data, dict) and len(data) == 1 else None
        if not isinstance(listed, list):
            raise ApiError("request.invalid", instance=req.path, extra={"fields": {"shipments": [
                "A JSON body is {\"shipments\": [{batchId, csv, location?}, ...]} and nothing else."]}})
        shipments = listed
    elif content_type == MULTIPART:
        shipments = _files_of(req)
    else:
        raise ApiError("request.unsupported_media_type", instance=req.path)
    if not 1 <= len(shipments) <= MAX_SHIPMENTS:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"body": [_SHIPMENTS_PER_REQUEST]}})
    single = replace(req, path="/api/imports")  # each line's answer is the single POST's, its instance too
    results: list[dict[str, Any] | None] = [None] * len(shipments)
    uploads: list[Upload] = []
    positions: list[int] = []
    for position, shipment in enumerate(shipments):
        try:
            uploads.append(_upload_of(api, single, shipment))
            positions.append(position)
        except Exception as exc:
            results[position] = _failed(api, single, exc)
    # Small new shipments are recorded without their messages, then sent together (_send_later).
    later: list[tuple[str, str, str]] = []
    failure: dict[str, Any] | None = None
    try:
        submitted = submit_imports(
            api.store, api.sender, uploads, owner=req.owner or "", max_rows=api.max_rows, archive=api.archive,
            send_later=later if api.group_max_bytes > 0 else None,
        )
    except Exception as exc:  # the store does not answer: nothing is known of any of them
        failure = _failed(api, single, exc)
        submitted = [exc] * len(uploads)
    position_of: dict[str, int] = {}
    for position, upload, outcome in zip(positions, uploads, submitted):
        if isinstance(outcome, Accepted):
            results[position] = {"status": 202, "body": accepted_body(outcome, upload.location)}
            position_of[outcome.job_id] = position
        else:
            results[position] = _failed(api, single, outcome)
            if failure is None and not isinstance(outcome, DomainError):
                failure = results[position]
    if later and failure is not None:
        for job_id, _, _ in later:
            results[position_of[job_id]] = failure  # recorded, not sent: the reconciler sends them
    elif later:
        _send_later(api, single, later, position_of, results)
    return json_response(200, {"results": results}, (("Cache-Control", "no-store"),))


def _send_later(
    api: Api, req: Request, later: list[tuple[str, str, str]], position_of: dict[str, int], results: list[Any],
) -> None:
    """The messages of the shipments recorded without them: a group message per
    location and per GROUP_MAX while every live worker reads groups (with none
    alive too: the work waits, as at the door), else one message each. A
    shipment whose send failed is answered 503, as a single POST whose send
    failed is: its job waits in the unsent index for the reconciler, and the
    same body sent again answers its job (nothing recorded twice)."""
    try:
        grouped = every_live_worker_reads_groups(api.store.live_workers().values())
    except Exception:
        grouped = False  # the store is away: the sends below fail alike, and are answered 503
    for job_id, exc in send_recorded(api.store, api.sender, later, grouped=grouped):
        if exc is not None:
            results[position_of[job_id]] = _failed(api, req, exc)


def _failed(api: Api, req: Request, exc: BaseException) -> dict[str, Any]:
    answer = answer_for(exc, path=req.path, unavailable=api.unavailable_errors, on_store_error=api.on_store_error)
    entry: dict[str, Any] = {"status": answer.status, "body": json.loads(answer.body)}
    wait = dict(answer.headers).get("Retry-After")
    if (seconds := whole_number(wait)) is not None:
        entry["retryAfter"] = seconds
    return entry


def _files_of(req: Request) -> list[FilePart]:
    """The parts of a multipart/form-data body, in order; 422 request.invalid
    for a body that is not one whole multipart stream (its closing delimiter
    included) or that has more than MAX_SHIPMENTS parts."""
    # (multipart 2.0.1 leaves parse_options_header and close unannotated)
    _, options = multipart.parse_options_header(req.headers.get("content-type", ""))  # type: ignore[no-untyped-call]
    parts: list[FilePart] = []
    chunks: list[bytes] = []
    filename: str | None = None
    try:
        parser = multipart.PushMultipartParser(
            options.get("boundary", ""), content_length=len(req.body), max_segment_count=MAX_SHIPMENTS, strict=True,
        )
        for event in parser.parse(req.body):
            if isinstance(event, multipart.MultipartSegment):
                filename, chunks = event.filename, []
            elif event is None:
                parts.append(FilePart(filename, b"".join(chunks)))
            else:
                chunks.append(bytes(event))
        parser.close()  # type: ignore[no-untyped-call]  # raises unless the closing delimiter was read
    except multipart.ParserLimitReached:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"body": [_SHIPMENTS_PER_REQUEST]}}) from None
    except multipart.MultipartError as exc:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"body": [
            f"Not one whole multipart/form-data body, each part a CSV file ({exc})."]}}) from None
    return parts


def _upload_of(api: Api, req: Request, shipment: Any) -> Upload:
    """One shipment (an NDJSON line, an item of the JSON list, or a multipart file), checked as a
    single POST of it is before anything is recorded; raises the problem that POST would answer."""
    if isinstance(shipment, FilePart):
        batch_id, csv, location = _file_shipment(api, req, shipment)
    else:
        batch_id, csv, location = enqueue_request_of(api, req, json_of(req, shipment) if isinstance(shipment, bytes) else shipment)
    if req.principal is not None:
        req.principal.require(location)  # 404 location.not_found, before anything is recorded
    if len(csv) > api.max_upload_bytes:
        raise ApiError("request.too_large", instance=req.path)
    return Upload(batch_id, csv, api.uuidgen(), location, send_later=len(csv) <= api.group_max_bytes)


def _file_shipment(api: Api, req: Request, part: FilePart) -> tuple[str, bytes, str]:
    """(batchId, CSV bytes, location) of a multipart file: a single text/csv POST of it with
    ?batchId= its file name without the extension, and the bulk's own ?location=."""
    if not part.filename:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"filename": [
            "Each part is one CSV file with a file name: the name without its extension is its batchId."]}})
    if not is_valid_batch_id(part.batch_id):
        raise ApiError("request.invalid", instance=req.path, extra={"fields": {"batchId": [
            f"A file's name without its extension is its batchId, and must match {BATCH_ID_PATTERN}."]}})
    return part.batch_id, part.csv, request_location(api, req)


ROUTE_SPEC: dict[str, Any] = dict(method="POST", template="/api/imports/bulk", handler=enqueue_bulk, operation={
    "operationId": "enqueueImportsBulk",
    "summary": "Send many CSV shipments in one request, each applied to stock exactly once",
    "description": (
        "NDJSON: one JSON object per line, each the body POST /api/imports takes ({batchId, csv, location?}), "
        "or JSON {\"shipments\": [...]} of the same objects; "
        "or multipart/form-data, one CSV file per part, each file's name without its extension its batchId, "
        "?location= for every file (a part is the body of a single text/csv POST; the body must end with its closing "
        "delimiter); "
        f"from 1 to {MAX_SHIPMENTS} lines, the whole body within the upload byte limit. The answer gives each line, "
        "in order, the status and body a single POST of it would get (202 with its job, or the problem), with "
        "retryAfter when that answer has one. Every rule of the single POST holds per shipment (rate limit: one "
        "token each). When the store does not answer, every line not answered yet is 503 (it may or may not be "
        "recorded). Sending the same body again is safe: each shipment is recorded once."
    ),
    "requestBody": {"required": True, "content": {"application/json": {"schema": "BulkRequest"}, NDJSON: {"schema": {
        "type": "array", "items": {"$ref": "#/components/schemas/EnqueueRequest"}, "minItems": 1, "maxItems": MAX_SHIPMENTS,
        "description": "Sent as NDJSON: each item one line.",
    }, "example": (
        '{"batchId": "acme-001", "csv": "sku,quantity\\nWIDGET-RED-01,10\\n"}\n'
        '{"batchId": "acme-002", "csv": "sku,quantity\\nGADGET-BLU-02,5\\n", "location": "paris"}\n'
    )}, MULTIPART: {"schema": {"type": "object", "required": ["file"], "properties": {"file": {
        "type": "array", "minItems": 1, "maxItems": MAX_SHIPMENTS, "items": {"type": "string", "format": "binary"},
        "description": "The CSV files: each file's name without its extension is its shipment's batchId.",
    }}}}}},
    "parameters": [{**LOCATION_PARAMETER, "description": (
        "The stock location of every file of a multipart/form-data body (default: the deployment's); "
        "a JSON or NDJSON shipment names its own, and must then equal this one when both are given.")}],
    "responses": {"200": {"description": "One result per line, in order.",
                          "content": {"application/json": {"schema": "BulkResults"}}}},
}, errors=(
    "auth.required", "auth.invalid", "service.unavailable", "request.invalid", "request.unsupported_media_type",
    "request.incomplete", "request.bad_length", "request.bad_digest", "request.digest_mismatch", "request.length_required",
    "request.too_large", "request.timeout", "service.busy", "auth.scope_required",
), before_body=(refuse_operator_key,), error_notes={
    "auth.scope_required": "An operator's key (the ops scope) does not upload: use a producer's key",
    "request.invalid": f"The body is not 1 to {MAX_SHIPMENTS} lines (a line's own problems are in its result)",
    "request.too_large": "The whole body is larger than the upload byte limit: split it",
})
