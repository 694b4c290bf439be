"""Stable error codes and the human explanation shown for each.

A code is part of the public contract (clients switch on it); the
explanation says what the sender should fix. Neither ever contains internal
details: diagnostics go to logs and to the operator's `importer inspect`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: code -> (title, what to do about it). One table for the whole service so
#: that the worker, the HTTP layer and the docs cannot disagree.
EXPLANATIONS: dict[str, tuple[str, str]] = {
    # CSV content (permanent: the same bytes will fail the same way)
    "csv.not_utf8": ("CSV is not UTF-8", "Save the file as UTF-8 (with or without BOM) and send it again under a new batchId."),
    "csv.empty": ("CSV is empty", "Send a file whose first line is the header 'sku,quantity' followed by at least one row."),
    "csv.bad_header": ("CSV header is wrong", "The first line must be exactly 'sku,quantity'."),
    "csv.no_rows": ("CSV has no rows", "Add at least one 'sku,quantity' row below the header."),
    "csv.bad_row": ("CSV row has the wrong number of columns", "Each row must have exactly two columns: sku,quantity."),
    "csv.bad_sku": ("SKU is not valid", "A SKU is 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit."),
    "csv.bad_quantity": ("Quantity is not valid", "A quantity is a whole number from 1 to 1000000, digits only."),
    "csv.duplicate_sku": ("SKU appears twice", "List each SKU once per file; add the quantities together."),
    "csv.too_many_rows": ("CSV has too many rows", "Split the shipment into several files under the row limit, each with its own batchId."),
    "csv.invalid": ("CSV is not valid", "Fix the listed issues and send the file again under a new batchId."),
    # Batch identity and stock
    "batch.conflict": ("batchId already used for other content", "A batchId names one shipment forever. Use a new batchId for different content."),
    "stock.overflow": ("Stock would exceed its maximum", "A SKU would go above the maximum stock; check the quantities."),
    # Queue contract
    "contract.unsupported_version": ("Message contract version not supported", "The worker does not accept this message version; upgrade the workers before the producers, then retry the import (POST to its /retry path, or `importer retry`)."),
    "contract.invalid_message": ("Message is not valid", "The queue message does not follow the contract; it was not applied."),
    "contract.no_worker": ("No running worker accepts this server's contract version", "Nothing was recorded: the workers that are running cannot read the message version this server sends (producerVersion; the versions they accept are in acceptedVersions). Deploy workers that accept it first (IMPORTER_ACCEPTED_VERSIONS), then send again."),
    # Transient causes that exhausted their attempts
    "import.attempts_exhausted": ("Import failed after all attempts", "The import kept failing for a temporary reason. Retry it (POST to its /retry path, the console's Retry button or `importer retry`); it will not be applied twice."),
    "import.time_limit": ("Import took too long", "The import exceeded its time limit on every attempt. Retry it (POST to its /retry path, the console's Retry button or `importer retry`) once the workers are less busy, or split it into smaller files under new batchIds."),
    "import.store_unavailable": ("Storage was unavailable", "The stock store could not be reached on every attempt. Retry it later (POST to its /retry path, the console's Retry button or `importer retry`); it will not be applied twice."),
    "import.stalled": ("Import stalled too often", "The worker running the import stopped answering on more attempts than allowed (IMPORTER_MAX_STALLS) while the store was reachable. Nothing was applied twice; retry the import once the workers are healthy."),
    "import.worker_lost": ("Worker stopped during the import", "The worker running the import stopped answering; the import is tried again and will not be applied twice."),
    "import.upload_missing": ("Upload is gone", "The stored file for this job was removed, so it cannot be retried. Send the shipment again under a new batchId."),
    # HTTP
    "request.bad_json": ("Body is not valid JSON", "Send a JSON object {\"batchId\": ..., \"csv\": ...}."),
    "request.invalid": ("Request is not valid", "Fix the fields listed in 'fields' and send again."),
    "request.unsupported_media_type": ("Content type not supported", "Send application/json or text/csv."),
    "request.too_large": ("Upload is too large", "Split the shipment into smaller files."),
    "request.not_found": ("Not found", "Check the URL."),
    "request.rate_limited": ("Too many requests", "This producer sent too many imports in a short time. Wait for the number of seconds in Retry-After, then send again."),
    "request.method_not_allowed": ("Method not allowed", "See openapi.yaml for the methods of this path."),
    "auth.required": ("API key required", "Send 'Authorization: Bearer <key>' with a key issued for your producer."),
    "auth.invalid": ("API key not recognised", "This server does not know the key sent: it is mistyped, revoked, or from another server. Send a key issued for your producer (`importer dev` prints its own, the same on every start with one data folder)."),
    "auth.scope_required": ("API key lacks the scope this route needs", "Stock levels belong to the business, not to one producer: they need a key with the stock:read scope (your own movements: GET /api/stock-movements). The operators' routes (/api/ops/) need a key with the ops scope, and an operator's key does not upload shipments: send them with a producer's key. An operator issues one: importer keys create NAME --scopes stock:read (or ops)."),
    "intake.paused": ("Intake paused by an operator", "Operators paused new shipments here for a while (maintenance, an outage). Nothing was recorded: send the same request again after the seconds in Retry-After; your batchId is still yours."),
    "ledger.unavailable": ("History unavailable", "The stock history (the ledger) cannot be read now: it is not reachable, or this deployment keeps none (IMPORTER_DATABASE_URL). Retry later; imports are not affected."),
    "job.not_found": ("No such import job", "The job record does not exist or was removed by retention some time after it finished. A missing record does not mean the batch was never applied: read the batch's durable history at /api/shipments/ followed by its batchId."),
    "job.not_retryable": ("Import cannot be retried", "Only a failed import whose failure a retry can change (its attempts ran out, its time limit, the store or a worker was lost, a message or contract version the workers did not take) can be retried. 'detail' says why this one cannot; a failed CSV validation, a conflict or an overflow needs a new file under a new batchId."),
    "rejections.not_found": ("No rejection report for this import", "Only an import that failed CSV validation has a rejection report. Read the import itself (the same path without /rejections.csv): its state and error say what happened."),
    "location.not_found": ("No such stock location for this API key", "The location the request names (?location=, the body's location, or the server's default location when it names none) is not one this server's operators declared, or this key cannot send shipments there. Check the location, or ask for a key that names it."),
    "shipment.not_found": ("No applied shipment with this batchId", "This batch has not been applied (yet). If you sent it, its import says where it stands: its jobId is 'shipment-' followed by the batchId (and '@' and the location, away from main)."),
    "receipt.not_recorded": ("No receipt for this shipment", "This batch was applied before this service recorded receipts, so what it changed per SKU was not kept. The shipment itself (the same path without /receipt) says when it was applied."),
    "request.not_acceptable": ("Media type not available", "Send 'Accept: application/json' (the default) or 'Accept: text/csv'."),
    "response.too_large": ("Answer too large for this deployment", "This answer is larger than this deployment (serverless) can send at once. Read it from a server deployment (importer serve), which streams it."),
    "service.busy": ("Server busy", "This server holds as many live event streams, or reads as many request bodies or large uploads, as it takes at once. Retry after the seconds in Retry-After (an event stream: or poll the import itself, the same path without /events)."),
    "request.stream_unsupported": ("Live streams not supported here", "This deployment cannot hold a live stream open. Poll the import itself instead (the same path without /events)."),
    "service.unavailable": ("Service unavailable", "The service cannot reach its store or is shutting down. Retry later."),
    "request.incomplete": ("Body is incomplete", "The connection ended before the whole body arrived (fewer bytes than Content-Length, or a chunked body without its last chunk). Nothing was recorded: send the whole request again."),
    "request.length_required": ("Content-Length required", "This server cannot tell a chunked upload that was cut on the way from a whole one. Nothing was read or recorded: send the upload with a Content-Length header (any HTTP client does for a file or a byte string), or add a Content-Digest header (sha-256) that proves it whole."),
    "store.behind_ledger": ("The store is being brought forward from the ledger", "This stock location's store came back behind the ledger (restored from an older backup, or emptied) and is being brought forward from it. Nothing was recorded: send the same request again after Retry-After; nothing is lost or applied twice."),
    "request.bad_length": ("Content-Length is not valid", "Nothing was recorded. Content-Length must be the body's size in bytes, in ASCII digits."),
    "request.bad_digest": ("Content-Digest is not valid", "Nothing was recorded. Send Content-Digest as RFC 9530 says, with a sha-256 or sha-512 member: 'Content-Digest: sha-256=:<base64 of the SHA-256 of the body>:'."),
    "request.digest_mismatch": ("Body does not match its Content-Digest", "The bytes that arrived are not the bytes the digest was computed on: the upload was cut or changed on the way. Nothing was recorded: send the whole request again."),
    "request.timeout": ("Body too slow", "The body did not arrive within the server's time for reading one (IMPORTER_HTTP_BODY_TIMEOUT). Nothing was recorded: send the whole request again, faster, or through a proxy that buffers uploads."),
    "internal": ("Internal error", "Something went wrong on our side. Retry later; when you report it, quote the requestId of this answer (it is on every log line of the request)."),
}


def explain(code: str) -> tuple[str, str]:
    """Return (title, human explanation) for a stable code."""
    return EXPLANATIONS.get(code, EXPLANATIONS["internal"])


class DomainError(Exception):
    """Base of every error the pure core raises. Carries a stable code."""

    code = "internal"
    #: Permanent errors fail the job at once; retrying cannot help.
    permanent = True

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail or self.code)
        self.detail = detail


#: Located issues a job record shows inline (GET /api/imports/{jobId} and its
#: events stay small); the rejection report holds all that were kept.
INLINE_ISSUES = 100


@dataclass(frozen=True)
class CsvIssue:
    """One located problem in a CSV file. line/column are 1-based; column None = whole row.

    ``value`` is the offending cell's raw text as in the file (the whole line
    for a row-level issue, '' when there is none), cut to a bounded length by
    the validator."""

    line: int
    column: int | None
    code: str
    message: str
    value: str = ""


class CsvInvalid(DomainError):
    code = "csv.invalid"

    def __init__(self, issues: tuple[CsvIssue, ...], truncated: bool = False, found: int | None = None) -> None:
        # The job's code is the first issue's code (e.g. csv.bad_quantity), so a
        # client can switch on it; every issue is listed with its location.
        self.code = issues[0].code if issues else "csv.invalid"
        super().__init__(f"{len(issues)} issue(s), first {self.code}")
        self.issues = issues
        #: How many issues the validator found (more than len(issues) when it kept only the first ones).
        self.found = found if found is not None else len(issues) + (1 if truncated else 0)
        #: True when issues were found beyond those kept.
        self.truncated = truncated or self.found > len(issues)


class JobNotFound(DomainError):
    """No job record, or another owner's: one answer for both."""

    code = "job.not_found"


class NotRetryable(DomainError):
    """The owner's import cannot be retried: not failed, or failed for a
    reason a retry cannot change (domain/retry_import.py retry_refusal)."""

    code = "job.not_retryable"

    def __init__(self, detail: str, *, state: str, error_code: str = "") -> None:
        super().__init__(detail)
        self.state = state
        self.error_code = error_code

    def public_members(self) -> dict[str, object]:
        """What the answer says: why (the owner's own import: its state and failure code)."""
        members: dict[str, object] = {"detail": self.detail, "state": self.state}
        if self.error_code:
            members["errorCode"] = self.error_code
        return members


class LocationNotAllowed(DomainError):
    """An upload to a stock location the producer's API key does not allow (domain/access.py),
    or that no operator declared (importer locations add)."""

    code = "location.not_found"


class BatchConflict(DomainError):
    """The batchId is bound to other content or to another owner (one answer for both)."""

    code = "batch.conflict"


class RateLimited(DomainError):
    """This owner sent too many imports in the current window."""

    code = "request.rate_limited"
    permanent = False

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s

    @classmethod
    def after_ms(cls, wait_ms: int) -> "RateLimited":
        """Refused until the window ends in ``wait_ms``: Retry-After in whole seconds, at least 1."""
        return cls(max(1, -(-wait_ms // 1000)))


class LedgerUnreachable(DomainError):
    """[ledger] Only the ledger can say whether this batch was applied long ago, and it
    does not answer now: nothing was recorded; the same POST may be sent again."""

    code = "ledger.unavailable"
    permanent = False
    retry_after_s = 5


class StoreBehindLedger(DomainError):
    """[ledger] This location's store came back behind the ledger (restored from an
    older backup, emptied, a lagging replica promoted): until it is brought forward
    from the ledger, nothing is taken there. Nothing was recorded; send the same
    request again after Retry-After."""

    code = "store.behind_ledger"
    permanent = False
    retry_after_s = 5


class IntakePaused(DomainError):
    """[ops] An operator paused new uploads at this location, or everywhere
    (POST /api/ops/intake): nothing was recorded; send again after Retry-After."""

    code = "intake.paused"
    permanent = False
    retry_after_s = 30


class BatchUnsettled(DomainError):
    """The batch's live job changed again and again while its content was
    compared (submit_import): nothing was recorded; the same POST may be sent
    again (transient)."""

    code = "service.unavailable"
    permanent = False
    retry_after_s = 1


class UnsupportedContractVersion(DomainError):
    code = "contract.unsupported_version"

    def __init__(self, version: object) -> None:
        super().__init__(f"message version {version!r} is not accepted")
        self.version = version


class InvalidMessage(DomainError):
    code = "contract.invalid_message"


class NoWorkerAccepts(DomainError):
    """Live workers exist and none accepts the message version this producer
    sends: new work is refused at the door, nothing is recorded (transient:
    it passes once such a worker runs)."""

    code = "contract.no_worker"
    permanent = False
    retry_after_s = 5

    def __init__(self, version: int, accepted: frozenset[int]) -> None:
        super().__init__(f"no live worker accepts version {version}; they accept {sorted(accepted)}")
        self.version = version
        self.accepted = accepted

    def public_members(self) -> dict[str, object]:
        """What the answer says about it: the versions (no worker names or addresses)."""
        accepted = sorted(self.accepted)
        listed = ", ".join(str(v) for v in accepted)
        return {
            "detail": (
                f"Nothing was recorded: this server sends queue messages of contract version {self.version}, "
                f"and the workers running now accept only version{'s' if len(accepted) > 1 else ''} {listed}. "
                f"Deploy workers that accept version {self.version} first (IMPORTER_ACCEPTED_VERSIONS), then send again."
            ),
            "producerVersion": self.version,
            "acceptedVersions": accepted,
        }


@dataclass(frozen=True)
class PublicError:
    """What the API may show about a failure: code, fixed explanation, CSV issues.

    ``issues`` holds every located issue kept (the rejection report, at most
    shipment.MAX_ISSUES); ``issues_found`` how many the validator found.
    """

    code: str
    message: str
    issues: tuple[CsvIssue, ...] = field(default=())
    issues_truncated: bool = False
    issues_found: int = 0

    @classmethod
    def from_code(
        cls, code: str, issues: tuple[CsvIssue, ...] = (), truncated: bool = False, found: int | None = None,
    ) -> "PublicError":
        found = max(found or 0, len(issues) + (1 if truncated else 0))
        return cls(code=code, message=explain(code)[1], issues=issues, issues_truncated=truncated, issues_found=found)

    def to_dict(self) -> dict[str, object]:
        """The job record's error: at most INLINE_ISSUES issues inline (without
        their values: the record and its events stay as small as before), and
        the size of the rejection report (``rejections``) when there are issues."""
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.issues:
            inline = self.issues[:INLINE_ISSUES]
            out["issues"] = [
                {"line": i.line, "column": i.column, "code": i.code, "message": i.message} for i in inline
            ]
            out["issuesTruncated"] = self.issues_found > len(inline)
            out["rejections"] = {
                "found": self.issues_found, "listed": len(self.issues), "truncated": self.issues_found > len(self.issues),
            }
        return out


def public_error_for(exc: DomainError) -> PublicError:
    if isinstance(exc, CsvInvalid):
        return PublicError.from_code(exc.code, exc.issues, exc.truncated, exc.found)
    return PublicError.from_code(exc.code)
