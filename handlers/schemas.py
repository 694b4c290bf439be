"""The marshmallow schemas of the HTTP API; openapi.yaml is generated from these."""

from __future__ import annotations

import re

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from importer.domain.jobs import JobState
from importer.domain.locations import LOCATION_PATTERN, LOCATION_RULE, is_valid_location
from importer.domain.shipment import BATCH_ID_PATTERN, BATCH_ID_RULE, is_valid_batch_id

_JOB_STATES = [state.value for state in JobState]


def _batch_id(value: str) -> None:
    # fullmatch semantics: validate.Regexp's re.match lets "$" accept a trailing newline.
    if not is_valid_batch_id(value):
        raise ValidationError(BATCH_ID_RULE)


def _location(value: str) -> None:
    if not is_valid_location(value):
        raise ValidationError(LOCATION_RULE)


#: A stock location, as every schema and query parameter documents it.
LOCATION_METADATA = {
    "pattern": LOCATION_PATTERN,
    "description": (
        "The stock location (warehouse, store) the shipment is for; the deployment's default "
        "(IMPORTER_DEFAULT_LOCATION, 'main') when not given. A batchId names one shipment of one location."
    ),
    "example": "main",
}


#: ?location= of the routes that take one (handlers/routes.py).
LOCATION_PARAMETER: dict[str, object] = {
    "name": "location", "in": "query", "required": False,
    "description": "The stock location (default: the deployment's, IMPORTER_DEFAULT_LOCATION, 'main').",
    "schema": {"type": "string", "pattern": LOCATION_PATTERN},
}


def location_field(required: bool) -> fields.String:
    return fields.String(required=required, validate=_location if not required else None, metadata=LOCATION_METADATA)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode_text(value: str) -> None:
    # JSON lets "\ud800" through as a lone surrogate, which is not text (and
    # cannot be encoded as UTF-8). Searched, not encoded: no copy of the CSV.
    if _SURROGATE.search(value):
        raise ValidationError("Must be Unicode text (a lone surrogate escape such as \\ud800 is not).")


class EnqueueRequestSchema(Schema):
    class Meta:
        unknown = RAISE

    batchId = fields.String(required=True, validate=_batch_id, metadata={
        "pattern": BATCH_ID_PATTERN,
        "description": "Names one shipment forever. Same batchId with other content is a conflict.",
        "example": "shipment-a-2026",
    })
    csv = fields.String(required=True, validate=_unicode_text, metadata={
        "description": "The CSV text: header 'sku,quantity', then one row per SKU.",
        "example": "sku,quantity\nWIDGET-RED-01,10\n",
    })
    location = location_field(required=False)


_ENQUEUE_FIELDS = frozenset({"batchId", "csv"})
_ENQUEUE_FIELDS_AT = frozenset({"batchId", "csv", "location"})


def plainly_valid_enqueue_request(data: object) -> dict[str, str] | None:
    """EnqueueRequestSchema().load(data) for a body that plainly passes it,
    without the schema machinery (about 9 µs a shipment: the largest Python
    item of a bulk request's line): exactly its fields, strings, each passing
    the schema's own rule. None for anything else, which the schema then
    reads, for its error message (tests/unit/test_plain_enqueue_request.py holds the
    two to the same answers)."""
    if type(data) is not dict or not (data.keys() == _ENQUEUE_FIELDS or data.keys() == _ENQUEUE_FIELDS_AT):
        return None
    batch_id, csv, location = data["batchId"], data["csv"], data.get("location", "")
    if type(batch_id) is not str or type(csv) is not str or type(location) is not str:
        return None
    if not is_valid_batch_id(batch_id) or _SURROGATE.search(csv) or ("location" in data and not is_valid_location(location)):
        return None
    return data


JOB_STATES = ("waiting", "active", "retrying", "completed", "failed")


class JobAcceptedSchema(Schema):
    jobId = fields.String(required=True, metadata={"example": "shipment-shipment-a-2026"})
    batchId = fields.String(required=True, metadata={"example": "shipment-a-2026"})
    location = location_field(required=True)
    state = fields.String(required=True, validate=validate.OneOf(_JOB_STATES))


class ProgressSchema(Schema):
    phase = fields.String(required=True, validate=validate.OneOf(["validated", "committed"]))
    rows = fields.Integer(required=True, metadata={"description": "Line items (rows) in the shipment, not units."})


class ResultSchema(Schema):
    imported = fields.Integer(required=True, metadata={"description": "Rows applied to stock."})
    batchId = fields.String(required=True)
    replay = fields.Boolean(metadata={"description": "Present and true when the batch had been applied before: nothing was added this time."})


class CsvIssueSchema(Schema):
    line = fields.Integer(required=True, metadata={"description": "1-based line of the file (the header is line 1)."})
    column = fields.Integer(required=True, allow_none=True, metadata={"description": "1 = sku, 2 = quantity, null = the whole line."})
    code = fields.String(required=True, metadata={"example": "csv.bad_quantity"})
    message = fields.String(required=True)


class RejectionsSchema(Schema):
    found = fields.Integer(required=True, metadata={"description": "Located issues the validator found."})
    listed = fields.Integer(required=True, metadata={"description": "Issues in the rejection report (at most 10,000)."})
    truncated = fields.Boolean(required=True, metadata={"description": "True when the report was cut: found > listed."})
    url = fields.String(metadata={
        "description": "The rejection report: GET it (as CSV) with the same key.",
        "example": "/api/imports/shipment-a-2026/rejections.csv",
    })


class JobErrorSchema(Schema):
    code = fields.String(required=True, metadata={"description": "Stable error code.", "example": "csv.bad_quantity"})
    message = fields.String(required=True, metadata={"description": "What to fix."})
    issues = fields.List(fields.Nested(CsvIssueSchema), metadata={
        "description": "Located CSV issues, for csv.* codes: the first 100 (every one kept is in the rejection report).",
    })
    issuesTruncated = fields.Boolean(metadata={"description": "True when more issues existed than listed."})
    rejections = fields.Nested(RejectionsSchema, metadata={
        "description": "For a failed CSV validation: the size of its rejection report and where to get it.",
    })


class JobStatusSchema(Schema):
    id = fields.String(required=True, metadata={"example": "shipment-shipment-a-2026"})
    batchId = fields.String(required=True)
    location = location_field(required=True)
    state = fields.String(required=True, validate=validate.OneOf(_JOB_STATES))
    attempt = fields.Integer(required=True, metadata={
        "description": "The current attempt (1-based; 0 before the first). progress always belongs to this attempt.",
    })
    progress = fields.Nested(ProgressSchema, required=True, allow_none=True)
    result = fields.Nested(ResultSchema, required=True, allow_none=True)
    error = fields.Nested(JobErrorSchema, required=True, allow_none=True)
    createdAt = fields.DateTime(required=True)
    updatedAt = fields.DateTime(required=True)
    startedAt = fields.DateTime(allow_none=True)
    finishedAt = fields.DateTime(allow_none=True)
    nextAttemptAt = fields.DateTime(allow_none=True, metadata={"description": "When state is retrying: the earliest next attempt."})
    retries = fields.Integer(required=True, metadata={
        "description": "How many times you retried it (POST /api/imports/{jobId}/retry); attempt counts within the latest.",
    })
    retryable = fields.Boolean(required=True, metadata={
        "description": "True when it failed for a reason a retry can change: POST /api/imports/{jobId}/retry is accepted.",
    })


class JobListSchema(Schema):
    items = fields.List(fields.Nested(JobStatusSchema), required=True, metadata={
        "description": "The caller's job records, newest first (by createdAt); each as GET /api/imports/{jobId} answers.",
    })
    nextCursor = fields.String(required=True, allow_none=True, metadata={
        "description": (
            "Pass as ?cursor= for the next page; null at the end. A page may hold fewer items than the limit "
            "(even none) and still have a nextCursor when a state filter matched few records."
        ),
    })


class JobEventSchema(Schema):
    """One event of GET /api/imports/{jobId}/events (the SSE data line, as JSON)."""

    id = fields.String(required=True, metadata={"description": "The Redis stream id; also the SSE id (send it back as Last-Event-ID)."})
    event = fields.String(required=True, validate=validate.OneOf(["waiting", "active", "progress", "retrying", "completed", "failed"]))
    jobId = fields.String(required=True)
    batchId = fields.String(required=True)
    attempt = fields.Integer(required=True)
    data = fields.Dict(required=True, metadata={
        "description": (
            "progress: {phase, rows}; completed: the result; failed and retrying: the error; waiting: {} or, "
            "when its owner retried the failed import, {retry: n} (the n-th retry: a new attempt chain); else {}."
        ),
    })


class ShipmentSchema(Schema):
    batchId = fields.String(required=True, metadata={"example": "shipment-a-2026"})
    location = location_field(required=True)
    state = fields.String(required=True, validate=validate.OneOf(["applied"]))
    appliedAt = fields.DateTime(required=True)
    result = fields.Nested(ResultSchema, required=True)
    contentSha256 = fields.String(required=True, metadata={
        "description": "SHA-256 of the canonical content (rows sorted by SKU, 'sku,quantity\\n' each).",
    })


class ReceiptItemSchema(Schema):
    sku = fields.String(required=True, metadata={"example": "WIDGET-RED-01"})
    before = fields.Integer(required=True, metadata={"description": "Units on hand just before this shipment was applied."})
    after = fields.Integer(required=True, metadata={"description": "Units on hand just after (after - before = the row's quantity)."})


class ReceiptSchema(Schema):
    """What one applied shipment changed (GET /api/shipments/{batchId}/receipt, as JSON)."""

    batchId = fields.String(required=True, metadata={"example": "shipment-a-2026"})
    jobId = fields.String(required=True, metadata={
        "description": "The job that applied the batch (the first application; a replay never writes a receipt).",
        "example": "shipment-shipment-a-2026",
    })
    appliedAt = fields.DateTime(required=True)
    rows = fields.Integer(required=True, metadata={"description": "Rows of the shipment: the number of items."})
    items = fields.List(fields.Nested(ReceiptItemSchema), required=True, metadata={
        "description": "One per row of the file, in the file's order.",
    })


class ShipmentListSchema(Schema):
    """GET /api/shipments: the caller's applied shipments as the ledger holds them, newest first."""

    items = fields.List(fields.Nested(ShipmentSchema), required=True, metadata={
        "description": "Each as GET /api/shipments/{batchId} answers it; newest first (by appliedAt).",
    })
    nextCursor = fields.String(required=True, allow_none=True, metadata={"description": "Pass as ?cursor= for the next page; null at the end."})


class MovementSchema(Schema):
    """One line of an applied shipment: what it did to one SKU's stock at one location."""

    location = location_field(required=True)
    batchId = fields.String(required=True, metadata={"example": "shipment-a-2026"})
    line = fields.Integer(required=True, metadata={"description": "The row's position in the file (1: the first row)."})
    sku = fields.String(required=True, metadata={"example": "WIDGET-RED-01"})
    before = fields.Integer(required=True, metadata={"description": "Units on hand just before this shipment."})
    quantity = fields.Integer(required=True, metadata={"description": "Units this row added."})
    after = fields.Integer(required=True, metadata={"description": "Units on hand just after (before + quantity)."})
    appliedAt = fields.DateTime(required=True)
    owner = fields.String(required=True, metadata={"description": "The producer whose shipment it was."})


class MovementListSchema(Schema):
    items = fields.List(fields.Nested(MovementSchema), required=True, metadata={"description": "Newest first (by appliedAt)."})
    nextCursor = fields.String(required=True, allow_none=True, metadata={"description": "Pass as ?cursor= for the next page; null at the end."})


class StockLevelSchema(Schema):
    sku = fields.String(required=True, metadata={"example": "WIDGET-RED-01"})
    units = fields.Integer(required=True, metadata={"description": "Units on hand."})


class StockSchema(Schema):
    """GET /api/stock: a location's stock levels, now or as of a time."""

    location = location_field(required=True)
    asOf = fields.DateTime(required=True, allow_none=True, metadata={"description": "null: now (from the live store)."})
    items = fields.List(fields.Nested(StockLevelSchema), required=True, metadata={
        "description": "SKUs with their units; as of a time, in SKU order; now, in no order across pages.",
    })
    nextCursor = fields.String(required=True, allow_none=True, metadata={"description": "Pass as ?cursor= for the next page; null at the end."})


class SkuStockSchema(Schema):
    """GET /api/stock/{sku}: one SKU's units at a location, now or as of a time."""

    location = location_field(required=True)
    sku = fields.String(required=True, metadata={"example": "WIDGET-RED-01"})
    asOf = fields.DateTime(required=True, allow_none=True, metadata={"description": "null: now (from the live store)."})
    units = fields.Integer(required=True, metadata={"description": "Units on hand (0 for a SKU never received)."})


class WorkersSchema(Schema):
    """[door] The live workers as the door check sees them (no names or addresses)."""

    alive = fields.Integer(required=True, metadata={"description": "Worker processes alive now (0: imports wait for one)."})
    acceptedVersions = fields.List(fields.Integer(), required=True, metadata={
        "description": "Every contract version some live worker accepts, ascending.",
    })
    producerVersion = fields.Integer(required=True, metadata={"description": "The contract version this server sends."})
    acceptsImports = fields.Boolean(required=True, metadata={
        "description": "false: a new import answers 503 contract.no_worker (live workers, none accepts producerVersion).",
    })


class LedgerHealthSchema(Schema):
    """[ledger] The ledger as /health sees it (at most a second old)."""

    up = fields.Boolean(required=True, metadata={"description": "The ledger (PostgreSQL) answered."})
    lagEntries = fields.Integer(required=True, allow_none=True, metadata={
        "description": "Applied shipments not yet in the ledger, every location together (null: unknown, the ledger is down).",
    })
    lagSeconds = fields.Float(required=True, allow_none=True, metadata={
        "description": "Age of the oldest applied shipment not yet in the ledger, in seconds (0: none; null: unknown).",
    })


class IntakeHealthSchema(Schema):
    """[ops] Whether operators paused new uploads (POST /api/ops/intake)."""

    paused = fields.Boolean(required=True, metadata={"description": "true: new uploads answer 503 intake.paused at `locations`."})
    locations = fields.List(fields.String(), required=True, metadata={
        "description": "Where intake is paused ('*': everywhere); empty when it runs everywhere.",
    })


class HealthSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(["ok", "unavailable"]))
    reason = fields.String(metadata={"description": "Why the service is unavailable: 'closing', 'redis_unreachable', 'redis_refuses_writes' (full, read-only, loading), 'broker_blocked' (RabbitMQ's memory or disk alarm) or 'broker_unreachable'."})
    workers = fields.Nested(WorkersSchema, metadata={"description": "With status ok: the live workers."})
    ledger = fields.Nested(LedgerHealthSchema, metadata={
        "description": "With status ok and a ledger configured: whether it answers and its export lag (never a reason for 503).",
    })
    intake = fields.Nested(IntakeHealthSchema, metadata={
        "description": "With status ok: whether operators paused intake. Paused is still 200: reads, event streams and "
                       "retries go on, and every node pauses alike.",
    })


class BulkRequestSchema(Schema):
    shipments = fields.List(fields.Nested(EnqueueRequestSchema), required=True, validate=validate.Length(min=1, max=1000),
                            metadata={"description": "The shipments, each as POST /api/imports takes it."})


class BulkResultSchema(Schema):
    status = fields.Integer(required=True, metadata={"description": "The status a single POST of this line would get (202, 409...)."})
    body = fields.Dict(required=True, metadata={
        "description": "The body that POST would get: a JobAccepted with 202, else a Problem.",
    })
    retryAfter = fields.Integer(metadata={"description": "Seconds to wait, when that answer had a Retry-After (429, 503)."})


class BulkResultsSchema(Schema):
    results = fields.List(fields.Nested(BulkResultSchema), required=True, metadata={"description": "One per line, in order."})


class ProblemSchema(Schema):
    """RFC 9457 problem details, with a stable ``code``."""

    type = fields.String(required=True, metadata={"example": "https://importer.example/problems/job.not_found"})
    title = fields.String(required=True)
    status = fields.Integer(required=True)
    detail = fields.String(required=True, metadata={"description": "What to do about it."})
    code = fields.String(required=True, metadata={"example": "job.not_found"})
    instance = fields.String(metadata={"description": "The request path."})
    fields_ = fields.Dict(
        data_key="fields",
        keys=fields.String(),
        values=fields.List(fields.String()),
        metadata={"description": "For request.invalid: the invalid fields and why."},
    )
    producerVersion = fields.Integer(metadata={"description": "For contract.no_worker: the contract version this server sends."})
    acceptedVersions = fields.List(fields.Integer(), metadata={
        "description": "For contract.no_worker: every contract version the live workers accept.",
    })
    state = fields.String(validate=validate.OneOf(_JOB_STATES), metadata={
        "description": "For job.not_retryable: the import's state.",
    })
    errorCode = fields.String(metadata={"description": "For job.not_retryable of a failed import: its failure's code."})
