"""The kernel cache stays under its cap (issue 20: 9,000 files after a test run, no way to see or
clear them)."""

from __future__ import annotations

import os
import time

import opgraph.core.cache as cache


def _fill(folder, n, size=1024, age_s=3600.0):
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    paths = []
    for i in range(n):
        p = folder / f"og_{i:020d}.py"
        p.write_bytes(b"#" * size)
        os.utime(p, (now - age_s - i, now - age_s - i))  # og_0 the newest
        paths.append(p)
    return paths


def test_prune_removes_the_least_recently_used_down_to_80_percent(tmp_path):
    paths = _fill(tmp_path, 20)
    kept = {paths[-1]}  # the oldest, but loaded by this process
    removed = cache.prune(tmp_path, cap=10 * 1024, keep=kept)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert removed == 12 and len(left) == 8
    assert paths[-1].exists() and all(p.exists() for p in paths[:7])  # the newest seven and the kept one


def test_recently_touched_files_are_never_pruned(tmp_path):
    _fill(tmp_path, 10, age_s=0.0)
    assert cache.prune(tmp_path, cap=1024) == 0 and len(list(tmp_path.iterdir())) == 10


def test_the_loader_keeps_the_folder_under_the_cap(tmp_path, monkeypatch):
    import pytest

    pytest.importorskip("triton")
    from opgraph.engines.triton import loader

    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", str(8 * 1024 / 2**20))  # 8 KiB
    monkeypatch.setattr(cache, "_written", 0)
    _fill(tmp_path / "kernels", 30)
    loader.load_module("def kernel_probe(x):\n    return x\n# " + "y" * 100 + "\n", interpret=True)
    files = list((tmp_path / "kernels").iterdir())
    assert len(files) <= 8, len(files)
    assert any(
        "og_" + loader.source_hash("def kernel_probe(x):\n    return x\n# " + "y" * 100 + "\n") in f.name for f in files
    )


def test_cap_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", "2")
    assert cache.kernel_cache_cap() == 2 * 2**20
    monkeypatch.setenv("OPGRAPH_KERNEL_CACHE_MB", "0")
    assert cache.prune(cache.cache_root(), cache.kernel_cache_cap()) == 0
