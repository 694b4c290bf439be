"""Fixtures for a real local Redis Cluster (see cluster_nodes.py).

``redis_cluster``: one 3-master / 3-replica cluster for the whole session; tests
on it must leave every node running (they may move slots: look the topology
up, never assume it). ``fresh_cluster``: a factory for clusters owned by one
test, for tests that kill or restart nodes.

Both FAIL (never skip) when the cluster cannot be formed: a machine that
cannot run these tests must show up red, not silently green.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.cluster.cluster_nodes import ClusterError, LocalCluster, resolve_server_binary, server_version

# Formation takes ~2-3 s on an idle 2-core box; the bound leaves room for a loaded one.
FORM_TIMEOUT_S = 60.0


def pytest_report_header(config: pytest.Config) -> str:
    try:
        binary = resolve_server_binary()
        return f"redis cluster server: {binary} ({server_version(binary)})"
    except ClusterError as exc:
        return f"redis cluster server: NONE ({exc})"


def _start(cluster_dir: Path, masters: int, replicas_per_master: int, **kwargs: Any) -> LocalCluster:
    problem = None
    try:
        cluster = LocalCluster(cluster_dir, masters=masters, replicas_per_master=replicas_per_master, **kwargs)
        cluster.start(timeout=FORM_TIMEOUT_S)
    except (ClusterError, OSError, redis.RedisError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:  # outside the except: no chained traceback noise
        pytest.fail(f"the local Redis Cluster could not be formed: {problem}", pytrace=False)
    return cluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = _start(tmp_path_factory.mktemp("redis-cluster"), masters=3, replicas_per_master=1)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``make(masters=3, replicas_per_master=1, **LocalCluster kwargs)`` -> a started
    cluster that this test owns; all of them are stopped at teardown."""
    made: list[LocalCluster] = []

    def make(masters: int = 3, replicas_per_master: int = 1, **kwargs: Any) -> LocalCluster:
        cluster = _start(tmp_path / f"cluster-{len(made)}", masters, replicas_per_master, **kwargs)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop()
