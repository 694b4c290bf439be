"""The producer's console: a static page (HTML, CSS, one JS file) shipped in
the package (``handlers/console/``) and served by the same app at ``/``.

No build step and nothing loaded from elsewhere: the Content-Security-Policy
allows this origin only, with no inline script or style. The page is public
(it holds no data); everything it shows comes from the authenticated API,
with the key the person pasted, kept in the tab's sessionStorage.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from importer.handlers.http import Request, Response

#: URL path -> (file in handlers/console/, content type)
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console.css": ("console.css", "text/css; charset=utf-8"),
    "/console.js": ("console.js", "text/javascript; charset=utf-8"),
    # [ops] The operators' page (its data needs a key with the ops scope).
    "/ops": ("ops.html", "text/html; charset=utf-8"),
    "/ops.js": ("ops.js", "text/javascript; charset=utf-8"),
}

SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    # Revalidate each time: a new release is picked up at once.
    ("Cache-Control", "no-cache"),
)


@cache
def _read(name: str) -> bytes:
    return (resources.files("importer.handlers") / "console" / name).read_bytes()


def serve(req: Request) -> Response | None:
    """The console's file for this request, or None when the path is not one of them."""
    entry = FILES.get(req.path)
    if entry is None or req.method not in ("GET", "HEAD"):
        return None
    name, content_type = entry
    body = _read(name)
    return Response(200, b"" if req.method == "HEAD" else body, (("Content-Type", content_type),) + SECURITY_HEADERS)
