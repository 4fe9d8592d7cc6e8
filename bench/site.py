"""A generated site on loopback for the crawl suites: ``/section/<i>`` pages linking to others with
``<a class="section">``, spread over several loopback hosts (127.0.0.2 and up: a download slot each to a crawler).

Each host is a ``ThreadingHTTPServer`` in a thread of this process. The site counts requests per page (all hosts
together), may answer every page after a delay, and holds its home page behind a gate until ``open_gate()``, so
that a crawl's workers can all be started before the first page is answered.
"""

from __future__ import annotations

import collections
import http.server
import threading
import time


def wide_links(pages: int) -> dict[int, list[int]]:
    """Page i links to 2i+1 and 2i+2 (a tree: every page reachable from page 0), to its parent and to one more page
    across the site: most pages are found several times over, as on a real site."""
    return {i: [j for j in (2 * i + 1, 2 * i + 2, i // 2, (7 * i + 3) % pages) if j < pages] for i in range(pages)}


class Site:
    """``pages`` pages, page i on host i mod ``hosts``, each answered after ``delay`` seconds."""

    def __init__(self, pages: int, hosts: int, delay: float = 0.0):
        self.links = wide_links(pages)
        self.delay = delay
        self.requests: collections.Counter[int] = collections.Counter()
        self.gate = threading.Event()
        self._counting = threading.Lock()
        self._servers = [self._server(f"127.0.0.{2 + host}") for host in range(hosts)]
        self._bases = [f"http://{server.server_address[0]}:{server.server_address[1]}" for server in self._servers]

    @property
    def home(self) -> str:
        return self._bases[0]

    def url(self, page: int) -> str:
        return f"{self._bases[page % len(self._bases)]}/section/{page}"

    def fetched(self) -> int:
        """Pages requested at least once."""
        with self._counting:
            return len(self.requests)

    def never_fetched(self) -> int:
        return len(self.links) - self.fetched()

    def open_gate(self) -> None:
        self.gate.set()

    def __enter__(self) -> Site:
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.gate.set()  # no handler thread left waiting
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _page(self, page: int) -> bytes:
        anchors = "".join(f'<a class="section" href="{self.url(target)}">{target}</a>' for target in self.links[page])
        return f"<html><body><h1>Section {page}</h1>{anchors}</body></html>".encode()

    def _server(self, host: str) -> http.server.ThreadingHTTPServer:
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                page = self.path.rsplit("/", 1)[-1]
                if not self.path.startswith("/section/") or not page.isdigit() or int(page) not in site.links:
                    self.send_error(404)
                    return
                if page == "0":
                    site.gate.wait()
                with site._counting:
                    site.requests[int(page)] += 1
                if site.delay:
                    time.sleep(site.delay)
                body = site._page(int(page))
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a worker killed while it waited for the page

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer((host, 0), Handler)
        server.daemon_threads = True
        return server
