"""Request bodies bounded before they are read: ``max_request_bytes`` for every path, ``max_egg_bytes`` for
addversion.json (an egg is legitimately large).

Twisted's HTTP channel reads a whole body (into memory, or a temporary file beyond 100 kB) before anything renders
it, and parses a form body at once. A request whose Content-Length is over its path's limit, or whose chunked body
grows over it, has the rest of its body counted and dropped, never kept nor parsed; once the body has arrived it is
answered with Scrapyd's JSON error (HTTP 200, as Scrapyd's own refusals). Answering only then keeps the answer
readable: a client still sending when the node closes the connection would see a reset, not the answer. Basic
authentication still comes first: a client without the right credentials gets 401.
"""

from __future__ import annotations

import json
from urllib.parse import unquote_to_bytes

from twisted.application.service import IServiceCollection
from twisted.web import resource, server, util
from twisted.web._auth.wrapper import UnauthorizedResource

EGG_PATH = [b"addversion.json"]


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
        self.answer = json.dumps({"node_name": node_name, "status": "error", "message": message}).encode() + b"\n"

    def render(self, request):
        request.setHeader(b"Content-Type", b"application/json")
        request.setHeader(b"Access-Control-Allow-Origin", b"*")
        return self.answer


class BoundedRequest(server.Request):
    """A request whose body may not exceed its path's limit (``bounded_request_class`` sets the limits)."""

    node_name: str
    max_request_bytes: int
    max_egg_bytes: int
    body_limit: tuple[int, str]  # and the option that sets it

    def gotLength(self, length):
        # The request line is parsed before the headers; Twisted keeps its target on the channel until the body is in.
        self.body_limit = self.limit_for(self.channel._path)
        if length is not None and length > self.body_limit[0]:
            self.content = _Dropped(0)
        else:
            super().gotLength(length)

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

    def render(self, resrc):
        # Authentication in progress (DeferredResource renders the resource it finds again) or refused: theirs.
        if isinstance(self.content, _Dropped) and not isinstance(resrc, (util.DeferredResource, UnauthorizedResource)):
            limit, option = self.body_limit
            resrc = _BodyTooLarge(self.node_name, (
                f"the request body is {self.content.size} bytes; {self.path.decode(errors='replace')} takes at most "
                f"{limit} ({option})"))
        super().render(resrc)


def bounded_request_class(node_name: str, max_request_bytes: int, max_egg_bytes: int) -> type[BoundedRequest]:
    return type("BoundedRequest", (BoundedRequest,), {
        "node_name": node_name, "max_request_bytes": max_request_bytes, "max_egg_bytes": max_egg_bytes,
    })


def bound_request_bodies(app, settings) -> None:
    """Make every HTTP site of a Scrapyd application (its TCP and Unix servers) bound request bodies."""
    request_class = bounded_request_class(settings.node_name, settings.max_request_bytes, settings.max_egg_bytes)
    for service in IServiceCollection(app):
        for argument in getattr(service, "args", ()):
            if isinstance(argument, server.Site):
                argument.requestFactory = request_class
