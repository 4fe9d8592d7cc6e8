"""What the pages share: each is built in the node's web threads (``offload``; its store calls are bounded by
``database_timeout``), never on the reactor; the layout looks like Scrapyd's own pages; everything from users is
escaped."""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import re
from urllib.parse import quote

from twisted.logger import Logger
from twisted.web import resource, server

from scrapyd_pgqueue.database.db import DatabaseError
from scrapyd_pgqueue.web import metrics, offload

log = Logger()

STYLE = """
    body { font-family: system-ui, sans-serif; }
    table { border-collapse: collapse; }
    th, td { border-style: solid; border-width: 1px; }
    tbody > tr:first-child { background-color: #eee; }
    th, td { padding: .5rem; }
    td:nth-child(2), td:nth-child(3) { word-break: break-all; }
"""


# Scrapyd's "Are you sure?" on the Cancel buttons of /jobs: the one script of any page, allowed by its hash alone.
CANCEL_CONFIRM = "return confirm('Are you sure?');"
_CANCEL_CONFIRM_HASH = base64.b64encode(hashlib.sha256(CANCEL_CONFIRM.encode()).digest()).decode()
# Every response's Content-Security-Policy: pages are server-rendered HTML and SVG with inline styles, and forms
# that post to this node.
POLICY = (
    "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    f"script-src 'unsafe-hashes' 'sha256-{_CANCEL_CONFIRM_HASH}'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
# A forwarded prefix (prefix_header, X-Forwarded-Prefix) the pages put before their links: a path of safe characters.
SAFE_PREFIX = re.compile(r"(?:/[A-Za-z0-9._~-]+)*/?")


def forwarded_prefix(request, header: str) -> str:
    """The proxy's path prefix for links, escaped; ignored unless it is a path of safe characters (a value like
    ``//evil.example`` or ``"><script>`` would make the links leave the node or inject markup)."""
    value = request.getHeader(header) or ""
    return esc(value.rstrip("/")) if SAFE_PREFIX.fullmatch(value) else ""


class BadPageRequest(Exception):
    """A page's query parameter that is out of range or malformed: a 400 page saying which values it takes."""


def int_parameter(request, name: str, default: int, lowest: int, highest: int) -> int:
    """The whole number ``name`` of the query string, ``default`` when absent; BadPageRequest when it is not a
    whole number from ``lowest`` to ``highest`` (never a value of its own chosen instead: the page would show
    numbers nobody asked for)."""
    values = request.args.get(name.encode())
    if not values:
        return default
    given = values[0].decode("utf-8", "replace")
    try:
        value = int(given)
    except ValueError:
        value = None
    if value is None or not lowest <= value <= highest:
        raise BadPageRequest(f"{name} must be a whole number from {lowest:,} to {highest:,}, not {given!r}")
    return value


def esc(value) -> str:
    """Text for HTML content and quoted attributes; None is empty."""
    return "" if value is None else html.escape(str(value), quote=True)


def quoted_log_path(project: str, spider: str, job: str) -> str:
    """A job's log under any node's ``/logs/`` (its segments quoted: they come from users)."""
    return "/logs/" + "/".join(quote(segment, safe="") for segment in (project, spider, f"{job}.log"))


def no_microseconds(value):
    if isinstance(value, datetime.timedelta):
        return value - datetime.timedelta(microseconds=value.microseconds)
    return None if value is None else value.replace(microsecond=0)


def document(title: str, body: str, *, head: str = "", style: str = "") -> bytes:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>{esc(title)}</title>
    {head}
    <style>{STYLE}{style}</style>
</head>
<body>
{body}
</body>
</html>
""".encode()


class ThreadedPage(resource.Resource):
    """A GET page built by ``build(request)`` in a thread; a database that does not answer gives a 503 page."""

    isLeaf = True
    content_type = b"text/html; charset=utf-8"

    def __init__(self, root):
        super().__init__()
        self.root = root

    def base_path(self, request) -> str:
        return forwarded_prefix(request, self.root.prefix_header)

    def build(self, request) -> bytes:  # runs in a thread
        raise NotImplementedError

    def render_GET(self, request):
        finished = offload.watch(request)
        offload.in_thread(self.build, request).addCallbacks(
            self._write, self._fail, callbackArgs=(request, finished), errbackArgs=(request, finished)
        )
        return server.NOT_DONE_YET

    def _write(self, content: bytes, request, finished) -> None:
        if finished:
            return
        request.setHeader(b"Content-Type", self.content_type)
        request.setHeader(b"Content-Length", str(len(content)).encode())
        request.write(content)
        request.finish()

    def _fail(self, failure, request, finished) -> None:
        heading = "Unavailable"
        if failure.check(BadPageRequest):
            request.setResponseCode(400)
            heading, message = "Bad request", failure.getErrorMessage()
        elif failure.check(DatabaseError):
            metrics.DATABASE_ERRORS.labels("web").inc()
            request.setResponseCode(503)
            message = f"The job queue is unavailable: {failure.getErrorMessage()}"
        else:
            log.failure("Could not build {path}", failure, path=request.path)
            request.setResponseCode(500)
            message = "Could not build this page; see the node's log."
        self._write(document("Scrapyd", f"<h1>{heading}</h1>\n<p>{esc(message)}</p>"), request, finished)
