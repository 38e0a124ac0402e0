"""Replaying fuzz cases: from a seed, a regression file or a case document; `python -m tests.fuzz.replay
SEED|FILE [--device cuda] [--shrink]` prints the failures and a minimal reproduction."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .gen import Case


def _runner(device: str, sets: Any = None, settings: dict | None = None) -> Any:
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .runner import CI_SETTINGS, Runner

    return Runner(device, sets, **(settings if settings is not None else CI_SETTINGS))


def load(what: str | int | Path) -> Case:
    """A case from a seed (int or digits), a JSON file, or a JSON document."""
    if isinstance(what, int) or (isinstance(what, str) and what.isdigit()):
        from .families import make_case

        return make_case(int(what))
    text = str(what)
    doc = json.loads(Path(text).read_text()) if not text.lstrip().startswith("{") else json.loads(text)
    return Case.from_dict(doc)


def replay_case(doc: str | dict, device: str = "cpu", settings: dict | None = None) -> list:
    case = Case.from_dict(json.loads(doc) if isinstance(doc, str) else doc)
    stats = _runner(device, settings=settings).run(case)
    for f in stats.failures:
        print(f)
    print(f"{len(stats.failures)} failure(s)")
    return stats.failures


def replay(what: str | int, device: str = "cpu") -> list:
    return replay_case(load(what).to_dict(), device)


def minimal(case: Case, device: str = "cpu", settings: dict | None = None) -> tuple[Case, list]:
    """The case shrunk while it fails with the same kind on the same engine set, and its failures.
    A damaged plan file is drawn at random: such failures are replayed whole, not shrunk."""
    from .shrink import shrink

    runner = _runner(device, settings=settings)
    first = runner.run(case).failures
    if not first or first[0].kind == "damaged-plan" or "damaged plan" in first[0].detail:
        return case, first
    target = (first[0].engines, first[0].kind)
    sets = [s for s in runner.sets if s.name == target[0]] or list(runner.sets)
    small_runner = _runner(device, sets, settings)

    def still(c: Case) -> bool:
        return any((f.engines, f.kind) == target for f in small_runner.run(c).failures)

    small = shrink(case, still)
    return small, small_runner.run(small).failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("what", help="a seed, a case JSON file or a regression file")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shrink", action="store_true")
    ap.add_argument("--out", help="where to write the (shrunk) case as JSON")
    args = ap.parse_args(argv)
    case = load(args.what)
    if not args.shrink:
        return 1 if replay_case(case.to_dict(), args.device) else 0
    from .runner import graph_of
    from .shrink import snippet

    case, failures = minimal(case, args.device)
    for f in failures:
        print(f)
    print(graph_of(case).final)
    print("profiles", case.profiles, "scalars", case.scalars, "by_reference", case.by_reference)
    out = Path(args.out or f"/tmp/fuzz_case_{case.seed}.json")
    out.write_text(json.dumps(case.to_dict(), indent=1) + "\n")
    print(f"case written to {out}; replay: {snippet(case, str(out))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
