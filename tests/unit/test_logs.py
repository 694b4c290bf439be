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


def _text_line(record_fields: dict[str, object], *, logger_name: str = "importer.worker", level: int = logging.INFO) -> str:
    from importer.adapters.logs import TextFormatter

    stream = Writes()
    handler = LineHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger(logger_name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        log_event(logger, str(record_fields.pop("event")), level, **record_fields)
    finally:
        logger.handlers[:] = []
        logger.propagate = True
    [write] = stream.writes
    assert write.endswith("\n")
    return write[:-1]


def test_a_text_line_is_time_level_event_and_its_fields() -> None:
    import re

    line = _text_line({"event": "worker.completed", "jobId": "shipment-a", "batchId": "a", "imported": 3})
    assert re.fullmatch(r"\d\d:\d\d:\d\d info  worker\.completed jobId=shipment-a batchId=a imported=3", line), line
    line = _text_line({"event": "redis.no_persistence", "hint": "enable AOF", "accepts": [1, 2], "ok": True}, level=logging.WARNING)
    assert line.split(" ", 1)[1] == 'warning redis.no_persistence hint="enable AOF" accepts=[1,2] ok=true'
    # A value that would break the line or the key=value reading is quoted.
    line = _text_line({"event": "http.refused", "detail": "a\nb", "empty": "", "eq": "k=v", "none": None})
    assert line.split(" ", 3)[3] == 'http.refused detail="a\\nb" empty="" eq="k=v" none=null'
    assert "\n" not in line


def test_a_text_line_carries_the_request_id_and_the_traceback() -> None:
    from importer.adapters.logs import TextFormatter
    from importer.domain.ids import request_id_var

    formatter = TextFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("importer.http", logging.ERROR, __file__, 1, "http.failed", (), sys.exc_info())
    record.event = "http.failed"
    record.jobId = "j-1"
    token = request_id_var.set("req-7")
    try:
        text = formatter.format(record)
    finally:
        request_id_var.reset(token)
    # one line at info: the exception as a field (the traceback is the JSON line's)
    assert text.split(" ", 1)[1] == 'error http.failed jobId=j-1 requestId=req-7 exc="ValueError: boom"'
    own = logging.getLogger("importer")  # IMPORTER_LOG_LEVEL is the level of Importer's own loggers
    level = own.level
    own.setLevel(logging.DEBUG)
    try:
        first, *rest = formatter.format(record).splitlines()
    finally:
        own.setLevel(level)
    # at debug level, the traceback follows
    assert first.endswith(" exc=\"ValueError: boom\"") and rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


def test_dramatiqs_repeats_of_an_imports_failure_are_debug_lines(tmp_path: Path) -> None:
    import io

    import dramatiq

    from importer.adapters.dramatiq.broker import ACTOR_NAME
    from importer.adapters.logs import IMPORT_ACTOR, configure_logging

    assert IMPORT_ACTOR == ACTOR_NAME
    out = io.StringIO()
    configure_logging(stream=out, log_format="text")
    ours = dramatiq.Message(queue_name="q", actor_name=ACTOR_NAME, args=(), kwargs={}, options={})
    other = dramatiq.Message(queue_name="q", actor_name="another_actor", args=(), kwargs={}, options={})
    logging.getLogger("dramatiq.worker.WorkerThread").error("Failed to process message %s with unhandled exception.", ours)
    logging.getLogger("dramatiq.middleware.time_limit.TimeLimit").warning("Time limit exceeded. Raising exception in worker thread %r.", 7)
    logging.getLogger("dramatiq.middleware.retries.Retries").info("Retrying message %r in %d milliseconds.", "m", 10)
    logging.getLogger("dramatiq.worker.WorkerThread").error("Failed to process message %s with unhandled exception.", other)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "another_actor" in lines[0], lines  # another actor's failure is still said


def test_a_text_line_of_another_library_names_its_logger_and_one_with_its_own_message_keeps_it() -> None:
    from importer.adapters.logs import TextFormatter

    formatter = TextFormatter()
    record = logging.LogRecord("dramatiq.WorkerProcess(0)", logging.INFO, __file__, 1, "Worker %s ready.", ("process",), None)
    assert formatter.format(record).split(" ", 1)[1] == "info  dramatiq.WorkerProcess(0): Worker process ready."
    record = logging.LogRecord("_granian", logging.WARNING, __file__, 1, "Listening", (), None)
    assert formatter.format(record).split(" ", 1)[1] == "warning granian: Listening"
    record = logging.LogRecord("importer.http", logging.WARNING, __file__, 1, "store unavailable", (), None)
    record.event = "http.stream_store_unavailable"
    assert formatter.format(record).split(" ", 1)[1] == 'warning http.stream_store_unavailable msg="store unavailable"'


def test_configure_logging_follows_importer_log_format(tmp_path: Path) -> None:
    """JSON unless IMPORTER_LOG_FORMAT=text; each in a process of its own (it sets the root logger)."""
    import os
    import re
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from importer.adapters.logs import configure_logging, log_event\n"
        "configure_logging()\n"
        "log_event(logging.getLogger('importer.worker'), 'import.applied', jobId='shipment-a')\n"
    )
    lines = {}
    for value in ("", "json", "text", "TEXT"):
        env = {k: v for k, v in os.environ.items() if k != "IMPORTER_LOG_FORMAT"}
        if value:
            env["IMPORTER_LOG_FORMAT"] = value
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        lines[value] = done.stderr.strip()
    assert json.loads(lines[""])["event"] == json.loads(lines["json"])["event"] == "import.applied"
    for value in ("text", "TEXT"):
        assert re.fullmatch(r"\d\d:\d\d:\d\d info  import\.applied jobId=shipment-a", lines[value]), lines[value]


def test_importer_log_level_sets_importers_own_lines_and_never_brings_dramatiqs_debug_lines() -> None:
    """IMPORTER_LOG_LEVEL (default info) is the level of Importer's own loggers:
    at debug, the line of each applied import; the libraries' own loggers stay
    at info (dramatiq's debug lines are several per message), or go up with it
    past info. A value it does not know is refused by name."""
    import os
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from importer.adapters.logs import configure_logging, log_event\n"
        "configure_logging()\n"
        "log_event(logging.getLogger('importer.worker'), 'import.applied', logging.DEBUG, jobId='shipment-a')\n"
        "log_event(logging.getLogger('importer.worker'), 'import.replayed', jobId='shipment-a')\n"
        "logging.getLogger('dramatiq.worker.WorkerThread').debug('Received message %s', 'x')\n"
        "logging.getLogger('importer.adapters.dramatiq.runner.import_shipment').debug('Completed after 0.06ms.')\n"
        "logging.getLogger('dramatiq.worker.Worker').info('Worker is ready')\n"
        "log_event(logging.getLogger('importer.worker'), 'import.fenced', logging.WARNING, jobId='shipment-a')\n"
    )
    seen = {}
    for value in ("", "info", "debug", "DEBUG", "warning", "loud"):
        env = {k: v for k, v in os.environ.items() if k not in ("IMPORTER_LOG_LEVEL", "IMPORTER_LOG_FORMAT")}
        if value:
            env["IMPORTER_LOG_LEVEL"] = value
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        if value == "loud":
            assert done.returncode != 0 and "IMPORTER_LOG_LEVEL must be debug, info, warning or error" in done.stderr
            continue
        assert done.returncode == 0, done.stderr
        seen[value] = [json.loads(line)["msg"] for line in done.stderr.splitlines()]
    assert seen[""] == seen["info"] == ["import.replayed", "Worker is ready", "import.fenced"]
    assert seen["debug"] == seen["DEBUG"] == ["import.applied", "import.replayed", "Worker is ready", "import.fenced"]
    assert seen["warning"] == ["import.fenced"]


def test_granian_lines_follow_the_format_and_only_its_threads_warning_up_to_the_measured_count_is_dropped() -> None:
    """granian's own logger, configured as granian does it (granian.log.configure_logging)."""
    import subprocess
    import sys

    code = (
        "from granian.log import LogLevels, configure_logging, logger\n"
        "from importer.adapters.processes.granian import MEASURED_THREADS, granian_log_config\n"
        "import sys\n"
        "configure_logging(LogLevels.warning, granian_log_config(sys.argv[1], MEASURED_THREADS))\n"
        "for n in (MEASURED_THREADS, MEASURED_THREADS + 1):\n"
        "    logger.warning(f'Configuration allows spawning up to {n} Python threads, which seems quite high')\n"
        "logger.warning('Killing worker-1 after it refused to gracefully stop')\n"
        "logger.info('Listening at: http://127.0.0.1:1')\n"
    )
    from importer.adapters.processes.granian import MEASURED_THREADS

    for log_format in ("json", "text"):
        done = subprocess.run([sys.executable, "-c", code, log_format], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 2, lines
        messages = [json.loads(line)["msg"] for line in lines] if log_format == "json" else [line.split(": ", 1)[1] for line in lines]
        assert messages == [
            f"Configuration allows spawning up to {MEASURED_THREADS + 1} Python threads, which seems quite high",
            "Killing worker-1 after it refused to gracefully stop",
        ]
        if log_format == "text":
            assert all(" warning granian: " in line for line in lines), lines
