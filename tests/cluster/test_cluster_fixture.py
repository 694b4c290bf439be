"""The LocalCluster fixture forms a real Redis Cluster and survives real faults.

Nothing here is skipped: with no usable server binary the fixtures fail.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.exceptions import AskError, RedisClusterException, TryAgainError

from tests.cluster.cluster_nodes import SLOTS, LocalCluster, close_cluster_client

HASH_TAGS = ["{importer}"] + [f"{{importer@{c}}}" for c in "abcdef"]

# Bounded waits, generous for a loaded 2-core machine.
FAILOVER_TIMEOUT_S = 30.0


def _cluster_client(cluster: LocalCluster) -> redis.RedisCluster:
    return redis.RedisCluster.from_url(cluster.url, socket_timeout=2, socket_connect_timeout=2)


def test_all_slots_covered_by_three_masters_each_with_a_replica(redis_cluster: LocalCluster) -> None:
    cluster = redis_cluster
    print(f"\nformed in {cluster.formation_s:.2f}s\n{cluster.describe()}")
    masters = cluster.masters()
    assert len(masters) == 3
    for node in cluster.nodes:
        assert node.alive and node.node_id
        assert (node.dir / "nodes.conf").is_file()
        cfg = node.client().config_get("*")
        assert cfg["cluster-enabled"] == "yes"
        assert cfg["appendonly"] == "yes" and cfg["appendfsync"] == "everysec"
        assert cfg["save"] == "" and cfg["maxmemory-policy"] == "noeviction"
        assert cfg["cluster-node-timeout"] == "2000"
        assert cfg["cluster-require-full-coverage"] == "yes"
        # Every node answers CLUSTER SLOTS with the complete map.
        served = set()
        for start, end, *holders in node.client().execute_command("CLUSTER", "SLOTS"):
            served.update(range(int(start), int(end) + 1))
            assert len(holders) == 2, f"{node}: slots {start}-{end} held by {holders} (master + replica expected)"
        assert served == set(range(SLOTS)), f"{node} serves {len(served)} slots"
        info = node.client().execute_command("CLUSTER", "INFO")
        assert "cluster_state:ok" in info and "cluster_slots_ok:16384" in info
    for master in masters:
        replicas = cluster.replicas_of(master)
        assert len(replicas) == 1, f"{master} has replicas {replicas}"
        repl = replicas[0].client().info("replication")
        assert repl["role"] == "slave" and repl["master_link_status"] == "up"
        assert int(repl["master_port"]) == master.port
    ranges = sorted(r for m in masters for r in cluster.slots_of(m))
    assert sum(b - a + 1 for a, b in ranges) == SLOTS


def test_hash_tags_spread_over_masters_and_rediscluster_reads_and_writes(redis_cluster: LocalCluster) -> None:
    cluster = redis_cluster
    placement = {tag: (cluster.keyslot(tag), cluster.node_of_key(tag)) for tag in HASH_TAGS}
    print()
    for tag, (slot, node) in placement.items():
        print(f"{tag:14} slot {slot:5} -> master :{node.port} (#{node.index})")
    assert len({node.port for _, node in placement.values()}) > 1

    client = _cluster_client(cluster)
    try:
        for tag in HASH_TAGS:
            key = f"{tag}:probe"
            assert client.set(key, f"value of {tag}")
        for tag, (_, node) in placement.items():
            key = f"{tag}:probe"
            assert client.get(key) == f"value of {tag}".encode()
            # It really lives on the master that serves its slot.
            assert node.client().get(key) == f"value of {tag}"
        # Same-tag multi-key commands work (one slot).
        client.mset({"{importer}:m1": "1", "{importer}:m2": "2"})
        assert client.mget("{importer}:m1", "{importer}:m2") == [b"1", b"2"]
    finally:
        close_cluster_client(client)


def test_context_manager_stop_leaves_no_process(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "small", masters=3, replicas_per_master=0) as cluster:
        pids = [n.pid for n in cluster.nodes]
        assert all(n.alive for n in cluster.nodes)
        client = _cluster_client(cluster)
        try:
            assert client.set("{importer@a}:x", "1") and client.get("{importer@a}:x") == b"1"
        finally:
            close_cluster_client(client)
    for node in cluster.nodes:
        assert node.process is not None and node.process.returncode is not None
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"pid {pid} still exists"


def test_sigkill_master_promotes_its_replica_and_writes_resume(fresh_cluster: Callable[..., LocalCluster]) -> None:
    cluster = fresh_cluster(masters=3, replicas_per_master=1)
    key = "{importer}:failover"
    victim = cluster.node_of_key(key)
    (replica,) = cluster.replicas_of(victim)
    client = _cluster_client(cluster)
    try:
        client.set(key, "before")
        # The write must be on the replica before the kill (replication is async).
        assert victim.client().execute_command("WAIT", 1, 5000) == 1

        cluster.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        assert not victim.alive

        attempts = 0
        errors: Counter[str] = Counter()
        while True:
            attempts += 1
            try:
                client.set(key, "after")
                break
            except (redis.RedisError, RedisClusterException) as exc:
                errors[type(exc).__name__] += 1
                if time.monotonic() - t_kill > FAILOVER_TIMEOUT_S:
                    raise AssertionError(f"no successful write {FAILOVER_TIMEOUT_S}s after the kill: {errors}") from exc
                time.sleep(0.05)
        t_write = time.monotonic() - t_kill

        promoted = cluster.failover_wait(victim, timeout=FAILOVER_TIMEOUT_S)
        t_ok = time.monotonic() - t_kill
        assert promoted is replica
        assert cluster.node_of_key(key) is replica
        assert client.get(key) == b"after"
        assert replica.client().get(key) == "after"

        cluster.restart(victim, timeout=FAILOVER_TIMEOUT_S)
        t_rejoin = time.monotonic() - t_kill - t_ok
        assert victim.role == "replica" and victim.master_id == replica.node_id
        # It synced from the new master (a replica serves reads after READONLY).
        with redis.Redis(port=victim.port, single_connection_client=True, decode_responses=True) as conn:
            conn.execute_command("READONLY")
            assert conn.get(key) == "after"
        print(
            f"\n[{cluster.binary.name}] SIGKILL :{victim.port} -> first successful write after {t_write:.2f}s "
            f"({attempts} attempts, errors {dict(errors)}); cluster ok with :{replica.port} as master after "
            f"{t_ok:.2f}s; restarted old master rejoined as replica in {t_rejoin:.2f}s"
        )
    finally:
        close_cluster_client(client)


def _incr_load(cluster: LocalCluster, keys: list[str], new_prefix: str, stop: threading.Event,
               counts: Counter[str], errors: list[BaseException], ops: list[int]) -> None:
    client = _cluster_client(cluster)
    rng = random.Random(7)
    try:
        j = 0
        while not stop.is_set():
            if rng.random() < 0.1:
                key = f"{new_prefix}:{j % 50}"  # keys created while the slot moves (ASK)
                j += 1
            else:
                key = rng.choice(keys)
            try:
                client.incr(key)
            except BaseException as exc:  # an INCR whose outcome is unknown: reported, not counted
                errors.append(exc)
                return
            counts[key] += 1
            ops[0] += 1
    finally:
        close_cluster_client(client)


def test_migrate_slot_with_keys_while_a_thread_increments_them(redis_cluster: LocalCluster) -> None:
    cluster = redis_cluster
    tag = "{importer@mig}"
    keys = [f"{tag}:{i}" for i in range(600)]
    slot = cluster.keyslot(tag)
    source = cluster.master_of_slot(slot)
    target = next(m for m in cluster.masters() if m is not source)
    seed = _cluster_client(cluster)
    try:
        seed.mset({k: 0 for k in keys})
        counts: Counter[str] = Counter()
        errors: list[BaseException] = []
        ops = [0]
        stop = threading.Event()
        writer = threading.Thread(
            target=_incr_load, args=(cluster, keys, f"{tag}:new", stop, counts, errors, ops), daemon=True
        )
        writer.start()
        time.sleep(0.3)
        ops_before = ops[0]
        t0 = time.monotonic()
        moved = cluster.migrate_slot(slot, target, batch=25, pause_between_batches_s=0.02)
        took = time.monotonic() - t0
        ops_during = ops[0] - ops_before
        time.sleep(0.3)  # and some writes after the hand-over (MOVED)
        stop.set()
        writer.join(timeout=15)
        assert not writer.is_alive()
        assert not errors, f"writer failed: {errors[0]!r}"
        print(
            f"\nslot {slot} :{source.port} -> :{target.port}: {moved} keys moved in {took:.2f}s, "
            f"{ops_during} INCRs during the migration, {ops[0]} in total"
        )
        assert ops_during > 0
        assert cluster.master_of_slot(slot) is target
        assert int(source.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 0
        all_keys = sorted(set(keys) | set(counts))
        assert int(target.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == len(all_keys)
        values = seed.mget(all_keys)
        lost = {k: (counts[k], v) for k, v in zip(all_keys, values) if int(v or 0) != counts[k]}
        assert not lost, f"lost or extra INCRs (expected, got): {dict(list(lost.items())[:10])}"
        seed.delete(*all_keys)
    finally:
        close_cluster_client(seed)


def test_two_step_migration_gives_ask_and_tryagain(redis_cluster: LocalCluster) -> None:
    cluster = redis_cluster
    tag = "{importer@ask}"
    keys = [f"{tag}:{i}" for i in range(20)]
    slot = cluster.keyslot(tag)
    source = cluster.master_of_slot(slot)
    target = next(m for m in cluster.masters() if m is not source)
    client = _cluster_client(cluster)
    try:
        client.mset({k: k for k in keys})
        migration = cluster.begin_migration(slot, target)
        assert migration.move_batch(8) == 8
        moved = set(target.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100))
        assert len(moved) == 8
        stayed = sorted(set(keys) - moved)
        one_moved = sorted(moved)[0]
        src = source.client()
        with pytest.raises(AskError) as ask:
            src.get(one_moved)
        assert f":{target.port}" in str(ask.value.args[0]) or ask.value.port == target.port
        with pytest.raises(TryAgainError):
            src.mget(one_moved, stayed[0])
        assert src.get(stayed[0]) == stayed[0]  # not moved yet: the source still serves it
        # RedisCluster follows the ASK redirects on its own.
        assert client.get(one_moved) == one_moved.encode()
        assert client.set(f"{tag}:created-mid-move", "x")
        assert client.incr(f"{tag}:counter-mid-move") == 1
        assert migration.finish() == len(stayed)
        assert cluster.master_of_slot(slot) is target
        assert client.mget(keys) == [k.encode() for k in keys]
        assert client.get(f"{tag}:created-mid-move") == b"x"
        client.delete(*keys, f"{tag}:created-mid-move", f"{tag}:counter-mid-move")
    finally:
        close_cluster_client(client)


def test_session_cluster_still_healthy(redis_cluster: LocalCluster) -> None:
    redis_cluster.wait_ok(timeout=15)
    assert all(n.alive for n in redis_cluster.nodes)
    assert os.getpid() != redis_cluster.nodes[0].pid
