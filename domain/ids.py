"""Random identifiers for requests, uploads and queue messages.

They must be unique, not secret: an upload id names a Redis key, a request id
is echoed to the client, a message id is dramatiq's. ``uuid.uuid4()`` builds a
UUID object and asks the kernel for 16 bytes every time: 4.4 us an id here,
four ids a POST. These come from one Mersenne Twister per process, seeded
from ``os.urandom`` at import and again in every forked child (granian and
dramatiq fork their workers), so no two processes share a sequence: 0.5 us.
The generator is this module's own, so code that seeds the global ``random``
(a test framework) never makes two ids repeat.
"""

from __future__ import annotations

import os
import random
from contextvars import ContextVar

#: The id of the request being handled in this thread/context (None outside
#: one): set by the HTTP edge, carried by a version 2 message to the worker,
#: added by the JSON log formatter to every line as ``requestId``.
request_id_var: ContextVar[str | None] = ContextVar("importer_request_id", default=None)

_generator = random.Random()
os.register_at_fork(after_in_child=_generator.seed)
_bits = _generator.getrandbits

#: Version 4 and the RFC 4122 variant, as uuid.UUID(version=4) sets them.
_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_SET = (0x4000 << 64) | (0x8000 << 48)


def random_hex() -> str:
    """32 lowercase hex digits: 128 random bits."""
    return "%032x" % _bits(128)


def random_uuid() -> str:
    """A version-4 UUID in its canonical text form, as ``str(uuid.uuid4())``."""
    h = "%032x" % ((_bits(128) & _CLEAR) | _SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
