"""core.cache: where the cache lives, what `info` counts and `clear` removes, the cap from the
environment, and how often writes check the cap (tests/test_cache.py covers pruning itself)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import opgraph.core.cache as cache


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "c"))
    return tmp_path / "c"


def test_the_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("OPGRAPH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "opgraph"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "opgraph"
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "mine"))  # wins over both
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "mine"
    assert not (tmp_path / "mine").exists()  # asking does not create it


def test_kernel_dir_is_created_and_tuning_sits_beside_it(root):
    assert cache.kernel_dir() == root / "kernels" and (root / "kernels").is_dir()
    assert cache.tuning_path() == root / "tuning.json"


@pytest.mark.parametrize(
    "text,mb",
    [
        ("", cache.DEFAULT_KERNEL_CACHE_MB),
        ("  ", cache.DEFAULT_KERNEL_CACHE_MB),
        ("lots", cache.DEFAULT_KERNEL_CACHE_MB),
        ("0.5", 0.5),
        ("-1", -1.0),
    ],
)
def test_cap_from_the_environment(monkeypatch, text, mb):
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", text)
    assert cache.kernel_cache_cap() == int(mb * 2**20)


def _kernels(root: Path, sizes) -> list[Path]:
    folder = root / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n in enumerate(sizes):
        p = folder / f"og_{i:04d}.py"
        p.write_bytes(b"#" * n)
        paths.append(p)
    (folder / "README").write_text("not a kernel")  # not ours: never counted, never removed
    return paths


def test_info_counts_kernel_files_and_tuning_entries(root, monkeypatch):
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", "1")
    empty = cache.info()
    assert (empty.root, empty.kernel_files, empty.kernel_bytes, empty.tuning_entries) == (root, 0, 0, 0)
    _kernels(root, [100, 250, 7])
    doc = json.dumps({"a": 1, "b": 2, "c": 3})
    (root / "tuning.json").write_text(doc)
    got = cache.info()
    assert (got.kernel_files, got.kernel_bytes, got.cap_bytes) == (3, 357, 2**20)
    assert (got.tuning_entries, got.tuning_bytes) == (3, len(doc))


@pytest.mark.parametrize("doc", ["{not json", "[1, 2]", ""])
def test_info_survives_a_broken_tuning_file(root, doc):
    root.mkdir(parents=True)
    (root / "tuning.json").write_text(doc)
    got = cache.info()
    assert got.tuning_entries == 0 and got.tuning_bytes == len(doc)


@pytest.mark.parametrize("kernels,tuning", [(True, True), (True, False), (False, True)])
def test_clear_removes_what_it_is_asked_to_and_says_how_much(root, kernels, tuning):
    paths = _kernels(root, [100, 250])
    (root / "tuning.json").write_text("{}")
    removed, freed = cache.clear(kernels=kernels, tuning=tuning)
    assert removed == 2 * kernels + tuning and freed == 350 * kernels + 2 * tuning
    assert all(p.exists() != kernels for p in paths) and (root / "tuning.json").exists() != tuning
    assert (root / "kernels" / "README").exists()


def test_clear_of_a_missing_cache_removes_nothing(root):
    assert cache.clear() == (0, 0) and not root.exists()


def test_writes_check_the_cap_on_the_first_write_then_every_32nd(root, monkeypatch):
    calls = []
    monkeypatch.setattr(cache, "_written", 0)
    monkeypatch.setattr(cache, "prune", lambda folder, cap, keep: calls.append(folder) or 0)
    for _ in range(70):
        cache.note_kernel_written(root, set())
    assert len(calls) == 3  # writes 1, 33 and 65


def test_prune_leaves_a_folder_under_its_cap_or_without_one(root):
    paths = _kernels(root, [1000] * 4)  # og_0000 .. og_0003
    old = time.time() - 2 * cache.RECENT_S
    for age, p in zip([1, 3, 0, 2], paths):  # paths[1] used longest ago
        os.utime(p, (old - age * 60, old - age * 60))
    assert cache.prune(root / "kernels", cap=4000) == 0  # at the cap, not over it
    assert cache.prune(root / "kernels", cap=0) == 0 and cache.prune(root / "kernels", cap=-5) == 0
    assert cache.prune(root / "kernels", cap=3999) == 1  # over: down to 80%, oldest first
    assert [p.exists() for p in paths] == [True, False, True, True]
    assert (root / "kernels" / "README").exists()
