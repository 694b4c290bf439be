"""The AWS Lambda entry point (``importer.adapters.processes.aws_lambda.handler``).

Like adapters/processes/worker.py for a dramatiq worker, this is a composition
root: the first invocation of an execution environment builds the Api from
the environment; the transport itself is handlers/serverless.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from importer.handlers.auth import KeyRing
from importer.handlers.serverless import Event, EventResponse, LambdaHandler, make_handler


@dataclass(frozen=True)
class _Deployed:
    """What a warm Lambda execution environment keeps between invocations."""

    side: Any  # importer.adapters.bootstrap.HttpSide (holds the Redis client and broker)
    handle: LambdaHandler


_deployed: _Deployed | None = None


def _deploy() -> _Deployed:
    # Imported here, not at module level: importing this module builds and
    # connects nothing (and needs no environment variable).
    from importer.adapters.bootstrap import build_http
    from importer.adapters.logs import configure_logging
    from importer.adapters.settings import Settings

    settings = Settings.from_env()
    configure_logging()
    side = build_http(settings)
    keys = KeyRing.parse(settings.api_keys)
    return _Deployed(side=side, handle=make_handler(side.api, keys))


def handler(event: Event, context: object) -> EventResponse:
    """AWS Lambda entry point (``importer.adapters.processes.aws_lambda.handler``).

    Works behind an API Gateway HTTP API (Lambda integration, payload format
    version 2.0, ``$default`` stage or a custom domain mapping, so that
    ``rawPath`` is ``/api/...``) and behind a Lambda Function URL (auth type
    NONE: the API keys are checked here).

    Needs, like ``importer serve``:

    * ``IMPORTER_REDIS_URL``: the Redis the workers use (reachable from the
      function's VPC/subnets);
    * ``IMPORTER_API_KEYS`` or ``IMPORTER_API_KEYS_FILE`` (``owner:sha256hex``
      entries); every other ``IMPORTER_*`` setting is read as for the server;
    * the worker (``importer worker``) running elsewhere: the function only
      records jobs and sends their messages, it never applies a shipment.

    The first invocation of an execution environment builds the Api (Redis
    client, broker) from the environment and keeps it for warm invocations;
    a failed build is retried on the next invocation. Nothing is built or
    connected at import time. If Lambda's timeout cuts an enqueue after the
    job was recorded but before its message was sent, the job stays in the
    *unsent* index and the reconciler in the workers sends it after
    ``IMPORTER_WAITING_GRACE`` seconds; a re-post of the same batch is harmless.
    """
    global _deployed
    deployed = _deployed
    if deployed is None:
        deployed = _deployed = _deploy()
    return deployed.handle(event, context)
