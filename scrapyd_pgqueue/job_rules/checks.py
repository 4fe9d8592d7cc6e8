"""What the store holds of a job, checked before any SQL: its names, its priority and its message as the row's
columns and indexes can hold them (``InvalidJobError`` says what is wrong)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import msgspec

# Longest project, spider, job id or version stored: (project, job) is one index entry, which Postgres caps at
# 2704 bytes.
MAX_NAME_BYTES = 1000

# Beyond 2 ** 53 a double (the priority column) no longer tells consecutive integers apart: p + 1 would run as p.
MAX_PRIORITY = 2**53


class InvalidJobError(ValueError):
    """The job cannot be stored as given (reason in the message)."""


def encode_message(message: dict[str, Any]) -> str:
    """A job's message as JSON text for its jsonb column (InvalidJobError when it cannot be stored)."""
    try:
        if _plain(message):  # what schedule.json and batches make: msgspec, several times faster, is exact there
            encoded = _MESSAGE_ENCODER.encode(message).decode()
        else:  # any value: json refuses NaN and infinities, where msgspec would write null
            encoded = json.dumps(message, ensure_ascii=False, allow_nan=False)
            encoded.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\udc80", from undecodable bytes) cannot be stored
        raise InvalidJobError("job arguments must be valid Unicode text") from None
    except (TypeError, ValueError) as e:
        raise InvalidJobError(f"job arguments must be JSON-serialisable finite values: {e}") from e
    if "\x00" in encoded or "\\u0000" in encoded:
        raise InvalidJobError("job arguments may not contain NUL characters")
    return encoded


_MESSAGE_ENCODER = msgspec.json.Encoder()


def _plain(message: dict[str, Any]) -> bool:
    """Whether every value is a string, or an object of strings (the settings), under string keys."""
    for key, value in message.items():
        if type(key) is not str:
            return False
        if type(value) is not str:
            if type(value) is not dict:
                return False
            for name, setting in value.items():
                if type(name) is not str or type(setting) is not str:
                    return False
    return True


def check_priority(priority: Any) -> float:
    """A job's priority, by every way in (schedule.json's number, a batch's or a line's JSON, the Python API, a
    periodic job): a number, not a boolean, finite, of magnitude at most MAX_PRIORITY; else InvalidJobError."""
    if type(priority) is float and -MAX_PRIORITY <= priority <= MAX_PRIORITY:  # most: no NaN or infinity passes
        return priority
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not is_finite(priority):
        raise InvalidJobError(f"priority must be a finite number, not {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidJobError(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, not {priority!r}")
    return float(priority)


def is_finite(number: int | float) -> bool:
    """Finite as a float: JSON's integers have any size, and a float cannot hold them all."""
    return abs(number) <= sys.float_info.max if isinstance(number, int) else math.isfinite(number)


def check_name(what: str, value: Any) -> str:
    """A project, spider, job id or version as the row's columns and indexes can hold it, else InvalidJobError."""
    if type(value) is str and value.isascii() and 0 < len(value) <= MAX_NAME_BYTES and "\x00" not in value:
        return value  # most: ASCII text is as many bytes as characters, and always valid
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidJobError(f"{what} may not be empty")
    if "\x00" in value:
        raise InvalidJobError(f"{what} may not contain NUL characters")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # a lone surrogate ("\udc80", from undecodable bytes) cannot be stored
        raise InvalidJobError(f"{what} must be valid Unicode text") from None
    if size > MAX_NAME_BYTES:
        raise InvalidJobError(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return value
