"""Every request of a node, judged before its body is read: who sent it (``request_gate.py``), then how large its
body may be: ``max_request_bytes`` for every path, ``max_egg_bytes`` for addversion.json (an egg is legitimately
large).

Twisted's HTTP channel reads a whole body (into memory, or a temporary file beyond 100 kB) before anything renders
it, and parses a form body at once; Scrapyd's basic authentication ran only then. Here a request is judged when its
headers arrive: a refused one (no credentials, a browser on another site, a write with the read-only credential) is
answered at once, its body counted and dropped as it arrives, never kept nor parsed, and the connection closed
after it (the client that keeps sending until its body ends still reads the answer, not a reset).

A request whose Content-Length is over its path's limit, or whose chunked body grows over it, has the rest of its
body dropped the same way; once the body has arrived it is answered with Scrapyd's JSON error (HTTP 200, as
Scrapyd's own refusals).

What Twisted refuses before a request exists (a request line or headers over 16 KiB, a malformed request) is
answered with Scrapyd's JSON error too, with HTTP 400 (``JsonErrorChannel``). Every response carries
``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and the pages' Content-Security-Policy
(``web/page.py``).
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from twisted.application.service import IServiceCollection
from twisted.web import http, resource, server
from twisted.web.guard import HTTPAuthSessionWrapper

from scrapyd_pgqueue.config import ConfigurationError
from scrapyd_pgqueue.web import request_gate
from scrapyd_pgqueue.web.page import POLICY

EGG_PATH = [b"addversion.json"]
SECURITY_HEADERS = {
    b"X-Frame-Options": b"DENY",
    b"X-Content-Type-Options": b"nosniff",
    b"Content-Security-Policy": POLICY.encode(),
}


class _Dropped:
    """Where a refused body goes: counted, never kept (a file-like of size 0 to Twisted's form parsing)."""

    def __init__(self, size: int):
        self.size = size

    def write(self, data: bytes) -> None:
        self.size += len(data)

    def tell(self) -> int:
        return 0

    def seek(self, *args) -> None:
        pass

    def read(self, *args) -> bytes:
        return b""

    def close(self) -> None:
        pass


class _BodyTooLarge(resource.Resource):
    isLeaf = True

    def __init__(self, node_name: str, message: str):
        super().__init__()
        self.answer = request_gate.json_error(node_name, message)

    def render(self, request):
        request.setHeader(b"Content-Type", b"application/json")
        request.setHeader(b"Access-Control-Allow-Origin", b"*")
        return self.answer


class BoundedRequest(server.Request):
    """A request judged on its headers, whose body may not exceed its path's limit (``bounded_request_class`` sets
    the credentials and limits)."""

    node_name: str
    credentials: request_gate.Credentials
    max_request_bytes: int
    max_egg_bytes: int
    body_limit: tuple[int, str]  # and the option that sets it
    answered = False  # answered when its headers arrived

    def gotLength(self, length):
        # The request line is parsed before the headers; Twisted keeps it on the channel until the body is in.
        channel = self.channel
        refused = request_gate.refusal(self.credentials, channel._command, channel._path, self.requestHeaders,
                                       channel.isSecure())
        if refused is not None:
            self.content = _Dropped(0)
            self.answer_now(refused, body_follows=length != 0)
            return
        self.body_limit = self.limit_for(channel._path)
        if length is not None and length > self.body_limit[0]:
            self.content = _Dropped(0)
        else:
            super().gotLength(length)

    def answer_now(self, refused: request_gate.Refusal, body_follows: bool) -> None:
        """Answer before the body is read; ``process`` only finishes the request once the body has been dropped."""
        self.method, self.uri, self.clientproto = self.channel._command, self.channel._path, self.channel._version
        self.answered = True
        self.requestHeaders.removeHeader(b"Expect")  # no "100 Continue" after the final answer
        if body_follows:  # read to its end (dropped), then the connection closes
            self.channel.persistent = False
            self.setHeader(b"Connection", b"close")
        self.setResponseCode(refused.code)
        for name, value in SECURITY_HEADERS.items():
            self.setHeader(name, value)
        self.setHeader(b"Date", http.datetimeToString())
        if refused.code == http.UNAUTHORIZED:  # as Scrapyd's HTTPAuthSessionWrapper answers it
            self.setHeader(b"WWW-Authenticate", request_gate.CHALLENGE)
            self.setHeader(b"Content-Type", b"text/html")
            answer = b"Unauthorized"
        else:
            self.setHeader(b"Content-Type", b"application/json")
            answer = request_gate.json_error(self.node_name, refused.message)
        self.setHeader(b"Content-Length", str(len(answer)).encode())
        self.write(answer)

    def limit_for(self, target: bytes) -> tuple[int, str]:
        """The body limit and its option's name for a request target, routed as Twisted's Site routes it."""
        path = target.split(b"?", 1)[0]
        if [unquote_to_bytes(segment) for segment in path[1:].split(b"/")] == EGG_PATH:
            return self.max_egg_bytes, "max_egg_bytes"
        return self.max_request_bytes, "max_request_bytes"

    def handleContentChunk(self, data):
        self.content.write(data)
        if not isinstance(self.content, _Dropped) and self.content.tell() > self.body_limit[0]:
            size = self.content.tell()
            self.content.close()  # a chunked body without Content-Length that grew over the limit
            self.content = _Dropped(size)

    def process(self):
        if self.answered:
            self.finish()
            return
        for name, value in SECURITY_HEADERS.items():
            self.setHeader(name, value)
        super().process()

    def render(self, resrc):
        if isinstance(self.content, _Dropped):
            limit, option = self.body_limit
            resrc = _BodyTooLarge(self.node_name, (
                f"the request body is {self.content.size} bytes; {self.path.decode(errors='replace')} takes at most "
                f"{limit} ({option})"))
        super().render(resrc)


class JsonErrorChannel(http.HTTPChannel):
    """Twisted's HTTP channel, answering what it refuses before a request exists with Scrapyd's JSON error: it
    closes the connection without a word for a line over 16 KiB (a request line, or one header), and answers a
    bare 400 for headers over 16 KiB in all, more than 500 headers, or a malformed request."""

    node_name: str

    def lineLengthExceeded(self, line):
        self.refuse_and_disconnect(f"the request line or a header is over {self.MAX_LENGTH} bytes")

    def _respondToBadRequestAndDisconnect(self):
        if self._receivedHeaderSize > self.totalHeadersSize:
            message = f"the request line and headers are over {self.totalHeadersSize} bytes in all"
        elif self._receivedHeaderCount > self.maxHeaders:
            message = f"the request has more than {self.maxHeaders} headers"
        else:
            message = "malformed request: its request line, a header, its chunked body or its form"
        self.refuse_and_disconnect(message)

    def refuse_and_disconnect(self, message: str) -> None:
        answer = request_gate.json_error(self.node_name, message)
        headers = {**SECURITY_HEADERS, b"Content-Type": b"application/json", b"Connection": b"close",
                   b"Content-Length": str(len(answer)).encode()}
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\n" + b"".join(
            name + b": " + value + b"\r\n" for name, value in headers.items()) + b"\r\n" + answer)
        self.loseConnection()


def bounded_request_class(node_name: str, credentials: request_gate.Credentials, max_request_bytes: int,
                          max_egg_bytes: int) -> type[BoundedRequest]:
    return type("BoundedRequest", (BoundedRequest,), {
        "node_name": node_name, "credentials": credentials, "max_request_bytes": max_request_bytes,
        "max_egg_bytes": max_egg_bytes,
    })


def judge_requests_on_their_headers(app, config, settings) -> None:
    """Make every HTTP site of a Scrapyd application (its TCP and Unix servers) judge requests on their headers
    and bound their bodies, in place of Scrapyd's basic authentication (which reads the body first), and answer
    Twisted's own refusals in JSON."""
    request_class = bounded_request_class(settings.node_name, request_gate.Credentials.from_config(config),
                                          settings.max_request_bytes, settings.max_egg_bytes)
    channel_class = type("JsonErrorChannel", (JsonErrorChannel,), {"node_name": settings.node_name})
    for service in IServiceCollection(app):
        for argument in getattr(service, "args", ()):
            if isinstance(argument, server.Site):
                argument.resource = without_scrapyds_authentication(argument.resource)
                argument.requestFactory = request_class
                argument.protocol = channel_class


def without_scrapyds_authentication(root):
    """The webroot Scrapyd's ``wrap_resource`` wrapped (its realm holds it), or ``root`` when not wrapped."""
    if not isinstance(root, HTTPAuthSessionWrapper):
        return root
    webroot = getattr(getattr(getattr(root, "_portal", None), "realm", None), "resource", None)
    if webroot is None:
        raise ConfigurationError("cannot find the webroot inside Scrapyd's basic authentication wrapper: this "
                                 "Scrapyd or Twisted version is not supported")
    return webroot
