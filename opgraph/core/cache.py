"""opgraph's disk cache: generated kernel sources (`kernels/`) and the autotuning answers
(`tuning.json`), under OPGRAPH_CACHE_DIR or $XDG_CACHE_HOME/opgraph (default ~/.cache/opgraph).

Generated sources are small files named by the hash of their text; Triton reads a kernel's source
from its file, so they must exist while a plan is built and first run. The folder is kept under a
size cap (OPGRAPH_KERNEL_CACHE_MB, default 16 MiB, about 3,000 kernels): when a new kernel is
written and the folder is over the cap, the least recently used files go first, down to 80% of it,
never a file this process loaded or one any process touched in the last ten minutes. `opgraph cache
info` shows what is there; `opgraph cache clear` empties it.

The cache never fails a build: an entry that cannot be read (missing rights, not UTF-8, a folder
where a file belongs, the wrong JSON shape) is built again, one that cannot be written is kept in
memory or in a private temporary folder for this process, and each such fault is reported once, as
a `CacheWarning` naming the path and the fix. Writers in several threads and processes share the
folder: every file is written under a unique temporary name and renamed into place, and the tuning
answers are merged under a lock (`locked`), so that none is lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_KERNEL_CACHE_MB = 16.0
RECENT_S = 600.0  # files touched this recently are never pruned (another process may be loading them)
_CHECK_EVERY = 32  # new kernel files between size checks
FIX_ROOT = "set OPGRAPH_CACHE_DIR to a folder you can write, or run `opgraph cache clear`"

log = logging.getLogger("opgraph.cache")


class CacheWarning(UserWarning):
    """A fault in opgraph's disk cache (unreadable, unwritable, corrupt): the build goes on without
    that entry."""


_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


def fault(path: Path | str, problem: str, fix: str = FIX_ROOT) -> None:
    """Report a cache fault once per path and problem (a CacheWarning and a log line)."""
    key = (str(path), problem)
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    text = f"opgraph's disk cache: {path}: {problem} (to fix: {fix})"
    log.warning(text)
    warnings.warn(text, CacheWarning, stacklevel=3)


def unwritable(err: BaseException) -> None:
    """Report once that the cache cannot be written (whatever part of it failed)."""
    fault(
        cache_root(),
        f"cannot be written ({describe(err)}); this process keeps its kernels in a temporary "
        "folder and its tuning answers in memory",
    )


def describe(err: BaseException) -> str:
    """An OS or decoding error in a few words (no traceback)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    if isinstance(err, UnicodeDecodeError):
        return "not UTF-8 text"
    return f"{type(err).__name__}: {err}"


def cache_root() -> Path:
    """The cache folder (not created)."""
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "opgraph"
    )
    return Path(root)


_private: Path | None = None
_private_lock = threading.Lock()


def private_dir() -> Path:
    """This process's own temporary folder, for kernels the shared cache cannot hold (removed at exit)."""
    global _private
    with _private_lock:
        if _private is None or not _private.is_dir():
            _private = Path(tempfile.mkdtemp(prefix="opgraph-kernels-"))
            import atexit

            atexit.register(shutil.rmtree, _private, True)
        return _private


def kernel_dir() -> Path:
    """The kernel folder, created; this process's private folder (with a CacheWarning) when the
    shared one cannot be created."""
    path = cache_root() / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError as err:
        unwritable(err)
    return private_dir()


def tuning_path() -> Path:
    return cache_root() / "tuning.json"


CAP_FIX = "set OPGRAPH_KERNEL_CACHE_MB to a number of MiB (0: no cap), or unset it"


def _cap_setting() -> tuple[int, str | None]:
    """(the cap in bytes, what is wrong with the setting or None)."""
    text = os.environ.get("OPGRAPH_KERNEL_CACHE_MB", "")
    default = int(DEFAULT_KERNEL_CACHE_MB * 2**20)
    if not text.strip():
        return default, None
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if math.isnan(mb):
        return default, f"{text!r} is not a size in MiB; the default {DEFAULT_KERNEL_CACHE_MB:g} MiB applies"
    if math.isinf(mb):
        return 0, None
    return int(min(mb, 2.0**40) * 2**20), None  # 0 or less: no cap


def kernel_cache_cap() -> int:
    """The kernel folder's cap in bytes (OPGRAPH_KERNEL_CACHE_MB; 0 or less, or inf: no cap). A value
    that is not a number gives the default, with a CacheWarning."""
    cap, problem = _cap_setting()
    if problem is not None:
        fault("OPGRAPH_KERNEL_CACHE_MB", problem, CAP_FIX)
    return cap


def unique_tmp(path: Path) -> Path:
    """A temporary name beside `path` that no other process or thread uses."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` at once: readers see the old file or the new one, never a part (raises
    OSError where the folder cannot be written)."""
    tmp = unique_tmp(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_thread_locks: dict[str, threading.Lock] = {}


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock (fcntl.flock, so across processes; a lock per path across
    threads) for a read-merge-write. Raises OSError where the lock file cannot be made."""
    with _private_lock:
        inner = _thread_locks.setdefault(str(path), threading.Lock())
    with inner:
        lock_path = path.with_name(path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file: locking needs only reading it
            try:
                fd = os.open(lock_path, os.O_RDONLY)
            except FileNotFoundError:
                raise PermissionError(13, "Permission denied", str(lock_path)) from None
        try:
            try:
                import fcntl
            except ImportError:  # not POSIX: threads are still ordered
                yield
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    kernel_files: int
    kernel_bytes: int
    cap_bytes: int
    tuning_entries: int
    tuning_bytes: int
    problems: tuple[str, ...] = ()  # faults found while looking (one line each)


def _kernel_files(folder: Path, problems: list[str] | None = None) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return [e for e in entries if e.name.startswith("og_") and e.is_file()]
    except FileNotFoundError:
        return []
    except OSError as err:
        if problems is not None:
            problems.append(f"{folder}: {describe(err)}")
        return []


def info() -> CacheInfo:
    """What the cache holds; faults (an unreadable folder, a corrupt tuning file, a bad size setting)
    are listed in `problems`, never raised."""
    root = cache_root()
    problems: list[str] = []
    files = _kernel_files(root / "kernels", problems)
    size = 0
    for e in files:
        try:
            size += e.stat().st_size
        except OSError:
            pass
    entries, tbytes = 0, 0
    tp = tuning_path()
    try:
        tbytes = tp.stat().st_size
        doc = json.loads(tp.read_bytes())
        if isinstance(doc, dict):
            entries = len(doc)
        else:
            problems.append(f"{tp}: not a tuning file (a JSON {type(doc).__name__}, not an object)")
    except (FileNotFoundError, NotADirectoryError):
        pass
    except (OSError, ValueError) as err:
        problems.append(f"{tp}: {'not JSON' if type(err) is json.JSONDecodeError else describe(err)}")
    cap, problem = _cap_setting()
    if problem is not None:
        problems.append(f"OPGRAPH_KERNEL_CACHE_MB: {problem} (to fix: {CAP_FIX})")
    return CacheInfo(root, len(files), size, cap, entries, tbytes, tuple(problems))


@dataclass(frozen=True)
class Cleared:
    removed: int
    freed: int
    problems: tuple[str, ...] = ()  # files or folders that could not be removed (one line each)


def clear_report(*, kernels: bool = True, tuning: bool = True) -> Cleared:
    """Delete the cached kernel sources and/or the tuning answers; what could not be deleted is
    listed, not raised."""
    removed, freed = 0, 0
    problems: list[str] = []
    paths: list[Path] = []
    if kernels:
        paths += [Path(e.path) for e in _kernel_files(cache_root() / "kernels", problems)]
    if tuning:
        paths.append(tuning_path())
    for p in paths:
        try:
            size = p.stat().st_size
            p.unlink()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            problems.append(f"{p}: {describe(err)}")
            continue
        removed += 1
        freed += size
    return Cleared(removed, freed, tuple(problems))


def clear(*, kernels: bool = True, tuning: bool = True) -> tuple[int, int]:
    """Delete the cached kernel sources and/or the tuning answers: (files removed, bytes freed)."""
    done = clear_report(kernels=kernels, tuning=tuning)
    return done.removed, done.freed


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
    never those in `keep` or touched in the last RECENT_S seconds (a file that cannot be removed
    is left)."""
    if cap <= 0:
        return 0
    stats = []
    for e in _kernel_files(folder):
        try:
            st = e.stat()
        except OSError:
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
        except OSError as err:  # another user's file in a shared cache
            log.debug("cannot prune %s: %s", path, err)
            continue
        total -= size
        removed += 1
    return removed


__all__ = [
    "CacheInfo",
    "CacheWarning",
    "Cleared",
    "cache_root",
    "clear",
    "clear_report",
    "fault",
    "info",
    "kernel_cache_cap",
    "kernel_dir",
    "locked",
    "private_dir",
    "prune",
    "tuning_path",
    "unique_tmp",
    "unwritable",
    "write_atomic",
]
