"""The bulk intake's fast check of a shipment (plainly_valid_enqueue_request)
never accepts what EnqueueRequestSchema refuses, and gives what it loads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from importer.handlers.schemas import EnqueueRequestSchema, plainly_valid_enqueue_request

SCHEMA = EnqueueRequestSchema()
CSV = "sku,quantity\nA-1,3\n"


def schema_load(data: Any) -> dict[str, Any] | None:
    try:
        return SCHEMA.load(data)  # type: ignore[no-any-return]
    except ValidationError:
        return None


@pytest.mark.parametrize("body", [
    {"batchId": "b-1", "csv": CSV},
    {"batchId": "b-1", "csv": CSV, "location": "paris"},
    {"batchId": "b-1", "csv": ""},
])
def test_plain_bodies_take_the_fast_check_and_load_as_the_schema_loads_them(body: dict[str, Any]) -> None:
    assert plainly_valid_enqueue_request(body) == schema_load(body) == body


@pytest.mark.parametrize("body", [
    {"batchId": "bad id", "csv": CSV},
    {"batchId": "b-1", "csv": CSV, "location": "Not A Location"},
    {"batchId": "b-1", "csv": CSV, "location": None},
    {"batchId": "b-1", "csv": "sku,quantity\n\ud800,1\n"},
    {"batchId": "b-1", "csv": 7},
    {"batchId": "b-1"},
    {"batchId": "b-1", "csv": CSV, "extra": 1},
    ["b-1", CSV],
    "b-1",
])
def test_what_the_schema_refuses_the_fast_check_leaves_to_it(body: Any) -> None:
    assert plainly_valid_enqueue_request(body) is None
    if isinstance(body, dict):
        assert schema_load(body) is None


values = st.one_of(st.none(), st.integers(), st.text(max_size=12), st.sampled_from(["b-1", "paris", CSV, "x" * 200]))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["batchId", "csv", "location", "other"]), values, max_size=4))
def test_the_fast_check_never_accepts_what_the_schema_refuses(body: dict[str, Any]) -> None:
    fast = plainly_valid_enqueue_request(body)
    if fast is not None:
        assert fast == schema_load(body)
