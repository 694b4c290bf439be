"""Sums the ``[faults]`` lines of a ``make faults`` soak (.faults-soak.log) per scenario.

    .venv/bin/python -m bench.faults_summary .faults-soak.log

Prints one Markdown row per scenario: runs, accepted jobs, stuck, failed,
jobs that needed another attempt, the slowest time to final after the fault,
the slowest request, and the answers of 500 (every one a failure).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(
    r"\[faults\] (?P<test>\S+): jobs=(?P<jobs>\d+) completed=\d+ failed=(?P<failed>\d+) stuck=(?P<stuck>\d+) "
    r"retried=(?P<retried>\d+) max_time_to_final=(?P<final>[\d.]+)s statuses=(?P<statuses>\{.*?\}) max_request=(?P<request>[\d.]+)s"
)


def summarize(text: str) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in text.splitlines():
        m = LINE.search(line)
        if m is None:
            continue
        row = rows[m["test"].split("::")[-1]]
        row["runs"] += 1
        for name in ("jobs", "failed", "stuck", "retried"):
            row[name] += int(m[name])
        row["final"] = max(row["final"], float(m["final"]))
        row["request"] = max(row["request"], float(m["request"]))
        row["500"] += ast.literal_eval(m["statuses"]).get(500, 0)
    return rows


def main(argv: list[str]) -> int:
    rows = summarize(Path(argv[1] if len(argv) > 1 else ".faults-soak.log").read_text())
    print("| scenario | runs | jobs | stuck | failed | retried | max time to final | max request | 500s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['runs']:.0f} | {r['jobs']:,.0f} | {r['stuck']:.0f} | {r['failed']:.0f} | {r['retried']:.0f} "
              f"| {r['final']:.1f} s | {r['request']:.1f} s | {r['500']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
