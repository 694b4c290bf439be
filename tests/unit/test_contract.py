"""The versioned queue message contract (domain/contract.py)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from importer.domain.contract import (
    CURRENT_VERSION,
    DEFAULT_ACCEPTED_VERSIONS,
    GROUP_MAX,
    GROUP_VERSION,
    KNOWN_VERSIONS,
    ImportMessage,
    decode_group,
    decode_message,
    encode_group,
    encode_message,
    is_group,
    job_id_of,
    job_ids_of,
    live_workers_can_run,
)
from importer.domain.errors import InvalidMessage, UnsupportedContractVersion, public_error_for

V1 = frozenset({1})
UPLOAD = "0123456789abcdef0123456789abcdef"


def body(**overrides: object) -> dict[str, object]:
    out: dict[str, object] = {"version": 1, "jobId": "shipment-batch-a", "batchId": "batch-a", "uploadId": UPLOAD}
    out.update(overrides)
    return out


def test_versions() -> None:
    assert CURRENT_VERSION == 1
    assert KNOWN_VERSIONS == frozenset({1, 2, 3})
    assert DEFAULT_ACCEPTED_VERSIONS == frozenset({CURRENT_VERSION, GROUP_VERSION})


def _jobs(n: int) -> list[tuple[str, str, str]]:
    return [(f"shipment-b-{i}@paris", f"b-{i}", f"{i:032x}") for i in range(n)]


def test_a_group_carries_each_import_and_the_request_id() -> None:
    body = encode_group(_jobs(3), request_id="req-1")
    assert body == {"version": 3, "requestId": "req-1", "jobs": [
        {"jobId": f"shipment-b-{i}@paris", "batchId": f"b-{i}", "uploadId": f"{i:032x}"} for i in range(3)]}
    assert is_group(body) and not is_group({"version": 2})
    decoded = decode_group(body, frozenset({1, 3}))
    assert [(m.job_id, m.batch_id, m.upload_id, m.version, m.request_id) for m in decoded] == [
        (j, b, u, 3, "req-1") for j, b, u in _jobs(3)]
    assert job_ids_of(body) == [j for j, _, _ in _jobs(3)]
    assert job_ids_of({"version": 1, "jobId": "shipment-x"}) == ["shipment-x"]


def test_a_group_is_bounded_and_each_import_valid() -> None:
    encode_group(_jobs(GROUP_MAX))
    with pytest.raises(InvalidMessage):
        encode_group(_jobs(GROUP_MAX + 1))
    with pytest.raises(InvalidMessage):
        encode_group([])
    with pytest.raises(InvalidMessage):
        encode_group([("shipment-x", "bad batch id", UPLOAD)])
    good = encode_group(_jobs(2))
    for bad in (
        {**good, "jobs": []},
        {**good, "jobs": [{"jobId": "shipment-x", "batchId": "x"}]},
        {**good, "jobs": [{"jobId": "shipment-x", "batchId": "x", "uploadId": "nope"}]},
        {**good, "extra": 1},
        {**good, "requestId": "bad id!"},
        {**good, "jobs": "x"},
    ):
        with pytest.raises(InvalidMessage):
            decode_group(bad, frozenset({3}))


def test_a_worker_that_does_not_accept_groups_refuses_them_whole() -> None:
    body = encode_group(_jobs(2))
    with pytest.raises(UnsupportedContractVersion):
        decode_group(body, frozenset({1, 2}))
    with pytest.raises(UnsupportedContractVersion):  # a single message's reader never takes a group for one
        decode_message(body, frozenset({1, 2, 3}))
    assert job_id_of(body) is None


def test_encode_gives_the_documented_body() -> None:
    assert encode_message("shipment-batch-a", "batch-a", UPLOAD) == body()


def test_round_trip() -> None:
    encoded = encode_message("shipment-batch-a", "batch-a", UPLOAD)
    assert decode_message(encoded, V1) == ImportMessage(1, "shipment-batch-a", "batch-a", UPLOAD)


def test_decode_accepts_any_mapping_and_does_not_mutate_it() -> None:
    payload = body()
    assert decode_message(MappingProxyType(payload), V1).batch_id == "batch-a"
    assert payload == body()


def test_decode_with_several_accepted_versions() -> None:
    assert decode_message(body(), frozenset({1, 2})).version == 1


def test_encode_unknown_version() -> None:
    with pytest.raises(UnsupportedContractVersion) as info:
        encode_message("j", "batch-a", UPLOAD, version=3)
    assert info.value.version == 3
    assert info.value.code == "contract.unsupported_version"


@pytest.mark.parametrize(
    ("job_id", "batch_id", "upload_id"),
    [("", "batch-a", UPLOAD), ("j" * 129, "batch-a", UPLOAD), ("j", "-bad", UPLOAD), ("j", "batch-a", UPLOAD.upper()), ("j", "batch-a", "x")],
)
def test_encode_refuses_an_invalid_message(job_id: str, batch_id: str, upload_id: str) -> None:
    with pytest.raises(InvalidMessage):
        encode_message(job_id, batch_id, upload_id)


@pytest.mark.parametrize("accepted", [V1, frozenset({1, 2}), frozenset({2})])
def test_version_3_is_unsupported(accepted: frozenset[int]) -> None:
    # Version 3 is not known to this code base even if configured as accepted.
    with pytest.raises(UnsupportedContractVersion) as info:
        decode_message(body(version=3), accepted | {3})
    assert info.value.version == 3
    assert info.value.permanent is True
    assert public_error_for(info.value).code == "contract.unsupported_version"


def test_version_2_carries_the_request_id() -> None:
    encoded = encode_message("shipment-batch-a", "batch-a", UPLOAD, version=2, request_id="req-1")
    assert encoded == body(version=2, requestId="req-1")
    assert decode_message(encoded, frozenset({1, 2})) == ImportMessage(2, "shipment-batch-a", "batch-a", UPLOAD, "req-1")
    # Without a request (the reconciler sending it again) the field is absent; version 1 never has it.
    assert encode_message("j", "batch-a", UPLOAD, version=2) == {"version": 2, "jobId": "j", "batchId": "batch-a", "uploadId": UPLOAD}
    assert decode_message(body(version=2), frozenset({2})).request_id is None
    assert "requestId" not in encode_message("j", "batch-a", UPLOAD, version=1, request_id="req-1")


@pytest.mark.parametrize("payload", [body(requestId="r"), body(version=2, requestId="a b"), body(version=2, requestId=""),
                                     body(version=2, requestId="r" * 129), body(version=2, requestId=5)])
def test_a_request_id_only_in_version_2_and_sane(payload: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(payload, frozenset({1, 2}))


def test_version_2_not_accepted_by_a_version_1_worker() -> None:
    with pytest.raises(UnsupportedContractVersion) as info:
        decode_message(body(version=2), V1)
    assert info.value.version == 2


# -- the door check: plain data in, a decision out ----------------


@pytest.mark.parametrize(("version", "live", "runs"), [
    (1, [], True),                                  # no worker alive: accepted, the job waits
    (2, [], True),
    (1, [frozenset({1})], True),
    (2, [frozenset({1})], False),                   # only non-matching live workers
    (2, [frozenset({1}), frozenset({1, 2})], True), # one matching worker is enough
    (2, [frozenset({1}), frozenset({1})], False),
    (1, [frozenset({2}), frozenset({1, 2})], True),
    (1, [frozenset({2})], False),
])
def test_live_workers_can_run(version: int, live: list[frozenset[int]], runs: bool) -> None:
    assert live_workers_can_run(version, live) is runs


def test_the_refusal_names_the_versions() -> None:
    from importer.domain.errors import NoWorkerAccepts

    members = NoWorkerAccepts(2, frozenset({1, 3})).public_members()
    assert members["producerVersion"] == 2 and members["acceptedVersions"] == [1, 3]
    assert "version 2" in str(members["detail"]) and "versions 1, 3" in str(members["detail"])
    assert "version 1." in str(NoWorkerAccepts(2, frozenset({1})).public_members()["detail"])


@pytest.mark.parametrize("accepted", [frozenset(), frozenset({2}), frozenset({0, 3})])
def test_version_1_not_accepted_is_unsupported(accepted: frozenset[int]) -> None:
    with pytest.raises(UnsupportedContractVersion) as info:
        decode_message(body(), accepted)
    assert info.value.version == 1


@pytest.mark.parametrize("version", [0, -1, 99, 2**70])
def test_other_integer_versions_are_unsupported(version: int) -> None:
    with pytest.raises(UnsupportedContractVersion):
        decode_message(body(version=version), V1)


@pytest.mark.parametrize("field", ["jobId", "batchId", "uploadId"])
def test_missing_field(field: str) -> None:
    payload = body()
    del payload[field]
    with pytest.raises(InvalidMessage) as info:
        decode_message(payload, V1)
    assert field in str(info.value)
    assert info.value.code == "contract.invalid_message"
    assert info.value.permanent is True


def test_missing_version() -> None:
    payload = body()
    del payload["version"]
    with pytest.raises(InvalidMessage):
        decode_message(payload, V1)


@pytest.mark.parametrize("extra", [{"csv": "sku,quantity\nA,1\n"}, {"version2": 1}, {"": None}])
def test_extra_field(extra: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(body(**extra), V1)


@pytest.mark.parametrize("version", [True, False, "1", 1.0, None, [1], {"v": 1}])
def test_non_integer_version(version: object) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(body(version=version), V1)


@pytest.mark.parametrize("payload", [None, [], [("version", 1)], "version=1", b"{}", 1, ("a", "b"), {1, 2}])
def test_non_mapping(payload: object) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(payload, V1)


@pytest.mark.parametrize(
    "overrides",
    [
        {"jobId": ""},
        {"jobId": "j" * 129},
        {"jobId": 5},
        {"jobId": None},
        {"batchId": ""},
        {"batchId": "-batch"},
        {"batchId": "a" * 65},
        {"batchId": "a b"},
        {"batchId": 7},
        {"uploadId": UPLOAD.upper()},
        {"uploadId": UPLOAD[:-1]},
        {"uploadId": UPLOAD + "0"},
        {"uploadId": "g" * 32},
        {"uploadId": None},
    ],
)
def test_invalid_field_values(overrides: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(body(**overrides), V1)


@pytest.mark.parametrize("overrides", [{"batchId": "batch-a\n"}, {"uploadId": UPLOAD + "\n"}])
def test_trailing_newline_is_invalid(overrides: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(body(**overrides), V1)


def test_limits_are_inclusive() -> None:
    message = decode_message(body(jobId="j" * 128, batchId="b" * 64), V1)
    assert (len(message.job_id), len(message.batch_id)) == (128, 64)


def test_job_id_of() -> None:
    assert job_id_of(body()) == "shipment-batch-a"
    # Works on messages that cannot be decoded, which is its purpose.
    assert job_id_of(body(version=3, uploadId="nope")) == "shipment-batch-a"
    assert job_id_of({"jobId": "j" * 128}) == "j" * 128
    assert job_id_of(MappingProxyType({"jobId": "x"})) == "x"


@pytest.mark.parametrize(
    "payload",
    [{}, {"jobId": ""}, {"jobId": "j" * 129}, {"jobId": 5}, {"jobId": None}, None, "shipment-x", ["jobId"], 3],
)
def test_job_id_of_unknown(payload: object) -> None:
    assert job_id_of(payload) is None


class _Str(str):
    """A str subclass: the schema accepts it; the plain reading leaves it to the schema."""


@pytest.mark.parametrize(
    "overrides",
    [
        {}, {"jobId": "j" * 128, "batchId": "b" * 64}, {"jobId": ""}, {"jobId": "j" * 129}, {"jobId": 5},
        {"batchId": "-batch"}, {"batchId": "a b"}, {"batchId": "batch-a\n"}, {"uploadId": UPLOAD.upper()},
        {"uploadId": UPLOAD + "\n"}, {"uploadId": None}, {"extra": 1}, {"jobId": _Str("shipment-batch-a")},
    ],
)
def test_the_plain_reading_of_v1_accepts_only_what_the_schema_accepts(overrides: dict[str, object]) -> None:
    from importer.domain.contract import ImportMessageV1, _plain_v1

    payload = body(**overrides)
    plain = _plain_v1(payload)
    if plain is not None:
        assert not ImportMessageV1().validate(payload)
        assert plain == ImportMessage(1, payload["jobId"], payload["batchId"], payload["uploadId"])  # type: ignore[arg-type]
    # Either way decode_message gives the schema's answer.
    if ImportMessageV1().validate(payload):
        with pytest.raises(InvalidMessage):
            decode_message(payload, V1)
    else:
        assert decode_message(payload, V1) == ImportMessage(1, str(payload["jobId"]), str(payload["batchId"]), str(payload["uploadId"]))


def test_the_plain_reading_agrees_with_the_schema_on_any_text() -> None:
    from hypothesis import given, settings, strategies as st

    from importer.domain.contract import ImportMessageV1, _plain_v1

    schema = ImportMessageV1()
    text = st.one_of(st.text(max_size=140), st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
                     st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,70}", fullmatch=True))

    @settings(max_examples=400, deadline=None)
    @given(job_id=text, batch_id=text, upload_id=text)
    def agree(job_id: str, batch_id: str, upload_id: str) -> None:
        payload = {"version": 1, "jobId": job_id, "batchId": batch_id, "uploadId": upload_id}
        assert (_plain_v1(payload) is not None) == (not schema.validate(payload))

    agree()


# -- the plain check of encode_message agrees with the schema -------------------------

from hypothesis import given, strategies as st  # noqa: E402

from importer.domain.contract import _SCHEMAS, _plainly_valid  # noqa: E402

_near_valid = st.one_of(
    st.just(UPLOAD), st.just("batch-a"), st.just("shipment-batch-a"), st.just(""), st.just("req-1"),
    st.from_regex(r"[0-9a-fA-F]{30,34}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9._:\- \n-]{0,130}", fullmatch=True),
    st.text(max_size=140),
)


@given(job_id=_near_valid, batch_id=_near_valid, upload_id=_near_valid,
       version=st.sampled_from([1, 2]), request_id=st.one_of(st.none(), _near_valid))
def test_the_plain_check_accepts_exactly_what_the_schema_accepts(
    job_id: str, batch_id: str, upload_id: str, version: int, request_id: str | None,
) -> None:
    candidate: dict[str, object] = {"version": version, "jobId": job_id, "batchId": batch_id, "uploadId": upload_id}
    if version == 2 and request_id is not None:
        candidate["requestId"] = request_id
    assert _plainly_valid(candidate) == (not _SCHEMAS[version].validate(candidate))
