"""opgraph's disk cache: generated kernel sources (`kernels/`) and the autotuning answers
(`tuning.json`), under OPGRAPH_CACHE_DIR or $XDG_CACHE_HOME/opgraph (default ~/.cache/opgraph).

Generated sources are small files named by the hash of their text; Triton reads a kernel's source
from its file, so they must exist while a plan is built and first run. The folder is kept under a
size cap (OPGRAPH_KERNEL_CACHE_MB, default 16 MiB, about 3,000 kernels): when a new kernel is
written and the folder is over the cap, the least recently used files go first, down to 80% of it,
never a file this process loaded or one any process touched in the last ten minutes. `opgraph cache
info` shows what is there; `opgraph cache clear` empties it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_KERNEL_CACHE_MB = 16.0
RECENT_S = 600.0  # files touched this recently are never pruned (another process may be loading them)
_CHECK_EVERY = 32  # new kernel files between size checks


def cache_root() -> Path:
    """The cache folder (not created)."""
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "opgraph"
    )
    return Path(root)


def kernel_dir() -> Path:
    path = cache_root() / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tuning_path() -> Path:
    return cache_root() / "tuning.json"


def kernel_cache_cap() -> int:
    """The kernel folder's cap in bytes (OPGRAPH_KERNEL_CACHE_MB; 0 or less: no cap)."""
    text = os.environ.get("OPGRAPH_KERNEL_CACHE_MB", "")
    try:
        mb = float(text) if text.strip() else DEFAULT_KERNEL_CACHE_MB
    except ValueError:
        mb = DEFAULT_KERNEL_CACHE_MB
    return int(mb * 2**20)


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    kernel_files: int
    kernel_bytes: int
    cap_bytes: int
    tuning_entries: int
    tuning_bytes: int


def _kernel_files(folder: Path) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(folder) if e.is_file() and e.name.startswith("og_")]
    except FileNotFoundError:
        return []


def info() -> CacheInfo:
    root = cache_root()
    files = _kernel_files(root / "kernels")
    size = 0
    for e in files:
        try:
            size += e.stat().st_size
        except FileNotFoundError:
            pass
    entries, tbytes = 0, 0
    tp = tuning_path()
    if tp.exists():
        import json

        tbytes = tp.stat().st_size
        try:
            doc = json.loads(tp.read_text())
            entries = len(doc) if isinstance(doc, dict) else 0
        except (OSError, ValueError):
            entries = 0
    return CacheInfo(root, len(files), size, kernel_cache_cap(), entries, tbytes)


def clear(*, kernels: bool = True, tuning: bool = True) -> tuple[int, int]:
    """Delete the cached kernel sources and/or the tuning answers: (files removed, bytes freed)."""
    removed, freed = 0, 0
    paths: list[Path] = []
    if kernels:
        paths += [Path(e.path) for e in _kernel_files(cache_root() / "kernels")]
    if tuning and tuning_path().exists():
        paths.append(tuning_path())
    for p in paths:
        try:
            size = p.stat().st_size
            p.unlink()
        except FileNotFoundError:
            continue
        removed += 1
        freed += size
    return removed, freed


_written = 0


def note_kernel_written(folder: Path, keep: set[Path]) -> int:
    """Called after a new kernel file is written; prunes the folder now and then. Returns the
    number of files removed."""
    global _written
    _written += 1
    if _written % _CHECK_EVERY != 1:  # the first write of a process checks, then every 32nd
        return 0
    return prune(folder, kernel_cache_cap(), keep)


def prune(folder: Path, cap: int, keep: set[Path] = frozenset(), *, now: float | None = None) -> int:  # type: ignore[assignment]
    """Remove the least recently used kernel files until the folder is at 80% of `cap` bytes;
    never those in `keep` or touched in the last RECENT_S seconds."""
    if cap <= 0:
        return 0
    stats = []
    for e in _kernel_files(folder):
        try:
            st = e.stat()
        except FileNotFoundError:
            continue
        stats.append((st.st_mtime, st.st_size, Path(e.path)))
    total = sum(s for _, s, _ in stats)
    if total <= cap:
        return 0
    now = time.time() if now is None else now
    removed = 0
    for mtime, size, path in sorted(stats):
        if total <= 0.8 * cap:
            break
        if path in keep or now - mtime < RECENT_S:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        total -= size
        removed += 1
    return removed


__all__ = ["CacheInfo", "cache_root", "clear", "info", "kernel_cache_cap", "kernel_dir", "prune", "tuning_path"]
