"""One plan executed from several threads at once, each on its own buffers and workspace: every
result right (opgraph.runtime.threads: each thread binds its own pack, table and workspaces).

Before, the plan kept one binder and one bound workspace: on 4 threads, 320 of 400 results were wrong
on the reference engine and 145 of 160 on the torch engine, with nothing raised, and Triton's
interpreter raised an untyped InterpreterError (it patches triton.language for each launch)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import opgraph as og
from opgraph.engines.reference import ReferenceKernel
from opgraph.testing import compare, poison, random_values

from ..helpers import OneOpEngine, engines_registered, record_allocations, requires_cuda, requires_interpreter

D = og.DataType


class _OnePerStep(OneOpEngine):
    """One op per kernel (the reference kernel), so intermediates cross steps in the workspace."""

    name = "test_threads_one_op"


@pytest.fixture(scope="module", autouse=True)
def _engine():
    with engines_registered(_OnePerStep()):
        yield


@pytest.fixture(autouse=True)
def _switch_often():
    """Threads switch every few bytecodes rather than every 5 ms: executes interleave everywhere."""
    import sys

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _graph(shape=(6, 10)):
    """y = relu(exp(x * 0.1) * s + b), s a pass-by-value scalar: three steps on the test engine."""
    g = og.Graph("threads", io_data_type=D.FLOAT)
    x = g.tensor(dim=list(shape), name="x")
    b = g.tensor(dim=[1, shape[1]], name="b")
    s = g.tensor(dim=[1], name="s", is_pass_by_value=True)
    y = g.relu(g.add(g.mul(g.exp(g.mul(x, 0.1)), s), b)).set_output(True).set_name("y")
    return g, x, b, s, y


def _want(xv, bv, sv):
    x = np.asarray(xv, np.float64)
    return np.maximum(np.exp(x * 0.1) * sv + np.asarray(bv, np.float64), 0)


def _hammer(plan, g, x, b, s, y, *, threads, executes, own_workspace=False, torch_buffers=False):
    """`threads` threads, each executing `executes` times on its own new buffers (and scalar), all
    started at once; every result checked. Returns (wrong results, errors)."""
    final = g.final
    start = threading.Barrier(threads)
    wrong: list[str] = []
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        ws = np.empty(plan.workspace_size, np.uint8) if own_workspace else None
        start.wait()
        for i in range(executes):
            xv, bv = random_values(final.tensor("x"), rng), random_values(final.tensor("b"), rng)
            sv = float(seed + 1 + i / 8)
            out = poison(np.empty(final.tensor("y").dim, np.float32))
            pack = {x: xv, b: bv, s: sv, y: out}
            if torch_buffers:
                import torch

                pack = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in pack.items()}
            try:
                plan.execute(pack, ws)
            except BaseException as err:  # noqa: BLE001 - reported by the test
                errors.append(err)
                return
            problem = compare(final.tensor("y"), out, _want(xv, bv, sv))
            if problem is not None:
                wrong.append(f"thread {seed} execute {i}: {problem}")

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return wrong, errors


@pytest.mark.parametrize("own_workspace", [False, True])
def test_threads_share_a_plan_on_the_reference_engine(own_workspace):
    g, x, b, s, y = _graph()
    plan = g.build(device="cpu", engines=[_OnePerStep.name])
    assert len(plan.steps) >= 3 and plan.workspace_size > 0  # intermediates live in the workspace
    wrong, errors = _hammer(plan, g, x, b, s, y, threads=4, executes=40, own_workspace=own_workspace)
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} of 160 wrong: {wrong[:3]}"


def test_threads_share_a_plan_on_the_torch_engine():
    pytest.importorskip("torch")
    g, x, b, s, y = _graph()
    plan = g.build(device="cpu", engines=["torch"])
    wrong, errors = _hammer(plan, g, x, b, s, y, threads=4, executes=40, torch_buffers=True)
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} of 160 wrong: {wrong[:3]}"


@requires_interpreter
def test_threads_share_a_plan_under_the_triton_interpreter():
    """Triton's interpreter patches triton.language for each launch: opgraph's interpreted launches
    take turns (interpret.interpreting_here), so threads get right results, not an InterpreterError."""
    g, x, b, s, y = _graph((4, 8))
    plan = g.build(device="cpu", engines=["triton"])
    wrong, errors = _hammer(plan, g, x, b, s, y, threads=4, executes=6)
    assert not errors, errors[:3]
    assert not wrong, wrong[:3]


def test_each_thread_binds_its_own_state_and_the_owner_thread_keeps_its_fast_path():
    g, x, b, s, y = _graph()
    plan = g.build(device="cpu", engines=[_OnePerStep.name])
    mine = plan.local_state()
    seen = []
    t = threading.Thread(target=lambda: seen.append(plan.local_state()))
    t.start()
    t.join()
    assert seen[0] is not mine and seen[0].binder is not mine.binder and plan.local_state() is mine
    rng = np.random.default_rng(0)
    pack = {
        x: random_values(g.final.tensor("x"), rng),
        b: random_values(g.final.tensor("b"), rng),
        s: 2.0,
        y: np.empty(g.final.tensor("y").dim, np.float32),
    }
    plan.execute(pack)
    owned = mine.owned
    plan.execute(pack)
    assert mine.owned is owned  # bound once per thread and workspace, reused


def test_a_thread_state_goes_with_its_thread():
    import gc
    import weakref

    g, *_ = _graph()
    plan = g.build(device="cpu", engines=[_OnePerStep.name])
    refs = []
    t = threading.Thread(target=lambda: refs.append(weakref.ref(plan.local_state())))
    t.start()
    t.join()
    gc.collect()
    assert refs[0]() is None


def test_reserve_allocates_the_threads_workspace_before_its_first_execute(monkeypatch):
    """plan.reserve() allocates what the first execute would (PyTorch's CUDA graph trees must not see
    that allocation in their warmup pool); the execute then binds that very workspace, once."""

    g, x, b, s, y = _graph()
    plan = g.build(device="cpu", engines=[_OnePerStep.name])
    made = record_allocations(monkeypatch)
    plan.reserve()
    plan.reserve()  # idempotent
    assert len(made) == 1
    final, rng = g.final, np.random.default_rng(0)
    xv, bv = random_values(final.tensor("x"), rng), random_values(final.tensor("b"), rng)
    out = poison(np.empty(final.tensor("y").dim, np.float32))
    plan.execute({x: xv, b: bv, s: 0.5, y: out})
    assert len(made) == 1 and plan.local_state().owned.base is made[0]
    np.testing.assert_allclose(out, _want(xv, bv, 0.5), rtol=1e-5, atol=1e-6)


def test_reserve_allocates_the_launches_own_memory_once_per_thread(monkeypatch):
    """A kernel whose launches keep device memory for the binding's life (a Triton kernel's global
    scratch: device-side TMA descriptors) gets it when the thread's state is reserved, outside any
    CUDA-graph capture, and every binding of that thread (the plan's workspace, then the caller's) sees
    that same memory; another thread gets its own."""

    monkeypatch.setattr(ReferenceKernel, "global_scratch_bytes", lambda self: {0: 64}, raising=False)
    g, x, b, s, y = _graph()
    plan = g.build(device="cpu", engines=[_OnePerStep.name])
    made = record_allocations(monkeypatch)
    plan.reserve()
    steps = len(plan.steps)
    assert len(made) == 1 + steps and all(m.nbytes == 64 for m in made[1:])  # the workspace, then each step's
    final, rng = g.final, np.random.default_rng(0)
    pack = {x: random_values(final.tensor("x"), rng), b: random_values(final.tensor("b"), rng), s: 0.5}
    pack[y] = poison(np.empty(final.tensor("y").dim, np.float32))
    plan.execute(pack)
    plan.execute(pack, workspace=np.empty(plan.workspace_size, np.uint8))
    assert len(made) == 1 + steps  # nothing allocated at the binds
    local = plan.local_state()
    for bound in (local.owned, local.user):
        assert {id(v) for v in bound.binding.reserved.values()} == {id(m) for m in made[1:]}
    np.testing.assert_allclose(pack[y], _want(pack[x], pack[b], 0.5), rtol=1e-5, atol=1e-6)
    mine = {id(m) for m in made[1:]}
    other = []
    t = threading.Thread(target=lambda: other.append(plan.local_state()._reserve_launch_memory()))
    t.start()
    t.join()
    assert len(other[0]) == steps and not {id(v) for v in other[0].values()} & mine


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("tma", [None, 1], ids=["heuristic", "device-descriptors"])
def test_gpu_after_reserve_the_first_execute_allocates_nothing(tma, monkeypatch):
    """On a GPU: after plan.reserve(), the first execute allocates no device memory (PyTorch's CUDA graph
    trees record a compiled graph's first calls in a pool that must end up holding outputs only): the
    workspace, and the global scratch of launches with device-side TMA descriptors, come from reserve."""
    import torch

    from opgraph.engines.triton.templates.matmul import MatmulMatch

    if tma is not None:  # the matmul's candidates with device-side descriptors (Hopper), where offered
        real = MatmulMatch.candidates
        monkeypatch.setattr(
            MatmulMatch, "candidates", lambda self: [c.replace(TMA=tma, TMA_HOST=None) for c in real(self)]
        )
    g = og.Graph("reserve_gpu", io_data_type=D.BFLOAT16, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT)
    a, w = g.tensor(dim=[1, 512, 256], name="a"), g.tensor(dim=[1, 256, 384], name="w")
    bias = g.tensor(dim=[1, 1, 384], name="bias")
    y = g.gelu(g.add(g.matmul(a, w), bias)).set_output(True).set_name("y")
    plan = g.build(device="cuda", engines=["triton"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    pack = {
        a: torch.randn(1, 512, 256, device="cuda", generator=gen).bfloat16(),
        w: torch.randn(1, 256, 384, device="cuda", generator=gen).bfloat16() / 16,
        bias: torch.randn(1, 1, 384, device="cuda", generator=gen).bfloat16(),
        y: torch.full((1, 512, 384), float("nan"), device="cuda", dtype=torch.bfloat16),
    }
    plan.reserve()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    plan.execute(pack)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before, plan.describe()
    want = torch.nn.functional.gelu(pack[a].double() @ pack[w].double() + pack[bias].double())
    torch.testing.assert_close(pack[y].double(), want, rtol=2e-2, atol=2e-2)


def test_release_drops_the_last_executes_buffers_and_keeps_the_workspace():
    """plan.release() forgets the calling thread's binding (its references to the pack's buffers), so
    buffers the caller drops are freed; the next execute binds afresh into the same workspace."""
    import gc
    import weakref

    torch = pytest.importorskip("torch")
    g, x, b, s, y = _graph()
    plan = g.build(device="cpu", engines=[_OnePerStep.name])
    final, rng = g.final, np.random.default_rng(0)

    def pack():
        xv = torch.from_numpy(random_values(final.tensor("x"), rng))
        bv = torch.from_numpy(random_values(final.tensor("b"), rng))
        return {x: xv, b: bv, s: 0.5, y: torch.full(final.tensor("y").dim, float("nan"))}

    first = pack()
    plan.execute(first)
    workspace = plan.local_state().owned.base
    out = weakref.ref(first[y])
    del first
    gc.collect()
    assert out() is not None  # the binding holds the last pack's buffers
    plan.release()
    gc.collect()
    assert out() is None and plan.local_state().owned is None
    second = pack()
    plan.execute(second)
    assert plan.local_state().owned.base is workspace
    want = _want(second[x].numpy(), second[b].numpy(), 0.5)
    np.testing.assert_allclose(second[y].numpy(), want, rtol=1e-5, atol=1e-6)
