"""Where opgraph keeps files between processes: `$OPGRAPH_CACHE_DIR`, else `$XDG_CACHE_HOME/opgraph`,
else `~/.cache/opgraph` (generated kernels under kernels/, the tuning cache in tuning.json)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "opgraph"
    )
    return Path(root)
