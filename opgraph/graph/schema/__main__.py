"""`python -m opgraph.graph.schema [--write | --check]`: print, rewrite or check graph.schema.json."""

import sys

from . import SCHEMA_PATH, schema_text

if __name__ == "__main__":
    text = schema_text()
    if "--write" in sys.argv:
        SCHEMA_PATH.write_text(text)
        print(f"wrote {SCHEMA_PATH}")
    elif "--check" in sys.argv:
        sys.exit(
            0 if SCHEMA_PATH.read_text() == text else f"{SCHEMA_PATH} is stale: python -m opgraph.graph.schema --write"
        )
    else:
        sys.stdout.write(text)
