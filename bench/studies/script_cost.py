"""What one small import's script call (start_apply.lua) costs the server, and
where inside the script that time goes.

    .venv/bin/python -m bench.studies.script_cost [--n 1500] [--repeat 5] [--against REV] [--segments]

On the bench's own valkey (never a shared Redis). Each round records N 3-row
imports through Importer's producer path (no worker), then runs one
start_apply per import through ``RedisStore.start_and_apply`` in this thread
(no queue message, so no acknowledgement). Per import, medians of the rounds:

* the EVALSHA's server time (INFO commandstats: execution only, no I/O);
* the commands run inside it, and their own server time; the rest of the
  call's time is Lua and the cost of each ``redis.call`` (arguments in,
  reply out);
* the server process's CPU (/proc: I/O, the AOF and the event loop included);
* the AOF bytes it appends (what a replica and the disk receive).

``--pruned`` runs every round as on a location where the ledger's exporter
has pruned done markers (P:ledger:pruned set, the Bloom filter of pruned
batchIds holding 20,000 others): each import then passes the ledger's door
(apply.lua, "The door"), as in a drain with the ledger on.

``--against REV`` runs the same rounds, alternating, on the Lua scripts (and
adapters/redis/scripts.py, which assembles them) of git revision REV, so a
script change is measured before/after in one run. REV's start_apply.lua must
take the KEYS and ARGV this tree's RedisStore passes.

``--segments`` then runs this tree's script once more with a checkpoint
(``os.clock()``, the server's CPU clock) after each top-level statement of
start.lua, apply.lua and start_apply.lua, and prints the time of each
statement per import, less the cost of a checkpoint (measured by two in a
row). Checkpoints inside functions or blocks are not made: a block is timed
as one statement.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.suite.common import cpu_seconds, csv_3rows, new_prefix  # noqa: E402
from bench.suite.producer import ImporterProducer  # noqa: E402
from bench.suite.servers import Bench, Config  # noqa: E402
from importer.adapters.redis import scripts as this_tree  # noqa: E402
from importer.domain.ports import OneStepImport  # noqa: E402
from importer.domain.shipment import job_id_for, parse_shipment  # noqa: E402

PROFILED = ("start", "apply", "start_apply")
#: The size of the filter of pruned batchIds (common.lua, pruned_filter_args).
FILTER_BITS = 1 << 22
NOT_COUNTED = {"cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_info", "cmdstat_script|load"}


def scripts_at(rev: str) -> types.ModuleType:
    """adapters/redis/scripts.py of git revision ``rev``, reading that revision's Lua."""
    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout

    module = types.ModuleType(f"scripts_at_{rev}")
    exec(compile(show("adapters/redis/scripts.py"), f"{rev}:adapters/redis/scripts.py", "exec"), module.__dict__)
    module._read = lambda name: show(f"adapters/redis/lua/{name}.lua")  # type: ignore[attr-defined]
    module.lua_source.cache_clear()  # type: ignore[attr-defined]
    return module


_OPENS = re.compile(r"\b(function|then|do)\b")
_CLOSES = re.compile(r"\b(end|elseif)\b")
_CONTINUES = re.compile(r"(\.\.|,|=|\(|\{|\band|\bor|\+|-|\*|/)\s*$")


def _code(line: str) -> str:
    """A line without its comment and string literals (enough for these scripts)."""
    line = re.sub(r"'(\\.|[^'\\])*'|\"(\\.|[^\"\\])*\"", "''", line)
    return line.split("--", 1)[0].rstrip()


def with_checkpoints(name: str, source: str) -> str:
    """``source`` with ``CHECKPOINT('<name>:<line> <statement>')`` after each top-level statement."""
    out: list[str] = []
    blocks = parens = 0
    lines = source.split("\n")
    for number, line in enumerate(lines, 1):
        out.append(line)
        code = _code(line)
        if not code:
            continue
        blocks += len(_OPENS.findall(code)) - len(_CLOSES.findall(code))
        parens += code.count("(") + code.count("{") - code.count(")") - code.count("}")
        if blocks or parens or _CONTINUES.search(code) or code.lstrip().startswith("return"):
            continue
        statement = line.strip() if not line[:1].isspace() else f"... {line.strip()}"
        label = f"{name}:{number} {statement[:56]}".replace("'", "").replace("\\", "")
        out.append(f"CHECKPOINT('{label}')")
    return "\n".join(out)


CHECKPOINTS = """
local checkpoint_at, checkpoint_times = os.clock(), {}
local function CHECKPOINT(label)
  local t = os.clock()
  checkpoint_times[#checkpoint_times + 1] = label
  checkpoint_times[#checkpoint_times + 1] = t - checkpoint_at
  checkpoint_at = os.clock()
end
CHECKPOINT('(one checkpoint)')
CHECKPOINT('(one checkpoint)')
"""


def segmented_source(prof_key: str) -> str:
    """This tree's start_apply.lua with checkpoints, writing their times to ``prof_key`` at its end."""
    write = (  # each label under its place in the run ("7 apply:61 ..."): the hash keeps no order
        "for i = 1, #checkpoint_times, 2 do "
        f"redis.call('HINCRBYFLOAT', '{prof_key}', ((i + 1) / 2) .. ' ' .. checkpoint_times[i], checkpoint_times[i + 1]) end\n"
    )
    read = this_tree._read

    def with_them(name: str) -> str:
        if name == "common":
            return read(name) + CHECKPOINTS
        if name == "start_apply":
            # Its body as a function, so that the times are written whatever it returns.
            body = with_checkpoints(name, read(name))
            return f"local function checkpointed()\n{body}\nend\nlocal reply = checkpointed()\n{write}return reply\n"
        return with_checkpoints(name, read(name)) if name in PROFILED else read(name)

    module = types.ModuleType("scripts_with_checkpoints")
    exec(compile(Path(this_tree.__file__).read_text(), this_tree.__file__, "exec"), module.__dict__)
    module._read = with_them  # type: ignore[attr-defined]
    return str(module.lua_source("start_apply"))  # type: ignore[attr-defined]


def as_pruned(store: Any, job_id: str) -> None:
    """The location of ``job_id`` as after the exporter pruned about 20,000 done markers
    (ledger_prune.lua): the counter set, and as many bits set in the filter of pruned
    batchIds as they set (6 each, at random here: only the density matters to a new batch)."""
    k = store.partition_of(job_id)
    pick = random.Random(0)
    pipe = store.client.pipeline(transaction=False)
    pipe.set(k.ledger_pruned, 1)
    for _ in range(20_000 * 6):
        pipe.setbit(k.ledger_pruned_filter, pick.randrange(FILTER_BITS), 1)
    pipe.execute()


def one_round(bench: Bench, source: str, n: int, tag: str, together: int = 1, pruned: bool = False,
              gate: bool = False) -> dict[str, float]:
    producer = ImporterProducer(bench.url, bench.importer_env(new_prefix("sc")))
    try:
        store = producer.side.api.store
        if gate:  # [ledger] start.lua's gate on, as with a ledger configured, and open (renewed)
            store.settings = dataclasses.replace(store.settings, database_url="postgresql://gate-only")
            store.renew_gate("main", verified=True, ttl_ms=3_600_000)
        jobs = []
        for i in range(n):
            batch_id, csv = f"{tag}-{i}", csv_3rows(i)
            jobs.append((job_id_for(batch_id), producer.submit(batch_id, csv), batch_id, parse_shipment(csv)))
        if pruned:
            as_pruned(store, jobs[0][0])
        script = store.client.register_script(source)
        store.client.script_load(source)
        store._scripts["start_apply"] = script
        r = bench.client
        r.config_resetstat()
        aof0 = r.info("persistence").get("aof_current_size", 0)
        cpu0 = cpu_seconds(bench.server_pid)
        calls = [jobs[at:at + together] for at in range(0, n, together)]
        for call in calls:
            imports = [OneStepImport(job_id, upload_id, batch_id, shipment) for job_id, upload_id, batch_id, shipment in call]
            for started, applied in store.start_and_apply_together(imports):
                if started.kind != "started" or applied is None or applied.kind != "applied":
                    raise SystemExit(f"start_apply answered {started}, {applied}")
        cpu = cpu_seconds(bench.server_pid) - cpu0
        aof = r.info("persistence").get("aof_current_size", 0) - aof0
        stats = r.info("commandstats")
        inside = {k: v for k, v in stats.items() if k not in NOT_COUNTED}
        return {
            "evalsha_us": stats["cmdstat_evalsha"]["usec"] / n,
            "calls": stats["cmdstat_evalsha"]["calls"] / n,
            "commands": sum(v["calls"] for v in inside.values()) / n,
            "commands_us": sum(v["usec"] for v in inside.values()) / n,
            "server_cpu_us": cpu * 1e6 / n,
            "aof_bytes": aof / n,
        }
    finally:
        producer.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--against", metavar="REV", help="also measure the scripts of this git revision, alternating")
    ap.add_argument("--segments", action="store_true", help="then time each top-level statement of the script")
    ap.add_argument("--pruned", action="store_true", help="every import passes the ledger's door (markers were pruned)")
    ap.add_argument("--gate", action="store_true",
                    help="also measure this tree with start.lua's ledger gate on (a ledger configured), alternating")
    ap.add_argument("--together", default="1", metavar="N,N...",
                    help="imports per call, each a row (e.g. 1,4,16; --against runs each size too)")
    a = ap.parse_args()

    cfg = Config(repeat=1, quick=True, drain_ns=[a.n], processes=1, threads=1, prefetch=64,
                 http_workers=2, http_threads=4, duration=3, rows=3, accounting_n=0, only=set())
    bench = Bench(cfg, Path(tempfile.mkdtemp(prefix="script-cost-")))
    bench.start_server()
    try:
        this = this_tree.lua_source("start_apply")
        sizes = [int(size) for size in a.together.split(",")]
        def named(tree: str, size: int) -> str:
            return tree if size == 1 else f"{tree}, {size} per call"

        sources = {named("this tree", size): (this, size) for size in sizes}
        if a.gate:
            sources.update({named("this tree, gate on", size): (this, size) for size in sizes})
        if a.against:
            then = scripts_at(a.against).lua_source("start_apply")
            sources.update({named(a.against, size): (then, size) for size in sizes})
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
        for rep in range(a.repeat):
            for name, (source, size) in (sources.items() if rep % 2 == 0 else reversed(sources.items())):
                rounds[name].append(one_round(bench, source, a.n, f"r{rep}-{uuid.uuid4().hex[:6]}", size, a.pruned,
                                              gate="gate on" in name))
        door = ", every import through the ledger's door (markers pruned)" if a.pruned else ""
        print(f"\nstart_apply.lua, 3-row imports{door}, N={a.n:,} per round, medians of {a.repeat} rounds "
              f"(valkey {bench.valkey_version}, {bench.server_config})\n")
        columns = [
            ("script calls", "calls", "{:.3f}"),
            ("EVALSHA server time, µs", "evalsha_us", "{:.1f}"),
            ("commands inside", "commands", "{:.2f}"),
            ("their own time, µs", "commands_us", "{:.1f}"),
            ("Lua and per-call cost, µs", None, "{:.1f}"),
            ("server CPU, µs", "server_cpu_us", "{:.0f}"),
            ("AOF bytes", "aof_bytes", "{:,.0f}"),
        ]
        print("| scripts | " + " | ".join(c[0] + " per import" for c in columns) + " |")
        print("| --- " * (len(columns) + 1) + "|")
        medians: dict[str, dict[str, float]] = {}
        for name, rs in rounds.items():
            m = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
            m["lua_us"] = m["evalsha_us"] - m["commands_us"]
            medians[name] = m
            cells = [fmt.format(m[key or "lua_us"]) for _, key, fmt in columns]
            print(f"| {name} | " + " | ".join(cells) + " |")
        for size in sizes if a.gate else []:
            now, before = medians[named("this tree, gate on", size)], medians[named("this tree", size)]
            print(f"| gate on ÷ off, {size} per call | EVALSHA {now['evalsha_us'] / before['evalsha_us']:.2f}×, "
                  f"commands {now['commands'] - before['commands']:+.2f} per import |")
        for size in sizes if a.against else []:
            now, before = medians[named("this tree", size)], medians[named(a.against, size)]
            cells = [f"{now[key or 'lua_us'] / before[key or 'lua_us']:.2f}×" if before[key or "lua_us"] else "—"
                     for _, key, _ in columns]
            print(f"| {named('this tree', size)} ÷ {a.against} | " + " | ".join(cells) + " |")
        for name, rs in rounds.items():
            print(f"{name}: EVALSHA µs per round: " + ", ".join(f"{r['evalsha_us']:.0f}" for r in rs))

        if a.segments:
            prof_key = "script-cost:segments"
            bench.client.delete(prof_key)
            one_round(bench, segmented_source(prof_key), a.n, f"seg-{uuid.uuid4().hex[:6]}", sizes[-1], a.pruned)
            raw = {k.decode(): float(v) for k, v in bench.client.hgetall(prof_key).items()}
            overhead = (raw.pop("1 (one checkpoint)") + raw.pop("2 (one checkpoint)")) / (2 * a.n)
            print(f"\nTime per statement per import (os.clock, less {overhead * 1e6:.2f} µs per checkpoint; "
                  "the checkpoints slow the script down, read the shares, not the sum):\n")
            rows = sorted(raw.items(), key=lambda kv: int(kv[0].split(" ", 1)[0]))
            total = sum(max(0.0, v / a.n - overhead) for _, v in rows)
            for label, seconds in rows:
                us = max(0.0, seconds / a.n - overhead) * 1e6
                print(f"{us:8.2f} µs {100 * us / (total * 1e6):5.1f} %  {label.split(' ', 1)[1]}")
    finally:
        bench.stop_server()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
