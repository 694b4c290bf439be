"""Checks the Redis this service runs on (docs/operations.md).

Stock, done markers and job records must never be evicted: a Redis whose
``maxmemory-policy`` is not ``noeviction`` could silently drop a done marker
and let a shipment be added twice. So HTTP and worker refuse to start on
such a Redis unless the operator explicitly overrides it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from importer.adapters.redis.client import RedisClient
from importer.adapters.logs import log_event

log = logging.getLogger("importer")


class EvictionPolicyError(RuntimeError):
    """Redis may evict keys; the message is the one-line explanation."""


@dataclass(frozen=True)
class RedisReport:
    version: str
    policy: str
    aof: bool
    rdb_save: str  # the 'save' schedule, '' when RDB snapshots are off, '?' when unknown

    @property
    def persistence(self) -> str:
        modes = [m for m, on in (("AOF", self.aof), ("RDB", self.rdb_save not in ("", "?"))) if on]
        return "+".join(modes) if modes else ("none" if self.rdb_save == "" else "unknown")


def inspect_redis(client: RedisClient) -> RedisReport:
    """Reads INFO (which managed services allow even where CONFIG is disabled).

    On a Redis Cluster, every master's: the report of the first one that
    evicts, else of the first without persistence, else of the first (an
    evicted done marker on any master could let a shipment be added twice)."""
    if isinstance(client, redis.RedisCluster):
        reports = [_inspect_node(node.redis_connection) for node in client.get_primaries()]
        evicting = [r for r in reports if r.policy != "noeviction"]
        unpersisted = [r for r in reports if r.persistence == "none"]
        return (evicting or unpersisted or reports)[0]
    return _inspect_node(client)


def _inspect_node(client: redis.Redis) -> RedisReport:
    server = client.info("server")
    memory = client.info("memory")
    persistence = client.info("persistence")
    try:
        save = client.config_get("save").get("save", "?")
    except redis.ResponseError:
        save = "?"
    return RedisReport(
        version=str(server.get("redis_version", "?")),
        policy=str(memory.get("maxmemory_policy", "?")),
        aof=bool(int(persistence.get("aof_enabled", 0))),
        rdb_save=str(save),
    )


def guard(client: RedisClient, *, allow_eviction: bool, process: str) -> RedisReport | None:
    """Refuse (EvictionPolicyError) unless noeviction, or warn loudly with the override.

    Returns None when Redis cannot be reached now: the process starts and
    reports it through /health and its logs.
    """
    try:
        report = inspect_redis(client)
    except (redis.ConnectionError, redis.TimeoutError):
        log_event(log, "redis.unreachable_at_start", logging.WARNING, component=process)
        return None
    log_event(
        log, "redis.checked", component=process, version=report.version, policy=report.policy,
        persistence=report.persistence,
    )
    if report.persistence == "none":
        log_event(log, "redis.no_persistence", logging.WARNING, component=process,
                  hint="a Redis restart loses stock and done markers; enable AOF")
    if report.policy != "noeviction":
        explanation = (
            f"Redis maxmemory-policy is {report.policy}; Importer requires noeviction "
            "(an evicted done marker could let a shipment be added twice). Set "
            "'maxmemory-policy noeviction', or start with --allow-eviction / IMPORTER_ALLOW_EVICTION=1 at your own risk."
        )
        if not allow_eviction:
            raise EvictionPolicyError(explanation)
        log_event(log, "redis.eviction_allowed", logging.WARNING, component=process, policy=report.policy,
                  warning="STARTING DESPITE AN EVICTING REDIS: stock and done markers may be lost")
    return report
