"""1. drain: N pre-enqueued 3-row imports through Importer's worker, the BullMQ peer's worker and a no-op
dramatiq actor on the same server; imports/s from the first fetch to the last completion.

1b. bulk drain: the same, each system's bulk path pre-enqueuing (requests of 100 shipments): Importer's
bulk intake (group messages of up to 64 imports), the peer's addBulk (one job per import)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from importer.adapters.redis.keys import Keys
from importer.domain.contract import encode_message
from importer.domain.shipment import job_id_for

from bench.suite.common import (
    QUEUE,
    ROOT,
    BenchError,
    OtherLoad,
    cpu_seconds,
    csv_3rows,
    log,
    new_prefix,
    tail,
    tree_cpu,
)
from bench.suite.procs import Proc
from bench.suite.producer import parallel, preenqueue_importer, preenqueue_importer_bulk
from bench.suite.report import peer_at_least, peer_at_most

if TYPE_CHECKING:
    from bench.suite.servers import Bench

SUBJECTS = ("importer", "peer", "noop")
#: scenario 1b: each system pre-enqueues through its bulk path
BULK_SUBJECTS = ("importer-bulk", "peer-bulk")
#: shipments per bulk request (Importer) or addBulk call (the peer)
BULK_PER_REQUEST = 100


def preenqueue_noop(b: Bench, namespace: str, n: int, tag: str) -> None:
    broker = RedisBroker(url=b.url, namespace=namespace, middleware=[])

    def work(indices: range) -> None:
        for i in indices:
            batch_id = f"{tag}-{i}"
            body = encode_message(job_id_for(batch_id), batch_id, uuid.uuid4().hex)
            broker.enqueue(dramatiq.Message(queue_name=QUEUE, actor_name="noop", args=(body,), kwargs={}, options={}))

    try:
        parallel(work, n)
    finally:
        broker.close()


@dataclass
class Setup:
    """What one subject's drain needs: its queue list, how to start its worker, how to see it done."""

    queue_key: str
    argv: list[str]
    env: dict[str, str]
    probe: list[tuple[str, ...]]
    done: Callable[[list[int]], bool]
    bad: Callable[[list[int]], str]
    enqueue_s: float
    prefix: str = ""
    #: queue messages the N imports travel in (N, but for group messages)
    messages: int = 0


def setup(b: Bench, which: str, n: int, tag: str) -> Setup:
    """Pre-enqueue N imports for one subject (no worker running) and say how to drain them."""
    c = b.cfg
    t = time.monotonic()
    if which in ("importer", "importer-bulk"):
        prefix = new_prefix("drain")
        env = b.importer_env(prefix)
        keys = Keys(prefix)
        if which == "importer":
            preenqueue_importer(b.url, env, n, tag, csv_3rows)
        else:
            preenqueue_importer_bulk(b.url, env, n, tag, csv_3rows, BULK_PER_REQUEST)
        return Setup(
            queue_key=f"{keys.dramatiq}:{QUEUE}", argv=b.importer_argv("worker", *b.worker_args()), env=env,
            probe=[("ZCARD", keys.completed), ("ZCARD", keys.failed)],
            done=lambda v: v[0] >= n, bad=lambda v: f"{v[1]} job(s) failed" if v[1] else "",
            enqueue_s=time.monotonic() - t, prefix=prefix,
            # What the worker will fetch: a group message carries up to 64 imports.
            messages=b.client.llen(f"{keys.dramatiq}:{QUEUE}") if b.client else n,
        )
    if which in ("peer", "peer-bulk"):
        assert b.peer is not None
        peer = b.peer
        prefix = new_prefix("peer")[:-1]
        if which == "peer":
            peer.enqueue(prefix, n, tag)
        else:
            peer.enqueue_bulk(prefix, n, tag, BULK_PER_REQUEST)
        return Setup(
            queue_key=peer.key(prefix, "wait"), argv=peer.worker_argv(), env=peer.env(prefix),
            probe=[("ZCARD", peer.key(prefix, "completed")), ("ZCARD", peer.key(prefix, "failed"))],
            done=lambda v: v[0] >= n, bad=lambda v: f"{v[1]} job(s) failed" if v[1] else "",
            enqueue_s=time.monotonic() - t, prefix=prefix, messages=n,
        )
    namespace = new_prefix("noop") + "dramatiq"
    queue_key = f"{namespace}:{QUEUE}"
    preenqueue_noop(b, namespace, n, tag)
    env = dict(b.base_env)
    env.update(BENCH_REDIS_URL=b.url, BENCH_NAMESPACE=namespace, BENCH_QUEUE=QUEUE)
    if c.prefetch:
        env["dramatiq_queue_prefetch"] = str(c.prefetch)
    argv = [
        sys.executable, "-m", "dramatiq", "bench.suite.noop_actor",
        "--processes", str(c.processes), "--threads", str(c.threads), "--path", str(ROOT),
    ]
    return Setup(
        queue_key=queue_key, argv=argv, env=env, probe=[("HLEN", f"{queue_key}.msgs")],
        done=lambda v: v[0] == 0, bad=lambda v: "", enqueue_s=time.monotonic() - t, messages=n,
    )


def watch(
    b: Bench, proc: Proc, queue_key: str, n: int, probe: list[tuple[str, ...]],
    done: Callable[[list[int]], bool], bad: Callable[[list[int]], str], timeout: float,
    on_first: Callable[[], None] | None = None,
) -> tuple[float, float, Counter[str]]:
    """Poll the queue until the first fetch (LLEN < N), then until done. One pipeline per poll.

    Returns (monotonic time of the first fetch seen, of completion seen, commands this poller sent).
    """
    poller = redis.Redis.from_url(b.url, single_connection_client=True, socket_timeout=10)
    sent: Counter[str] = Counter()
    first: float | None = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            pipe = poller.pipeline(transaction=False)
            pipe.llen(queue_key)
            for cmd in probe:
                pipe.execute_command(*cmd)
            values = [int(v) for v in pipe.execute()]
            now = time.monotonic()
            sent["llen"] += 1
            sent["_reads"] += 1
            for cmd in probe:
                sent[cmd[0].lower()] += 1
            if first is None and values[0] < n:
                first = now
                if on_first is not None:
                    on_first()
            if done(values[1:]):
                return (first if first is not None else now), now, sent
            problem = bad(values[1:])
            if problem:
                raise BenchError(problem)
            if proc.popen.poll() is not None:
                raise BenchError(f"{proc.name} exited with {proc.popen.returncode}: {tail(proc.log_path, 5)}")
            if now > deadline:
                raise BenchError(f"timed out after {timeout:.0f} s (probe {values})")
            time.sleep(0.002 if first is None else 0.005)
    finally:
        poller.close()

def drain_once(b: Bench, n: int, which: str) -> dict[str, float]:
    """One drain of N messages; which is 'importer', 'peer' or 'noop'. Returns the figures of this run."""
    tag = f"d{uuid.uuid4().hex[:8]}"
    su = setup(b, which, n, tag)
    queue_key, argv, env, probe, done, bad, enqueue_s = su.queue_key, su.argv, su.env, su.probe, su.done, su.bad, su.enqueue_s
    assert b.client is not None
    queued = b.client.llen(queue_key)
    if queued != su.messages or (which.startswith("importer") and not n <= queued * 64 or queued > n):
        raise BenchError(f"{queued} messages queued instead of {su.messages}")
    before = b.server_stats()
    rewrites0 = b.client.info("persistence").get("aof_rewrites", 0)
    proc = b.procs.spawn(f"{which}-worker", argv, env)
    cpu: dict[str, float] = {}

    load: list[OtherLoad] = []

    def snapshot_cpu() -> None:
        cpu["worker0"] = tree_cpu(proc.popen.pid)
        cpu["server0"] = cpu_seconds(b.server_pid)
        load.append(OtherLoad(lambda: [os.getpid(), b.server_pid, proc.popen.pid]))

    try:
        timeout = 60 + n / 200
        first, end, sent = watch(b, proc, queue_key, su.messages, probe, done, bad, timeout, on_first=snapshot_cpu)
        cpu["worker1"] = tree_cpu(proc.popen.pid)
        cpu["server1"] = cpu_seconds(b.server_pid)
        other = load[0].stop() if load else {"other_pct": float("nan"), "steal_pct": float("nan")}
        after = b.server_stats()
        rewrites = b.client.info("persistence").get("aof_rewrites", 0) - rewrites0
    finally:
        b.procs.stop(proc)
    out = {
        "n": n,
        "messages": su.messages,
        "enqueue_s": enqueue_s,
        "rate": n / (end - first),
        "rate_boot": n / (end - proc.started),
        "seconds": end - first,
        "boot_s": first - proc.started,
        "worker_cpu_ms": (cpu["worker1"] - cpu.get("worker0", 0.0)) * 1000 / n,
        "server_cpu_us": (cpu["server1"] - cpu.get("server0", 0.0)) * 1e6 / n,
        "worker_util": (cpu["worker1"] - cpu.get("worker0", 0.0)) / (end - first),
        **other,
        "server_util": (cpu["server1"] - cpu.get("server0", 0.0)) / (end - first),
        "aof_rewrites": rewrites,
    }
    own_commands = sum(v for k, v in sent.items() if not k.startswith("_")) + 1  # + the first INFO
    out["commands_per"] = (after["commands"] - before["commands"] - own_commands) / n
    out["reads_per"] = (after["reads"] - before["reads"] - sent["_reads"] - 1) / n
    out["evalsha_per"] = (after.get("evalsha", 0) - before.get("evalsha", 0) + after.get("eval", 0) - before.get("eval", 0)) / n
    per_cmd = {}
    usec = {}
    for name in set(after) | set(before):
        if name.startswith("usec:"):
            delta = after.get(name, 0) - before.get(name, 0)
            if delta > 0:
                usec[name[5:]] = delta / n
            continue
        if name in ("commands", "reads"):
            continue
        delta = after.get(name, 0) - before.get(name, 0) - sent.get(name, 0) - (1 if name == "info" else 0)
        if delta / n >= 0.005:
            per_cmd[name] = delta / n
    out["per_cmd"] = per_cmd  # type: ignore[assignment]
    out["usec"] = usec  # type: ignore[assignment]
    if which in ("importer", "importer-bulk"):
        out.update(record_span(b, su.prefix, tag, n))
    return out


def record_span(b: Bench, prefix: str, tag: str, n: int) -> dict[str, float]:
    """Cross-check from the job records: first startedAt to last finishedAt (worker clock, ms)."""
    assert b.client is not None
    keys = Keys(prefix)
    pipe = b.client.pipeline(transaction=False)
    for i in range(n):
        pipe.hmget(keys.job(job_id_for(f"{tag}-{i}")), "startedAt", "finishedAt", "state")
    rows = pipe.execute()
    started = [int(r[0]) for r in rows if r[0]]
    finished = [int(r[1]) for r in rows if r[1]]
    states = Counter((r[2] or b"?").decode() for r in rows)
    if states.get("completed", 0) != n:
        raise BenchError(f"job states after the drain: {dict(states)}")
    span_ms = max(finished) - min(started)
    return {"records_rate": n / (span_ms / 1000) if span_ms > 0 else 0.0}

FIELD = {"importer": "imp", "peer": "peer", "noop": "base", "importer-bulk": "imp", "peer-bulk": "peer"}


def subjects(b: Bench) -> tuple[str, ...]:
    return tuple(s for s in SUBJECTS if s != "peer" or b.peer is not None)



def _drain_logged(b: Bench, n: int, which: str, rep: int) -> dict[str, float] | None:
    """One drain, logged and kept in the details; None when it failed (noted)."""
    c = b.cfg
    log(f"drain N={n} rep {rep + 1}/{c.repeat}: {which}")
    try:
        fig = drain_once(b, n, which)
    except BenchError as exc:
        log(f"drain {which} N={n} failed: {exc}")
        b.results.notes.append(f"drain {which} N={n} rep {rep + 1} failed: {exc}")
        return None
    finally:
        b.flush()
    b.other_load.append(fig["other_pct"])
    log(
        f"  {which}: {fig['rate']:,.0f}/s over {fig['seconds']:.2f} s (boot {fig['boot_s']:.2f} s, "
        f"pre-enqueue {fig['enqueue_s']:.1f} s, {fig['messages']:,.0f} messages); worker CPU {fig['worker_cpu_ms']:.3f} ms/import "
        f"({fig['worker_util'] * 100:.0f}% of a core), Redis {fig['server_cpu_us']:.0f} µs/import "
        f"({fig['server_util'] * 100:.0f}%, AOF rewrites {fig['aof_rewrites']}), others {fig['other_pct']:.0f}%; {fig['commands_per']:.1f} cmds, "
        f"{fig['evalsha_per']:.2f} EVALSHA, {fig['reads_per']:.2f} reads per import"
        + (f"; records span {fig['records_rate']:,.0f}/s" if "records_rate" in fig else "")
    )
    per_cmd = ", ".join(f"{k} {v:.2f}" for k, v in sorted(fig["per_cmd"].items(), key=lambda kv: -kv[1]))  # type: ignore[union-attr]
    b.results.details.append(
        f"drain N={n} rep {rep + 1} {which}: {fig['rate']:,.0f}/s over {fig['seconds']:.3f} s, "
        f"{fig['messages']:,.0f} queue messages, "
        f"worker boot {fig['boot_s']:.2f} s, pre-enqueue {fig['enqueue_s']:.1f} s, "
        f"worker CPU {fig['worker_cpu_ms']:.3f} ms/import (busy {fig['worker_util'] * 100:.0f}% of one core), "
        f"Redis CPU {fig['server_cpu_us']:.1f} µs/import (busy {fig['server_util'] * 100:.0f}% of one core), "
        f"other processes on the machine {fig['other_pct']:.0f}% of a core (steal {fig['steal_pct']:.0f}%)"
        + (f", job records first startedAt→last finishedAt {fig['records_rate']:,.0f}/s" if "records_rate" in fig else "")
        + f"; server commands per import: {per_cmd}; "
        + "server time per import by command (commandstats usec, scripts include their inner commands): "
        + ", ".join(f"{k} {v:.1f} µs" for k, v in sorted(fig["usec"].items(), key=lambda kv: -kv[1])[:8])  # type: ignore[union-attr]
    )
    return fig


def scenario_drain(b: Bench) -> None:
    c = b.cfg
    res = b.results
    for n in c.drain_ns:
        rate = res.row(
            "1. drain", f"N={n:,}: imports/s, first fetch → all completed", "/s",
            base_label="no-op actor", target=peer_at_least(0.8),
        )
        boot = res.row("1. drain", f"N={n:,}: imports/s incl. worker boot (from process start)", "/s", base_label="no-op actor")
        last = n == max(c.drain_ns)
        if last:
            msgs = res.row("1. drain", f"N={n:,}: queue messages per import", "", base_label="per no-op msg", decimals=3)
            cmds = res.row("1. drain", f"N={n:,}: server commands per import (all, incl. inside scripts)", "", base_label="per no-op msg")
            evals = res.row("1. drain", f"N={n:,}: EVALSHA calls per import", "", base_label="per no-op msg")
            reads = res.row("1. drain", f"N={n:,}: request reads per import (≈ round trips)", "", base_label="per no-op msg")
            wcpu = res.row("1. drain", f"N={n:,}: worker CPU per import (user+sys, all worker processes)", "ms", base_label="per no-op msg", decimals=3)
            scpu = res.row("1. drain", f"N={n:,}: Redis server CPU per import", "µs", base_label="per no-op msg", decimals=1)
        for rep in range(c.repeat):
            for which in subjects(b):
                fig = _drain_logged(b, n, which, rep)
                if fig is None:
                    continue
                target = FIELD[which]
                getattr(rate, target).append(fig["rate"])
                getattr(boot, target).append(fig["rate_boot"])
                if last:
                    getattr(msgs, target).append(fig["messages"] / n)
                    getattr(cmds, target).append(fig["commands_per"])
                    getattr(evals, target).append(fig["evalsha_per"])
                    getattr(reads, target).append(fig["reads_per"])
                    getattr(wcpu, target).append(fig["worker_cpu_ms"])
                    getattr(scpu, target).append(fig["server_cpu_us"])


def scenario_bulk_drain(b: Bench) -> None:
    """1b: N imports pre-enqueued through each system's bulk path, then drained."""
    c = b.cfg
    res = b.results
    n = max(c.drain_ns)
    scenario = "1b. bulk drain"
    head = f"N={n:,}, enqueued {BULK_PER_REQUEST} per request"
    rate = res.row(scenario, f"{head}: imports/s, first fetch → all completed", "/s", target=peer_at_least(1.0))
    msgs = res.row(scenario, f"{head}: queue messages per import", "", decimals=3)
    cmds = res.row(scenario, f"{head}: server commands per import (all, incl. inside scripts)", "")
    reads = res.row(scenario, f"{head}: request reads per import (≈ round trips)", "")
    wcpu = res.row(scenario, f"{head}: worker CPU per import (user+sys, all worker processes)", "ms", decimals=3,
                   target=peer_at_most(1.0))
    scpu = res.row(scenario, f"{head}: Redis server CPU per import", "µs", decimals=1, target=peer_at_most(1.0))
    for rep in range(c.repeat):
        for which in BULK_SUBJECTS:
            if which == "peer-bulk" and b.peer is None:
                continue
            fig = _drain_logged(b, n, which, rep)
            if fig is None:
                continue
            target = FIELD[which]
            getattr(rate, target).append(fig["rate"])
            getattr(msgs, target).append(fig["messages"] / n)
            getattr(cmds, target).append(fig["commands_per"])
            getattr(reads, target).append(fig["reads_per"])
            getattr(wcpu, target).append(fig["worker_cpu_ms"])
            getattr(scpu, target).append(fig["server_cpu_us"])
