"""Who may send what, decided from a request's line and headers alone, before its body is read.

``refusal`` answers three questions, in this order:

- **Authenticated?** With Scrapyd's ``username`` and ``password`` set, a request without them or the read-only pair
  is answered 401 exactly as Scrapyd's own ``HTTPAuthSessionWrapper`` answers it, which this replaces.
- **From a browser on another site?** A request that writes (any method but GET, HEAD and OPTIONS) carrying
  ``Sec-Fetch-Site: cross-site`` or ``same-site``, or an ``Origin`` that is not the node's own, is refused: a page
  elsewhere must not make an operator's browser (which holds the Basic credentials of ``/jobs``) schedule or deploy.
  Command-line clients and Scrapyd's clients send neither header.
- **Allowed with the read-only pair?** ``readonly_username``/``readonly_password`` may GET the pages, the logs and the
  services in ``READ_ONLY``, and nothing else.

Pure functions over bytes: no Twisted here, so the rules are tested alone too.
"""

from __future__ import annotations

import binascii
import hmac
import json
import os
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

from scrapyd_pgqueue.config import ConfigurationError

# First path segments a read-only credential may GET: the pages, the logs and items, and the services that only
# read. Every other service writes (schedule, cancel, deploy, delete, periodic jobs) or is not known to be safe.
READ_ONLY = frozenset({
    b"", b"jobs", b"dashboard", b"metrics", b"logs", b"items",
    b"daemonstatus.json", b"alive.json", b"status.json", b"listjobs.json", b"listprojects.json",
    b"listversions.json", b"listspiders.json", b"listperiodic.json", b"tree.json",
})
SAFE_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS"})
CROSS_SITE = frozenset({b"cross-site", b"same-site"})
DEFAULT_PORTS = {b"http": b":80", b"https": b":443"}
# Twisted's UnauthorizedResource with Scrapyd's BasicCredentialFactory(b"Scrapyd"): clients depend on it.
CHALLENGE = b'basic realm="Scrapyd"'


@dataclass(frozen=True)
class Credentials:
    """The node's Basic credentials (None: Scrapyd asks for none), and the optional read-only pair."""

    full: tuple[bytes, bytes] | None = field(repr=False)  # passwords: never in a log line
    read_only: tuple[bytes, bytes] | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config) -> Credentials:
        """As Scrapyd reads its own pair: the environment first, then the configuration files."""
        def pair(username: str, password: str) -> tuple[bytes, bytes] | None:
            return (username.encode(), password.encode()) if username and password else None

        credentials = cls(
            pair(os.environ.get("SCRAPYD_USERNAME") or config.get("username", ""),
                 os.environ.get("SCRAPYD_PASSWORD") or config.get("password", "")),
            pair(os.environ.get("SCRAPYD_READONLY_USERNAME") or config.get("readonly_username", ""),
                 os.environ.get("SCRAPYD_READONLY_PASSWORD") or config.get("readonly_password", "")))
        if credentials.read_only and not credentials.full:
            raise ConfigurationError("readonly_username and readonly_password need Scrapyd's username and password "
                                     "(without them the node asks for no credentials at all)")
        if credentials.read_only and b":" in credentials.read_only[0]:
            raise ConfigurationError("readonly_username must not contain ':' (RFC 7617)")
        if credentials.read_only and credentials.read_only[0] == credentials.full[0]:
            raise ConfigurationError("readonly_username must differ from username")
        return credentials

    def role(self, authorization: bytes | None) -> str | None:
        """"full", "read-only" or None for an ``Authorization`` header value (any pair when none is configured)."""
        if self.full is None:
            return "full"
        given = basic_pair(authorization)
        if given is None:
            return None
        if same_pair(given, self.full):
            return "full"
        if self.read_only is not None and same_pair(given, self.read_only):
            return "read-only"
        return None


def basic_pair(authorization: bytes | None) -> tuple[bytes, bytes] | None:
    """The (username, password) of a Basic ``Authorization`` value, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:  # as Twisted's BasicCredentialFactory decodes it (padding optional)
        username, separator, password = binascii.a2b_base64(token.strip() + b"===").partition(b":")
    except binascii.Error:
        return None
    return (username, password) if separator else None


def same_pair(given: tuple[bytes, bytes], expected: tuple[bytes, bytes]) -> bool:
    """Both compared in constant time, whichever differs."""
    return hmac.compare_digest(given[0], expected[0]) & hmac.compare_digest(given[1], expected[1])


@dataclass(frozen=True)
class Refusal:
    code: int
    message: str  # for the JSON answer; the 401 answers as Scrapyd's does


def refusal(credentials: Credentials, method: bytes, target: bytes, headers, secure: bool) -> Refusal | None:
    """Why a request must be answered without reading its body, or None. ``headers`` has ``getRawHeaders``."""
    def first(name: bytes) -> bytes | None:
        values = headers.getRawHeaders(name)
        return values[0] if values else None

    role = credentials.role(first(b"Authorization"))
    if role is None:
        return Refusal(401, "Unauthorized")
    if method not in SAFE_METHODS:
        site = (first(b"Sec-Fetch-Site") or b"").strip().lower()
        origin = first(b"Origin")
        if site in CROSS_SITE or (origin is not None and not is_own_origin(origin, headers, secure)):
            return Refusal(403, f"a {method.decode(errors='replace')} from a page of another site is refused "
                                "(Origin / Sec-Fetch-Site): send it from a client of the API, or from this node's "
                                "own pages")
    if role == "read-only" and (method not in SAFE_METHODS or first_segment(target) not in READ_ONLY):
        return Refusal(403, f"the read-only credential may not {method.decode(errors='replace')} "
                            f"{target.split(b'?', 1)[0].decode(errors='replace')}: it may read the pages, the logs "
                            "and the services that only read (see docs/how-to/security.md)")
    return None


def first_segment(target: bytes) -> bytes:
    """The first path segment of a request target, unquoted as Twisted's Site routes it."""
    path = target.split(b"?", 1)[0]
    return unquote_to_bytes(path[1:].split(b"/", 1)[0])


def is_own_origin(origin: bytes, headers, secure: bool) -> bool:
    """Whether ``Origin`` names this node as the browser reached it: the scheme (TLS, else a proxy's
    ``X-Forwarded-Proto``) and host (a proxy's ``X-Forwarded-Host``, else ``Host``). A page cannot set those
    headers on a form it sends, so trusting them cannot let another site pass."""
    def first(name: bytes) -> bytes | None:
        values = headers.getRawHeaders(name)
        return values[0].split(b",")[0].strip().lower() if values else None

    scheme = b"https" if secure else (first(b"X-Forwarded-Proto") or b"http")
    host = first(b"X-Forwarded-Host") or first(b"Host")
    if not host or scheme not in DEFAULT_PORTS:
        return False
    return without_default_port(origin.strip().lower()) == without_default_port(scheme + b"://" + host)


def without_default_port(origin: bytes) -> bytes:
    scheme = origin.split(b"://", 1)[0]
    port = DEFAULT_PORTS.get(scheme)
    return origin[: -len(port)] if port and origin.endswith(port) else origin


def json_error(node_name: str, message: str) -> bytes:
    """Scrapyd's JSON error."""
    return json.dumps({"node_name": node_name, "status": "error", "message": message}).encode() + b"\n"
