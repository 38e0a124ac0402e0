"""'Did you mean' for names a user types: op kinds, builders, modes, engines."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close_names(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` of `choices` close to `word`, case-insensitively: names that extend it or that it
    extends by a `_suffix` (GELU -> GELU_FWD, gelu_fwd -> gelu) first, then close spellings."""
    upper = {c.upper(): c for c in choices}
    key = str(word).strip().upper()
    related = [c for u, c in upper.items()
               if key and u != key and (u.startswith(key + "_") or key.startswith(u + "_") or u.endswith("_" + key))]
    related.sort(key=lambda c: abs(len(c) - len(key)))
    spelled = [upper[m] for m in difflib.get_close_matches(key, list(upper), n=n, cutoff=0.6)]
    return list(dict.fromkeys([*related, *spelled]))[:n]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'X'?)' or ' (did you mean 'X' or 'Y'?)', or '' when nothing is close."""
    found = close_names(word, choices)
    if not found:
        return ""
    return " (did you mean " + " or ".join(repr(f) for f in found) + "?)"
