"""Shrinking a failing case to a minimal one (dropping ops while it still fails the same way) and
writing the reproduction: the case as JSON, and a snippet that replays it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .gen import Case

REGRESSIONS = Path(__file__).parent / "regressions"


def drop_op(graph: dict[str, Any], index: int) -> dict[str, Any] | None:
    """The graph document without op `index`: what it produced and others read becomes a graph input;
    tensors nothing refers to any more are removed. None when no output would be left."""
    g = json.loads(json.dumps(graph))
    ops = g["ops"]
    gone = ops.pop(index)
    produced = set(gone["outputs"].values())
    read = {v for o in ops for v in o["inputs"].values() if isinstance(v, int) and not isinstance(v, bool)}
    written = {v for o in ops for v in o["outputs"].values()}
    tensors = []
    for t in g["tensors"]:
        uid = t["uid"]
        if uid in produced and uid not in written:
            if uid not in read:
                continue
            t = {**t, "is_virtual": False}  # now an input
        elif uid not in read and uid not in written:
            continue
        tensors.append(t)
    g["tensors"] = tensors
    if not any(not t["is_virtual"] and t["uid"] in written for t in tensors):
        return None
    return g


def shrink(case: Case, still_fails: Callable[[Case], bool], budget: int = 60) -> Case:
    """Greedily drop ops (last first) while `still_fails`; at most `budget` tries."""
    best = case
    changed = True
    while changed and budget > 0:
        changed = False
        for i in reversed(range(len(best.graph["ops"]))):
            if budget <= 0:
                break
            smaller = drop_op(best.graph, i)
            if smaller is None:
                continue
            budget -= 1
            trial = Case(best.seed, smaller, best.profiles, best.scalars, best.by_reference, best.families)
            try:
                ok = still_fails(trial)
            except Exception:  # noqa: BLE001 - a shrunk graph that no longer validates
                ok = False
            if ok:
                best, changed = trial, True
                break
    return best


def snippet(case: Case, path: str | None = None) -> str:
    """A runnable reproduction of `case` (from the repository root)."""
    if path is not None:
        return f"PYTHONPATH=. python -c \"from tests.fuzz.replay import replay; replay('{path}')\""
    doc = json.dumps(case.to_dict())
    return f"PYTHONPATH=. python - <<'EOF'\nfrom tests.fuzz.replay import replay_case\nreplay_case({doc!r})\nEOF"


def save_regression(case: Case, note: str, directory: Path = REGRESSIONS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"seed{case.seed}.json"
    path.write_text(json.dumps({"note": note, **case.to_dict()}, indent=1) + "\n")
    return path
