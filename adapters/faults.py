"""Test-only fault injection (IMPORTER_FAULT): wrappers the composition root
installs around the store and the sender, and only when the setting is set.

With ``IMPORTER_FAULT=point:5`` the process sleeps 5 s at that point, with
``point:crash`` it dies there (exit 137, no cleanup), as a machine losing
power would. Points: ``before_send`` (producer, after the job is recorded),
``before_apply`` and ``after_apply`` (worker, around the atomic apply).
No production module imports this one; adapters/bootstrap.py does, lazily.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from importer.adapters.logs import log_event
from importer.domain.ports import ApplyResult, AttemptStore, MessageSender

log = logging.getLogger("importer.fault")


class Faults:
    """The parsed IMPORTER_FAULT value: ``point:seconds`` or ``point:crash``, comma separated."""

    def __init__(self, spec: str, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.actions: dict[str, str] = {}
        for item in spec.split(","):
            name, _, action = item.partition(":")
            if name.strip():
                self.actions[name.strip()] = action.strip() or "crash"
        self.sleep = sleep

    def at(self, point: str) -> None:
        action = self.actions.get(point)
        if action is None:
            return
        log_event(log, "fault.injected", logging.WARNING, point=point, action=action)
        if action == "crash":
            os._exit(137)
        self.sleep(float(action))


class FaultyAttemptStore:
    """The worker's store with faults before and after the atomic apply."""

    def __init__(self, store: AttemptStore, faults: Faults) -> None:
        self._store = store
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def validated_and_apply(self, **kwargs: Any) -> ApplyResult:
        self._faults.at("before_apply")
        result = self._store.validated_and_apply(**kwargs)
        self._faults.at("after_apply")
        return result


class FaultySender:
    """The producer's sender with a fault after the job was recorded, before its message is sent."""

    def __init__(self, sender: MessageSender, faults: Faults) -> None:
        self._sender = sender
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sender, name)

    def send(self, *, job_id: str, batch_id: str, upload_id: str) -> None:
        self._faults.at("before_send")
        self._sender.send(job_id=job_id, batch_id=batch_id, upload_id=upload_id)
