"""CUDA graphs of plans, one test per pitfall (in the spirit of tinygrad's jit footguns)."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.tools.samples import nhwc

from ..helpers import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]
DT = og.DataType
DIMS = [4, 32, 8, 8]


def _graph(by_reference: bool):
    """y = relu(x * lr + b): lr a 1-element device tensor, s a pass-by-value scale."""
    g = og.Graph("cg", io_data_type=DT.FLOAT)
    x = g.tensor(dim=DIMS, stride=nhwc(DIMS), name="x", is_by_reference=by_reference)
    b = g.tensor(dim=[1, 32, 1, 1], name="b")
    lr = g.tensor(dim=[1], name="lr")
    y = g.relu(g.bias(g.mul(x, lr), b)).set_output(True).set_name("y").set_is_by_reference(by_reference)
    g.validate()
    return g, x, b, lr, y


def _buffers():
    import torch

    x = torch.randn(*DIMS, device="cuda").to(memory_format=torch.channels_last)
    return (
        x,
        torch.randn(1, 32, 1, 1, device="cuda"),
        torch.full((1,), 0.5, device="cuda"),
        torch.full_like(x, float("nan")),
    )


def _want(x, b, lr):
    import torch

    return torch.relu(x * lr + b)


def test_device_scalar_changed_between_replays():
    import torch

    g, x, b, lr, y = _graph(False)
    plan = g.build(device="cuda")
    xv, bv, lv, yv = _buffers()
    graph = plan.populate_cuda_graph({x: xv, b: bv, lr: lv, y: yv})
    for value in (0.5, -1.0, 3.0):
        lv.fill_(value)  # a learning-rate schedule: no update call, no re-capture
        graph.replay()
        torch.testing.assert_close(yv, _want(xv, bv, lv))


def test_table_flipped_between_replays():
    import torch

    g, x, b, lr, y = _graph(True)
    plan = g.build(device="cuda")
    xa, bv, lv, yv = _buffers()
    xb = torch.randn_like(xa)
    graph = plan.populate_cuda_graph({x: xa, b: bv, lr: lv, y: yv})
    graph.replay()
    torch.testing.assert_close(yv, _want(xa, bv, lv))
    plan.set_address(x, xb)  # double buffering: the next replay reads xb
    graph.replay()
    torch.testing.assert_close(yv, _want(xb, bv, lv))
    slot = plan.table_slot(x)
    plan.address_table[slot : slot + 1].copy_(torch.tensor([xa.data_ptr()], device="cuda"))  # a device-side flip
    graph.replay()
    torch.testing.assert_close(yv, _want(xa, bv, lv))


def test_update_rejects_a_pack_of_another_shape():
    import torch

    g, x, b, lr, y = _graph(True)
    plan = g.build(device="cuda")
    xv, bv, lv, yv = _buffers()
    graph = plan.populate_cuda_graph({x: xv, b: bv, lr: lv, y: yv})
    with pytest.raises(og.VariantPackError):
        plan.update_cuda_graph(graph, {x: torch.randn(2, 32, 8, 8, device="cuda"), b: bv, lr: lv, y: yv})


@pytest.mark.parametrize("by_reference", [True, False])
def test_update_after_the_old_buffers_were_freed(by_reference):
    import torch

    g, x, b, lr, y = _graph(by_reference)
    plan = g.build(device="cuda")
    xv, bv, lv, yv = _buffers()
    graph = plan.populate_cuda_graph({x: xv, b: bv, lr: lv, y: yv})
    del xv, yv
    torch.cuda.empty_cache()
    x2, _, _, y2 = _buffers()
    result = plan.update_cuda_graph(graph, {x: x2, b: bv, lr: lv, y: y2})
    assert result.recaptured is (not by_reference), result
    graph.replay()
    torch.testing.assert_close(y2, _want(x2, bv, lv))


def test_pass_by_value_change_recaptures():
    import torch

    g = og.Graph("pbv", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1024], name="x")
    s = g.tensor(dim=[1], is_pass_by_value=True, name="s")
    y = g.mul(x, s).set_output(True)
    plan = g.build(device="cuda")
    xv, yv = torch.randn(1024, device="cuda"), torch.empty(1024, device="cuda")
    graph = plan.populate_cuda_graph({x: xv, s: 2.0, y: yv})
    result = plan.update_cuda_graph(graph, {x: xv, s: 3.0, y: yv})
    assert result.recaptured and "s" in result.reason
    graph.replay()
    torch.testing.assert_close(yv, xv * 3.0)


def test_replay_on_another_stream():
    import torch

    g, x, b, lr, y = _graph(True)
    plan = g.build(device="cuda")
    xv, bv, lv, yv = _buffers()
    graph = plan.populate_cuda_graph({x: xv, b: bv, lr: lv, y: yv})
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        graph.replay()
    other.synchronize()
    torch.testing.assert_close(yv, _want(xv, bv, lv))


def test_two_plans_in_one_user_captured_graph():
    import torch

    g1, x1, b1, l1, y1 = _graph(False)
    p1 = g1.build(device="cuda")
    g2 = og.Graph("second", io_data_type=DT.FLOAT)
    t = g2.tensor(dim=DIMS, stride=nhwc(DIMS), name="t")
    z = g2.tanh(t).set_output(True)
    p2 = g2.build(device="cuda")
    xv, bv, lv, yv = _buffers()
    zv = torch.empty_like(yv)
    pack1, pack2 = {x1: xv, b1: bv, l1: lv, y1: yv}, {t: yv, z: zv}
    p1.execute(pack1)
    p2.execute(pack2)  # warm up (compile) before capturing
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p1.execute(pack1)
        p2.execute(pack2)
    xv.copy_(torch.randn_like(xv))
    graph.replay()
    torch.testing.assert_close(zv, torch.tanh(_want(xv, bv, lv)))


def test_autotuning_inside_a_capture_is_rejected():
    import torch

    g, *_ = _graph(False)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(og.GraphError) as err:
        with torch.cuda.graph(graph):
            g.build(device="cuda", autotune=True)
    assert err.value.rule == "autotune.capturing"


def test_update_cost_is_small():
    """Re-pointing by-reference tensors costs a table write, not a capture."""
    import time

    import torch

    g, x, b, lr, y = _graph(True)
    plan = g.build(device="cuda")
    bufs = [_buffers() for _ in range(2)]
    packs = [{x: xv, b: bv, lr: lv, y: yv} for xv, bv, lv, yv in bufs]
    graph = plan.populate_cuda_graph(packs[0])
    plan.update_cuda_graph(graph, {**packs[1], b: bufs[0][1], lr: bufs[0][2]})
    t0 = time.perf_counter()
    for i in range(100):
        plan.update_cuda_graph(graph, {**packs[i % 2], b: bufs[0][1], lr: bufs[0][2]})
    us = (time.perf_counter() - t0) / 100 * 1e6
    torch.cuda.synchronize()
    assert us < 500, us  # the benchmark reports the figure; this only guards against re-capturing


def test_by_reference_tensor_read_by_a_torch_step_is_recaptured_not_redirected():
    """A by-reference input of a step that bakes addresses (a PyTorch conv): update_cuda_graph
    re-captures, set_address refuses (a replay would read the old buffer)."""
    import torch

    g = og.Graph("baked", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[2, 8, 6, 6], stride=nhwc([2, 8, 6, 6]), name="x").set_is_by_reference(True)
    w = g.tensor(dim=[8, 8, 3, 3], stride=nhwc([8, 8, 3, 3]), name="w")
    y = g.conv_fprop(x, w, padding=[1, 1]).set_output(True)
    plan = g.build(device="cuda", engines=["torch"])
    assert x.uid in plan.baked_addresses()

    def buf(t):
        return torch.randn(*t.dim, device="cuda", dtype=torch.float16).as_strided(t.dim, t.stride)

    pack = {
        x.uid: buf(x),
        w.uid: buf(w),
        y.uid: torch.empty_strided(y.dim, y.stride, device="cuda", dtype=torch.float16),
    }
    graph = plan.populate_cuda_graph(pack)
    x2 = buf(x)
    with pytest.raises(og.GraphError) as info:
        plan.set_address(x, x2)
    assert info.value.rule == "cudagraph.baked_address"
    result = plan.update_cuda_graph(graph, {**pack, x.uid: x2})
    assert result.recaptured and x.uid in result.moved
    graph.replay()
    torch.cuda.synchronize()
    want = torch.nn.functional.conv2d(x2.float(), pack[w.uid].float(), padding=1)
    assert torch.allclose(pack[y.uid].float(), want, rtol=1e-2, atol=1e-2)
