"""The disk cache never fails a build (issue 38): a cache folder that is a file, a read-only cache
(cold, or warm with another user's files), kernel files of other bytes or folders in their place,
tuning answers of the wrong shape and a bad size setting each cost that entry only, with one
CacheWarning naming the path and the fix; `opgraph cache info|clear` report them in one line each.
Threads and processes building and tuning at once share the folder and lose no answer."""

from __future__ import annotations

import builtins
import io
import json
import os
import threading
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import opgraph as og
import opgraph.core.cache as cache
from opgraph.build import autotune
from opgraph.tools.cli import main

from ..helpers import requires_interpreter

pytestmark = pytest.mark.interpreter


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A temporary cache, and this process as if it had just started (nothing loaded or warned yet)."""
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.delenv("OPGRAPH_KERNEL_CACHE_MB", raising=False)
    _fresh_process(monkeypatch)
    return tmp_path / "c"


def _fresh_process(monkeypatch) -> None:
    from opgraph.engines.triton import compiler, loader

    monkeypatch.setattr(loader, "_MODULES", {})
    monkeypatch.setattr(loader, "_LOADED", set())
    monkeypatch.setattr(compiler, "_CANON", {})
    monkeypatch.setattr(compiler, "_BINARIES", {})
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setattr(cache, "_written", 0)


def _graph(width: int = 32, name: str = "cached") -> og.Graph:
    g = og.Graph(name, io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, width], name="x")
    g.sigmoid(g.mul(x, 3.0)).set_output(True).set_name("y")
    return g


def _build_and_check(rng, *, autotune: bool = False, width: int = 32) -> list[warnings.WarningMessage]:
    """Build and run on the Triton interpreter (checked against the reference); the CacheWarnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = _graph(width).build(device="cpu", engines=["triton"], autotune=autotune)
        assert [s.config.engine for s in plan.steps] == ["triton"]
        assert not og.testing.check_plan(plan, rng)
    return [w for w in caught if issubclass(w.category, cache.CacheWarning)]


def _read_only(monkeypatch, folder: Path) -> None:
    """`folder` and everything in it read-only, as another user's cache is: chmod, and where this
    process is root (which chmod does not stop) every write under it refused as the kernel would."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)
    monkeypatch.setattr(_Restore, "folders", [*_Restore.folders, folder])
    if os.geteuid() != 0:
        return
    inside = str(folder.resolve())

    def under(path) -> bool:
        try:
            return os.path.abspath(os.fspath(path)).startswith(inside)
        except TypeError:  # a file descriptor
            return False

    def refused(path):
        raise PermissionError(13, "Permission denied", os.fspath(path))

    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wxa+") and under(file):
            refused(file)
        return real_open(file, mode, *a, **k)

    def guarded_os_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and under(path):
            refused(path)
        return real_os_open(path, flags, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)
    for name in ("replace", "rename", "unlink", "mkdir", "utime", "rmdir"):
        real = getattr(os, name)

        def guarded(path, *a, _real=real, **k):
            if under(path):
                refused(path)
            return _real(path, *a, **k)

        monkeypatch.setattr(os, name, guarded)


class _Restore:
    folders: list[Path] = []


@pytest.fixture(autouse=True)
def _writable_again():
    """pytest must be able to remove tmp_path after a read-only test."""
    yield
    for folder in _Restore.folders:
        for dirpath, _, filenames in os.walk(folder):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)


def _one(warned: list[warnings.WarningMessage], path: Path | str) -> str:
    assert len(warned) == 1, [str(w.message) for w in warned]
    text = str(warned[0].message)
    assert str(path) in text and "to fix:" in text, text
    return text


def _kernel_files(root: Path) -> list[Path]:
    return sorted((root / "kernels").glob("og_*.py"))


@requires_interpreter
def test_a_cache_folder_that_is_a_file(root, rng):
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("not a folder")
    text = _one(_build_and_check(rng), root)
    assert "OPGRAPH_CACHE_DIR" in text
    assert root.read_text() == "not a folder"  # left alone


@requires_interpreter
def test_a_read_only_cache_cold(root, rng, monkeypatch):
    root.mkdir(parents=True)
    _read_only(monkeypatch, root)
    text = _one(_build_and_check(rng, autotune=True), root)
    assert "cannot be written" in text


@requires_interpreter
def test_a_read_only_cache_warm_with_another_users_files(root, rng, monkeypatch):
    assert not _build_and_check(rng, autotune=True)
    assert _kernel_files(root) and (root / "tuning.json").exists()
    _fresh_process(monkeypatch)
    _read_only(monkeypatch, root)
    timed = []
    real = autotune.time_kernel
    monkeypatch.setattr(autotune, "time_kernel", lambda k, *a: timed.append(k) or real(k, *a))
    assert not _build_and_check(rng, autotune=True)  # everything read, nothing to write: no warning
    assert not timed
    # another graph must be written and tuned: one warning for the whole cache
    text = _one(_build_and_check(rng, autotune=True, width=48), root)
    assert "cannot be written" in text


@requires_interpreter
@pytest.mark.parametrize("damage", ["bytes", "folder"])
def test_a_kernel_file_of_other_bytes_or_a_folder(root, rng, monkeypatch, damage):
    assert not _build_and_check(rng)
    files = _kernel_files(root)
    assert files
    for f in files:
        f.unlink()
        if damage == "bytes":
            f.write_bytes(b"\xff\xfe\x00 not UTF-8")
        else:
            f.mkdir()
    _fresh_process(monkeypatch)
    warned = _build_and_check(rng)
    assert len(warned) == len(files)
    for f in files:
        _one([w for w in warned if str(f) in str(w.message)], f)
    if damage == "bytes":  # repaired in place
        assert all(f.read_bytes().startswith(b"#") or b"import" in f.read_bytes() for f in files)


@requires_interpreter
@pytest.mark.parametrize("damage", [b"\xff" * 32, b"z" * 32, None])
def test_canonical_digests_of_other_bytes_are_computed_again(root, monkeypatch, damage):
    from opgraph.engines.triton import compiler, loader

    source = "def kernel_a(x_1, y_2):\n    return x_1 + y_2\n"
    good = compiler.canonical_digest(source)
    path = loader.cache_dir() / f"og_{loader.source_hash(source)}.canon"
    assert path.read_text() == good
    path.unlink()
    if damage is None:
        path.mkdir()
    else:
        path.write_bytes(damage)
    _fresh_process(monkeypatch)
    assert compiler.canonical_digest(source) == good
    assert damage is None or path.read_text() == good


@requires_interpreter
@pytest.mark.parametrize(
    "doc",
    [
        [1, 2],
        "text",
        {"entry": [1, 2]},
        {"entry": {"engine": 3}},
        {"entry": {"engine": "triton", "knobs": [], "times": [1]}},
    ],
)
def test_tuning_answers_of_the_wrong_shape(root, rng, monkeypatch, doc):
    assert not _build_and_check(rng, autotune=True)
    path = root / "tuning.json"
    (key,) = json.loads(path.read_text())
    if isinstance(doc, dict):
        doc = {key: doc["entry"], "someone-elses": {"engine": "x", "knobs": []}}
    path.write_text(json.dumps(doc))
    timed = []
    real = autotune.time_kernel
    monkeypatch.setattr(autotune, "time_kernel", lambda k, *a: timed.append(k) or real(k, *a))
    _one(_build_and_check(rng, autotune=True), path)
    assert timed  # tuned again
    data = json.loads(path.read_text())
    assert autotune._answer(data[key])  # and replaced by a good answer
    if isinstance(doc, dict):
        assert data["someone-elses"] == doc["someone-elses"]  # another's entry is kept


@requires_interpreter
def test_a_tuning_file_of_other_bytes(root, rng):
    root.mkdir(parents=True)
    (root / "tuning.json").write_bytes(b"\xff\xfe{")
    _one(_build_and_check(rng, autotune=True), root / "tuning.json")
    assert json.loads((root / "tuning.json").read_text())  # replaced by a good file


@requires_interpreter
@pytest.mark.parametrize("value", ["nan", "-nan", "lots"])
def test_a_bad_size_setting(root, rng, monkeypatch, value):
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", value)
    text = _one(_build_and_check(rng), "OPGRAPH_KERNEL_CACHE_MB")
    assert repr(value) in text


@pytest.mark.parametrize("value,cap", [("inf", 0), ("1e300", 2**60), ("-inf", 0)])
def test_huge_and_infinite_sizes_mean_no_cap(monkeypatch, value, cap):
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", value)
    assert cache.kernel_cache_cap() == cap


# --- the CLI's cache commands ---------------------------------------------------------------------


def _cli(*args: str):
    result = CliRunner().invoke(main, ["cache", *args])
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit), (
        result.output
    )
    return result


def test_cache_info_reports_faults_in_one_line_each(root, monkeypatch):
    root.mkdir(parents=True)
    (root / "kernels").write_text("a file")
    (root / "tuning.json").write_bytes(b"\xff")
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", "nan")
    result = _cli("info")
    assert result.exit_code == 1
    problems = [line for line in result.output.splitlines() if line.startswith("cache problem")]
    assert len(problems) == 3, result.output
    assert any(str(root / "kernels") in p for p in problems) and any("tuning.json" in p for p in problems)
    assert any("OPGRAPH_KERNEL_CACHE_MB" in p for p in problems)


def test_cache_info_and_clear_on_a_root_that_is_a_file(root):
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("x")
    info = _cli("info")
    assert info.exit_code == 1 and info.output.count("cache problem") == 1
    cleared = _cli("clear")
    assert cleared.exit_code == 1 and cleared.output.count("cache problem") == 1
    assert root.read_text() == "x"


def test_cache_clear_reports_what_it_cannot_remove(root, monkeypatch):
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "og_0.py").write_text("#")
    (root / "tuning.json").write_text("{}")
    _read_only(monkeypatch, root)
    result = _cli("clear")
    assert result.exit_code == 1
    assert result.output.count("cache problem") == 2 and "og_0.py" in result.output
    assert (root / "tuning.json").exists()


def test_cache_clear_and_info_on_a_healthy_cache(root):
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "og_0.py").write_text("#")
    (root / "tuning.json").write_text(json.dumps({"k": {"engine": "triton", "knobs": []}}))
    info = _cli("info")
    assert info.exit_code == 0 and "1 files" in info.output and "1 entries" in info.output
    assert _cli("clear").exit_code == 0
    assert not (root / "tuning.json").exists() and not list((root / "kernels").iterdir())


# --- threads and processes sharing the cache -----------------------------------------------------


def _answer(i: int) -> dict:
    return {"engine": "triton", "knobs": [["i", i]], "times": {"x": float(i)}}


def test_threads_writing_tuning_answers_lose_none(root):
    n = 24
    barrier = threading.Barrier(n)
    failures: list[BaseException] = []

    def put(i: int) -> None:
        try:
            barrier.wait()
            autotune.TuningCache().put(f"key{i}", _answer(i))
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    data = json.loads((root / "tuning.json").read_text())
    assert data == {f"key{i}": _answer(i) for i in range(n)}
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def _put_many(args: tuple[str, int, int]) -> None:
    folder, start, count = args
    os.environ["OPGRAPH_CACHE_DIR"] = folder
    for i in range(start, start + count):
        autotune.TuningCache().put(f"key{i}", _answer(i))


def test_processes_writing_tuning_answers_lose_none(root):
    import multiprocessing

    root.mkdir(parents=True)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_put_many, [(str(root), 10 * p, 10) for p in range(4)])
    data = json.loads((root / "tuning.json").read_text())
    assert data == {f"key{i}": _answer(i) for i in range(40)}


@requires_interpreter
def test_threads_building_and_tuning_at_once(root, rng):
    """Threads build and tune different graphs (and one the same) at once: every build is right, no
    temporary name collides, every answer is kept."""
    widths = [16, 24, 32, 40, 48, 16]
    barrier = threading.Barrier(len(widths))
    failures: list[BaseException] = []
    plans: list = []

    def build(width: int) -> None:
        try:
            barrier.wait()
            plans.append(_graph(width, name=f"w{width}").build(device="cpu", engines=["triton"], autotune=True))
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)

    threads = [threading.Thread(target=build, args=(w,)) for w in widths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for plan in plans:
        assert not og.testing.check_plan(plan, rng)
    assert len(json.loads((root / "tuning.json").read_text())) == len(set(widths))
    assert not [p for p in root.rglob("*.tmp")]


def _build_in_process(args: tuple[str, int]) -> str:
    folder, width = args
    os.environ["OPGRAPH_CACHE_DIR"] = folder
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np

    plan = _graph(width, name=f"w{width}").build(device="cpu", engines=["triton"], autotune=True)
    return repr(og.testing.check_plan(plan, np.random.default_rng(width)))


@requires_interpreter
@pytest.mark.slow
def test_processes_building_and_tuning_at_once(root):
    import multiprocessing

    root.mkdir(parents=True)
    widths = [16, 24, 32, 16]
    with multiprocessing.get_context("spawn").Pool(len(widths)) as pool:
        answers = pool.map(_build_in_process, [(str(root), w) for w in widths])
    assert answers == ["[]"] * len(widths)
    assert len(json.loads((root / "tuning.json").read_text())) == len(set(widths))
    assert not [p for p in root.rglob("*.tmp")]
