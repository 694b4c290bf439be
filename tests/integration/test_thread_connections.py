"""The store's scripts on each thread's own connection (ImporterRedis.run_script),
against a real Redis-compatible server: each thread has one, a call
interrupted between its send and its reply never hands that reply to the
next call, a server that lost its scripts gets them again, a connection the
server closed is reopened, and close() closes every thread's."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from importer.adapters.redis.client import ImporterRedis

pytestmark = pytest.mark.integration

ECHO = "return ARGV[1]"


def client_ids(client: ImporterRedis) -> set[int]:
    return {int(c["id"]) for c in client.client_list() if c.get("name") == "thread-conn-test"}


@pytest.fixture
def client(redis_url: str) -> Any:
    c = ImporterRedis.from_url(redis_url, client_name="thread-conn-test")
    yield c
    c.close()


def test_each_thread_keeps_one_connection_and_close_closes_them_all(client: ImporterRedis) -> None:
    script = client.register_script(ECHO)
    seen: dict[str, list[bytes]] = {}

    def work(name: str) -> None:
        seen[name] = [client.run_script(script, [], [f"{name}-{i}"]) for i in range(20)]

    threads = [threading.Thread(target=work, args=(f"t{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert seen == {f"t{n}": [f"t{n}-{i}".encode() for i in range(20)] for n in range(4)}
    assert len(client._own_connections) == 4  # one per thread, made once
    assert len(client_ids(client)) >= 4
    client.close()
    assert not client._own_connections


def test_a_call_interrupted_before_its_reply_never_hands_the_reply_to_the_next(client: ImporterRedis) -> None:
    script = client.register_script(ECHO)
    assert client.run_script(script, [], ["warm"]) == b"warm"
    connection = client._thread_connection()
    real_read = connection.read_response
    calls = {"n": 0}

    def interrupted_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # as an asynchronous TimeLimitExceeded would, after the send
        return real_read(*args, **kwargs)

    connection.read_response = interrupted_once  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        client.run_script(script, [], ["first"])
    assert client.run_script(script, [], ["second"]) == b"second"  # not "first"


def test_a_flushed_script_cache_and_a_killed_connection_are_recovered(client: ImporterRedis) -> None:
    script = client.register_script(ECHO)
    assert client.run_script(script, [], ["a"]) == b"a"
    client.script_flush()
    assert client.run_script(script, [], ["b"]) == b"b"  # NOSCRIPT: run by EVAL
    own = client._thread_connection()
    own.send_command("CLIENT", "ID")
    own_id = int(own.read_response())
    client.client_kill_filter(_id=own_id)
    assert client.run_script(script, [], ["c"]) == b"c"  # the closed connection is reopened once
