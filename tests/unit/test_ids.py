"""The random identifiers of requests, uploads and queue messages."""

from __future__ import annotations

import os
import random
import re
import uuid

from importer.domain.ids import random_hex, random_uuid


def test_random_hex_is_128_bits_of_hex() -> None:
    ids = {random_hex() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_random_uuid_is_a_canonical_version_4_uuid() -> None:
    for _ in range(1_000):
        text = random_uuid()
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


def test_seeding_the_global_random_never_repeats_an_id() -> None:
    random.seed(12345)
    first = random_hex()
    random.seed(12345)
    assert random_hex() != first


def test_a_forked_child_draws_its_own_sequence() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, "".join(random_hex() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    parent = "".join(random_hex() for _ in range(4))
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    assert len(child) == 128
    assert child != parent
