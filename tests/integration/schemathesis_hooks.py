"""schemathesis hooks for tests/integration/test_contract_schemathesis.py (SCHEMATHESIS_HOOKS):
POST /api/imports/bulk's NDJSON body, generated from its schema (an array of
EnqueueRequest objects), is sent one JSON object per line."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx: Any, value: Any) -> bytes:
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)
