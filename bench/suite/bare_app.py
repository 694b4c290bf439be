"""Baseline for the HTTP scenario: the barest WSGI app that answers like Importer.

Served by gunicorn with the same worker class, workers, threads and timeouts
as ``importer serve``. It reads the request body (any real app must) and
answers 202 with a tiny JSON body; no auth, no validation, no Redis.
"""

_BODY = b'{"jobId":"shipment-x","batchId":"x","state":"waiting"}'
_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(_BODY)))]


def app(environ, start_response):  # type: ignore[no-untyped-def]
    stream = environ.get("wsgi.input")
    if stream is not None:
        while stream.read(65536):
            pass
    start_response("202 Accepted", list(_HEADERS))
    return [_BODY]
