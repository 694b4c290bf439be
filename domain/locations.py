"""Stock locations: every shipment is for one location (a warehouse, a store).

A location is a partition of the store: its stock, generation, done markers,
journal, receipts, job records and their events live together (one Redis
hash tag, so one slot of a Redis Cluster), and the apply of a shipment stays
one atomic step. Across locations nothing is atomic.

A batchId names one shipment of one location: the same batchId at two
locations is two shipments (two done markers, two jobs). The job id says
where its job lives, so every read by job id goes to exactly one partition:
``shipment-<batchId>`` at the default partition ``main`` (the seed's job
ids, unchanged) and ``shipment-<batchId>@<location>`` anywhere else.
"""

from __future__ import annotations

import re

#: The location of the original single-location store, and of every request
#: that names none (a deployment can choose another default: IMPORTER_DEFAULT_LOCATION).
MAIN = "main"
#: Lowercase so that two spellings never name two locations; no '@' or '{}' (job ids, hash tags).
LOCATION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
LOCATION_RULE = "Must be 1-32 characters of a-z 0-9 _ -, starting with a letter or digit."

_LOCATION = re.compile(LOCATION_PATTERN)


def is_valid_location(value: object) -> bool:
    return isinstance(value, str) and _LOCATION.fullmatch(value) is not None


def split_job_id(job_id: str) -> tuple[str, str]:
    """(the job id without its location, the location) of a job id: 'shipment-x@paris' -> ('shipment-x', 'paris')."""
    head, at, location = job_id.rpartition("@")
    if at and is_valid_location(location):
        return head, location
    return job_id, MAIN


def location_of_job(job_id: str) -> str:
    """The location whose partition holds this job (MAIN for a job id without '@')."""
    return split_job_id(job_id)[1]
