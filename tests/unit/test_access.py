"""API keys restricted to stock locations: the key line's syntax, the rule
(domain/access.py), ``importer keys create --locations`` and the answers
through the real WSGI app with the typed fakes. No Redis, no network."""

from __future__ import annotations

import json

import pytest

from importer.adapters.processes import cli
from importer.domain.access import NO_OWNER, Principal
from importer.domain.errors import LocationNotAllowed
from importer.handlers.auth import KeyConfigError, KeyRing, hash_key
from importer.handlers.wsgi import create_app
from tests.unit.test_http_handlers import (
    KEY_A, KEY_B, VALID_CSV, ExplodingStream, Harness, assert_problem, make_harness, record, shipment,
    without_request_id,
)

HEX = "ab" * 32
KEY_P = "imp_test-key-for-owner-a-at-paris"


# -- the rule -------------------------------------------------------------------


def test_a_key_without_locations_may_use_every_location() -> None:
    anywhere = Principal("acme")
    assert anywhere.may_use("main") and anywhere.may_use("paris")
    assert anywhere.owner_at("lyon") == "acme"
    anywhere.require("lyon")


def test_a_key_with_locations_reads_elsewhere_as_nobody_and_may_not_upload_there() -> None:
    paris = Principal("acme", frozenset({"paris", "lyon"}))
    assert paris.may_use("paris") and paris.may_use("lyon") and not paris.may_use("main")
    assert paris.owner_at("lyon") == "acme"
    assert paris.owner_at("main") == NO_OWNER != "acme"
    paris.require("paris")
    with pytest.raises(LocationNotAllowed) as raised:
        paris.require("main")
    assert raised.value.code == "location.not_found"


# -- the key line -----------------------------------------------------------------


def test_existing_lines_stay_valid_and_allow_every_location() -> None:
    ring = KeyRing.parse(f"# keys\nacme:{HEX}\n  beta : {HEX.upper()}  # comment\n,gamma:{HEX}")
    assert [owner for owner, _ in ring.entries] == ["acme", "beta", "gamma"]
    assert ring.allowed == (None, None, None)


def test_locations_follow_the_hash_separated_by_bars_in_lines_and_comma_lists() -> None:
    ring = KeyRing.parse(f"acme:{HEX} locations=paris|lyon,beta:{HEX}\ngamma:{HEX}  locations=main  # main only")
    assert ring.allowed == (frozenset({"paris", "lyon"}), None, frozenset({"main"}))


@pytest.mark.parametrize("line", [
    f"acme:{HEX} locations=",             # no location
    f"acme:{HEX} locations=paris|",       # an empty one
    f"acme:{HEX} locations=Paris",        # not lowercase
    f"acme:{HEX} locations=paris lyon",   # a space between them
    f"acme:{HEX} locations=a@b",          # not a location
    f"acme:{HEX} location=paris",         # unknown option
    f"acme:{HEX} paris",                  # no option name
    f"acme:{HEX} locations=paris locations=lyon",
    f"acme:{HEX}:paris",                  # the hash is not 64 hex digits then
    "acme:",
    f":{HEX}",
])
def test_a_malformed_entry_is_refused_at_start(line: str) -> None:
    with pytest.raises(KeyConfigError):
        KeyRing.parse(line)


def test_the_principal_carries_its_keys_locations() -> None:
    ring = KeyRing.parse(f"owner-a:{hash_key(KEY_A)}\nowner-a:{hash_key(KEY_P)} locations=paris")
    assert ring.principal_for(KEY_A) == Principal("owner-a", None)
    assert ring.principal_for(KEY_P) == Principal("owner-a", frozenset({"paris"}))
    assert ring.principal_for("imp_unknown") is None
    assert ring.owner_for(KEY_P) == "owner-a"


# -- importer keys create --locations ------------------------------------------------


def test_keys_create_prints_a_line_the_server_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "create", "acme", "--locations", "paris,lyon"]) == 0
    out = capsys.readouterr().out.splitlines()
    key, line = out[1].strip(), out[3].strip()
    assert line == f"acme:{hash_key(key)} locations=paris|lyon"
    assert KeyRing.parse(line).principal_for(key) == Principal("acme", frozenset({"paris", "lyon"}))


def test_keys_create_without_locations_prints_the_plain_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "create", "acme"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[3].strip() == f"acme:{hash_key(out[1].strip())}"


@pytest.mark.parametrize("given", ["Paris", "paris,,", "a@b", " , ", ""])
def test_keys_create_refuses_a_bad_location(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "create", "acme", "--locations", given]) == 2
    assert "--locations" in capsys.readouterr().err


# -- the answers ------------------------------------------------------------------------


@pytest.fixture
def h() -> Harness:
    """owner-a has two keys: KEY_A for every location, KEY_P for paris only; owner-b one key."""
    h = make_harness()
    keys = KeyRing.parse(
        f"owner-a:{hash_key(KEY_A)}\nowner-a:{hash_key(KEY_P)} locations=paris\nowner-b:{hash_key(KEY_B)}"
    )
    h.app = create_app(h.api, keys)
    return h


def test_an_upload_to_another_location_is_refused_and_nothing_recorded(h: Harness) -> None:
    for result in (
        h.post_csv(VALID_CSV, "b-1", key=KEY_P),                                  # the default location (main)
        h.call("POST", "/api/imports", key=KEY_P, query="batchId=b-1&location=lyon", body=VALID_CSV.encode(),
               content_type="text/csv"),
        h.post_json({"batchId": "b-1", "csv": VALID_CSV}, key=KEY_P),            # JSON: the default location
        h.post_json({"batchId": "b-1", "csv": VALID_CSV, "location": "lyon"}, key=KEY_P),
    ):
        assert_problem(result, 404, "location.not_found")
    assert h.store.jobs == {} and h.sender.sent == []
    assert "take_rate_token" not in h.store.calls and "enqueue" not in h.store.calls


def test_an_upload_to_a_forbidden_location_named_in_the_head_is_refused_unread(h: Harness) -> None:
    for query in ("batchId=b-1&location=main", "batchId=b-1"):
        result = h.call("POST", "/api/imports", key=KEY_P, query=query, content_type="text/csv",
                        stream=ExplodingStream(), content_length="1000")
        assert_problem(result, 404, "location.not_found")
    assert h.store.calls == []  # no rate token, no read, no record


def test_an_upload_to_an_allowed_location_is_accepted(h: Harness) -> None:
    result = h.post_json({"batchId": "b-1", "csv": VALID_CSV, "location": "paris"}, key=KEY_P)
    assert result.status == 202, result.body
    assert result.json()["jobId"] == "shipment-b-1@paris"
    assert h.store.jobs["shipment-b-1@paris"].owner == "owner-a"


def test_reads_at_another_location_answer_the_bytes_of_a_missing_one(h: Harness) -> None:
    h.store.jobs["shipment-b-full"] = record()  # owner-a's, at main
    h.store.shipments["b-done"] = shipment()    # owner-a's, applied at main
    assert h.get_job("shipment-b-full").status == 200  # the key for every location sees it
    pairs = [
        ("GET", "/api/imports/shipment-b-full", "/api/imports/shipment-never", "", "job.not_found"),
        ("GET", "/api/imports/shipment-b-full/events", "/api/imports/shipment-never/events", "", "job.not_found"),
        ("GET", "/api/imports/shipment-b-full/rejections.csv", "/api/imports/shipment-never/rejections.csv", "",
         "job.not_found"),
        ("POST", "/api/imports/shipment-b-full/retry", "/api/imports/shipment-never/retry", "", "job.not_found"),
        ("GET", "/api/shipments/b-done", "/api/shipments/never", "", "shipment.not_found"),
        ("GET", "/api/shipments/b-done/receipt", "/api/shipments/never/receipt", "", "shipment.not_found"),
        ("GET", "/api/shipments/b-done", "/api/shipments/b-done", "location=main", "shipment.not_found"),
    ]
    for method, forbidden, missing, query, code in pairs:
        calls = len(h.store.calls)
        hidden = h.call(method, forbidden, key=KEY_P, query=query)
        hidden_calls = h.store.calls[calls:]
        absent = h.call(method, missing.replace("/b-done", "/never"), key=KEY_P, query=query.replace("main", "paris"))
        assert_problem(hidden, 404, code)
        assert (hidden.body, without_request_id(hidden.headers)) == (absent.body, without_request_id(absent.headers))
        assert hidden_calls == h.store.calls[calls + len(hidden_calls):], method + forbidden  # the same work


def test_the_list_shows_only_the_keys_locations(h: Harness) -> None:
    h.store.jobs["shipment-m"] = record(id="shipment-m", batch_id="m")
    h.store.jobs["shipment-p@paris"] = record(id="shipment-p@paris", batch_id="p")
    h.store.jobs["shipment-l@lyon"] = record(id="shipment-l@lyon", batch_id="l")

    def ids(key: str, query: str = "") -> list[str]:
        result = h.call("GET", "/api/imports", key=key, query=query)
        assert result.status == 200, result.body
        return sorted(item["id"] for item in json.loads(result.body)["items"])

    assert ids(KEY_A) == ["shipment-l@lyon", "shipment-m", "shipment-p@paris"]
    assert ids(KEY_P) == ["shipment-p@paris"]
    assert ids(KEY_P, "location=paris") == ["shipment-p@paris"]
    # Another location: the page of a location without imports.
    hidden = h.call("GET", "/api/imports", key=KEY_P, query="location=lyon")
    empty = h.call("GET", "/api/imports", key=KEY_P, query="location=nowhere")
    assert hidden.status == 200 and hidden.body == empty.body == b'{"items":[],"nextCursor":null}'
