"""[ops] The operators' routes, under /api/ops/: for keys with the ``ops`` scope
(``importer keys create NAME --scopes ops``); any other key gets 403
auth.scope_required on every one of them.

* ``GET /api/ops/overview``: the live workers, and per declared location its
  queue (waiting, active, retrying, the oldest waiting age), failures by code
  over the last hour and day, stalls, intake, and the ledger's export lag;
* ``POST /api/ops/retry-failed``: retry in bulk a location's failed imports of one code;
* ``POST /api/ops/intake``: pause or resume new uploads, at one location or everywhere;
* ``GET /api/ops/failed``: a location's failed imports, by code;
* ``GET /api/ops/imports/{jobId}``: any import's record with its diagnostic (``importer inspect``);
* ``GET /api/ops/actions``: what operators did, by whom and when.

Every action is logged (``ops.action``) and kept in the store's log of actions.
Every page costs a bounded number of store calls: the overview one script call
per location of its page (``limit``), the lists one bounded read each.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from typing import Any

from marshmallow import ValidationError

from importer.domain.locations import MAIN, is_valid_location, location_of_job
from importer.domain.operations import EVERYWHERE, NotARetryableCode, OpsStore, recent_failures, retry_failed
from importer.domain.retry_import import RETRYABLE_CODES
from importer.handlers.api import Api, _field_errors, job_status
from importer.handlers import query
from importer.handlers.query import JOB_ID, LOCATION, MILLIS, STREAM_ID, Field, encode_cursor
from importer.handlers.http import Request, Response, json_response
from importer.handlers.ops_schemas import (
    OpsActionListSchema, OpsFailedListSchema, OpsImportSchema, OpsIntakeRequestSchema, OpsIntakeSchema,
    OpsOverviewSchema, OpsRetryRequestSchema, OpsRetryResultSchema,
)
from importer.handlers.problems import ApiError

log = logging.getLogger("importer.ops")

_OVERVIEW, _RETRY_IN, _RETRY_OUT = OpsOverviewSchema(), OpsRetryRequestSchema(), OpsRetryResultSchema()
_INTAKE_IN, _INTAKE_OUT, _FAILED = OpsIntakeRequestSchema(), OpsIntakeSchema(), OpsFailedListSchema()
_IMPORT, _ACTIONS = OpsImportSchema(), OpsActionListSchema()
_NO_STORE = (("Cache-Control", "no-store"),)
#: What an error code looks like (import.time_limit, csv.bad_sku).
_ERROR_CODE = re.compile(r"^[a-z0-9_]{1,32}(\.[a-z0-9_]{1,32}){0,3}$")


def _ops(api: Api, req: Request) -> OpsStore:
    """The store's operator side, for a key with the ops scope only."""
    if req.principal is None or not req.principal.operates:
        raise ApiError("auth.scope_required")
    if api.operations is None:
        raise ApiError("service.unavailable", (("Retry-After", "1"),))
    return api.operations


def _time(ms: Any) -> datetime | None:
    return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc) if isinstance(ms, int) else None


def _page(req: Request, default: int, most: int, shape: tuple[Field, ...],
          errors: dict[str, list[str]] | None = None) -> tuple[int, list[Any] | None]:
    """?limit= and ?cursor= (a position of ``shape``); 422 request.invalid naming every bad field."""
    errors = {} if errors is None else errors
    limit = query.limit(req.query, errors, default=default, most=most)
    position = query.cursor(req.query, errors, shape)
    if errors:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": errors})
    return limit, position


def _declared(store: OpsStore, location: Any, errors: dict[str, list[str]]) -> str:
    if not isinstance(location, str) or not is_valid_location(location) or location not in store.locations():
        errors["location"] = ["Not a declared location (importer locations list)."]
        return MAIN
    return location


def _body(req: Request, schema: Any) -> dict[str, Any]:
    try:
        data = json.loads(req.body or b"{}")
    except (ValueError, RecursionError):
        raise ApiError("request.bad_json", instance=req.path) from None
    try:
        loaded: dict[str, Any] = schema.load(data if isinstance(data, dict) else {"_": data})
    except ValidationError as err:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": _field_errors(err)}) from None
    return loaded


def _paused(intake: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"location": where, "by": str(who.get("by", "")), "at": _time(who.get("at"))}
            for where, who in intake.items()]


def _record(store: OpsStore, req: Request, action: str, detail: dict[str, Any]) -> None:
    by = req.owner or ""
    store.record_action(by, action, detail)
    log.info("ops action", extra={"event": "ops.action", "by": by, "action": action, **{f"ops_{k}": v for k, v in detail.items()}})


def overview(api: Api, req: Request) -> Response:
    """GET /api/ops/overview: one page of locations (declared order), the workers, intake."""
    store = _ops(api, req)
    limit, after = _page(req, 50, 200, (LOCATION,))
    locations = [loc for loc in store.locations() if after is None or loc > after[0]]
    page = sorted(locations)[:limit]
    paused = store.intake()
    lags = api.ledger_lags()
    rows = []
    for location in page:
        queue = store.location_queue(location)
        hour, day = recent_failures(queue.recent, queue.now_ms)
        rows.append({
            "location": location, "waiting": queue.waiting, "oldestWaitingAgeSeconds": round(queue.oldest_waiting_age_s, 3),
            "active": queue.active, "retrying": queue.retrying, "failedKept": queue.failed_kept, "stalls": queue.stalls,
            "intakePaused": EVERYWHERE in paused or location in paused,
            "failures": {"lastHour": hour, "lastDay": day},
            "ledger": (lags or {}).get(location),
        })
    workers = [{
        "id": w.id, "release": str(w.info.get("release", "unknown")), "acceptedVersions": sorted(w.accepts),
        "lastBeatAgeSeconds": w.last_beat_age_s, "inFlight": int(w.info.get("inFlight", 0)),
        "startedAt": _time(w.info.get("startedAt")),
    } for w in store.workers_now()]
    payload = {
        "workers": workers, "locations": rows, "intake": _paused(paused),
        "ledgerUp": None if lags is None else bool(lags),
        "nextCursor": encode_cursor([page[-1]]) if len(locations) > limit else None,
    }
    return json_response(200, _OVERVIEW.dump(payload), _NO_STORE)


def retry_failed_imports(api: Api, req: Request) -> Response:
    """POST /api/ops/retry-failed: {location, errorCode, limit?}: retry those failed imports, each as its owner."""
    store = _ops(api, req)
    body = _body(req, _RETRY_IN)
    errors: dict[str, list[str]] = {}
    location = _declared(store, body["location"], errors)
    if body["errorCode"] not in RETRYABLE_CODES:
        errors["errorCode"] = [f"A retry cannot change {body['errorCode']!r}; one of: {', '.join(sorted(RETRYABLE_CODES))}."]
    if errors:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": errors})
    try:
        done = retry_failed(store, api.store, api.sender, location=location, code=body["errorCode"],
                            limit=body["limit"], uuidgen=api.uuidgen)
    except NotARetryableCode:  # checked above
        raise ApiError("request.invalid", instance=req.path) from None
    _record(store, req, "retry-failed", {"location": location, "errorCode": body["errorCode"],
                                         "retried": len(done.retried), "skipped": len(done.skipped)})
    return json_response(200, _RETRY_OUT.dump({"retried": done.retried, "skipped": done.skipped, "more": done.more}), _NO_STORE)


def set_intake(api: Api, req: Request) -> Response:
    """POST /api/ops/intake: {paused, location?}: pause or resume new uploads."""
    store = _ops(api, req)
    body = _body(req, _INTAKE_IN)
    errors: dict[str, list[str]] = {}
    location = body["location"] if body["location"] == EVERYWHERE else _declared(store, body["location"], errors)
    if errors:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": errors})
    store.set_intake(location, paused=body["paused"], by=req.owner or "")
    _record(store, req, "intake", {"location": location, "paused": body["paused"]})
    return json_response(200, _INTAKE_OUT.dump({"intake": _paused(store.intake())}), _NO_STORE)


def list_failed(api: Api, req: Request) -> Response:
    """GET /api/ops/failed?location=&errorCode=: a location's failed imports, newest first."""
    store = _ops(api, req)
    errors: dict[str, list[str]] = {}
    location = _declared(store, req.query.get("location", MAIN), errors)
    code = req.query.get("errorCode")
    if code is not None and _ERROR_CODE.fullmatch(code) is None:
        errors["errorCode"] = ["Must be an error code, e.g. import.time_limit."]
    limit, after = _page(req, 50, 500, (MILLIS, JOB_ID), errors)
    items, position = store.failed_imports(location, code=code, limit=limit,
                                           after=(after[0], after[1]) if after else None)
    payload = {"items": [{"jobId": f.job_id, "owner": f.owner, "errorCode": f.code} for f in items],
               "nextCursor": encode_cursor(list(position)) if position else None}
    return json_response(200, _FAILED.dump(payload), _NO_STORE)


def get_import(api: Api, req: Request) -> Response:
    """GET /api/ops/imports/{jobId}: any owner's record, with the operator diagnostic."""
    store = _ops(api, req)
    job_id = req.path_params["jobId"]
    location = location_of_job(job_id)
    record = store.get_job(job_id) if location in store.locations() else None
    if record is None:
        raise ApiError("job.not_found")
    payload = {"record": job_status(record), "owner": record.owner, "diagnostic": store.get_diagnostic(job_id),
               "traceparent": record.traceparent or None}
    return json_response(200, _IMPORT.dump(payload), _NO_STORE)


def list_actions(api: Api, req: Request) -> Response:
    """GET /api/ops/actions: what operators did, newest first."""
    store = _ops(api, req)
    limit, before = _page(req, 50, 500, (STREAM_ID,))
    items, last = store.actions(limit=limit, before=before[0] if before else None)
    payload = {"items": [{**item, "at": _time(item["at"])} for item in items],
               "nextCursor": encode_cursor([last]) if last else None}
    return json_response(200, _ACTIONS.dump(payload), _NO_STORE)


# -- the routes' OpenAPI operations (handlers/routes.py adds them to its table) --

_ERRORS = ("auth.required", "auth.invalid", "auth.scope_required", "service.unavailable")
_NOTES = {"auth.scope_required": "The API key lacks the ops scope (importer keys create NAME --scopes ops)"}
_CURSOR = query.CURSOR_PARAMETER
_LOCATION = {"name": "location", "in": "query", "required": False, "description": "A declared location (default main).",
             "schema": {"type": "string"}}


def _op(operation_id: str, summary: str, schema: str, description: str = "", **more: Any) -> dict[str, Any]:
    return {"operationId": operation_id, "summary": summary, "description": description,
            "responses": {"200": {"description": "The answer.", "content": {"application/json": {"schema": schema}}}},
            **more}


#: keyword arguments of handlers/routes.py's Route, one per route of this module.
ROUTE_SPECS: tuple[dict[str, Any], ...] = (
    dict(method="GET", template="/api/ops/overview", handler=overview, operation=_op(
        "opsOverview", "Operators: the live workers, and each location's queue, failures, intake and export lag",
        "OpsOverview", "One page of the declared locations (?limit=, default 50, at most 200; ?cursor=), each read "
        "in one step; the live workers; where intake is paused.", parameters=[query.limit_parameter(50, 200), _CURSOR],
    ), errors=(*_ERRORS, "request.invalid"), error_notes=_NOTES),
    dict(method="POST", template="/api/ops/retry-failed", handler=retry_failed_imports, operation=_op(
        "opsRetryFailed", "Operators: retry a location's failed imports of one error code (after an outage)",
        "OpsRetryResult", "Each import is retried as its owner's POST .../retry would (same checks; an applied batch "
        "replays, never applies twice), newest first, up to `limit` (default 100, at most 1,000): send again "
        "while `more`. Recorded in GET /api/ops/actions.",
        requestBody={"required": True, "content": {"application/json": {"schema": "OpsRetryRequest"}}},
    ), errors=(*_ERRORS, "request.bad_json", "request.invalid", "contract.no_worker"), error_notes={
        **_NOTES, "request.invalid": "location not declared, or errorCode not one a retry can change (see fields)",
    }),
    dict(method="POST", template="/api/ops/intake", handler=set_intake, operation=_op(
        "opsSetIntake", "Operators: pause or resume new uploads, at one location or everywhere",
        "OpsIntake", "While paused, POST /api/imports there answers 503 intake.paused with Retry-After, and "
        "/health says so (still 200). Reads, event streams and retries go on. Resuming '*' resumes every location. "
        "Recorded in GET /api/ops/actions.",
        requestBody={"required": True, "content": {"application/json": {"schema": "OpsIntakeRequest"}}},
    ), errors=(*_ERRORS, "request.bad_json", "request.invalid"), error_notes=_NOTES),
    dict(method="GET", template="/api/ops/failed", handler=list_failed, operation=_op(
        "opsListFailed", "Operators: a location's failed imports, newest first, any owner's",
        "OpsFailedList", "", parameters=[
            _LOCATION, {"name": "errorCode", "in": "query", "required": False,
                        "schema": {"type": "string", "pattern": _ERROR_CODE.pattern}},
            query.limit_parameter(50, 500), _CURSOR,
        ],
    ), errors=(*_ERRORS, "request.invalid"), error_notes=_NOTES),
    dict(method="GET", template="/api/ops/imports/{jobId}", handler=get_import, operation=_op(
        "opsGetImport", "Operators: any import's record, its owner and its diagnostic (as importer inspect)",
        "OpsImport", "", parameters=[{"name": "jobId", "in": "path", "required": True, "schema": {"type": "string"}}],
    ), errors=(*_ERRORS, "job.not_found"), error_notes=_NOTES),
    dict(method="GET", template="/api/ops/actions", handler=list_actions, operation=_op(
        "opsListActions", "Operators: what operators did (bulk retries, intake), by whom and when, newest first",
        "OpsActionList", "", parameters=[query.limit_parameter(50, 500), _CURSOR],
    ), errors=(*_ERRORS, "request.invalid"), error_notes=_NOTES),
)
