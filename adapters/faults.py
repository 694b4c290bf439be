"""Test-only fault injection (IMPORTER_FAULT), in one place.

A named point in the code calls ``inject(settings, point)``; with
``IMPORTER_FAULT=point:5`` it sleeps 5 s there, with ``point:crash`` the process
dies there (exit 137, no cleanup), as a machine losing power would. Tests use
it to put a SIGKILL or a SIGTERM exactly where it matters. Unset in production.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from importer.adapters.logs import log_event
from importer.adapters.settings import Settings

log = logging.getLogger("importer.fault")


def inject(settings: Settings, point: str, *, sleep: Callable[[float], None] = time.sleep) -> None:
    action = settings.fault_at(point)
    if action is None:
        return
    log_event(log, "fault.injected", logging.WARNING, point=point, action=action)
    if action == "crash":
        os._exit(137)
    sleep(float(action))
