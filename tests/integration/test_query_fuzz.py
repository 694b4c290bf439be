"""Property-based cases for every query parameter and cursor of the ledger,
stock and operators' routes, sent to the real processes (`importer serve`,
a worker, `importer ledger`, a real PostgreSQL): whatever the value, the
answer is never a 5xx, and a refusal is a problem document with a stable code.

The strategies aim where drivers break: Unicode digits, NULs, bytes that are
not UTF-8, lone surrogates inside cursors, JSON nested deep, numbers past
64 bits, instants at and past the ends of the years, ISO 8601 forms that are
not RFC 3339. schemathesis (test_contract_schemathesis.py) covers the spec's
shapes; these cover what the spec forbids.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote_from_bytes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from importer.handlers.problems import HTTP_STATUS
from tests.integration.support import System
from tests.integration.test_history import imported
from tests.integration.test_hostile_queries import hostile_system  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

#: Examples per run (the closing count of issue 51: routes x parameters, shrunk on a failure).
EXAMPLES = 600

UNICODE_DIGITS = "\u00b2\u2460\u0661\u0660\uff15\u0966\u09e6\U0001d7ce"
ROUTES: dict[str, tuple[str, ...]] = {
    "/api/shipments": ("limit", "cursor", "from", "to", "location"),
    "/api/stock-movements": ("limit", "cursor", "from", "to", "location", "sku", "batchId"),
    "/api/stock": ("limit", "cursor", "asOf", "location"),
    "/api/stock/HQ-A": ("asOf", "location"),
    "/api/imports": ("limit", "cursor", "state", "location"),
    "/api/ops/overview": ("limit", "cursor"),
    "/api/ops/failed": ("limit", "cursor", "location", "errorCode"),
    "/api/ops/actions": ("limit", "cursor"),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


cursors = st.one_of(
    json_values.map(lambda v: ["v1", v]).map(lambda v: _b64(json.dumps(v).encode())),
    st.lists(json_values, max_size=6).map(lambda v: _b64(json.dumps(["v1", *v]).encode("utf-8", "surrogatepass"))),
    st.integers(min_value=1, max_value=5000).map(lambda d: _b64(_deep(d))),
    st.integers(min_value=2**62, max_value=2**80).map(lambda n: _b64(json.dumps(["v1", n]).encode())),
    st.text(st.sampled_from("\x00\ud800\udfff,\"\\"), min_size=1, max_size=4).map(
        lambda t: _b64(('["v1",1,"main' + t + '","x",1]').encode("utf-8", "surrogatepass"))),
    st.binary(max_size=700),
)
numbers = st.one_of(
    st.text(st.sampled_from("0123456789" + UNICODE_DIGITS), min_size=1, max_size=8).map(str.encode),
    st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: str(n).encode()),
    st.integers(min_value=1, max_value=6000).map(lambda n: b"9" * n),
)
years = st.sampled_from(["0000", "0001", "1969", "1970", "2026", "9999", "\u0662026"])
offsets = st.sampled_from(["Z", "z", "+14:00", "-14:00", "+23:59", "+24:00", "-00:00", "", "+0100", " Z", "Z\x00"])
instants = st.one_of(
    st.builds(lambda y, mo, d, h, offset, frac: f"{y}-{mo}-{d}T{h}:00:00{frac}{offset}".encode("utf-8", "surrogatepass"),
              years, st.sampled_from(["00", "01", "12", "13"]), st.sampled_from(["00", "01", "30", "31", "32"]),
              st.sampled_from(["00", "23", "24"]), offsets, st.sampled_from(["", ".5", ".123456789", ".1234567891"])),
    st.sampled_from([b"2026-12-01", b"2026-W49-1", b"20261201T000000Z", b"2026-12-01T00:00:00Z\x00", b"now"]),
)
values = st.one_of(numbers, cursors, instants, st.binary(max_size=80),
                   st.text(st.characters(codec="utf-8"), max_size=40).map(str.encode))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_no_query_value_gets_a_5xx(hostile_system: tuple[System, str, str], data: Any) -> None:  # noqa: F811
    system, reader, operator = hostile_system
    if not getattr(system, "_fuzz_seeded", False):
        imported(system, "fz-1", {"HQ-A": 3})  # something to page over
        system._fuzz_seeded = True  # type: ignore[attr-defined]
    route = data.draw(st.sampled_from(sorted(ROUTES)), label="route")
    names = data.draw(st.lists(st.sampled_from(ROUTES[route]), min_size=1, max_size=3, unique=True), label="names")
    query: list[str] = []
    for name in names:
        strategy = {"limit": numbers, "cursor": cursors, "from": instants, "to": instants, "asOf": instants}.get(name, values)
        query.append(f"{name}={quote_from_bytes(data.draw(strategy, label=name), safe='')}")
    if route.startswith("/api/stock") and "location" not in names:
        query.append("location=main")
    key = reader if route.startswith("/api/stock") else operator if route.startswith("/api/ops") else system.api_key
    status, headers, raw = system.request("GET", route + "?" + "&".join(query), key=key)
    assert status < 500, (route, query, status, raw[:300])
    if status >= 400:
        problem = json.loads(raw)
        assert problem["code"] in HTTP_STATUS and HTTP_STATUS[problem["code"]] == status, (route, query, problem)
