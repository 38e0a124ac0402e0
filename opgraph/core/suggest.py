"""'Did you mean' for names a user types: op kinds, builders, modes, engines.

The search is bounded, since the word may come from a hostile file: a word far longer than every
choice (or than MAX_WORD characters) is close to none of them and is not compared at all, and at
most MAX_CHOICES choices are compared."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from itertools import islice

MAX_WORD = 256
MAX_CHOICES = 4096


def close_names(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` of `choices` close to `word`, case-insensitively: names that extend it or that it
    extends by a `_suffix` (GELU -> GELU_FWD, gelu_fwd -> gelu) first, then close spellings."""
    word = word if isinstance(word, str) else str(word)[: MAX_WORD + 1]
    if len(word) > MAX_WORD:
        return []
    upper = {c.upper(): c for c in islice((c for c in choices if isinstance(c, str)), MAX_CHOICES)}
    key = word.strip().upper()
    if not upper or len(key) > 2 * max(map(len, upper)) + 8:  # close to nothing: ratio < 0.6
        return []
    related = [
        c
        for u, c in upper.items()
        if key and u != key and (u.startswith(key + "_") or key.startswith(u + "_") or u.endswith("_" + key))
    ]
    related.sort(key=lambda c: abs(len(c) - len(key)))
    spelled = [upper[m] for m in difflib.get_close_matches(key, list(upper), n=n, cutoff=0.6)]
    return list(dict.fromkeys([*related, *spelled]))[:n]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'X'?)' or ' (did you mean 'X' or 'Y'?)', or '' when nothing is close."""
    found = close_names(word, choices)
    if not found:
        return ""
    return " (did you mean " + " or ".join(repr(f) for f in found) + "?)"
