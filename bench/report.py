"""Re-render or merge benchmark result files: `python -m bench.report FILE.json ... [--out DIR] [--title T]`.

Each FILE is what `python -m bench.run` wrote (every repeat's raw records). One file: its Markdown is
rendered again (e.g. after a change to the tables). Several files (the groups of one session, each run
by its own command): one document with each file's tables under its own header, one machine per table;
written to DIR/<name>.md (default name: the first file's date and device + "-suite")."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .core.aggregate import aggregate
from .core.records import RunRecord
from .core.render import render, render_many


def load(path: str) -> tuple[str, object, object]:
    with open(path) as f:
        d = json.load(f)
    runs = [RunRecord.from_json(json.dumps(r)) for r in d["runs"]]
    name = os.path.splitext(os.path.basename(path))[0]
    return (
        name,
        aggregate(runs),
        (
            aggregate([RunRecord.from_json(json.dumps(d["warm"]))])
            if d.get("warm") and d["warm"].get("workloads")
            else None
        ),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default=None, help="folder for the Markdown (default: print it)")
    ap.add_argument("--name", default=None, help="file name (without .md) of the merged document")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    loaded = [load(p) for p in args.files]
    if len(loaded) == 1:
        name, agg, warm = loaded[0]
        md = render(agg, args.title or name, warm)  # type: ignore[arg-type]
    else:
        first = loaded[0][0].split("-")
        name = args.name or "-".join(first[:4]) + "-suite"
        md = render_many([(n, a) for n, a, _ in loaded], args.title or name)  # type: ignore[arg-type]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, (args.name or name) + ".md")
        with open(path, "w") as f:
            f.write(md)
        print(f"wrote {path}")
    else:
        sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
