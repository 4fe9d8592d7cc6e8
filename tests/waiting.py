"""Waiting on a condition with a deadline: how the tests wait for real processes, never with a bare sleep."""

import time


def wait_for(condition, timeout: float, what: str, interval: float = 0.1):
    """Call ``condition`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
