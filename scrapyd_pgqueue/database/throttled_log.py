"""A recurring problem said once, then at most once a minute with a count: logs that stay readable while a
database is away for an hour."""

from __future__ import annotations

import threading
import time


class ThrottledLog:
    """Says a recurring problem once, then at most once per ``every`` seconds with how often it recurred."""

    def __init__(self, emit, every: float = 60.0):
        self.emit = emit
        self.every = every
        self.lock = threading.Lock()
        self.last_said: dict[str, float] = {}
        self.unsaid: dict[str, int] = {}

    def report(self, message: str, key: str | None = None) -> None:
        key = message if key is None else key
        now = time.monotonic()
        with self.lock:
            said = self.last_said.get(key)
            if said is not None and now - said < self.every:
                self.unsaid[key] = self.unsaid.get(key, 0) + 1
                return
            repeats = self.unsaid.pop(key, 0)
            self.last_said[key] = now
        if repeats:
            message += f" ({repeats} more times in the last {now - said:.0f} s)"
        self.emit(message)

    def clear(self, key: str) -> None:
        """The problem is over: say it again at once if it comes back."""
        with self.lock:
            self.last_said.pop(key, None)
            self.unsaid.pop(key, None)
