"""The module ``dramatiq`` loads in each worker process (``importer worker``).

dramatiq's CLI needs a module that exposes a broker; this one is a
composition root entry point, so building here is its purpose.
"""

import signal

from importer.adapters.bootstrap import build_worker
from importer.adapters.logs import configure_logging, shared_stderr
from importer.adapters.settings import Settings
from importer.adapters.processes.signals import StopOnce, on_parent_death

# Each log line goes straight to the stderr the processes share, not through
# dramatiq's pipe to its main process (see shared_stderr).
configure_logging(stream=shared_stderr())
broker = build_worker(Settings.from_env())

# dramatiq's worker process kills itself (exit 1) on a second SIGTERM, which
# would cut in-flight imports short. Keep its first-signal behaviour (stop
# fetching, finish in flight within --worker-shutdown-timeout, give back the
# prefetched messages, then close) and make every later signal a no-op.
_dramatiq_termhandler = signal.getsignal(signal.SIGTERM)
if callable(_dramatiq_termhandler):
    _once = StopOnce(lambda signum: _dramatiq_termhandler(signum, None), name="worker")  # type: ignore[misc,operator]  # callable: checked above
    _once.install(signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))
    # dramatiq's main process supervises this one. If it dies (SIGKILL, OOM
    # killer), nobody would ever stop this process: stop as on SIGTERM.
    on_parent_death(lambda: _once(signal.SIGTERM), name="worker")
