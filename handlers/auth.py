"""API keys: the server knows only SHA-256 hashes of keys, each bound to an owner.

A key is a random token (``importer keys create OWNER``). The configured line
is ``owner:sha256hex``. Lookup compares the presented key's hash against every
configured hash with ``hmac.compare_digest``, so timing does not reveal how
much of a hash matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

OWNER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class KeyConfigError(ValueError):
    pass


def hash_key(key: str) -> str:
    # surrogatepass: a presented key is whatever a transport decoded (a Lambda
    # event may carry a lone surrogate); it then simply matches no hash.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_key() -> str:
    return "imp_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class KeyRing:
    entries: tuple[tuple[str, str], ...]  # (owner, sha256 hex)

    @classmethod
    def parse(cls, text: str) -> "KeyRing":
        """Lines or comma-separated items ``owner:sha256hex``; '#' starts a comment."""
        entries = []
        for raw in re.split(r"[\n,]", text):
            item = raw.split("#", 1)[0].strip()
            if not item:
                continue
            owner, sep, digest = item.partition(":")
            owner, digest = owner.strip(), digest.strip().lower()
            if not sep or not OWNER_PATTERN.match(owner) or not _HEX64.match(digest):
                raise KeyConfigError("each API key entry must be 'owner:<64 hex sha256>'")
            entries.append((owner, digest))
        return cls(tuple(entries))

    def owner_for(self, presented: str) -> str | None:
        digest = hash_key(presented)
        found: str | None = None
        for owner, expected in self.entries:
            if hmac.compare_digest(digest, expected):
                found = owner
        return found


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
