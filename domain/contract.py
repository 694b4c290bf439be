"""The versioned contract of the queue message a producer sends to workers.

The message carries references, never the CSV itself, so its size does not
depend on the file's size.

Rolling upgrade order (docs/reliability.md, "Contract versions"): first deploy workers that accept both
the old and the new version (``IMPORTER_ACCEPTED_VERSIONS=1,2``), then the
producers that emit the new one (``IMPORTER_PRODUCER_VERSION=2``), then drop
the old version from the workers once no old message remains in the queue.
A producer refuses new work at the door when live workers exist and none
accepts its version (:func:`live_workers_can_run`): the wrong order fails
loudly with ``503 contract.no_worker`` instead of filling the failed list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from marshmallow import RAISE, Schema, ValidationError, fields, validate

import re
from collections.abc import Collection, Sequence

from importer.domain.errors import InvalidMessage, UnsupportedContractVersion

from importer.domain.shipment import is_valid_batch_id

_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
#: The HTTP request id as handlers/http.py keeps it (X-Request-Id).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

#: Versions this code base can read. A worker accepts a configured subset.
#: Version 3 is a group: one message that carries several imports
#: (:func:`encode_group`), sent only while every live worker accepts it.
KNOWN_VERSIONS = frozenset({1, 2, 3})
#: The version of a message that carries several imports of one location.
GROUP_VERSION = 3
#: Imports one group message carries at most: its size stays bounded (about
#: 200 bytes an import) whatever the bulk request that made them.
GROUP_MAX = 64
#: What a producer sends unless IMPORTER_PRODUCER_VERSION says otherwise.
CURRENT_VERSION = 1
#: What a worker accepts unless IMPORTER_ACCEPTED_VERSIONS says otherwise: the
#: current single message, and groups (which producers send only while every
#: live worker accepts them).
DEFAULT_ACCEPTED_VERSIONS = frozenset({CURRENT_VERSION, GROUP_VERSION})


def _require(ok: bool, message: str) -> None:
    # marshmallow 4 ignores a validator's return value: it must raise.
    if not ok:
        raise ValidationError(message)


class ImportMessageV1(Schema):
    """Version 1: ``{"version": 1, "jobId", "batchId", "uploadId"}``."""

    class Meta:
        unknown = RAISE

    version = fields.Integer(required=True, validate=validate.Equal(1))
    jobId = fields.String(required=True, validate=validate.Length(min=1, max=128))
    # fullmatch, not validate.Regexp: its re.match lets "$" accept a trailing newline.
    batchId = fields.String(required=True, validate=lambda v: _require(is_valid_batch_id(v), "not a valid batchId"))
    uploadId = fields.String(required=True, validate=lambda v: _require(_UPLOAD_ID.fullmatch(v) is not None, "not an upload id"))


class ImportMessageV2(ImportMessageV1):
    """Version 2: version 1 plus ``requestId``, the X-Request-Id of the POST
    that made the job, so one id follows an import from the HTTP log to the
    worker's log lines. Absent when no request made the message (the
    reconciler sending it again, a producer outside HTTP)."""

    version = fields.Integer(required=True, validate=validate.Equal(2))
    requestId = fields.String(validate=lambda v: _require(_REQUEST_ID.fullmatch(v) is not None, "not a request id"))


_SCHEMAS: dict[int, Schema] = {1: ImportMessageV1(), 2: ImportMessageV2()}
_GROUP_FIELDS = frozenset({"version", "jobs", "requestId"})
_GROUP_ENTRY_FIELDS = frozenset({"jobId", "batchId", "uploadId"})
_V1_FIELDS = frozenset(ImportMessageV1().fields)


@dataclass(frozen=True)
class ImportMessage:
    version: int
    job_id: str
    batch_id: str
    upload_id: str
    #: Version 2: the request that made the job (None when none did).
    request_id: str | None = None


def encode_message(
    job_id: str, batch_id: str, upload_id: str, *, version: int = CURRENT_VERSION, request_id: str | None = None,
) -> dict[str, object]:
    """The message body a producer sends (validated against its own schema).
    ``request_id`` goes into version 2 messages only."""
    if version not in _SCHEMAS:
        raise UnsupportedContractVersion(version)
    body: dict[str, object] = {"version": version, "jobId": job_id, "batchId": batch_id, "uploadId": upload_id}
    if version >= 2 and request_id is not None:
        body["requestId"] = request_id
    if _plainly_valid(body):
        return body
    errors = _SCHEMAS[version].validate(body)
    if errors:
        raise InvalidMessage(f"refusing to send an invalid message: {sorted(errors)}")
    return body


def _plainly_valid(body: Mapping[str, object]) -> bool:
    """The schema's rules for a message body's fields, checked without the
    schema machinery (a tenth of a POST's Python time, a third of a small
    import's on the worker). False sends the body through the schema, for
    its error message."""
    job_id, batch_id, upload_id = body["jobId"], body["batchId"], body["uploadId"]
    request_id = body.get("requestId")
    return (
        type(job_id) is str and 1 <= len(job_id) <= 128
        and type(batch_id) is str and is_valid_batch_id(batch_id)
        and type(upload_id) is str and _UPLOAD_ID.fullmatch(upload_id) is not None
        and (request_id is None or (type(request_id) is str and _REQUEST_ID.fullmatch(request_id) is not None))
    )


def decode_message(payload: object, accepted_versions: frozenset[int]) -> ImportMessage:
    """Read a queue message. Raises UnsupportedContractVersion or InvalidMessage (both permanent)."""
    if not isinstance(payload, Mapping):
        raise InvalidMessage("message body is not an object")
    version = payload.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise InvalidMessage("message has no integer version")
    if version not in accepted_versions or version not in _SCHEMAS:
        raise UnsupportedContractVersion(version)
    if version == 1:
        plain = _plain_v1(payload)
        if plain is not None:
            return plain
    try:
        data = _SCHEMAS[version].load(dict(payload))
    except ValidationError as err:
        raise InvalidMessage(f"fields {sorted(err.messages)} are not valid") from None
    return ImportMessage(version, data["jobId"], data["batchId"], data["uploadId"], data.get("requestId"))


def _plain_v1(payload: Mapping[str, object]) -> ImportMessage | None:
    """A valid version-1 message read without the schema machinery (a third
    of a small import's Python time on the worker went to it): exactly the
    schema's fields, each passing the schema's own rules. None for anything
    else, which the schema then reads, for its error message."""
    if payload.keys() != _V1_FIELDS or not _plainly_valid(payload):
        return None
    return ImportMessage(1, payload["jobId"], payload["batchId"], payload["uploadId"])  # type: ignore[arg-type]


def encode_group(jobs: Sequence[tuple[str, str, str]], *, request_id: str | None = None) -> dict[str, object]:
    """Version 3: ``{"version": 3, "jobs": [{"jobId", "batchId", "uploadId"}, ...], "requestId"?}``,
    one message for 1 to :data:`GROUP_MAX` imports of one location (``jobs``: (jobId, batchId, uploadId)).
    Each import keeps its own attempt, fencing token, outcome and events on the worker."""
    if not 1 <= len(jobs) <= GROUP_MAX:
        raise InvalidMessage(f"a group carries 1 to {GROUP_MAX} imports, not {len(jobs)}")
    entries = [{"jobId": job_id, "batchId": batch_id, "uploadId": upload_id} for job_id, batch_id, upload_id in jobs]
    body: dict[str, object] = {"version": GROUP_VERSION, "jobs": entries}
    if request_id is not None:
        body["requestId"] = request_id
    if not all(_plainly_valid(e) for e in entries) or not _plainly_valid({**entries[0], "requestId": request_id}):
        raise InvalidMessage("refusing to send an invalid group message")
    return body


def is_group(payload: object) -> bool:
    """Whether a message body is a group (version 3), whatever else is wrong with it."""
    return isinstance(payload, Mapping) and payload.get("version") == GROUP_VERSION


def decode_group(payload: object, accepted_versions: frozenset[int]) -> list[ImportMessage]:
    """Read a group message: each import it carries, in order (version 3 each).
    Raises UnsupportedContractVersion or InvalidMessage (both permanent) for the whole message."""
    if not isinstance(payload, Mapping) or payload.get("version") != GROUP_VERSION:
        raise InvalidMessage("message is not a group")
    if GROUP_VERSION not in accepted_versions:
        raise UnsupportedContractVersion(GROUP_VERSION)
    jobs, request_id = payload.get("jobs"), payload.get("requestId")
    if (not payload.keys() <= _GROUP_FIELDS or not isinstance(jobs, list) or not 1 <= len(jobs) <= GROUP_MAX
            or (request_id is not None and (type(request_id) is not str or _REQUEST_ID.fullmatch(request_id) is None))):
        raise InvalidMessage("a group is {version: 3, jobs: [1 to %d imports], requestId?}" % GROUP_MAX)
    messages = []
    for entry in jobs:
        if not isinstance(entry, Mapping) or entry.keys() != _GROUP_ENTRY_FIELDS or not _plainly_valid(entry):
            raise InvalidMessage("a group's import is {jobId, batchId, uploadId}, each valid")
        messages.append(ImportMessage(GROUP_VERSION, entry["jobId"], entry["batchId"], entry["uploadId"], request_id))
    return messages


def job_ids_of(payload: object) -> list[str]:
    """Best-effort job ids of any message body, a group's too ([] when none can be read)."""
    if is_group(payload):
        jobs = payload.get("jobs") if isinstance(payload, Mapping) else None
        return [j for j in (job_id_of(e) for e in (jobs if isinstance(jobs, list) else [])) if j]
    job_id = job_id_of(payload)
    return [job_id] if job_id else []


def job_id_of(payload: object) -> str | None:
    """Best-effort job id of a message we cannot decode, to record its failure."""
    if isinstance(payload, Mapping):
        job_id = payload.get("jobId")
        if isinstance(job_id, str) and 0 < len(job_id) <= 128:
            return job_id
    return None


def live_workers_can_run(version: int, live_workers_accept: Collection[frozenset[int]]) -> bool:
    """The door check: may a producer of ``version`` record new work now?

    ``live_workers_accept`` holds the accepted versions of each live worker.
    With no live worker at all the answer is yes (queued work waits for
    workers); with some, at least one of them must accept ``version``.
    (adapters/lua/enqueue.lua decides the same inside the enqueue script; a
    test holds the two to the same answers.)
    """
    return not live_workers_accept or any(version in accepts for accepts in live_workers_accept)


def every_live_worker_reads_groups(live_workers_accept: Collection[frozenset[int]]) -> bool:
    """May group messages (:data:`GROUP_VERSION`) be sent now? Only while every
    live worker reads them (with none alive too: queued work waits, as at the
    door); otherwise a worker that does not would fail every import it takes."""
    return all(GROUP_VERSION in accepts for accepts in live_workers_accept)
