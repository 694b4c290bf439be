"""StopOnce (adapters/processes/signals.py): the first signal starts shutdown,
later ones change nothing, even when one arrives while the first is handled."""

from __future__ import annotations

import signal
import threading

from importer.adapters.processes.signals import StopOnce


class _SignalInside(threading.Event):
    """An Event whose first set() runs ``handler`` first: a second signal
    delivered while the first one is being handled (Python runs a signal
    handler in the main thread between two bytecodes, so one can nest inside
    another: a terminal's SIGINT and granian's SIGTERM reach a granian worker
    together)."""

    def __init__(self) -> None:
        super().__init__()
        self.handler: StopOnce | None = None

    def set(self) -> None:
        handler, self.handler = self.handler, None
        if handler is not None:
            handler(signal.SIGTERM)
        super().set()


def test_a_signal_during_the_first_signals_handler_neither_deadlocks_nor_stops_twice() -> None:
    started: list[int] = []
    stop = StopOnce(started.append, name="test")
    nesting = _SignalInside()
    nesting.handler = stop
    stop.event = nesting

    runner = threading.Thread(target=stop, args=(signal.SIGINT,), daemon=True)
    runner.start()
    runner.join(timeout=10)

    # A lock held around the decision: the nested run waited for it forever.
    assert not runner.is_alive(), "the nested handler waited for a lock its own thread holds"
    # A re-entrant one: both runs took themselves for the first.
    assert stop.event.is_set()
    assert len(started) == 1
    stop(signal.SIGTERM)  # and any later signal is a no-op
    assert len(started) == 1
