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


HELPERS = """import triton
import triton.language as tl


def _og_helper(x):
    # a comment the canonical text drops
    y = x + 1
    return y
"""


def _module(names: tuple[str, str, str], second: str) -> str:
    a, b, c = names
    return (
        f"{HELPERS}\n\ndef kernel({a}, {b}):\n    {c} = tl.load({a})\n    tl.store({b}, _og_helper({c}))\n"
        f"\n\ndef kernel_2({a}, {b}):\n    {second} = tl.load({a}) * 2\n    tl.store({b}, {second})\n"
    )


def test_the_canonical_text_renames_every_kernels_names_and_keeps_the_helpers():
    """Modules differing only in their kernels' parameter and local names share a digest, whichever
    kernel the names are in; the helpers before the first kernel are the module's own (parsed once a
    process): the text is the whole module's unparsed, kernels renamed."""
    import ast

    one = _module(("p1", "p2", "t3"), "t4")
    other = _module(("p7", "p9", "t10"), "t11")
    assert compiler.alpha_renamed(one) == compiler.alpha_renamed(other)
    assert compiler.alpha_renamed(one) != compiler.alpha_renamed(_module(("p1", "p2", "t3"), "p2"))
    text = compiler.alpha_renamed(one)
    assert "_og_helper(x)" in text and "y = x + 1" in text and "comment" not in text
    assert "p1" not in text and "t4" not in text  # (both kernels renamed)
    assert text == compiler._kernels_renamed(one)  # the whole module's text, parsed at once
    assert compiler._PRELUDES[one[: one.index("\ndef kernel") + 1]] == ast.unparse(ast.parse(HELPERS))
    decorated = one.replace("\ndef kernel(", "\n@triton.jit\ndef kernel(", 1)
    assert compiler.alpha_renamed(decorated) == compiler._kernels_renamed(decorated)  # (no cut there)
    bare = one[one.index("def kernel(") :]
    assert compiler.alpha_renamed(bare) == compiler._kernels_renamed(bare)


def test_a_compiler_that_aborts_fails_its_kernel_not_this_process(tmp_path, monkeypatch):
    """Triton 3.6's LLVM aborted the process on one generated attention backward (an SLPVectorizer
    assertion, H200, NVIDIA's test_mhas_v2 ragged case 203): a kernel compiled for a bind, or one
    missing kernel of a build, compiles in a worker process, whose death is a typed error here. The
    module below aborts the interpreter that imports it, as that compiler did; the pool then serves on."""
    from opgraph.core.errors import ExecutionError
    from opgraph.engines.triton.pool import WorkerPool

    pool = WorkerPool(1)
    monkeypatch.setattr("opgraph.engines.triton.pool.shared_pool", lambda: pool)
    monkeypatch.setattr(compiler, "_FAILED", {})
    path = tmp_path / "og_aborts.py"
    path.write_text('import os, sys\nsys.stderr.write("Assertion `x\' failed.\\n")\nsys.stderr.flush()\nos.abort()\n')
    spec = compiler.KernelSpec(
        str(path), "og_aborts", "kernel", (("x", "*fp32"),), (), (0,), (("num_warps", 4),), ("cuda", 90, 32)
    )
    try:
        with pytest.raises(ExecutionError, match=r"kernel kernel \(og_aborts\) failed to compile: .*exited") as err:
            compiler.compile_here(spec, None, isolated=True)
        assert err.value.rule == "triton.compile_failed"
        assert "SIGABRT" in str(err.value) and "Assertion `x' failed." in str(err.value)  # (its stderr's last lines)
        before = list(pool.workers)
        report = compiler.compile_all({spec.key: (spec, None)}, parallel=True, pool=pool)  # (remembered)
        assert "SIGABRT" in report.failed[spec.key] and spec.key not in compiler._BINARIES
        assert pool.workers == before  # (not compiled again: no worker died)
    finally:
        pool.close()


def test_workers_started_under_another_environment_are_replaced(tmp_path, monkeypatch):
    """A worker writes its binary into the Triton cache of the environment it was started with: after
    TRITON_CACHE_DIR changes, the next run starts fresh workers (else this process, looking in its own
    cache, would compile every kernel a second time); an environment changed elsewhere keeps them."""
    from opgraph.engines.triton.pool import WorkerPool

    pool = WorkerPool(1)
    sick = tmp_path / "og_env.py"
    sick.write_text("raise RuntimeError('no')\n")

    def one(i):
        pool.run([{"path": str(sick), "module": f"og_env{i}", "kernel": "kernel", "id": str(i)}], lambda j, a: None)
        return [w.proc.pid for w in pool.workers]

    try:
        first = one(0)
        assert one(1) == first
        monkeypatch.setenv("OG_UNRELATED", "1")  # (pytest's PYTEST_CURRENT_TEST changes so at every test)
        assert one(3) == first
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "other"))
        second = one(2)
        assert len(second) == 1 and second != first
        assert pool.workers[0].env["TRITON_CACHE_DIR"] == str(tmp_path / "other")
    finally:
        pool.close()


def test_a_run_left_early_kills_its_busy_workers(tmp_path):
    """A `done` that raises (or an interrupt) leaves workers busy: they are killed, so a later run never
    takes their answer for its own job."""
    from opgraph.engines.triton.pool import WorkerPool

    pool = WorkerPool(2)
    path = tmp_path / "og_slow.py"
    path.write_text("import time\ntime.sleep(30)\n")
    jobs = [{"path": str(path), "module": f"og_slow{i}", "kernel": "kernel", "id": str(i)} for i in range(2)]

    def done(job, answer):
        raise KeyboardInterrupt

    sick = tmp_path / "og_fails.py"
    sick.write_text("raise RuntimeError('no')\n")
    try:
        pool.run([{"path": str(sick), "module": "og_fails", "kernel": "kernel", "id": "s"}] + jobs[:1], done)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("done's exception was swallowed")
    assert all(w.job is None for w in pool.workers) and len(pool.workers) <= 1
    answers = []
    pool.run(
        [{"path": str(sick), "module": "og_fails2", "kernel": "kernel", "id": "t"}], lambda j, a: answers.append((j, a))
    )
    assert [(j["id"], a["id"]) for j, a in answers] == [("t", "t")]
    pool.close()
