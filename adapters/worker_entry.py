"""The module ``dramatiq`` loads in each worker process (``importer worker``).

dramatiq's CLI needs a module that exposes a broker; this one is a
composition root entry point, so building here is its purpose.
"""

from adapters.bootstrap import build_worker
from adapters.logs import configure_logging
from adapters.settings import Settings

configure_logging()
broker = build_worker(Settings.from_env())
