"""Compiled kernels embedded in plan files: checked against their hashes, and used by the plan that
carries them only (opgraph.engines.artifacts.Scope). Before, a loaded file's kernels went into a
process-wide registry, from which plans built later in the same process took compiled kernels: a
plan file could supply code to other plans."""

from __future__ import annotations

import base64
import hashlib
import json
import logging

import numpy as np
import pytest

import opgraph as og
from opgraph.core.config import EngineConfig, Support
from opgraph.engines import ENGINES, artifacts, register_engine
from opgraph.engines.base import Engine
from opgraph.engines.reference import ReferenceKernel
from opgraph.runtime.plan_io import MAGIC

from ..helpers import requires_interpreter

KIND = "test_compiled"


class _Kernel(ReferenceKernel):
    """A kernel that, like cuDNN's, looks for its compiled form among the artifacts before
    'compiling' one (here: bytes naming the piece)."""

    def __init__(self, piece, config):
        super().__init__(piece, config)
        self.key = hashlib.sha256(repr(piece.signature()).encode()).hexdigest()[:32]
        art = artifacts.get(KIND, self.key)
        self.found = art.data if art is not None else None
        self.compiled = self.found or f"compiled {self.key}".encode()

    def artifacts(self):
        return [artifacts.Artifact(KIND, self.key, self.compiled)]


class _CompilingEngine(Engine):
    name = "test_compiling"

    def available(self, device):
        return Support.no("CPU only") if device.is_cuda else Support.yes()

    def supports(self, piece, device):
        return Support.yes()

    def configs(self, piece, device, mode):
        return [EngineConfig(self.name, why="test")]

    def compile(self, piece, config, device):
        return _Kernel(piece, config)


@pytest.fixture(scope="module", autouse=True)
def _engine():
    register_engine(_CompilingEngine())
    yield
    ENGINES.pop(_CompilingEngine.name, None)


def _graph() -> og.Graph:
    g = og.Graph("embedded", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    g.relu(g.mul(x, 2.0)).set_output(True).set_name("y")
    return g


def _doc(data: bytes) -> dict:
    return json.loads(data.split(b"\n", 1)[1])


def _file(doc: dict) -> bytes:
    """A plan file of `doc` with a valid header checksum: damage that is consistent, as a tamperer makes."""
    body = json.dumps(doc).encode()
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def _tamper(doc: dict, index: int, data: bytes) -> dict:
    """The artifact's bytes replaced, its own SHA-256 fixed up to match."""
    art = doc["artifacts"][index]
    art["data"] = base64.b64encode(data).decode()
    art["sha256"] = hashlib.sha256(data).hexdigest()
    return doc


def test_a_files_kernels_serve_its_own_plan_only(rng):
    plan = _graph().build(device="cpu", engines=[_CompilingEngine.name])
    assert plan.steps[0].kernel.found is None
    data = plan.to_bytes()
    loaded = og.ExecutionPlan.from_bytes(data)
    assert loaded.steps[0].kernel.found == plan.steps[0].kernel.compiled  # the file's, as built
    assert loaded.build_stats["compile"]["embedded"] == 1
    # consistently altered bytes: the loaded plan carries them (nothing can tell them from real ones)...
    evil = og.ExecutionPlan.from_bytes(_file(_tamper(_doc(data), 0, b"not what was compiled")))
    assert evil.steps[0].kernel.found == b"not what was compiled"
    # ...and nothing else ever sees them: no global lookup, no later build, no other plan's save
    assert artifacts.get(KIND, plan.steps[0].kernel.key) is None
    later = _graph().build(device="cpu", engines=[_CompilingEngine.name])
    assert later.steps[0].kernel.found is None
    assert _doc(later.to_bytes())["artifacts"][0]["data"] == base64.b64encode(later.steps[0].kernel.compiled).decode()
    # the altered plan saves what it carries (its own), the honest one what it carries
    assert base64.b64decode(_doc(evil.to_bytes())["artifacts"][0]["data"]) == b"not what was compiled"
    assert _doc(loaded.to_bytes())["artifacts"] == _doc(data)["artifacts"]


def test_kernels_no_step_uses_are_dropped(caplog):
    plan = _graph().build(device="cpu", engines=[_CompilingEngine.name])
    doc = _doc(plan.to_bytes())
    stray = artifacts.Artifact(KIND, "f" * 32, b"a kernel for some other plan")
    doc["artifacts"].append(stray.to_doc())
    with caplog.at_level(logging.INFO, logger="opgraph.runtime"):
        loaded = og.ExecutionPlan.from_bytes(_file(doc))
    assert [a.key for a in loaded.state.kernels] == [plan.steps[0].kernel.key]
    assert "1 embedded kernel(s) that no step uses were dropped" in caplog.text
    assert artifacts.get(KIND, "f" * 32) is None
    assert all(a["key"] != "f" * 32 for a in _doc(loaded.to_bytes())["artifacts"])


def test_an_artifact_whose_bytes_do_not_match_its_hash_is_refused():
    plan = _graph().build(device="cpu", engines=[_CompilingEngine.name])
    doc = _doc(plan.to_bytes())
    doc["artifacts"][0]["data"] = base64.b64encode(b"other bytes").decode()  # sha256 left as it was
    with pytest.raises(og.SerializationError) as err:
        og.ExecutionPlan.from_bytes(_file(doc))
    assert err.value.rule == "plan.artifact" and "artifacts[0]" in str(err.value)


def test_another_thread_does_not_see_a_plans_kernels_while_it_binds():
    import threading

    plan = _graph().build(device="cpu", engines=[_CompilingEngine.name])
    loaded = og.ExecutionPlan.from_bytes(plan.to_bytes())
    key = plan.steps[0].kernel.key
    seen = []
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        inside.wait()
        seen.append(artifacts.get(KIND, key))
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with loaded.state.kernels.visible():
        assert artifacts.get(KIND, key) is not None
        inside.set()
        done.wait()
    t.join()
    assert seen == [None]


# -- Triton's compiled kernels ------------------------------------------------------------------------


@requires_interpreter
def test_a_tampered_triton_kernel_never_replaces_this_machines(tmp_path, monkeypatch, caplog):
    """Real cubins (Triton compiles for sm_90 without a GPU, in worker processes). A plan file's
    binary for a spec, altered consistently (bytes and SHA-256): where this process or this machine's
    kernel cache has the spec's binary, that one is used and the file's is refused (a warning); on a
    machine with neither, the file's binary serves the loading plan only: the registry never takes it
    and a later build compiles its own."""
    from opgraph.engines.triton import compiler
    from opgraph.engines.triton.pool import WorkerPool

    from ..test_runtime import _specs

    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "og"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    g = og.Graph("tamper", io_data_type=og.DataType.HALF)
    g.sigmoid(g.mul(g.tensor(dim=[4, 32], name="x"), 3.0)).set_output(True)
    ((spec, fn),) = _specs([g])
    compiler._BINARIES.clear()
    pool = WorkerPool(1)
    try:
        assert not compiler.compile_all({spec.key: (spec, fn)}, pool=pool).failed
        trusted = compiler.registered(spec)
        assert trusted is not None and trusted.cubin[:4] == b"\x7fELF"
        bad = bytearray(trusted.cubin)
        bad[len(bad) // 2] ^= 0xFF
        forged = artifacts.Artifact("triton", spec.key, bytes(bad), {"metadata": trusted.metadata})
        assert forged.sha256 != trusted.sha256  # consistent: its own hash matches its bytes

        with caplog.at_level(logging.WARNING, logger="opgraph.compile"):
            with artifacts.Scope([forged]).visible():  # this process compiled it
                assert compiler.registered(spec) is trusted
            compiler._BINARIES.clear()  # a new process; the kernel cache on disk has it
            with artifacts.Scope([forged]).visible():
                assert compiler.registered(spec).cubin == trusted.cubin
        assert "differs from the one compiled on this machine" in caplog.text

        compiler._BINARIES.clear()  # a new machine: no cache of either kind
        monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "og2"))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton2"))
        scope = artifacts.Scope([forged])
        with scope.visible():
            assert compiler.registered(spec).cubin == bytes(bad)  # the loading plan's own
        assert compiler.registered(spec) is None and not compiler._BINARIES  # nothing registered
        pool.close()
        pool = WorkerPool(1)  # workers of the new machine (their Triton cache is the new one too)
        again = compiler.compile_all({spec.key: (spec, fn)}, pool=pool)  # a later build
        assert again.compiled == 1, again.failed
        assert compiler.registered(spec).cubin == trusted.cubin
    finally:
        pool.close()
        compiler._BINARIES.clear()


def test_binaries_of_one_spec_load_as_separate_modules():
    """The native launcher caches loaded CUDA modules by (identity, device): a plan file's binary and
    this machine's for the same spec never stand in for each other."""
    from opgraph.engines.triton.compiler import KernelBinary

    a = KernelBinary("k" * 32, b"\x7fELF one", {"name": "kernel"})
    b = KernelBinary("k" * 32, b"\x7fELF two", {"name": "kernel"})
    assert a.sha256 == hashlib.sha256(a.cubin).hexdigest()
    assert a.key == b.key and a.identity != b.identity and a.identity.startswith(a.key)


class _LateKernel(_Kernel):
    """A kernel that reads its compiled form again when the plan reserves its launches' memory, as the
    Triton engine reads its binary's global scratch then (a loaded plan's binary: from the file)."""

    seen: list[bytes | None] = []

    def global_scratch_bytes(self):
        art = artifacts.get(KIND, self.key)
        _LateKernel.seen.append(art.data if art is not None else None)
        return {}


class _LateEngine(_CompilingEngine):
    name = "test_compiling_late"

    def compile(self, piece, config, device):
        return _LateKernel(piece, config)


def test_a_loaded_plan_reserves_with_its_own_kernels(rng):
    """Reserving a thread's launch memory (before the first bind) sees the file's kernels: it read
    them outside the plan's scope, so a loaded plan compiled its Triton kernels again at its first
    execute (4 kernels on an H200, 2026-11-29)."""
    register_engine(_LateEngine())
    try:
        plan = _graph().build(device="cpu", engines=[_LateEngine.name])
        loaded = og.ExecutionPlan.from_bytes(plan.to_bytes())
        _LateKernel.seen.clear()
        x = rng.standard_normal((4, 8)).astype("float32")
        loaded.execute({loaded.graph.inputs[0]: x, loaded.graph.outputs[0]: np.full_like(x, np.nan)})
        assert _LateKernel.seen and all(s == plan.steps[0].kernel.compiled for s in _LateKernel.seen)
    finally:
        ENGINES.pop(_LateEngine.name, None)
