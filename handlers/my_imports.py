"""The caller's own imports: the list (``GET /api/imports``), one job's
live events (``GET /api/imports/{jobId}/events``) and the retry of a failed
one (``POST /api/imports/{jobId}/retry``). Each is scoped to the
authenticated owner; another owner's job answers the same 404 bytes as a
missing one."""

from __future__ import annotations

from importer.domain.errors import JobNotFound, RateLimited
from importer.domain.locations import location_of_job
from importer.domain.retry_import import retry_import
from importer.handlers.answers import RETRY_AFTER_STREAM_SLOT_S, retry_after
from importer.handlers.api import Api, job_status, request_location
from importer.handlers.event_stream import STREAM_ID, JobEventStream
from importer.handlers.http import Request, Response, json_response
from importer.handlers.problems import ApiError
from importer.handlers import query
from importer.handlers.query import JOB_ID, MILLIS
from importer.handlers.schemas import JOB_STATES

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def list_imports(api: Api, req: Request) -> Response:
    """GET /api/imports: the caller's job records, newest first, one page."""
    errors: dict[str, list[str]] = {}
    limit = query.limit(req.query, errors, default=DEFAULT_LIMIT, most=MAX_LIMIT)
    state = req.query.get("state")
    if state is not None and state not in JOB_STATES:
        errors["state"] = ["Must be one of " + ", ".join(JOB_STATES) + "."]
    given = query.cursor(req.query, errors, (MILLIS, JOB_ID))
    after = (given[0], given[1]) if given else None
    if errors:
        raise ApiError("request.invalid", instance=req.path, extra={"fields": errors})
    owner = req.owner or ""
    within = req.principal.locations if req.principal is not None else None
    location = request_location(api, req) if "location" in req.query else None  # None: every location (the key allows)
    if location is not None:
        owner = req.owner_at(location) or ""  # a location the key does not allow: an empty list, as for one without imports
    records, position = api.store.list_jobs(owner, limit=limit, state=state, after=after, location=location, within=within)
    payload = {
        "items": [job_status(record) for record in records],
        "nextCursor": query.encode_cursor(position) if position is not None else None,
    }
    # Each item is already the status answer's dump (JobListSchema documents the shape).
    return json_response(200, payload, (("Cache-Control", "no-store"),))


def job_events(api: Api, req: Request) -> Response:
    """GET /api/imports/{jobId}/events: the job's events as text/event-stream."""
    job_id = req.path_params["jobId"]
    owner = req.owner_at(location_of_job(job_id))
    record = api.store.get_owned_job(job_id, owner) if owner else None
    if record is None:
        raise ApiError("job.not_found")  # the same bytes as GET /api/imports/{jobId}
    last_id = req.headers.get("last-event-id", "").strip()
    after_id = last_id if STREAM_ID.fullmatch(last_id) else "0-0"
    streams = api.event_streams
    if not streams.slots.try_acquire():
        raise ApiError("service.busy", retry_after(RETRY_AFTER_STREAM_SLOT_S))
    stream = JobEventStream(
        api.store,
        streams,
        record,
        after_id,
        closing=lambda: api.lifecycle.closing,
        unavailable_errors=api.unavailable_errors,
        on_store_error=api.on_store_error,
    )
    headers = (
        ("Content-Type", "text/event-stream; charset=utf-8"),
        ("Cache-Control", "no-store"),
        # nginx (and proxies that honour it): pass each event on at once.
        ("X-Accel-Buffering", "no"),
    )
    return Response(200, b"", headers, stream=stream)


def retry(api: Api, req: Request) -> Response:
    """POST /api/imports/{jobId}/retry: the use case "retry a failed import"
    (importer.domain.retry_import). It has no body. Like a POST of an import
    it takes one of the owner's rate-limit tokens first (for any job id, so a
    429 tells nothing about the job); then 202 with the enqueue answer's
    shape, or the same 404 as GET /api/imports/{jobId} of a missing job, or
    409 job.not_retryable saying why."""
    wait_ms = api.store.take_rate_token(req.owner or "")
    if wait_ms:
        raise RateLimited.after_ms(wait_ms)
    job_id = req.path_params["jobId"]
    try:
        accepted = retry_import(  # at a location the key does not allow, as nobody: the 404 of a missing job
            api.store, api.sender, job_id=job_id, owner=req.owner_at(location_of_job(job_id)) or "", upload_id=api.uuidgen(),
        )
    except JobNotFound:
        raise ApiError("job.not_found") from None  # no instance member: the same bytes as GET's
    body = {
        "jobId": accepted.job_id, "batchId": accepted.batch_id, "location": location_of_job(accepted.job_id),
        "state": accepted.state,
    }
    return json_response(202, body, (("Location", f"/api/imports/{accepted.job_id}"),))
