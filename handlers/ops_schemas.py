"""[ops] The marshmallow schemas of the operators' routes (handlers/ops.py), in openapi.yaml."""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from importer.handlers.schemas import location_field

_COUNTS = fields.Dict(keys=fields.String(), values=fields.Integer())


class OpsWorkerSchema(Schema):
    id = fields.String(required=True, metadata={"description": "host:pid:random, as `importer doctor` shows it."})
    release = fields.String(required=True, metadata={"description": "The Importer release the worker runs."})
    acceptedVersions = fields.List(fields.Integer(), required=True, metadata={"description": "Contract versions it accepts."})
    lastBeatAgeSeconds = fields.Float(required=True, metadata={"description": "Seconds since its last presence beat."})
    inFlight = fields.Integer(required=True, metadata={"description": "Messages it was running at its last beat."})
    startedAt = fields.DateTime(required=True, allow_none=True)


class OpsFailuresSchema(Schema):
    lastHour = _COUNTS
    lastDay = _COUNTS


class OpsLagSchema(Schema):
    lagEntries = fields.Integer(required=True)
    lagSeconds = fields.Float(required=True)
    behindShipments = fields.Integer(load_default=0, dump_default=0, metadata={
        "description": "Shipments the ledger holds that this location's Redis lacked when it came back behind "
                       "(restored from an older backup, emptied): intake and applies wait here until it is "
                       "brought forward. 0: not behind."})


class OpsLocationSchema(Schema):
    location = location_field(required=True)
    waiting = fields.Integer(required=True)
    oldestWaitingAgeSeconds = fields.Float(required=True, metadata={"description": "0 when none waits."})
    active = fields.Integer(required=True)
    retrying = fields.Integer(required=True, metadata={"description": "Sent imports between two attempts."})
    failedKept = fields.Integer(required=True, metadata={"description": "Failed records still kept (retention removes them)."})
    stalls = fields.Integer(required=True, metadata={"description": "Attempts whose lease ran out (a worker stalled or died), ever."})
    intakePaused = fields.Boolean(required=True)
    failures = fields.Nested(OpsFailuresSchema, required=True, metadata={
        "description": "Failed imports by error code: the last hour (5-minute buckets) and the last day (hourly buckets).",
    })
    ledger = fields.Nested(OpsLagSchema, allow_none=True, required=True, metadata={
        "description": "The ledger's export lag here; null without a ledger, or while it is down.",
    })


class OpsPauseSchema(Schema):
    location = fields.String(required=True, metadata={"description": "The location, or '*': every one."})
    by = fields.String(required=True)
    at = fields.DateTime(required=True, allow_none=True)


class OpsOverviewSchema(Schema):
    workers = fields.List(fields.Nested(OpsWorkerSchema), required=True)
    locations = fields.List(fields.Nested(OpsLocationSchema), required=True)
    intake = fields.List(fields.Nested(OpsPauseSchema), required=True, metadata={"description": "Where intake is paused."})
    ledgerUp = fields.Boolean(required=True, allow_none=True, metadata={"description": "null: no ledger configured."})
    nextCursor = fields.String(required=True, allow_none=True, metadata={"description": "The next page of locations (?cursor=)."})


class OpsRetryRequestSchema(Schema):
    location = location_field(required=True)
    errorCode = fields.String(required=True, metadata={"example": "import.store_unavailable"})
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))


class OpsRetryResultSchema(Schema):
    retried = fields.List(fields.String(), required=True, metadata={"description": "The jobIds now waiting again."})
    skipped = fields.Dict(keys=fields.String(), values=fields.String(), required=True,
                          metadata={"description": "jobId -> why it was not retried."})
    more = fields.Boolean(required=True, metadata={"description": "More failed imports with that code remain: send again."})


class OpsIntakeRequestSchema(Schema):
    paused = fields.Boolean(required=True)
    location = fields.String(load_default="*", metadata={"description": "A declared location, or '*' (the default): every one."})


class OpsIntakeSchema(Schema):
    intake = fields.List(fields.Nested(OpsPauseSchema), required=True, metadata={"description": "Where intake is paused now."})


class OpsFailedImportSchema(Schema):
    jobId = fields.String(required=True)
    owner = fields.String(required=True)
    errorCode = fields.String(required=True)


class OpsFailedListSchema(Schema):
    items = fields.List(fields.Nested(OpsFailedImportSchema), required=True)
    nextCursor = fields.String(required=True, allow_none=True)


class OpsImportSchema(Schema):
    record = fields.Dict(required=True, metadata={"description": "The job record as GET /api/imports/{jobId} shows it."})
    owner = fields.String(required=True)
    diagnostic = fields.String(required=True, metadata={"description": "What the API never shows producers (from logs' side)."})
    traceparent = fields.String(required=True, allow_none=True, metadata={
        "description": "The W3C traceparent of the POST that made it (null: tracing was off): find its trace.",
    })


class OpsActionSchema(Schema):
    id = fields.String(required=True)
    at = fields.DateTime(required=True)
    by = fields.String(required=True)
    action = fields.String(required=True, validate=validate.OneOf(["retry-failed", "intake"]))
    detail = fields.Dict(required=True)


class OpsActionListSchema(Schema):
    items = fields.List(fields.Nested(OpsActionSchema), required=True)
    nextCursor = fields.String(required=True, allow_none=True)
