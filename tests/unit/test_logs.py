"""Structured log lines (adapters/logs.py)."""

from __future__ import annotations

from pathlib import Path

import json
import logging

from importer.adapters.logs import JsonFormatter, LineHandler, log_event


class Writes:
    """A stream that keeps each write apart (as dramatiq's pipe to its main process does)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def test_each_record_is_one_write_of_one_json_line() -> None:
    stream = Writes()
    handler = LineHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("importer.test_logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)

    log_event(logger, "import.applied", jobId="shipment-a", rows=3)
    log_event(logger, "import.started", logging.DEBUG, jobId="shipment-a")  # level off: nothing

    assert len(stream.writes) == 1 and stream.writes[0].endswith("\n") and stream.writes[0].count("\n") == 1
    line = json.loads(stream.writes[0])
    assert (line["msg"], line["event"], line["jobId"], line["rows"], line["level"]) == (
        "import.applied", "import.applied", "shipment-a", 3, "info",
    )


def test_worker_lines_go_to_descriptor_2_not_through_a_replaced_sys_stderr(tmp_path: Path) -> None:
    """As in a dramatiq worker process, whose sys.stderr is a pipe to dramatiq's main process."""
    import subprocess
    import sys

    code = (
        "import io, logging, sys\n"
        "from importer.adapters.logs import configure_logging, log_event, shared_stderr\n"
        "sys.stderr = io.StringIO()\n"
        "configure_logging(stream=shared_stderr())\n"
        "log_event(logging.getLogger('importer.worker'), 'import.applied', jobId='shipment-a')\n"
        "sys.__stdout__.write(repr(sys.stderr.getvalue()))\n"
    )
    err = tmp_path / "stderr"
    with open(err, "wb") as handle:
        done = subprocess.run([sys.executable, "-c", code], stderr=handle, stdout=subprocess.PIPE, timeout=60)
    assert done.returncode == 0
    assert done.stdout == b"''"  # nothing went to the replaced sys.stderr
    [line] = err.read_text().splitlines()
    assert (json.loads(line)["event"], json.loads(line)["jobId"]) == ("import.applied", "shipment-a")
