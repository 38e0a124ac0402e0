"""The Triton engine's compiler (opgraph/engines/triton/compiler.py): its counts of compiled kernels."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("triton")

from opgraph.engines.triton import compiler  # noqa: E402


class _Pool:
    size = 4

    def run(self, jobs, finished):
        for job in jobs:
            finished(job, {"id": job["id"], "ok": True, "cache_hit": False})


def _spec(key):
    return types.SimpleNamespace(key=key, kernel=f"kernel_{key}", job=lambda: {"module": key, "kernel": "k"})


def test_a_kernel_compiled_by_a_worker_counts_once_when_this_process_reads_it_back(monkeypatch, tmp_path):
    """The worker compiled it (counted); where its Triton cache cannot be read here directly, this
    process compiles it again through Triton, which finds the worker's result: that is a load, not a
    second compilation (a GPU run counted every kernel of a parallel build twice)."""
    meta = tmp_path / "k.json"
    meta.write_text("{}")
    kernel = types.SimpleNamespace(metadata_group={"k.json": str(meta)}, kernel=b"\0")
    monkeypatch.setattr(compiler, "_BINARIES", {})
    monkeypatch.setattr(compiler, "_disk_get", lambda spec: None)
    monkeypatch.setattr(compiler, "_disk_put", lambda binary: None)
    monkeypatch.setattr(compiler, "_cached", lambda spec, fn: None)
    monkeypatch.setattr(compiler, "registered", lambda spec: compiler._BINARIES.get(spec.key))
    # Triton 3.6's compile listener may not report the cache hit: the worst case, a "miss"
    monkeypatch.setattr(compiler, "compile_spec", lambda fn, job: (kernel, False))
    monkeypatch.setattr(compiler, "_binary", lambda spec, meta, cubin: compiler.KernelBinary(spec.key, cubin, {}, "0"))
    monkeypatch.setattr(compiler.native, "too_big", lambda shared: None)
    before = dict(compiler.STATS)
    specs = {k: (_spec(k), None) for k in ("a", "b", "c")}
    report = compiler.compile_all(specs, parallel=True, pool=_Pool())
    assert report.compiled == 3 and not report.failed
    assert compiler.STATS["compiled"] - before["compiled"] == 3
    assert compiler.STATS["loaded"] - before["loaded"] == 3
    assert set(compiler._BINARIES) == {"a", "b", "c"}
