"""Plans on CUDA: the fast path of repeated executes, streams, workspaces, raw pointers."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.tools.samples import nhwc

from ..helpers import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]
DT = og.DataType


def _graph():
    dims = [4, 32, 8, 8]
    g = og.Graph("fast", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    b = g.tensor(dim=[1, 32, 1, 1], name="b")
    y = g.relu(g.bias(x, b)).set_output(True).set_name("y")
    g.validate()
    return g, x, b, y


def test_repeated_executes_with_new_buffers_are_right():
    import torch

    g, x, b, y = _graph()
    plan = g.build(device="cuda")
    for i in range(4):  # the first execute takes the slow path, the others the fast one
        xv = torch.randn(4, 32, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        bv = torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16)
        yv = torch.full_like(xv, float("nan"))
        plan.execute({x: xv, b: bv, y: yv})
        torch.testing.assert_close(yv, torch.relu(xv.float() + bv.float()).half())


def test_fast_path_still_rejects_bad_packs():
    import torch

    g, x, b, y = _graph()
    plan = g.build(device="cuda")
    xv = torch.randn(4, 32, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    bv = torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16)
    yv = torch.empty_like(xv)
    plan.execute({x: xv, b: bv, y: yv})
    with pytest.raises(og.VariantPackError):
        plan.execute({x: xv.contiguous(), b: bv, y: yv})  # NCHW strides
    # the output bound to the very buffer of the input it updates element by element: an in-place
    # update through the pack (issue 18), computed as if out of place
    want = torch.relu(xv.float() + bv.float()).half()
    xi = xv.clone(memory_format=torch.channels_last)
    plan.execute({x: xi, b: bv, y: xi})
    torch.testing.assert_close(xi, want)
    # ... but an output overlapping the input at other elements is refused
    base = torch.empty(xv.numel() + 32, device="cuda", dtype=torch.float16)
    xs = base[: xv.numel()].as_strided(xv.shape, xv.stride())
    xs.copy_(xv)
    ys = base[32:].as_strided(xv.shape, xv.stride())
    with pytest.raises(og.VariantPackError):
        plan.execute({x: xs, b: bv, y: ys})
    with pytest.raises(og.VariantPackError):
        plan.execute({x: xv.float(), b: bv, y: yv})


def test_raw_pointers_and_streams():
    import torch

    g, x, b, y = _graph()
    plan = g.build(device="cuda")
    xv = torch.randn(4, 32, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    bv = torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16)
    yv = torch.full_like(xv, float("nan"))
    s = torch.cuda.Stream()
    plan.execute({x: xv.data_ptr(), b: bv.data_ptr(), y: yv.data_ptr()}, stream=s)
    s.synchronize()
    torch.testing.assert_close(yv, torch.relu(xv.float() + bv.float()).half())


def test_partitioned_plan_uses_the_device_workspace(rng):
    import torch

    g = og.Graph("ws", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[64, 128], name="x")
    t = g.exp(x)
    r = g.reduction(t, og.ReductionMode.ADD).set_dim([64, 1])
    g.div(x, r).set_output(True).set_name("y")
    plan = g.build(device="cuda")
    assert len(plan.steps) >= 2 and plan.workspace_size > 0, plan.describe()
    bad = og.testing.check_plan(plan, rng)
    assert not bad, bad
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    from opgraph.core.torch_interop import pack_to_device

    pack = pack_to_device(og.testing.random_pack(g.final, rng), "cuda")
    plan.execute(pack, workspace=ws)
    with pytest.raises(og.VariantPackError):
        plan.execute(pack, workspace=torch.empty(1, dtype=torch.uint8, device="cuda"))


@pytest.mark.parametrize("engines", [None, ["torch"]])
@pytest.mark.parametrize("by_reference", [False, True])
def test_threads_share_a_plan_each_on_its_own_stream_and_buffers(engines, by_reference):
    """Four threads execute one plan at once, each on its own stream, buffers and workspace, some
    executes with the same pack again (the fast path, then the internal CUDA graph), some with new
    buffers: every result right (opgraph.runtime.threads)."""
    import threading

    import torch

    g, x, b, y = _graph()
    plan = g.build(device="cuda", engines=engines, by_reference=by_reference)
    start = threading.Barrier(4)
    problems: list[str] = []

    def work(k: int) -> None:
        stream = torch.cuda.Stream()
        gen = torch.Generator(device="cuda").manual_seed(k)
        start.wait()
        with torch.cuda.stream(stream):
            for i in range(30):
                if i % 10 == 0:  # new buffers every ten executes; the same pack in between
                    xv = torch.randn(4, 32, 8, 8, device="cuda", dtype=torch.float16, generator=gen).to(
                        memory_format=torch.channels_last
                    )
                    bv = torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16, generator=gen)
                    yv = torch.empty_like(xv)
                    pack = {x: xv, b: bv, y: yv}
                xv.normal_(generator=gen)  # new data in the same buffer
                yv.fill_(float("nan"))
                try:
                    plan.execute(pack)
                except Exception as err:  # noqa: BLE001 - reported by the test
                    problems.append(f"thread {k}: {type(err).__name__}: {err}")
                    return
                want = torch.relu(xv.float() + bv.float())
                if not torch.allclose(yv.float(), want, rtol=1e-2, atol=1e-2):
                    problems.append(f"thread {k} execute {i}: max err {(yv.float() - want).abs().max().item()}")
        stream.synchronize()

    pool = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not problems, problems[:3]
