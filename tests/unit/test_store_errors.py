"""Which Redis errors mean "the store is sick" (503, retried) and which are bugs (500)."""

from __future__ import annotations

import pytest
import redis

from importer.adapters.redis.errors import StoreUnavailable, store_errors, unavailable


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (redis.ConnectionError("Connection refused"), "redis_unreachable"),
        (redis.TimeoutError("Timeout reading from socket"), "redis_unreachable"),
        (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "redis_refuses_writes"),
        (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), "redis_refuses_writes"),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), "redis_refuses_writes"),
        (redis.ResponseError("BUSY Redis is busy running a script."), "redis_refuses_writes"),
        (redis.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), "redis_refuses_writes"),
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), "redis_refuses_writes"),
        (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"), "redis_refuses_writes"),
        (redis.ResponseError("Error running script (call to f_x): @user_script:1: OOM command not allowed when used memory > 'maxmemory'."), "redis_refuses_writes"),
    ],
)
def test_a_sick_store_is_unavailable(error: Exception, reason: str) -> None:
    translated = unavailable(error)
    assert isinstance(translated, StoreUnavailable) and translated.reason == reason
    with pytest.raises(StoreUnavailable):
        with store_errors():
            raise error


@pytest.mark.parametrize("error", [
    redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    redis.ResponseError("ERR Error running script: user_script:3: attempt to compare nil with number"),
])
def test_a_bug_is_not_unavailable(error: Exception) -> None:
    assert unavailable(error) is None
    with pytest.raises(redis.ResponseError):
        with store_errors():
            raise error


def test_the_client_raises_a_refusal_as_a_connection_error_so_dramatiq_survives_it() -> None:
    import redis

    from importer.adapters.redis.client import ImporterRedis
    from importer.adapters.redis.errors import RedisRefusesWrites, unavailable

    class Refusing(ImporterRedis):
        def _execute_command(self, *args: object, **options: object) -> object:
            raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    class Broken(ImporterRedis):
        def _execute_command(self, *args: object, **options: object) -> object:
            raise redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    with pytest.raises(RedisRefusesWrites) as refused:
        Refusing().execute_command("SET", "k", "v")
    with pytest.raises(redis.ResponseError) as bug:
        Broken().execute_command("SET", "k", "v")

    assert isinstance(refused.value, redis.ConnectionError)  # what dramatiq's consumer handles
    assert unavailable(refused.value) is not None and unavailable(refused.value).reason == "redis_refuses_writes"  # type: ignore[union-attr]
    assert not isinstance(bug.value, redis.ConnectionError)
