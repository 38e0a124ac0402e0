"""Logging under the `opgraph` logger. Set OPGRAPH_LOG=info (or 1) for a readable trace of each stage
(finalize, partition, configs considered and declined with reasons, compilation, tuning), or
OPGRAPH_LOG=debug for more; messages name ops and reasons, not internal functions."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("opgraph")


def configure_from_env() -> None:
    value = os.environ.get("OPGRAPH_LOG", "").strip().lower()
    if not value or value in ("0", "off", "false"):
        return
    level = logging.DEBUG if value in ("2", "debug") else logging.INFO
    if not any(getattr(h, "_opgraph", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        handler._opgraph = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
