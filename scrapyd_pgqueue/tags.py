"""Tags, a node's (``node_tags``) and a job's (``_tags``), by one rule; a job's pool is the tags it requires."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# A tag: letters, digits and '_', '.', ':', '-', starting with a letter or digit; a comma separates tags.
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")
MAX_TAGS = 16


class InvalidTagsError(ValueError):
    """Tags that cannot be a node's or a job's (reason in the message)."""


def parse_tags(value: Any) -> tuple[str, ...]:
    """Tags as given (a comma-separated string, or a list of strings), checked, sorted and deduplicated; an empty
    string or list: no tags."""
    if isinstance(value, str):
        given = value.split(",") if value.strip() else []
    elif isinstance(value, (list, tuple)) and all(isinstance(tag, str) for tag in value):
        given = list(value)
    else:
        raise InvalidTagsError("tags must be a comma-separated string or a list of strings")
    tags = sorted({tag.strip() for tag in given})
    for tag in tags:
        if not TAG_PATTERN.fullmatch(tag):
            raise InvalidTagsError(
                f"tag {tag[:100]!r} is not valid: 1 to 63 letters, digits, '_', '.', ':' or '-', starting with a "
                "letter or digit")
    if len(tags) > MAX_TAGS:
        raise InvalidTagsError(f"at most {MAX_TAGS} tags, not {len(tags)}")
    return tuple(tags)


def pool_key(tags: Iterable[str]) -> str:
    """The pool of a job requiring ``tags`` (checked already): sorted, joined by commas; '' for none."""
    return ",".join(sorted(set(tags)))


def pool_tags(pool: str | None) -> list[str]:
    """The tags a pool requires, as a list (empty for '' and None)."""
    return pool.split(",") if pool else []
