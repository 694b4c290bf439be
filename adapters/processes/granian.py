"""``importer serve``: the WSGI app under granian (default) or gunicorn.

granian by measurement on a 2-core machine (README, Performance; the script is
bench/http_servers.py): its HTTP/1 parser and connection handling are Rust
on an async runtime, so a connection that trickles its header block holds no
Python thread, and a bare WSGI app answers about twice as many requests as
under gunicorn gthread with the same processes and threads. 64 clients sending
their headers at 1 byte/s left ``/health`` p99 at a few ms under granian; under
gunicorn gthread (2 workers x 4 threads) every ``/health`` timed out.

What granian does and does not do for us, checked against granian 2.8.9:

* Headers: read asynchronously; a header block not complete within
  ``--header-timeout`` seconds (``http1_settings.header_read_timeout``) closes
  the connection; a header block larger than the HTTP/1 buffer (408 KiB) is
  refused by granian.
* Body: streamed to the app on demand (``wsgi.input.read(n)`` waits for n
  bytes or the end), never buffered before the app asks. The app refuses an
  oversize ``Content-Length`` before reading and stops a chunked body at its
  limit (handlers/wsgi.py), so the upload limit holds as under gunicorn.
  granian has **no body read timeout**, its read cannot be interrupted and
  the app cannot close a connection: a body that trickles holds its thread
  until it ends or the client goes away (then, past IMPORTER_HTTP_BODY_TIMEOUT,
  408 request.timeout, handlers/wsgi.py). IMPORTER_MAX_BODY_READS bounds how
  many threads of a process such bodies hold. (Reading in a helper thread
  that the request stops waiting for at the deadline cost a third of the
  POST throughput.) Only requests that passed authentication and the rate
  limit read their body.
* ``Expect: 100-continue``: hyper sends ``100 Continue`` when the app first
  reads the body, so a refused request (401, 429, 503) gets its final answer
  without the client sending the body (``importer submit`` relies on it).
* No request timeout (gunicorn's ``--timeout`` restarts a stuck worker; with
  granian a stuck request holds its thread). Redis calls have socket timeouts.
* Response header names go out in lower case (hyper's HTTP/1; header names are
  case-insensitive).
* The worker processes are forked (Linux's default start method): the worker
  body below is a closure.

Shutdown, in each worker process, on the first SIGTERM or SIGINT (sent by
granian's main process, which forwards its own first signal, or directly):
1. the app marks itself closing: ``/health`` answers 503 ``closing``;
2. for ``IMPORTER_HTTP_DRAIN_DELAY`` seconds it keeps serving;
3. granian stops accepting and finishes in-flight requests (the main process
   waits drain delay + ``--graceful-timeout`` before it kills a worker);
4. the broker and Redis clients are closed; ``http.closed`` is logged.
Later signals are ignored; the main process exits 0.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from importer.adapters.exclusive import address_in_use
from importer.adapters.logs import configure_logging, formatter_class, log_event
from importer.adapters.settings import Settings, SettingsError
from importer.adapters.processes.signals import StopOnce

log = logging.getLogger("importer.http")


def default_workers() -> int:
    """``importer serve``'s processes: one per core this process may run on,
    plus one. On 2 cores (wrk -t2 -c32 POSTing 3-row files as bench/run.py
    does, in turn, docs/performance.md): 3 processes x 4 threads answered
    5,500-5,900 POSTs/s against 4,600-4,700 with 2 x 4, p99 16-19 ms against
    18 ms: a process's Python threads share one GIL, so while one process
    waits for Redis or for its GIL, another has the core."""
    return len(os.sched_getaffinity(0)) + 1


#: ``importer serve``'s Python threads per process (plus IMPORTER_MAX_EVENT_STREAMS and IMPORTER_MAX_DOWNLOADS).
DEFAULT_THREADS = 4

#: The threads per process of a default ``importer serve``: the measured count.
MEASURED_THREADS = DEFAULT_THREADS + Settings.max_event_streams + Settings.max_downloads

#: The start of the warning granian's MPServer.serve logs when a WSGI server's
#: threads per process exceed 2 x cores + 1 (granian 2.8.9, server/mp.py).
_THREADS_WARNING = re.compile(r"^Configuration allows spawning up to (\d+) Python threads")


class MeasuredThreadsFilter(logging.Filter):
    """Drops granian's "up to N Python threads ... seems quite high" warning
    when N is at most ``measured``: ``importer serve``'s default count
    (MEASURED_THREADS).

    Why a filter and not another setting: granian warns whenever its WSGI
    threads per process exceed 2 x cores + 1, which ``importer serve``'s
    default (DEFAULT_THREADS + one per allowed event stream: 8) does on a
    machine of 3 cores or fewer, so every ``importer dev`` and every default
    ``importer serve`` on a small machine started with it. That count is a
    measured choice (docs/performance.md, "HTTP: threads per process"; the
    stream threads mostly wait on Redis), and granian has no option to turn
    the check off; the ``backpressure`` it suggests does not change the check
    (and, tried at 4 and 8 per process, parked connections: p99 0.6-1.3 s,
    commit 219994e). So only that one message, and only up to the measured
    count: a larger --threads or IMPORTER_MAX_EVENT_STREAMS still gets
    granian's warning. Every other granian line passes."""

    def __init__(self, measured: int) -> None:
        super().__init__()
        self.measured = measured

    def filter(self, record: logging.LogRecord) -> bool:
        match = _THREADS_WARNING.match(record.getMessage())
        return match is None or int(match.group(1)) > self.measured


def granian_log_config(log_format: str, measured_threads: int) -> dict[str, Any]:
    """granian's own log lines in our format (IMPORTER_LOG_FORMAT): merged by
    granian.log.configure_logging into its dictConfig, in its main process and
    in each worker process."""
    cls = formatter_class(log_format)
    return {
        "formatters": {"importer": {"()": f"{cls.__module__}.{cls.__qualname__}"}},
        "filters": {"measured_threads": {"()": MeasuredThreadsFilter, "measured": measured_threads}},
        "handlers": {"console": {"formatter": "importer", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
        "loggers": {
            "_granian": {"handlers": ["console"], "level": "WARNING", "propagate": False, "filters": ["measured_threads"]},
        },
    }


#: Seconds a 411 or 413 answer stays open after its last byte (see _wsgi_callback).
LINGER_AFTER_REFUSED_BODY_S = 0.5

#: Answers that refuse a body the client may still be sending.
_REFUSED_BODY = frozenset({411, 413})


def _wsgi_callback(app: Any, scope_opts: dict[str, Any]) -> Any:
    """What granian calls per request: granian.wsgi._callback_wrapper's
    ``_runner`` (no access log), with two differences.

    * The environ is granian's scope plus the few PEP 3333 keys, not a copy
      of the whole process environment merged into every request (granian does
      that; gunicorn and waitress do not, and the app never reads it): with
      a deployment's few dozen variables it was about a tenth of a POST's
      Python time (docs/performance.md).
    * A 413 (or a 411: a chunked body without a digest) refuses a body the
      client is still sending. granian (hyper) closes
      the connection right after the answer, with unread body bytes in the
      socket: the kernel then sends a reset, and a client that reads only
      between two writes may lose the answer (seen: 1 run in 4 of the 1 GiB
      chunked upload test). Keeping the answer open a moment after its last
      byte lets the client read it first. Costs one thread for
      LINGER_AFTER_REFUSED_BODY_S per refused upload, which only comes after
      its key was accepted.
    """
    from granian.wsgi import Response, ResponseIterWrap

    prefix = scope_opts.get("url_path_prefix") or ""
    base: dict[str, Any] = {
        "GATEWAY_INTERFACE": "CGI/1.1",
        "SCRIPT_NAME": prefix,
        "SERVER_SOFTWARE": "Granian",
        "wsgi.errors": sys.stderr,
        "wsgi.input_terminated": True,
        "wsgi.multiprocess": False,
        "wsgi.multithread": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }

    def lingering(body: Any) -> Any:
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        time.sleep(LINGER_AFTER_REFUSED_BODY_S)

    def runner(proto: Any, scope: dict[str, Any]) -> int:
        response = Response()
        environ = base | scope
        if prefix:
            environ["PATH_INFO"] = scope["PATH_INFO"][len(prefix):] or "/"
        body = app(environ, response)
        if response.status in _REFUSED_BODY:
            body = lingering(body)
        if isinstance(body, list):
            proto.response_bytes(response.status, response.headers, b"".join(body))
        else:
            proto.response_iter(response.status, response.headers, ResponseIterWrap(body))
        return response.status

    return runner


def _load_side() -> Any:
    """Runs in each granian worker process: its own clients and app."""
    from importer.adapters.bootstrap import build_http

    configure_logging()
    return build_http(Settings.from_env())


def _wsgi_worker_target() -> Any:
    """granian's WSGI worker body (granian.server.mp.MPServer._spawn_wsgi_worker)
    with Importer's shutdown instead of granian's immediate one."""
    from granian._futures import _new_cbscheduler
    from granian._granian import WorkerSignal, WSGIWorker
    from granian.constants import TaskImpl
    from granian.server.common import WORKERS_METHODS
    from granian.server.mp import WorkerProcess
    from granian.wsgi import _callback_wrapper

    @WorkerProcess.wrap_target
    def worker(
        worker_id: int, side: Any, sock: Any, ipc: Any, loop: Any, runtime_mode: Any, runtime_threads: int,
        runtime_blocking_threads: int | None, blocking_threads: int, blocking_threads_idle_timeout: int,
        backpressure: int, task_impl: Any, http_mode: Any, http1_settings: Any, http2_settings: Any,
        websockets: bool, static_path: Any, log_access_fmt: str | None, ssl_ctx: Any, scope_opts: dict[str, Any],
        metrics: Any,
    ) -> None:
        callback = _wsgi_callback(side.app, scope_opts)
        if log_access_fmt:  # granian's own wrapper, with its access log (importer serve never asks for one)
            callback = _callback_wrapper(side.app, scope_opts, log_access_fmt)
        shutdown = WorkerSignal()
        served = threading.Event()
        shutdown.add_cb(served.set)

        def begin(signum: int) -> None:
            side.api.lifecycle.begin_closing()
            timer = threading.Timer(side.settings.http_drain_delay_s, shutdown.set)
            timer.daemon = True
            timer.start()

        StopOnce(begin, name="http").install(signal.SIGTERM, signal.SIGINT)
        # granian 2.8.9's _granian.pyi lags the worker's real signature (ipc, metrics).
        server = WSGIWorker(  # type: ignore[call-arg]
            worker_id, sock, ipc, runtime_threads, runtime_blocking_threads,  # type: ignore[arg-type]
            blocking_threads, blocking_threads_idle_timeout, backpressure, http_mode, http1_settings,  # type: ignore[arg-type]
            http2_settings, static_path, *ssl_ctx, metrics,
        )
        serve = getattr(server, WORKERS_METHODS[runtime_mode][(sock[0] or sock[1]).is_uds()])
        scheduler = _new_cbscheduler(loop, callback, impl_asyncio=task_impl == TaskImpl.asyncio)
        serve(scheduler, loop, shutdown)
        served.wait()
        # In-flight requests have finished: granian released the signal only then.
        side.close()
        log_event(log, "http.closed")

    return worker


def serve_granian(
    bind: str, workers: int, threads: int, graceful_timeout: int, header_timeout: float, backlog: int = 1024
) -> int:
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server.mp import MPServer

    host, _, port = bind.rpartition(":")
    # granian binds each worker's socket with SO_REUSEPORT: on a port already served
    # it would bind too, and the kernel would split the connections between the two.
    if address_in_use(host.strip("[]") or "127.0.0.1", int(port)):
        raise SettingsError(f"{bind} is already in use (another server listens there); stop it, or --bind another address")
    settings = Settings.from_env()
    server = MPServer(
        "importer.adapters.processes.wsgi_app:wsgi_app",  # the same factory any WSGI server uses
        address=host.strip("[]") or "127.0.0.1",
        port=int(port),
        interface=Interfaces.WSGI,
        workers=workers,
        blocking_threads=threads,
        http=HTTPModes.http1,
        websockets=False,
        backlog=backlog,
        http1_settings=HTTP1Settings(header_read_timeout=max(1, int(header_timeout * 1000))),
        log_level=LogLevels.warning,
        log_dictconfig=granian_log_config(settings.log_format, MEASURED_THREADS),
        workers_kill_timeout=max(1, int(settings.http_drain_delay_s + graceful_timeout + 1)),
        # A worker that dies (OOM killer, a crash) is replaced, as gunicorn does;
        # granian gives up on a crash loop (a respawn within 5.5 s).
        respawn_failed_workers=True,
    )
    server.serve(spawn_target=_wsgi_worker_target(), target_loader=_load_side, wrap_loader=False)
    return 0


def serve_command(
    *, server: str, bind: str, workers: int, threads: int, timeout: int, graceful_timeout: int, header_timeout: float
) -> int:
    """Run the chosen server until a signal stops it; returns the exit code."""
    if server == "gunicorn":
        from importer.adapters.processes.gunicorn import serve

        serve(bind, workers, threads, timeout, graceful_timeout)
        return 0
    return serve_granian(bind, workers, threads, graceful_timeout, header_timeout)
