"""Bounds on what a graph or plan file may make opgraph do: a file's size and the length of every
string in it (names, keys, modes), so that a hostile or broken file costs a typed error, never minutes
or gigabytes. The defaults are generous (no real graph comes near them); raise them with
OPGRAPH_MAX_FILE_MB (default 1024) and OPGRAPH_MAX_STRING (characters, default 65536)."""

from __future__ import annotations

import os
from typing import Any

from .errors import SerializationError, printable

DEFAULT_MAX_FILE_MB = 1024
DEFAULT_MAX_STRING = 65536


def _setting(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = default
    return value if value > 0 and value != float("inf") else default  # (NaN is not > 0)


def max_file_bytes() -> int:
    return int(_setting("OPGRAPH_MAX_FILE_MB", DEFAULT_MAX_FILE_MB) * 2**20)


def max_string() -> int:
    return int(_setting("OPGRAPH_MAX_STRING", DEFAULT_MAX_STRING))


def check_file_size(size: int, what: str) -> None:
    """Refuse a file (or document) of `size` bytes over OPGRAPH_MAX_FILE_MB."""
    limit = max_file_bytes()
    if size > limit:
        raise SerializationError(
            f"the {what} is {size / 2**20:.2f} MiB, over the limit of {limit / 2**20:.2f} MiB (OPGRAPH_MAX_FILE_MB)",
            rule="file.size_limit",
            hint="if the file is genuine, raise OPGRAPH_MAX_FILE_MB",
        )


def preview(text: str, n: int = 40) -> str:
    """The start of a string, printable, for an error message."""
    head = printable(text[:n])
    return repr(head + "...") if len(text) > n else repr(head)


def check_strings(doc: Any, where: str, payloads: frozenset[str] = frozenset()) -> None:
    """Refuse a parsed JSON document holding a string (a key or a value) longer than OPGRAPH_MAX_STRING
    characters, naming where it is. Iterative: a deep document cannot overflow the stack. String values
    under a key in `payloads` (a plan's embedded kernels, base64) are bounded by the file's size alone."""
    limit = max_string()
    stack: list[tuple[Any, str]] = [(doc, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            if len(value) > limit:
                raise SerializationError(
                    f"{at}: a string of {len(value):,} characters ({preview(value)}), over the limit of {limit:,}",
                    rule="file.string_limit",
                    hint="if the file is genuine, raise OPGRAPH_MAX_STRING",
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and len(key) > limit:
                    raise SerializationError(
                        f"{at}: a key of {len(key):,} characters ({preview(key)}), over the limit of {limit:,}",
                        rule="file.string_limit",
                        hint="if the file is genuine, raise OPGRAPH_MAX_STRING",
                    )
                if not (key in payloads and isinstance(item, str)):
                    stack.append((item, f"{at}.{key}" if len(str(key)) <= 40 else f"{at}.<key>"))
        elif isinstance(value, list):
            stack.extend((item, f"{at}[{i}]") for i, item in enumerate(value))


__all__ = ["check_file_size", "check_strings", "max_file_bytes", "max_string", "preview"]
