"""A finished job's log kept in the database, served as the log file itself is (``scrapyd.website.File``, a
``twisted.web.static.File``): ``Range`` (``bytes=-N``, ``bytes=N-``, ``bytes=N-M``, several ranges), 206 with
Content-Range, 416 for a range past the end, and the whole log (200) for no or a malformed ``Range``.

Clients poll a log's end (Gerapy asks ``Range: bytes=-1000`` every 2 s while its log panel is open): every node
answers the same, whichever ran the job.
"""

from __future__ import annotations

import io

from twisted.web import server, static

CONTENT_TYPE = "text/plain; charset=utf-8"


class _StoredLog(static.File):
    """Twisted's File, sized by the stored bytes instead of a file on disk (it only reads the size and the bytes)."""

    def __init__(self, log: bytes):
        super().__init__("stored.log", defaultType=CONTENT_TYPE)
        self.log = log
        self.type, self.encoding = CONTENT_TYPE, None

    def getFileSize(self) -> int:
        return len(self.log)


def render_stored_log(request, log: bytes):
    """Answer ``request`` with ``log`` (or the ranges it asks for); returns what a ``render`` method returns."""
    request.setHeader(b"Accept-Ranges", b"bytes")
    clamp_suffix_ranges(request, len(log))
    stored = _StoredLog(log)
    stored.makeProducer(request, io.BytesIO(log)).start()
    return server.NOT_DONE_YET


def clamp_suffix_ranges(request, size: int) -> None:
    """A suffix range longer than the log (``bytes=-N``, N > size) asks for all of it (RFC 9110, 14.1.2), but
    Twisted's File seeks before the file's start and fails with a 500: rewrite it as the whole log first. Called
    for log files on disk too, so both answer alike."""
    header = request.getHeader(b"range")
    if not header:
        return
    unit, _, ranges = header.partition(b"=")
    if unit.strip().lower() != b"bytes":
        return
    parts = []
    for part in ranges.split(b","):
        part = part.strip()
        if part.startswith(b"-") and part[1:].isdigit() and int(part[1:]) > size:
            part = b"-%d" % size
        parts.append(part)
    request.requestHeaders.setRawHeaders(b"range", [b"bytes=" + b",".join(parts)])
