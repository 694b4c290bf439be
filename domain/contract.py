"""The versioned contract of the queue message a producer sends to workers.

The message carries references, never the CSV itself, so its size does not
depend on the file's size.

Rolling upgrade order (README, "Contract versions"): first deploy workers that accept both
the old and the new version (``IMPORTER_ACCEPTED_VERSIONS=1,2``), then the
producers that emit the new one (``IMPORTER_PRODUCER_VERSION=2``), then drop
the old version from the workers once no old message remains in the queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from importer.domain.errors import InvalidMessage, UnsupportedContractVersion
import re

from importer.domain.shipment import is_valid_batch_id

_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")

#: Versions this code base can read. A worker accepts a configured subset.
KNOWN_VERSIONS = frozenset({1})
CURRENT_VERSION = 1


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


_SCHEMAS: dict[int, Schema] = {1: ImportMessageV1()}
_V1_FIELDS = frozenset(ImportMessageV1().fields)


@dataclass(frozen=True)
class ImportMessage:
    version: int
    job_id: str
    batch_id: str
    upload_id: str


def encode_message(job_id: str, batch_id: str, upload_id: str, *, version: int = CURRENT_VERSION) -> dict[str, object]:
    """The message body a producer sends (validated against its own schema)."""
    if version not in _SCHEMAS:
        raise UnsupportedContractVersion(version)
    body = {"version": version, "jobId": job_id, "batchId": batch_id, "uploadId": upload_id}
    errors = _SCHEMAS[version].validate(body)
    if errors:
        raise InvalidMessage(f"refusing to send an invalid message: {sorted(errors)}")
    return body


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
    return ImportMessage(version, data["jobId"], data["batchId"], data["uploadId"])


def _plain_v1(payload: Mapping[str, object]) -> ImportMessage | None:
    """A valid version-1 message read without the schema machinery (a third
    of a small import's Python time on the worker went to it): exactly the
    schema's fields, each passing the schema's own rules. None for anything
    else, which the schema then reads, for its error message."""
    if payload.keys() != _V1_FIELDS:
        return None
    job_id, batch_id, upload_id = payload["jobId"], payload["batchId"], payload["uploadId"]
    if (
        type(job_id) is str and 1 <= len(job_id) <= 128
        and type(batch_id) is str and is_valid_batch_id(batch_id)
        and type(upload_id) is str and _UPLOAD_ID.fullmatch(upload_id) is not None
    ):
        return ImportMessage(1, job_id, batch_id, upload_id)
    return None


def job_id_of(payload: object) -> str | None:
    """Best-effort job id of a message we cannot decode, to record its failure."""
    if isinstance(payload, Mapping):
        job_id = payload.get("jobId")
        if isinstance(job_id, str) and 0 < len(job_id) <= 128:
            return job_id
    return None
