"""RabbitMQ's waits bounded by IMPORTER_REDIS_SOCKET_TIMEOUT (adapters/dramatiq/rabbitmq.py),
and /health naming a sick broker. On a real node: tests/integration/test_rabbitmq_bounds.py."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pika
import pika.exceptions
import pytest
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.errors import BrokerError, ConnectionClosed

from importer.adapters.dramatiq.broker import build_broker
from importer.adapters.dramatiq.rabbitmq import BoundedRabbitmqBroker, with_amqp_timeouts
from importer.adapters.settings import Settings
from tests.unit.fakes import StoreDown
from tests.unit.test_http_handlers import Harness, make_harness


def _query(url: str) -> dict[str, str]:
    return dict(parse_qsl(url.partition("?")[2]))


def test_every_wait_of_a_connection_is_bounded_by_default() -> None:
    url = with_amqp_timeouts("amqp://guest:guest@rabbit:5672/%2F", 10.0)
    assert _query(url) == {
        "socket_timeout": "5", "stack_timeout": "10", "blocked_connection_timeout": "10", "connection_attempts": "1",
    }
    params = pika.URLParameters(url)
    assert (params.socket_timeout, params.stack_timeout, params.blocked_connection_timeout) == (5, 10, 10)


def test_what_the_url_says_wins_and_each_url_of_a_list_is_bounded() -> None:
    url = with_amqp_timeouts("amqp://a/%2F?socket_timeout=1&heartbeat=30;amqp://b/%2F", 2.5)
    first, second = url.split(";")
    assert _query(first) == {
        "socket_timeout": "1", "heartbeat": "30", "stack_timeout": "2.5", "blocked_connection_timeout": "2.5",
        "connection_attempts": "1",
    }
    assert _query(second)["stack_timeout"] == "2.5" and _query(second)["socket_timeout"] == "2.5"


def test_an_amqp_url_gets_the_bounded_broker_with_the_socket_timeout_as_its_bound() -> None:
    settings = Settings.from_env({"IMPORTER_BROKER_URL": "amqp://guest:guest@127.0.0.1:1/%2F",
                                  "IMPORTER_REDIS_SOCKET_TIMEOUT": "3"})
    broker = build_broker(settings, client=None)  # connects lazily: nothing listens on port 1
    assert isinstance(broker, BoundedRabbitmqBroker)
    assert broker.bound_s == 3.0 and broker.confirm_delivery
    assert broker.parameters.blocked_connection_timeout == 3.0


@pytest.mark.parametrize("raised", [pika.exceptions.ProtocolSyntaxError("bad frame"), AssertionError("pika's state")])
def test_a_publish_that_fails_any_other_way_is_a_closed_connection_not_a_500(
    raised: Exception, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """dramatiq tries again on pika's connection and channel errors only; anything
    else a publish raises is ConnectionClosed (a BrokerError: 503, the reconciler sends)."""
    def publish(self: object, message: object, *, delay: object = None) -> object:
        raise raised

    monkeypatch.setattr(RabbitmqBroker, "enqueue", publish)
    broker = BoundedRabbitmqBroker(url="amqp://guest:guest@127.0.0.1:1/%2F", bound_s=1.0)
    with pytest.raises(ConnectionClosed) as caught:
        broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    assert isinstance(caught.value, BrokerError)


@pytest.mark.parametrize("reason", ["broker_blocked", "broker_unreachable"])
def test_health_is_503_naming_the_sick_broker(reason: str) -> None:
    h: Harness = make_harness()
    h.api.broker_sickness = lambda: reason

    result = h.call("GET", "/health", key=None)

    assert result.status == 503
    assert result.header("Retry-After")
    assert result.json() == {"status": "unavailable", "reason": reason}


def test_health_names_redis_first_and_asks_the_broker_only_when_redis_answers() -> None:
    h: Harness = make_harness()
    asked: list[str] = []

    def sickness() -> str:
        asked.append("broker")
        return "broker_unreachable"

    h.api.broker_sickness = sickness
    h.store.failure = StoreDown("no route")

    assert h.call("GET", "/health", key=None).json() == {"status": "unavailable", "reason": "redis_unreachable"}
    assert asked == []

    h.store.failure = None
    h.api.broker_sickness = lambda: ""
    assert h.call("GET", "/health", key=None).status == 200
