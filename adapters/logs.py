"""Structured logs, one record per line, with jobId/batchId/owner when known:
a JSON object per line (IMPORTER_LOG_FORMAT=json, the default for services),
or a short readable line for a terminal (text, ``importer dev``'s default).

Nothing here ever logs CSV content; callers pass ids, codes and counts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any, TextIO

from importer.adapters import tracing
from importer.adapters.settings import log_format as configured_log_format
from importer.adapters.settings import log_level as configured_log_level
from importer.domain.ids import request_id_var

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None)))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            out["requestId"] = request_id
        trace = tracing.trace_id()
        if trace is not None:
            out["traceId"] = trace
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


#: A text value written as it is; any other is quoted (JSON), so a line stays one line.
_BARE = re.compile(r"^[^\s\"'=]+$")


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        return value if _BARE.match(value) else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """One short line per record, for a person at a terminal:

        21:40:01 info  worker.completed jobId=shipment-a batchId=a imported=3

    local time, level, the event (or, for a record without one, its message,
    after the logger's name when that is not Importer's), then the same fields
    as the JSON line as key=value (requestId when known). An exception is one
    field, exc="Type: message"; its traceback is in the JSON lines (``exc``,
    IMPORTER_LOG_FORMAT=json) and, at debug level, on the lines that follow."""

    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        message = record.getMessage()
        event = getattr(record, "event", None)
        if isinstance(event, str):
            head = event
        elif record.name == "importer" or record.name.startswith("importer."):
            head = message
        else:
            head = f"{record.name.lstrip('_')}: {message}"
        fields = [f"{clock} {record.levelname.lower():<5} {head}"]
        if isinstance(event, str) and message != event:
            fields.append(f"msg={_text_value(message)}")
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_") and key != "event":
                fields.append(f"{key}={_text_value(value)}")
        request_id = request_id_var.get()
        if request_id is not None:
            fields.append(f"requestId={_text_value(request_id)}")
        trace = tracing.trace_id()
        if trace is not None:
            fields.append(f"traceId={trace}")
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            fields.append(f"exc={_text_value(f'{type(error).__name__}: {error}'[:300])}")
        line = " ".join(fields)
        if record.exc_info and logging.getLogger("importer").isEnabledFor(logging.DEBUG):
            line += "\n" + self.formatException(record.exc_info)
        return line


#: dramatiq's own lines about an import's failed attempt, which Importer's events
#: say already, one line each (import.attempt_failed, import.failure_recorded):
#: (logger, the start of its message). They are kept at debug level.
_SAID_BY_IMPORTER = (
    ("dramatiq.worker.WorkerThread", "Failed to process message"),
    ("dramatiq.middleware.time_limit.TimeLimit", "Time limit exceeded"),
    ("dramatiq.middleware.retries.Retries", "Retrying message"),
)


class _DramatiqRepeats(logging.Filter):
    """Moves dramatiq's repeats of an import's failure (_SAID_BY_IMPORTER) to debug
    level: with the worker at info, a failed attempt is one line, not four."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("dramatiq."):
            return True
        for name, start in _SAID_BY_IMPORTER:
            if record.name == name and str(record.msg).startswith(start) and _about_an_import(record):
                if not logging.getLogger("importer").isEnabledFor(logging.DEBUG):
                    return False
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


#: adapters/dramatiq/broker.py ACTOR_NAME (a unit test keeps them equal; logs import no dramatiq code).
IMPORT_ACTOR = "import_shipment"


def _about_an_import(record: logging.LogRecord) -> bool:
    """The record names no message, or a message of the import actor."""
    args = record.args if isinstance(record.args, tuple) else ()
    actor = getattr(args[0], "actor_name", None) if args else None
    return actor is None or actor == IMPORT_ACTOR


def formatter_class(log_format: str | None = None) -> type[logging.Formatter]:
    """The formatter of ``log_format``, else of IMPORTER_LOG_FORMAT: TextFormatter or JsonFormatter."""
    return TextFormatter if (log_format or configured_log_format()) == "text" else JsonFormatter


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes each record as one write: the line and its
    newline together. In a dramatiq worker process stderr is a pipe to
    dramatiq's main process, where every write is one message that the main
    process receives and writes out again: the stock handler's two writes per
    record doubled that cost on the worker's per-import line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + self.terminator)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def shared_stderr() -> TextIO:
    """This process's file descriptor 2 as a line-buffered stream, whatever
    ``sys.stderr`` was replaced with.

    dramatiq replaces ``sys.stderr`` in each worker process with a pipe that its
    main process reads and writes out again to the stderr they all share: per
    log line, a pipe message, a wake-up and a write in another process (the
    per-import line cost the worker processes more CPU than the import's own
    script call; docs/performance.md). Written straight to descriptor 2, each
    line is still one write (LineHandler; a write of up to PIPE_BUF bytes to a
    pipe is atomic), so the lines of several processes do not mix."""
    return open(os.dup(2), "w", encoding="utf-8", errors="replace", buffering=1)


def configure_logging(level: str | None = None, stream: TextIO | None = None, log_format: str | None = None) -> None:
    """Every record to ``stream`` (stderr), one line each, in ``log_format``
    (default: IMPORTER_LOG_FORMAT, else json).

    ``level`` (default: IMPORTER_LOG_LEVEL, else info) is that of Importer's own
    loggers (``importer.*``): at debug they add the line of each applied import.
    The libraries' loggers (dramatiq, redis, ...) stay at info below it: dramatiq
    writes several debug lines per message."""
    name = (level or configured_log_level()).upper()
    handler = LineHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter_class(log_format)())
    handler.addFilter(_DramatiqRepeats())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(logging.INFO, logging.getLevelName(name)))
    logging.getLogger("importer").setLevel(name)
    # dramatiq names an actor's logger after its function's module: its per-message
    # debug line ("Completed after ...") would come under importer.adapters.
    logging.getLogger("importer.adapters").setLevel(root.level)


def log_event(
    logger: logging.Logger, event: str, level: int = logging.INFO, *, exc_info: Any = None, **fields: Any
) -> None:
    """Log a named event with structured fields (jobId, batchId, owner, ...)."""
    if not logger.isEnabledFor(level):  # e.g. the worker's per-import DEBUG lines at INFO
        return
    safe = {(f"{k}_" if k in _RESERVED else k): v for k, v in fields.items()}
    logger.log(level, event, exc_info=exc_info, extra={"event": event, **safe})
