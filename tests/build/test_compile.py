"""build.compile: the build compiles kernels ahead of time through the compiler of each step's engine
(Engine.compiler(), the engine contract), never through an engine's modules: specs gathered per
compiler, each distinct key once, one merged report, a step whose kernel failed replaced by an
alternative that compiles. Fake engines with fake compilers, on a simulated GPU (no GPU needed)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from opgraph.build.compile import compile_steps, merged
from opgraph.build.planner import Step
from opgraph.core.config import EngineConfig
from opgraph.core.errors import ExecutionError, GraphError, InternalError
from opgraph.core.piece import make_piece
from opgraph.engines import ENGINES
from opgraph.engines.base import CompileReport, Kernel

from .fakes import H100, FakeEngine, chain


@dataclass(frozen=True)
class Spec:
    key: str


class FakeCompiler:
    """Keys in `failing` do not compile; keys in `oversized` compile, and the batch's check refuses them (a
    kernel over the device's shared memory, as the Triton compiler's `_refuse_oversized`)."""

    def __init__(self, failing: set[str] = frozenset(), oversized: set[str] = frozenset()) -> None:
        self.batches: list[dict] = []
        self.here: list[str] = []
        self.failing = failing
        self.oversized = oversized

    def compile_all(self, specs, *, parallel=True, progress=None):
        self.batches.append(dict(specs))
        if progress:
            progress(len(specs), len(specs))
        failed = {k: "boom" for k in specs if k in self.failing}
        failed |= {k: f"kernel {k} needs 233472 bytes of shared memory" for k in specs if k in self.oversized}
        return CompileReport(kernels=len(specs), compiled=len(specs), workers=2 if parallel else 0, failed=failed)

    def compile_here(self, spec, fn):
        self.here.append(spec.key)
        if spec.key in self.failing:
            raise RuntimeError(f"{spec.key} does not compile")
        return spec.key


class SpecKernel(Kernel):
    def __init__(self, piece, config, keys):
        super().__init__(piece, config)
        self.keys = keys

    def run(self, buffers, stream=None, scratch=None):  # pragma: no cover
        raise AssertionError("not run")

    def compile_specs(self):
        return [(Spec(k), f"fn:{k}") for k in self.keys]


class AotEngine(FakeEngine):
    """A fake engine whose kernels give the specs named by the config's 'keys' knob."""

    def __init__(self, name, compiler):
        super().__init__(name)
        self._compiler = compiler

    def compiler(self):
        return self._compiler

    def compile(self, piece, config, device):
        return SpecKernel(piece, config, config.knob("keys"))


@pytest.fixture
def piece():
    g = chain()
    return make_piece(g, 0, g.nodes[:1])


def step(i, piece, engine, *keys, alternatives=()):
    config = EngineConfig(engine, (("keys", keys),))
    return Step(i, piece, config, SpecKernel(piece, config, keys), tuple(alternatives))


def test_specs_go_to_their_engines_compiler_once_per_key(piece, monkeypatch):
    a, b = FakeCompiler(), FakeCompiler()
    monkeypatch.setitem(ENGINES, "aot_a", AotEngine("aot_a", a))
    monkeypatch.setitem(ENGINES, "aot_b", AotEngine("aot_b", b))
    monkeypatch.setitem(ENGINES, "plain", FakeEngine("plain"))
    steps = [
        step(0, piece, "aot_a", "k1", "k2"),
        step(1, piece, "aot_a", "k2"),
        step(2, piece, "aot_b", "k3"),
        step(3, piece, "plain"),
    ]
    out, stats = compile_steps(steps, H100, "parallel")
    assert out == steps
    assert [list(x) for x in a.batches] == [["k1", "k2"]] and [list(x) for x in b.batches] == [["k3"]]
    assert stats["kernels"] == 3 and stats["launches"] == 4 and stats["compiled"] == 3 and stats["workers"] == 2
    assert stats["mode"] == "parallel" and stats["failed"] == {}
    _, serial = compile_steps(steps, H100, "serial")
    assert serial["workers"] == 0


def test_nothing_is_compiled_ahead_lazily_or_on_the_cpu(piece, monkeypatch):
    from opgraph.core.device import CPU

    a = FakeCompiler()
    monkeypatch.setitem(ENGINES, "aot_a", AotEngine("aot_a", a))
    steps = [step(0, piece, "aot_a", "k1")]
    assert compile_steps(steps, H100, "lazy") == (steps, {"mode": "lazy"})
    assert compile_steps(steps, CPU, "parallel") == (steps, {"mode": "parallel"})
    assert a.batches == []


def test_a_step_whose_kernel_fails_takes_its_first_alternative_that_compiles(piece, monkeypatch):
    a = FakeCompiler(failing={"bad", "bad2"})
    monkeypatch.setitem(ENGINES, "aot_a", AotEngine("aot_a", a))
    broken, good = EngineConfig("aot_a", (("keys", ("bad2",)),)), EngineConfig("aot_a", (("keys", ("ok",)),))
    steps = [step(0, piece, "aot_a", "bad", alternatives=(broken, good)), step(1, piece, "aot_a", "fine")]
    out, stats = compile_steps(steps, H100, "parallel")
    assert stats["failed"] == {"bad": "boom"}
    assert out[1] is steps[1] and out[0].config == good and out[0].kernel.keys == ("ok",)
    assert out[0].alternatives == (steps[0].config, broken)
    assert [list(x) for x in a.batches[1:]] == [["bad2"], ["ok"]]  # each alternative compiled, in order
    with pytest.raises(ExecutionError) as info:
        compile_steps([step(0, piece, "aot_a", "bad", alternatives=(broken,))], H100, "parallel")
    assert info.value.rule == "build.compile_failed"


def test_an_alternative_over_the_devices_shared_memory_is_not_taken(piece, monkeypatch):
    """The attention forward with a block mask (bf16, D 128, GPU test): its first config was refused for
    its shared memory, and the alternative with the same tiles (ONELOOP=0) was taken unchecked and failed
    at the first bind. Alternatives pass the batch's checks too."""
    a = FakeCompiler(oversized={"big", "big_too"})
    monkeypatch.setitem(ENGINES, "aot_a", AotEngine("aot_a", a))
    same_tiles, smaller = EngineConfig("aot_a", (("keys", ("big_too",)),)), EngineConfig("aot_a", (("keys", ("ok",)),))
    out, stats = compile_steps([step(0, piece, "aot_a", "big", alternatives=(same_tiles, smaller))], H100, "parallel")
    assert list(stats["failed"]) == ["big"]
    assert out[0].config == smaller and out[0].alternatives == (
        EngineConfig("aot_a", (("keys", ("big",)),)),
        same_tiles,
    )
    with pytest.raises(ExecutionError) as info:
        compile_steps([step(0, piece, "aot_a", "big", alternatives=(same_tiles,))], H100, "parallel")
    assert info.value.rule == "build.compile_failed" and "233472 bytes" in str(info.value)


class StagedEngine(AotEngine):
    """A fake engine whose kernel's key is its config's key at its stages (`key@stages`)."""

    def compile(self, piece, config, device):
        return SpecKernel(piece, config, (f"{config.knob('keys')[0]}@{config.knob('num_stages')}",))


def test_a_kernel_over_the_shared_memory_tries_its_tiles_at_fewer_stages_first(piece, monkeypatch):
    """The Llama training step's query projection with RoPE (fp32 cos / sin tiles converted through shared
    memory beside 3 stages of 128 x 256 tiles: 245,784 bytes under Triton 3.6, 196,624 at 2 stages) fell to
    its engine's broadest 64 x 64 alternative, 3-4x slower: its own tiles at fewer stages come first, down
    to 2; a failure for another reason does not try them."""
    a = FakeCompiler(oversized={"big@4", "big@3"}, failing={"boom@4"})
    monkeypatch.setitem(ENGINES, "staged", StagedEngine("staged", a))
    cfg = lambda key, n: EngineConfig("staged", (("keys", (key,)), ("num_stages", n)))  # noqa: E731
    broad = cfg("broad", 2)
    engine = ENGINES["staged"]
    big = Step(0, piece, cfg("big", 4), engine.compile(piece, cfg("big", 4), H100), (broad,))
    out, stats = compile_steps([big], H100, "parallel")
    assert list(stats["failed"]) == ["big@4"]
    assert out[0].config == cfg("big", 2) and out[0].kernel.keys == ("big@2",)
    assert [list(x) for x in a.batches[1:]] == [["big@3"], ["big@2"]]  # 3 stages over too, then 2
    assert "shared memory" in out[0].note and out[0].alternatives == (cfg("big", 4), broad)
    other = Step(0, piece, cfg("boom", 4), engine.compile(piece, cfg("boom", 4), H100), (broad,))
    out, _ = compile_steps([other], H100, "parallel")
    assert out[0].config == broad  # (not a matter of shared memory: no stages cut)


def test_a_failed_kernel_gives_way_to_its_engines_other_kernels_first(piece, monkeypatch, caplog):
    """The heuristic's mode A offers one generated config a piece, then PyTorch's: a Llama's norm-backward GEMM
    whose Gluon kernel did not fit the H200's shared memory under Triton 3.6 ran on the torch engine, 20x slower.
    The failed config's engine is asked first: its alternatives, then its configs among `more` (the piece's in
    more modes), then the other engines' alternatives in their order."""
    a = FakeCompiler(failing={"bad", "bad2"})
    monkeypatch.setitem(ENGINES, "aot_a", AotEngine("aot_a", a))
    monkeypatch.setitem(ENGINES, "aot_b", AotEngine("aot_b", FakeCompiler()))
    cfg = lambda engine, key: EngineConfig(engine, (("keys", (key,)),))  # noqa: E731
    fallback, broken, good = cfg("aot_b", "slow"), cfg("aot_a", "bad2"), cfg("aot_a", "ok")
    failing = step(0, piece, "aot_a", "bad", alternatives=(fallback, broken))
    seen = []

    def more(s):
        seen.append(s.index)
        return [failing.config, fallback, broken, good]

    out, _ = compile_steps([failing, step(1, piece, "aot_a", "fine")], H100, "parallel", more)
    assert seen == [0]  # (asked for the failed step only)
    assert out[0].config == good and out[0].alternatives == (failing.config, fallback, broken)
    assert [list(x) for x in a.batches[1:]] == [["bad2"], ["ok"]]  # its own alternative, then `more`'s
    # none of its own compiles: the other engine's alternative, as before
    with caplog.at_level(logging.WARNING, logger="opgraph.build"):
        out, _ = compile_steps([failing], H100, "parallel", lambda s: [cfg("aot_a", "bad2")])
    assert out[0].config == fallback
    # (another engine's config: said in the plan's description and warned, where it may run far slower)
    assert "failed to compile: boom" in out[0].note and "aot_b" in out[0].note
    assert any("failed to compile" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)

    def refuses(s):
        raise GraphError("no configs in mode B", rule="engine.no_config")

    out, _ = compile_steps([failing], H100, "parallel", refuses)  # (its alternatives still serve)
    assert out[0].config == fallback


def test_a_kernel_that_failed_is_not_compiled_again_for_another_step(piece, monkeypatch):
    """A model's repeated layers: their steps share the failed kernel and try the same alternatives; one that
    failed for the first step is not compiled again for the next."""
    a = FakeCompiler(failing={"bad", "bad2"})
    monkeypatch.setitem(ENGINES, "aot_a", AotEngine("aot_a", a))
    broken, good = EngineConfig("aot_a", (("keys", ("bad2",)),)), EngineConfig("aot_a", (("keys", ("ok",)),))
    steps = [step(i, piece, "aot_a", "bad", alternatives=(broken, good)) for i in range(3)]
    out, _ = compile_steps(steps, H100, "parallel")
    assert all(s.config == good for s in out)
    compiled = [k for batch in a.batches[1:] for k in batch]
    assert compiled.count("bad2") == 1 and compiled.count("bad") == 0, compiled


def test_specs_from_an_engine_without_a_compiler_are_a_bug(piece, monkeypatch):
    monkeypatch.setitem(ENGINES, "plain", FakeEngine("plain"))
    with pytest.raises(InternalError):
        compile_steps([step(0, piece, "plain", "k1")], H100, "parallel")


def test_reports_merge():
    total = merged(
        [
            CompileReport(kernels=2, ready=1, seconds=1.0, workers=4, failed={"a": "x"}),
            CompileReport(kernels=1, cached=1, compiled=1, seconds=0.5, workers=2),
        ]
    )
    assert total == CompileReport(kernels=3, ready=1, cached=1, compiled=1, workers=4, seconds=1.5, failed={"a": "x"})
    assert merged([]) == CompileReport()
