"""API keys: the server knows only SHA-256 hashes of keys, each bound to an owner.

A key is a random token (``importer keys create OWNER``). The configured line
is ``owner:sha256hex``, or ``owner:sha256hex locations=paris|lyon`` for a key
that may use only those stock locations (domain/access.py; ``|`` because
entries are separated by commas or newlines). Lookup compares the presented key's hash against every
configured hash with ``hmac.compare_digest``, so timing does not reveal how
much of a hash matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from importer.domain.access import SCOPES, Principal
from importer.domain.locations import LOCATION_RULE, is_valid_location

OWNER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: Between the locations of ``locations=``: neither entry separator (',' or a newline) nor a location character.
LOCATION_SEPARATOR = "|"


class KeyConfigError(ValueError):
    pass


def hash_key(key: str) -> str:
    # surrogatepass: a presented key is whatever a transport decoded (a Lambda
    # event may carry a lone surrogate); it then simply matches no hash.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_key() -> str:
    return "imp_" + secrets.token_urlsafe(32)


def key_line(owner: str, digest: str, locations: tuple[str, ...] = (), scopes: tuple[str, ...] = ()) -> str:
    """The configuration line of a key (what ``importer keys create`` prints)."""
    line = f"{owner}:{digest}"
    if locations:
        line += f" locations={LOCATION_SEPARATOR.join(locations)}"
    if scopes:
        line += f" scopes={LOCATION_SEPARATOR.join(scopes)}"
    return line


def parse_scopes(text: str) -> frozenset[str]:
    """The scopes of ``scopes=`` (``stock:read``); KeyConfigError for an unknown one."""
    names = [name.strip() for name in text.split(LOCATION_SEPARATOR)]
    if not names or not all(name in SCOPES for name in names):
        raise KeyConfigError(f"scopes= takes one or more of {', '.join(sorted(SCOPES))} separated by '{LOCATION_SEPARATOR}'")
    return frozenset(names)


def parse_locations(text: str) -> frozenset[str]:
    """The locations of ``locations=`` (``paris|lyon``); KeyConfigError when one is not a location."""
    names = [name.strip() for name in text.split(LOCATION_SEPARATOR)]
    if not names or not all(is_valid_location(name) for name in names):
        raise KeyConfigError(f"locations= takes one or more locations separated by '{LOCATION_SEPARATOR}'. {LOCATION_RULE}")
    return frozenset(names)


@dataclass(frozen=True)
class KeyRing:
    entries: tuple[tuple[str, str], ...]  # (owner, sha256 hex)
    #: The locations each entry's key allows (None: every one), by entry index.
    allowed: tuple[frozenset[str] | None, ...] = ()
    #: The scopes each entry's key carries, by entry index.
    scopes: tuple[frozenset[str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> "KeyRing":
        """Lines or comma-separated items ``owner:sha256hex``, each optionally
        followed by `` locations=a|b``; '#' starts a comment."""
        entries = []
        allowed: list[frozenset[str] | None] = []
        scopes: list[frozenset[str]] = []
        for raw in re.split(r"[\n,]", text):
            item = raw.split("#", 1)[0].strip()
            if not item:
                continue
            owner, sep, rest = item.partition(":")
            digest, *options = rest.split() or [""]
            owner, digest = owner.strip(), digest.lower()
            if not sep or not OWNER_PATTERN.match(owner) or not _HEX64.match(digest):
                raise KeyConfigError("each API key entry must be 'owner:<64 hex sha256>' (then optionally ' locations=a|b')")
            locations: frozenset[str] | None = None
            granted: frozenset[str] | None = None
            for option in options:
                name, eq, value = option.partition("=")
                if name == "locations" and eq and locations is None:
                    locations = parse_locations(value)
                elif name == "scopes" and eq and granted is None:
                    granted = parse_scopes(value)
                else:
                    raise KeyConfigError(
                        f"after an API key's hash only ' locations=a{LOCATION_SEPARATOR}b' and ' scopes=stock:read' may follow, once each"
                    )
            entries.append((owner, digest))
            allowed.append(locations)
            scopes.append(granted or frozenset())
        return cls(tuple(entries), tuple(allowed), tuple(scopes))

    def principal_for(self, presented: str) -> Principal | None:
        """The owner of the presented key and the locations it allows, or None for an unknown key.
        Every hash is compared (in constant time), whichever matches."""
        digest = hash_key(presented)
        found: Principal | None = None
        for index, (owner, expected) in enumerate(self.entries):
            if hmac.compare_digest(digest, expected):
                found = Principal(
                    owner, self.allowed[index] if index < len(self.allowed) else None,
                    self.scopes[index] if index < len(self.scopes) else frozenset(),
                )
        return found

    def owner_for(self, presented: str) -> str | None:
        principal = self.principal_for(presented)
        return principal.owner if principal is not None else None


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
