"""RabbitMQ: dramatiq's RabbitmqBroker, every publish of which ends within a bound, and its health probe.

dramatiq's ``RabbitmqBroker.enqueue`` (publisher confirms) can wait without
end: a blocked connection (a memory or disk alarm) waits for
``Connection.Unblocked``, a silent broker for its confirm, and after each
failed try dramatiq opens a new connection and publishes again, 6 tries in
all. With a 10 s ``blocked_connection_timeout`` a POST under a memory alarm
answered 503 after 60 s. Here a publish has one deadline, ``bound_s`` after
it began (IMPORTER_REDIS_SOCKET_TIMEOUT, the bound of every Redis call):

* a connection opened within it gets what remains as its connect timeouts,
  and one that cannot be opened ends the publish (a kept connection that
  RabbitMQ closed meanwhile is still replaced: dramatiq tries again);
* a timer on the connection tears it down at the deadline, whatever it waits
  for (the unblock, a queue declaration, the confirm).

Past the deadline the publish raises ``ConnectionClosed`` (ImportQueue: 503;
the job already recorded is sent later by the reconciler). A message RabbitMQ
stores after all (a blocked connection's frames are read once the alarm
clears) is a duplicate, harmless (the done marker).

The timer uses pika's private connection API (``BlockingConnection._impl``
and its ``_adapter_call_later`` / ``_adapter_remove_timeout`` /
``_terminate_stream``, the way pika's own blocked-connection timeout tears a
connection down): tests/integration/test_rabbitmq_bounds.py holds it to
pika's shape on a real node.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any
from urllib.parse import parse_qsl

import pika
import pika.exceptions
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.errors import ConnectionClosed

from importer.adapters.dramatiq.hooks import OwnHooksOnly

#: Where the health probe publishes: the default exchange with a routing key
#: no queue has, so RabbitMQ confirms the message and drops it.
PROBE_ROUTING_KEY = "importer.health-probe"

#: A sick answer of the probe is kept this long (a probe of a blocked broker
#: opens a connection that RabbitMQ keeps until the alarm clears).
PROBE_SICK_CACHE_S = 1.0


class PublishTimeout(pika.exceptions.AMQPConnectionError):  # type: ignore[misc]  # pika is untyped
    """A publish (connect, blocked connection, queue declaration, confirm) outlived its bound."""


def with_amqp_timeouts(url: str, bound_s: float) -> str:
    """The URL (each of a ``;``-separated list) with every wait bounded by
    ``bound_s``, where its query does not say otherwise: TCP connect
    (``socket_timeout``, at most 5 s), the whole connection setup
    (``stack_timeout``), a blocked connection (``blocked_connection_timeout``),
    and one connection attempt (dramatiq's enqueue tries again, within the
    publish's deadline)."""
    defaults = {
        "socket_timeout": _seconds(min(bound_s, 5.0)),
        "stack_timeout": _seconds(bound_s),
        "blocked_connection_timeout": _seconds(bound_s),
        "connection_attempts": "1",
    }
    out = []
    for one in url.split(";"):
        base, _, query = one.partition("?")
        given = dict(parse_qsl(query, keep_blank_values=True))
        extra = [f"{k}={v}" for k, v in defaults.items() if k not in given]
        out.append(base + "?" + "&".join(([query] if query else []) + extra))
    return ";".join(out)


def _seconds(value: float) -> str:
    return f"{value:g}"


def _within(parameters: Any, remaining: float, **overrides: Any) -> Any:
    """Copies of the connection parameters whose connection setup ends within ``remaining`` seconds."""
    many = parameters if isinstance(parameters, list) else [parameters]
    out = []
    for params in many:
        params = copy.copy(params)
        params.socket_timeout = min(params.socket_timeout or remaining, remaining)
        params.stack_timeout = min(params.stack_timeout or remaining, remaining)
        params.connection_attempts = 1
        for name, value in overrides.items():
            setattr(params, name, value)
        out.append(params)
    return out if isinstance(parameters, list) else out[0]


def _arm(connection: pika.BlockingConnection, deadline: float) -> Any:
    """A timer that tears ``connection`` down at ``deadline`` (monotonic), in
    the middle of whatever it waits for; pika then raises PublishTimeout."""
    impl = connection._impl

    def expire() -> None:
        if impl.is_open or impl.is_opening:
            impl._terminate_stream(PublishTimeout("the publish outlived its bound"))

    return impl, impl._adapter_call_later(max(0.0, deadline - time.monotonic()), expire)


def _disarm(armed: Any) -> None:
    impl, timer = armed
    try:
        impl._adapter_remove_timeout(timer)
    except Exception:  # noqa: BLE001 - a closed connection's ioloop: nothing left to fire
        pass


class BoundedRabbitmqBroker(OwnHooksOnly, RabbitmqBroker):
    """dramatiq's RabbitMQ broker with publisher confirms, whose every publish
    is confirmed or raises ``ConnectionClosed`` within ``bound_s``; and
    :meth:`sickness`, /health's probe."""

    def __init__(self, *, url: str, bound_s: float, **kwargs: Any) -> None:
        super().__init__(url=with_amqp_timeouts(url, bound_s), confirm_delivery=True, **kwargs)
        self.bound_s = bound_s
        self._probe_lock = threading.Lock()
        self._probe: tuple[pika.BlockingConnection, Any] | None = None
        self._probe_answer = ("", 0.0)

    # -- publishing within a deadline -----------------------------------------

    def enqueue(self, message: Any, *, delay: int | None = None) -> Any:
        deadline = time.monotonic() + self.bound_s
        state = self.state
        state.deadline, state.armed = deadline, []
        connection = getattr(state, "connection", None)
        if connection is not None and connection.is_open:
            state.armed.append(_arm(connection, deadline))
        try:
            return super().enqueue(message, delay=delay)
        except ConnectionClosed:
            raise
        except Exception as exc:  # noqa: BLE001 - see below
            # dramatiq's enqueue tries again on pika's connection and channel
            # errors only; anything else that escapes a publish (a pika error of
            # another kind, or pika's own state checks failing on a connection the
            # node's death tore down) means alike that no confirm came: the
            # message is not known to be sent. 503 and the reconciler sends it,
            # never a 500 (seen once in CI with the node SIGKILLed).
            self.logger.warning("publish failed: %s: %s", type(exc).__name__, exc)
            try:
                del self.connection  # the next publish opens a new one
            except Exception:  # noqa: BLE001 - closing what is already broken
                pass
            raise ConnectionClosed(exc) from None
        finally:
            for armed in state.armed:
                _disarm(armed)
            state.deadline, state.armed = None, []

    @property
    def connection(self) -> Any:
        """This thread's connection (dramatiq's), opened within the running publish's deadline."""
        state = self.state
        connection = getattr(state, "connection", None)
        if connection is not None:
            return connection
        deadline = getattr(state, "deadline", None)
        parameters = self.parameters
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Not a pika error: dramatiq's enqueue does not try again.
                raise ConnectionClosed(PublishTimeout(f"no confirm within {self.bound_s:g}s"))
            parameters = _within(parameters, remaining)
            try:
                connection = pika.BlockingConnection(parameters=parameters)
            except pika.exceptions.AMQPConnectionError as exc:
                # Refused or timed out just now: dramatiq's 5 more tries at once would be too.
                raise ConnectionClosed(exc) from None
        else:
            connection = pika.BlockingConnection(parameters=parameters)
        state.connection = connection
        self.connections.add(connection)
        if deadline is not None:
            state.armed.append(_arm(connection, deadline))
        return connection

    @connection.deleter
    def connection(self) -> None:
        RabbitmqBroker.connection.fdel(self)  # type: ignore[attr-defined]

    # -- health ---------------------------------------------------------------

    def sickness(self) -> str:
        """Why a message cannot be published now: ``broker_blocked`` (RabbitMQ
        blocks publishers: a memory or disk alarm), ``broker_unreachable``
        (refused, closed, or no confirm within the bound), or '' (a probe
        message was confirmed). One probe at a time per process; a request
        that finds one running takes its answer."""
        if not self._probe_lock.acquire(blocking=False):
            if self._probe_lock.acquire(timeout=self.bound_s):
                self._probe_lock.release()
            return self._probe_answer[0]
        try:
            answer, at = self._probe_answer
            if answer and time.monotonic() - at < PROBE_SICK_CACHE_S:
                return answer
            answer = self._probe_once()
            self._probe_answer = (answer, time.monotonic())
            return answer
        finally:
            self._probe_lock.release()

    def _probe_once(self) -> str:
        """Publish one probe message with a confirm, within the bound. A
        connection kept from the probe before may have been closed meanwhile
        (heartbeats, a restart): then once more on a new one."""
        deadline = time.monotonic() + self.bound_s
        for fresh in (self._probe is None, True):
            try:
                if fresh:
                    self._close_probe(deadline)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return "broker_unreachable"
                    # Blocked: torn down at once (pika raises ConnectionBlockedTimeout).
                    params = _within(self.parameters, remaining, blocked_connection_timeout=0)
                    connection = pika.BlockingConnection(parameters=params)
                    channel = connection.channel()
                    channel.confirm_delivery()
                    self._probe = (connection, channel)
                assert self._probe is not None
                connection, channel = self._probe
                armed = _arm(connection, deadline)
                try:
                    # Twice: under an alarm RabbitMQ confirms a connection's first publish,
                    # then blocks the connection (Connection.Blocked: pika's timeout of 0
                    # raises ConnectionBlockedTimeout); one publish said "ok" every time.
                    for _ in range(2):
                        channel.basic_publish(exchange="", routing_key=PROBE_ROUTING_KEY, body=b"", mandatory=False)
                finally:
                    _disarm(armed)
                return ""
            except pika.exceptions.ConnectionBlockedTimeout:
                self._close_probe(deadline)
                return "broker_blocked"
            except (pika.exceptions.AMQPError, OSError):
                self._close_probe(deadline)
                if fresh:
                    return "broker_unreachable"
        return "broker_unreachable"

    def _close_probe(self, deadline: float | None = None) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            _close_within(probe[0], time.monotonic() + self.bound_s if deadline is None else deadline)

    def close(self) -> None:
        """Close every connection (dramatiq's close), each within the bound:
        closing waits for RabbitMQ's answer, which a silent broker never sends."""
        with self._probe_lock:
            self._close_probe()
        deadline = time.monotonic() + self.bound_s
        for connection in list(self.connections):
            if connection.is_open:
                _arm(connection, deadline)
        super().close()


def _close_within(connection: pika.BlockingConnection, deadline: float) -> None:
    if not connection.is_open:
        return
    armed = _arm(connection, deadline)
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - closing a connection that died meanwhile
        pass
    finally:
        _disarm(armed)
