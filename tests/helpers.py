"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph as og
from opgraph.build.planner import Step
from opgraph.core.config import HeurMode, Support
from opgraph.engines import EngineConfig, get_engine
from opgraph.engines.base import Engine
from opgraph.engines.reference import ReferenceKernel
from opgraph.ops.pointwise import MODES, PointwiseMode
from opgraph.runtime.plan import ExecutionPlan
from opgraph.testing import compare, random_pack, reference_outputs  # noqa: F401
from opgraph.tools.samples import nhwc


class OneOpEngine(Engine):
    """A test engine that runs one op per kernel (through the reference kernel), so that any multi-op
    graph gets partitioned and its intermediates cross steps in the workspace. Register it with
    `engines_registered`."""

    name = "test_one_op"

    def available(self, device):
        return Support.no("CPU only") if device.is_cuda else Support.yes()

    def supports(self, piece, device):
        if len(piece.nodes) > 1:
            return Support.no("one op per kernel", piece.nodes[1])
        return Support.yes()

    def configs(self, piece, device, mode):
        return [EngineConfig(self.name, knobs=(("mode", mode.value),), why="test")]

    def compile(self, piece, config, device):
        return ReferenceKernel(piece, config)


@contextlib.contextmanager
def engines_registered(*engines):
    """The test engines exist inside the block, and only there."""
    from opgraph.engines import ENGINES, register_engine

    for engine in engines:
        register_engine(engine)
    try:
        yield
    finally:
        for engine in engines:
            ENGINES.pop(engine.name, None)


def run_reference(g: og.Graph, rng: np.random.Generator, **kw):
    """Validate g, run it on the reference engine over random inputs with poisoned outputs.
    Returns (pack, {uid: output array})."""
    final = g.final
    pack = random_pack(final, rng, **kw)
    g.build(device="cpu").execute(pack)
    return pack, {u: pack[u] for u in final.outputs}


def torch_or_skip():
    return pytest.importorskip("torch")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


requires_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")


def interpreter_available() -> bool:
    """Triton and PyTorch installed, and Triton in interpreter mode (set by conftest without a GPU)."""
    import os

    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


requires_interpreter = pytest.mark.skipif(not interpreter_available(), reason="needs Triton and PyTorch")


def assert_engine_matches(
    g: og.Graph,
    rng: np.random.Generator,
    *,
    engines=("triton",),
    device: str = "cpu",
    expect_steps: int | None = None,
    prepare=None,
    rtol=None,
    atol=None,
    **kw,
):
    """Build g for `engines` on `device` (the CPU means Triton's interpreter), run it on random
    inputs with poisoned outputs and assert every output matches the reference engine.
    Returns the plan (so tests can look at its steps)."""
    plan = g.build(device=device, engines=list(engines))
    if expect_steps is not None:
        assert len(plan.steps) == expect_steps, plan.describe()
    bad = og.testing.check_plan(plan, rng, prepare=prepare, rtol=rtol, atol=atol, **kw)
    assert not bad, "\n".join(str(m) for m in bad) + "\n" + plan.describe()
    return plan


# -- validation errors -----------------------------------------------------------------------------


def raises_rule(g: og.Graph, cls: type[og.GraphError], rule: str, *names: str) -> og.GraphError:
    """g.validate() must raise `cls` for `rule`, naming each of `names` (see check_rule)."""
    with pytest.raises(cls) as info:
        g.validate()
    return check_rule(info.value, rule, *names)


def check_rule(err: og.GraphError, rule: str, *names: str) -> og.GraphError:
    """err is for `rule`, says so in its message and names each tensor or op of `names` in quotes."""
    assert err.rule == rule, str(err)
    text = str(err)
    assert f"[rule {rule}]" in text
    for n in names:
        assert f"'{n}'" in text, text
    return err


# -- graphs ----------------------------------------------------------------------------------------


def layout_stride(dims, layout: str):
    """The stride to declare a tensor of `dims` with: channels-last for "nhwc", else None (packed)."""
    return nhwc(list(dims)) if layout == "nhwc" else None


def per_channel(dims) -> list[int]:
    """[1, C, 1, ...]: the dims of a per-channel tensor of an image of `dims` ([N, C, ...])."""
    return [1, dims[1]] + [1] * (len(dims) - 2)


def outputs(*tensors) -> None:
    """Mark the tensors outputs (None, an optional result left out, skipped)."""
    for t in tensors:
        if t is not None:
            t.set_output(True)


POSITIVE = {PointwiseMode.SQRT, PointwiseMode.RSQRT, PointwiseMode.LOG, PointwiseMode.POW}  # inputs kept > 0


def pointwise_graph(mode: PointwiseMode, dt: og.DataType, layout: str, dims=(2, 3, 4, 5)) -> og.Graph:
    """y = mode(x0, ...) over inputs of `dims` in `layout`, in a safe domain for the mode."""
    g = og.Graph("pw", io_data_type=dt)
    arity = MODES[mode].arity
    xs = [g.tensor(dim=list(dims), stride=layout_stride(dims, layout), name=f"x{i}") for i in range(arity)]
    if mode in POSITIVE:
        xs = [g.add(g.abs(x), 0.5) for x in xs]
    if mode is PointwiseMode.BINARY_SELECT:
        xs[2] = g.cmp_gt(xs[2], 0.0)
    g.pointwise(*xs, mode=mode).set_output(True).set_name("y")
    return g


# -- plans of chosen Triton configs ----------------------------------------------------------------


def templates(plan) -> list[str]:
    """The template of each step's config."""
    return [s.config.knob("template") for s in plan.steps]


def step_plan(plan, step, config: EngineConfig) -> ExecutionPlan:
    """A plan running only `step` of `plan`, compiled by `config`'s engine with `config`."""
    return ExecutionPlan(plan.graph, plan.device, (_recompiled(plan, step, 0, config),), plan.cuts)


def _recompiled(plan, step, index: int, config: EngineConfig) -> Step:
    kernel = get_engine(config.engine).compile(step.piece, config, plan.device)
    return Step(index, step.piece, config, kernel)


def with_step_config(plan, index: int, config: EngineConfig) -> ExecutionPlan:
    """`plan` with its step `index` compiled by `config` instead (the other steps unchanged)."""
    steps = tuple(_recompiled(plan, s, index, config) if i == index else s for i, s in enumerate(plan.steps))
    return ExecutionPlan(plan.graph, plan.device, steps, plan.cuts)


def plan_with(g: og.Graph, knobs: dict, *, engines=("triton",), **build) -> ExecutionPlan:
    """A plan whose only step runs its template with `knobs` (the other knobs from its heuristic)."""
    plan = g.build(device="cpu", engines=list(engines), **build)
    (step,) = plan.steps
    base = dict(step.config.knobs)
    if knobs.get("template", base.get("template")) != base.get("template"):
        base = {}  # (another template's knobs mean nothing to this one)
    config = EngineConfig("triton", tuple(sorted({**base, **knobs}.items())))
    return step_plan(plan, step, config)


def candidate_configs(g: og.Graph):
    """g built for the CPU under heuristic mode B: (plan, its first step, the step's config and then
    each alternative)."""
    plan = g.build(device="cpu", engines=["triton"], heur_mode=[HeurMode.B])
    step = plan.steps[0]
    return plan, step, (step.config, *step.alternatives)


def assert_candidates_match(plan, step, configs, rng: np.random.Generator, **tolerance) -> None:
    """Run `step` of `plan` alone with each of `configs` on random inputs; every output must match the
    reference engine."""
    for config in configs:
        bad = og.testing.check_plan(step_plan(plan, step, config), rng, **tolerance)
        assert not bad, f"{config}: " + "\n".join(map(str, bad))


def assert_engine_close_l2(
    g: og.Graph, rng: np.random.Generator, *, max_rel_l2: float, engines=("triton",), device: str = "cuda", **kw
):
    """Like assert_engine_matches, but each output is compared by its relative L2 error
    ||got - want|| / ||want||: for low-precision results of long sums with cancellation (gradients),
    where an elementwise tolerance measures the inputs' rounding, not the kernel."""
    from opgraph.testing import random_pack, reference_outputs

    plan = g.build(device=device, engines=list(engines))
    f = plan.graph
    pack = random_pack(f, rng, **kw)
    want = reference_outputs(f, pack)
    if plan.device.is_cuda:
        from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

        dev = pack_to_device(pack, f"cuda:{plan.device.index}")
        plan.execute(dev)
        got = {u: torch_to_numpy(dev[u]) for u in f.outputs}
    else:
        plan.execute(pack)
        got = {u: pack[u] for u in f.outputs}
    for u in f.outputs:
        w = np.asarray(want[u], dtype=np.float64)
        d = np.asarray(got[u], dtype=np.float64) - w
        rel = float(np.linalg.norm(d) / max(np.linalg.norm(w), 1e-30))
        assert np.isfinite(rel) and rel <= max_rel_l2, (f.tensors[u].label(), rel, plan.describe())
    return plan


def scale_mask_or_genstats(g: og.Graph, y: og.Tensor, epi: str) -> None:
    """The fuzzers' shared epilogues of a GEMM-class output `y`: "scale_mask" (2y and its >= 0 mask
    as outputs) or "genstats" (y with its per-channel sum and sum of squares)."""
    if epi == "scale_mask":
        z = g.mul(y, 2.0)
        z.set_output(True)
        g.cmp_ge(z, 0.0).set_output(True)
    else:
        y.set_output(True)
        s, sq = g.genstats(y)
        s.set_output(True)
        sq.set_output(True)


def assert_replay_equals_execute(plan, pack, out_uid: int) -> None:
    """Execute `plan` on `pack`, then capture it in a CUDA graph and replay it over a poisoned output:
    the replay must write exactly what the execute wrote."""
    import torch

    plan.execute(pack)
    want = pack[out_uid].clone()
    pack[out_uid].fill_(float("nan"))
    graph = plan.populate_cuda_graph(pack)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(pack[out_uid], want)


ROOT = Path(__file__).parent.parent


def example_env(**extra: str) -> dict[str, str]:
    """The environment an example runs in as a user's shell starts it from a checkout: the repo on the
    path (an uninstalled checkout works too), unbuffered, no TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def run_example(name: str, *args: str, timeout: float = 600, **extra: str) -> str:
    """Run examples/<name> in a subprocess: it must exit 0 and report no mismatch. Returns its output."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=example_env(**extra),
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "MISMATCH" not in proc.stdout, proc.stdout[-3000:]
    return proc.stdout


def run_at_shape(
    plan,
    env: dict,
    rng: np.random.Generator,
    *,
    prepare=None,
    keyed=None,
    relative_to_scale: bool = False,
) -> None:
    """Execute the dynamic plan `plan` on a random pack of the shape `env` and compare every output with
    the reference engine run on the static graph of that shape (outputs poisoned by random_pack). A
    CUDA plan gets the pack copied to its device and its outputs back. `prepare(static, pack, rng)`
    adjusts the pack first (sequence lengths); `keyed(static, uid)` keys it (a name, a handle)."""
    static = plan.graph.at(env)
    pack = random_pack(static, rng)
    if prepare is not None:
        prepare(static, pack, rng)
    want = reference_outputs(static, pack)
    if plan.device.is_cuda:
        from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

        dev = pack_to_device(pack, plan.device.torch_name)
        plan.execute(dev)
        pack = {**pack, **{u: torch_to_numpy(dev[u]) for u in static.outputs}}
    else:
        plan.execute(pack if keyed is None else {keyed(static, u): v for u, v in pack.items()})
    bad = [
        m
        for u in static.outputs
        if (m := compare(static.tensors[u], pack[u], want[u], relative_to_scale=relative_to_scale)) is not None
    ]
    assert not bad, f"{env}: " + "\n".join(map(str, bad))


def record_allocations(monkeypatch) -> list:
    """From now on, every buffer opgraph allocates for a workspace or a launch's own memory
    (memory.workspace.allocate), in order."""
    from opgraph.memory import workspace as wsp

    made: list = []
    real = wsp.allocate
    monkeypatch.setattr(wsp, "allocate", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    return made


def record_generations(monkeypatch) -> list:
    """From now on, each (piece, config) the Triton engine generates kernels for (TritonEngine.generated),
    in order: a test's check that a kernel was re-pointed, not generated again."""
    from opgraph.engines.triton import TritonEngine

    seen: list = []
    real = TritonEngine.generated
    monkeypatch.setattr(TritonEngine, "generated", lambda self, p, c, d: seen.append((p, c)) or real(self, p, c, d))
    return seen


def check_re_pointed(plan, shapes, rng: np.random.Generator, template: str, monkeypatch, run=None) -> None:
    """Run the dynamic plan at `shapes` (`run(plan, env, rng)`, default run_at_shape): after the first, no
    kernel of `template` is generated again, and the shapes' launches differ (each its own grid)."""
    run = run or run_at_shape
    run(plan, shapes[0], rng)
    generated = record_generations(monkeypatch)
    for env in shapes[1:]:
        run(plan, env, rng)
    assert not [c for _, c in generated if c.knob("template") == template]
    steps = [[s for s in plan.at(env).steps if s.config.knob("template") == template][0] for env in shapes]
    assert len({s.kernel.generated.launches[0].grid for s in steps}) > 1  # each shape's grid


def check_one_sized_kernel(plan, shapes, rng: np.random.Generator, template: str, run=None) -> None:
    """Run the dynamic plan at each shape of `shapes` (`run(plan, env, rng)`, default run_at_shape) and
    check that its one `template` step is the same sized kernel at all of them: one source taking the
    sizes at run time (and, on a GPU, one binary) for the bucket, or for each of its tiles (a GPU's
    bucket may run a tile variant at its small shapes: build/tile_variants.py)."""
    modules: dict[object, set[int]] = {}
    for env in shapes:
        (run or run_at_shape)(plan, env, rng)
        (step,) = [s for s in plan.at(env).steps if s.config.knob("template") == template]
        gen = step.kernel.generated
        assert gen.sized, gen.source
        assert "_OG_SIZES = ('sz0'" in gen.source
        modules.setdefault(step.config.knobs, set()).add(id(step.kernel.module))
    assert all(len(m) == 1 for m in modules.values()) and len(modules) <= 1 + plan.device.is_cuda * 2, modules
