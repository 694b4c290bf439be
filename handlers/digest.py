"""RFC 9530 ``Content-Digest``: the producer's proof that a body arrived whole.

A producer that sends ``Content-Digest: sha-256=:<base64 of the body's
SHA-256>:`` (``sha-512`` is taken too) gets its upload refused when the bytes
that arrived differ from the bytes it hashed: whatever cut or changed them
on the way (a proxy, a server that cannot report a cut chunked body), nothing
is recorded. The header is an RFC 8941 dictionary of byte sequences; a member
may carry parameters, which are ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable

#: The algorithms checked, by their RFC 9530 names.
ALGORITHMS: dict[str, Callable[[], "hashlib._Hash"]] = {"sha-256": hashlib.sha256, "sha-512": hashlib.sha512}

#: One dictionary member: a key, then a byte sequence (``:base64:``), then parameters.
_MEMBER = re.compile(r"^([a-z*][a-z0-9_.*-]*)=:([A-Za-z0-9+/]*={0,2}):((?:;[^,;]*)*)$")

#: Bytes hashed per step: a large body is hashed in steps (hashlib releases the
#: GIL during each one), like the content hash of an upload.
_STEP = 1024 * 1024


class BadDigest(ValueError):
    """The header is not a dictionary of byte sequences, or names no algorithm checked here."""


def parse(header: str) -> dict[str, bytes]:
    """The digests of the algorithms checked here, by name; raises BadDigest."""
    digests: dict[str, bytes] = {}
    for member in header.split(","):
        match = _MEMBER.match(member.strip())
        if match is None:
            raise BadDigest("not a dictionary of byte sequences")
        name, encoded = match.group(1), match.group(2)
        if name not in ALGORITHMS:
            continue
        try:
            value = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise BadDigest(f"{name}: not base64") from None
        if len(value) != ALGORITHMS[name]().digest_size:
            raise BadDigest(f"{name}: {len(value)} bytes")
        digests[name] = value
    if not digests:
        raise BadDigest("no sha-256 or sha-512 member")
    return digests


def matches(digests: dict[str, bytes], body: bytes) -> bool:
    """True when ``body`` has every digest given."""
    view = memoryview(body)
    for name, expected in digests.items():
        hasher = ALGORITHMS[name]()
        for start in range(0, len(view), _STEP):
            hasher.update(view[start:start + _STEP])
        if not hmac.compare_digest(hasher.digest(), expected):
            return False
    return True


def content_digest(body: bytes) -> str:
    """The header value a producer sends for ``body`` (sha-256)."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"
