"""The runtime at model scale (issue 14), GPU tier: native launches against PyTorch, one rounding of
pass-by-value scalars, one data_ptr() per tensor per execute, one stream interpretation, CUDA-graph
records that go with their graph, kernels compiled at build (and not again when a saved plan loads),
cuDNN steps launched with a prebuilt variant pack and kept as serialized plans."""

from __future__ import annotations

import gc
import weakref

import pytest

import opgraph as og
from opgraph.tools.samples import nhwc

from .helpers import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]
DT = og.DataType
DIMS = [4, 32, 8, 8]


def _bias_relu(by_reference: bool = False):
    g = og.Graph("bias_relu", io_data_type=DT.HALF)
    x = g.tensor(dim=DIMS, stride=nhwc(DIMS), name="x", is_by_reference=by_reference)
    b = g.tensor(dim=[1, 32, 1, 1], name="b")
    y = g.relu(g.bias(x, b)).set_output(True).set_name("y")
    g.validate()
    return g, x, b, y


def _cl(t):
    import torch

    return t.to(memory_format=torch.channels_last)


def _buffers():
    import torch

    x = _cl(torch.randn(*DIMS, device="cuda", dtype=torch.float16))
    return x, torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16), torch.full_like(x, float("nan"))


def _want(x, b):
    import torch

    return torch.relu(x.float() + b.float()).half()


def test_half_scalar_is_rounded_the_same_on_every_execute():
    """The fast binder used to pass the raw Python float: a HALF scalar was fp16 on the first execute
    (full check) and fp32 on the next ones. One semantics now: rounded to the declared type."""
    import torch

    g = og.Graph("scale", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1024], name="x")
    s = g.tensor(dim=[1], data_type=DT.HALF, is_pass_by_value=True, name="s")
    y = g.mul(x, s).set_output(True).set_name("y")
    plan = g.build(device="cuda")
    xv = torch.linspace(1, 2, 1024, device="cuda")
    yv = torch.empty(1024, device="cuda")
    pack = {x: xv, s: 1 / 3, y: yv}
    for value in (1 / 3, 1 / 3, 1 / 3, 0.1, 0.1):
        pack[s] = value
        yv.fill_(float("nan"))
        plan.execute(pack)
        torch.testing.assert_close(yv, xv * float(torch.tensor(value).half()), rtol=0, atol=0)


def test_each_pointer_is_read_once_per_execute(monkeypatch):
    """Binding read data_ptr() twice per tensor per execute, and Triton's launcher once more."""
    import torch

    g, x, b, y = _bias_relu()
    plan = g.build(device="cuda")
    xv, bv, yv = _buffers()
    pack = {x: xv, b: bv, y: yv}
    plan.execute(pack)
    reads = []
    real = torch.Tensor.data_ptr
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda self: reads.append(1) or real(self))
    for _ in range(3):
        plan.execute(pack)  # the same pack again
    same = len(reads)
    for _ in range(3):
        plan.execute(dict(pack))  # a new dict of the same tensors
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert (same, len(reads) - same) == (9, 9), (
        f"data_ptr() reads for 3 + 3 executes of a 3-tensor pack: {same}, {len(reads) - same}"
    )
    torch.testing.assert_close(yv, _want(xv, bv))


def test_native_launches_follow_moving_and_unaligned_buffers():
    """New buffers every call rewrite the argument slots; a buffer not 16-byte aligned takes Triton's
    own launch (its JIT specialises), and the result is right either way."""
    import torch

    g, x, b, y = _bias_relu()
    plan = g.build(device="cuda")
    for _ in range(3):
        xv, bv, yv = _buffers()
        plan.execute({x: xv, b: bv, y: yv})
        torch.testing.assert_close(yv, _want(xv, bv))
    big = torch.randn(32 + 1, device="cuda", dtype=torch.float16)
    bv = big[1:].view(1, 32, 1, 1)  # 2 bytes past an aligned address
    assert bv.data_ptr() % 16
    xv, _, yv = _buffers()
    plan.execute({x: xv, b: bv, y: yv})
    torch.testing.assert_close(yv, _want(xv, bv))
    xv, bv, yv = _buffers()
    plan.execute({x: xv, b: bv, y: yv})  # aligned again: native again
    torch.testing.assert_close(yv, _want(xv, bv))


class _ProtocolStream:
    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream.cuda_stream)


def test_every_stream_form_runs_every_step_on_that_stream():
    """None, a torch stream, a raw handle and a __cuda_stream__ object: one interpretation. The stream
    is held back by a spin kernel, so any step launched elsewhere would write its output early."""
    import torch

    dims = [8, 64, 16, 16]
    g = og.Graph("two", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    w = g.tensor(dim=[64, 64, 1, 1], stride=nhwc([64, 64, 1, 1]), name="w")
    y = g.relu(g.conv_fprop(g.relu(x), w)).set_output(True).set_name("y")
    plan = g.build(device="cuda")
    xv = _cl(torch.randn(*dims, device="cuda", dtype=torch.float16))
    wv = _cl(torch.randn(64, 64, 1, 1, device="cuda", dtype=torch.float16) / 8)
    want = torch.relu(torch.nn.functional.conv2d(torch.relu(xv.float()), wv.float())).half()
    side = torch.cuda.Stream()
    plan.execute({x: xv, w: wv, y: torch.empty_like(xv)})  # bound and loaded: the launches below are quick
    for form in (side, side.cuda_stream, _ProtocolStream(side), torch.cuda.ExternalStream(side.cuda_stream)):
        yv = _cl(torch.full((8, 64, 16, 16), float("nan"), device="cuda", dtype=torch.float16))
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # tens of ms
        plan.execute({x: xv, w: wv, y: yv}, stream=form)
        probe = torch.cuda.Stream()
        with torch.cuda.stream(probe):
            snapshot = yv.clone()
        probe.synchronize()
        assert snapshot.isnan().all(), f"a step ran outside the stream given as {type(form).__name__}"
        side.synchronize()
        torch.testing.assert_close(yv, want, rtol=2e-2, atol=2e-2)
    yv = torch.full_like(xv, float("nan"))
    with pytest.raises(og.VariantPackError) as err:
        plan.execute({x: xv, w: wv, y: yv}, stream="side")
    assert err.value.rule == "execute.stream" and yv.isnan().all()
    with pytest.raises(og.VariantPackError):
        plan.execute({x: xv, w: wv, y: yv}, stream=-1)


def test_capture_records_go_with_their_graph_and_keep_no_pack():
    """Records were kept by id(graph) forever, each with its whole pack (every buffer kept alive)."""
    import torch

    g, x, b, y = _bias_relu(by_reference=True)
    plan = g.build(device="cuda")
    xv, bv, yv = _buffers()
    alive = weakref.ref(xv)
    graph = plan.populate_cuda_graph({x: xv, b: bv, y: yv})
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(yv, _want(xv, bv))
    assert len(plan.local_state().captures) == 1
    x2, b2, y2 = _buffers()
    plan.execute({x: x2, b: b2, y: y2})  # the plan binds these now; only the record could hold xv
    del graph, xv
    gc.collect()
    assert len(plan.local_state().captures) == 0
    assert alive() is None
    with pytest.raises(og.GraphError):
        plan.update_cuda_graph(torch.cuda.CUDAGraph(), {x: _buffers()[0], b: bv, y: yv})


def test_set_address_then_execute_uses_the_pack():
    import torch

    g, x, b, y = _bias_relu(by_reference=True)
    plan = g.build(device="cuda")
    xv, bv, yv = _buffers()
    pack = {x: xv, b: bv, y: yv}
    plan.execute(pack)
    other = _buffers()[0]
    plan.set_address(x, other)
    plan.execute(pack)  # the pack names xv: the table points back at it
    torch.testing.assert_close(yv, _want(xv, bv))


def test_a_saved_plan_loads_without_compiling(tmp_path, monkeypatch):
    """Built with compile="parallel", saved with its kernels; loaded with no kernel in this process
    and empty kernel caches (a new machine): nothing compiles, and the results equal the built plan's.
    The file's kernels serve the loaded plan only: the registry never takes them, and a plan built
    afterwards compiles (or finds in the cache) its own."""
    import torch

    from opgraph.engines.triton import compiler

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_a"))
    dims = [8, 64, 16, 16]
    g = og.Graph("mix", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    m = g.reduction(g.relu(x), mode="max").set_dim([8, 64, 1, 1])
    y = g.sigmoid(g.sub(x, m)).set_output(True).set_name("y")
    plan = g.build(device="cuda", engines=["triton"])
    assert plan.build_stats["compile"]["kernels"] >= 2
    xv = _cl(torch.randn(*dims, device="cuda", dtype=torch.float16))
    y1, y2, y3 = torch.empty_like(xv), torch.empty_like(xv), torch.empty_like(xv)
    plan.execute({x: xv, y: y1})
    data = plan.to_bytes()
    compiler._BINARIES.clear()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_b"))
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "og_b"))
    before = dict(compiler.STATS)
    loaded = og.ExecutionPlan.from_bytes(data)
    loaded.execute({x.uid: xv, y.uid: y2})
    torch.cuda.synchronize()
    assert compiler.STATS["compiled"] == before["compiled"]
    assert compiler.STATS["embedded"] > before["embedded"]
    assert loaded.build_stats["compile"]["embedded"] >= 2
    assert not compiler._BINARIES  # the file's kernels stay the loaded plan's
    torch.testing.assert_close(y2, y1, rtol=0, atol=0)
    again = g.build(device="cuda", engines=["triton"])
    assert compiler._BINARIES  # its own kernels (compiled or from the cache), registered: not the file's
    again.execute({x: xv, y: y3})
    torch.testing.assert_close(y3, y1, rtol=0, atol=0)


def test_lazy_compile_compiles_at_the_first_execute(tmp_path, monkeypatch):
    import torch

    from opgraph.engines.triton import compiler

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    compiler._BINARIES.clear()
    g, x, b, y = _bias_relu()

    def made():  # compiled, or loaded from a disk cache that another test of this process filled
        return compiler.STATS["compiled"] + compiler.STATS["loaded"]

    before = made()
    plan = g.build(device="cuda", compile="lazy")
    assert made() == before  # nothing at build time
    xv, bv, yv = _buffers()
    plan.execute({x: xv, b: bv, y: yv})
    assert made() == before + 1
    torch.testing.assert_close(yv, _want(xv, bv))
    with pytest.raises(og.GraphError):
        g.build(device="cuda", compile="sometimes")


def _conv_graph():
    dims = [8, 64, 28, 28]
    g = og.Graph("conv", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    w = g.tensor(dim=[64, 64, 3, 3], stride=nhwc([64, 64, 3, 3]), name="w")
    bias = g.tensor(dim=[1, 64, 1, 1], name="b")
    y = g.relu(g.bias(g.conv_fprop(x, w, padding=[1, 1]), bias)).set_output(True).set_name("y")
    g.validate()
    return g, x, w, bias, y


def test_cudnn_launch_paths_agree_and_plans_are_kept(tmp_path, monkeypatch):
    """The prebuilt pointer array, the UID dict and the frontend's execute give the same bits; a plan
    built once is deserialized from the cache the next time (when this cuDNN can serialize it)."""
    import torch

    pytest.importorskip("cudnn")
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    g, x, w, bias, y = _conv_graph()
    xv = _cl(torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.float16))
    wv = _cl(torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16) / 24)
    bv = torch.randn(1, 64, 1, 1, device="cuda", dtype=torch.float16)
    outs = {}
    for mode in ("raw", "dict", "execute"):
        monkeypatch.setenv("OPGRAPH_CUDNN_LAUNCH", mode)
        plan = g.build(device="cuda", engines=["cudnn", "triton", "torch"])
        if plan.steps[0].config.engine != "cudnn":
            pytest.skip(f"cuDNN does not take the conv here: {plan.describe()}")
        yv = torch.full_like(xv, float("nan"))
        for _ in range(2):
            plan.execute({x: xv, w: wv, bias: bv, y: yv})
        outs[mode] = (yv, plan.bind({x: xv, w: wv, bias: bv, y: yv}, None).launchers[0].mode)
    want = torch.relu(torch.nn.functional.conv2d(xv.float(), wv.float(), bv.float().view(-1), padding=1)).half()
    for mode, (yv, used) in outs.items():
        assert used == mode or (mode == "raw" and used == "dict"), (mode, used)
        torch.testing.assert_close(yv, want, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(yv, outs["execute"][0], rtol=0, atol=0)
    kernel = plan.steps[0].kernel
    if kernel.serialized is None:
        pytest.skip("this cuDNN plan cannot be serialized")
    monkeypatch.setenv("OPGRAPH_CUDNN_LAUNCH", "raw")
    again = g.build(device="cuda", engines=["cudnn", "triton", "torch"])
    assert again.steps[0].kernel.lowered_is_deserialized()
    yv = torch.full_like(xv, float("nan"))
    again.execute({x: xv, w: wv, bias: bv, y: yv})
    torch.testing.assert_close(yv, outs["execute"][0], rtol=0, atol=0)


def _scaled(by_reference: bool):
    """y = relu(x * lr + b) * s: lr a device scalar, s a pass-by-value scalar."""
    g = og.Graph("scaled", io_data_type=DT.FLOAT)
    x = g.tensor(dim=DIMS, stride=nhwc(DIMS), name="x", is_by_reference=by_reference)
    b = g.tensor(dim=[1, 32, 1, 1], name="b")
    lr = g.tensor(dim=[1], name="lr")
    s = g.tensor(dim=[1], is_pass_by_value=True, name="s")
    y = g.mul(g.relu(g.bias(g.mul(x, lr), b)), s).set_output(True).set_name("y").set_is_by_reference(by_reference)
    g.validate()
    return g, x, b, lr, s, y


def test_a_stable_binding_replays_one_graph_that_sees_what_changes():
    """After a few executes with nothing moved, the plan replays a CUDA graph of its launches; new data
    and device scalars reach it, a moved buffer or a new pass-by-value scalar drops it (flat launches,
    right results, a new graph later), and plan.auto_graph = False turns it off."""
    import torch

    g, x, b, lr, s, y = _scaled(False)
    plan = g.build(device="cuda")
    assert plan.auto_graph is True  # the default (OPGRAPH_AUTOGRAPH=0 turns it off)
    xv = _cl(torch.randn(*DIMS, device="cuda"))
    bv, lv = torch.randn(1, 32, 1, 1, device="cuda"), torch.full((1,), 0.5, device="cuda")
    yv = torch.full_like(xv, float("nan"))
    pack = {x: xv, b: bv, lr: lv, s: 2.0, y: yv}

    def check(scale):
        torch.cuda.synchronize()
        torch.testing.assert_close(yv, torch.relu(xv * lv + bv) * scale)

    for i in range(6):
        xv.copy_(torch.randn(*DIMS, device="cuda"))
        lv.fill_(0.1 * (i + 1))
        plan.execute(pack)
        check(2.0)
    ag = plan.local_state().owned.autograph
    assert (ag.captures, ag.replays) == (1, 4), (ag.captures, ag.replays)
    pack[s] = 3.0  # baked into the launches: flat, then a new graph
    for _ in range(4):
        yv.fill_(float("nan"))
        plan.execute(pack)
        check(3.0)
    assert ag.captures == 2
    xv = _cl(torch.randn(*DIMS, device="cuda"))  # a new buffer, held by address
    pack[x] = xv
    plan.execute(pack)
    check(3.0)
    assert ag.graph is None
    plan.auto_graph = False
    replays = ag.replays
    for _ in range(4):
        plan.execute(pack)
        check(3.0)
    assert ag.replays == replays


def test_a_graph_follows_table_addressed_buffers_without_a_new_capture():
    import torch

    g, x, b, lr, s, y = _scaled(True)
    plan = g.build(device="cuda")
    plan.auto_graph = True
    bv, lv = torch.randn(1, 32, 1, 1, device="cuda"), torch.full((1,), 0.5, device="cuda")
    xs = [_cl(torch.randn(*DIMS, device="cuda")) for _ in range(2)]
    ys = [torch.full_like(xs[0], float("nan")) for _ in range(2)]
    for i in range(8):
        k = i % 2 if i >= 4 else 0
        plan.execute({x: xs[k], b: bv, lr: lv, s: 2.0, y: ys[k]})
        torch.cuda.synchronize()
        torch.testing.assert_close(ys[k], torch.relu(xs[k] * lv + bv) * 2.0)
    ag = plan.local_state().owned.autograph
    assert ag.captures == 1 and ag.replays == 6, (ag.captures, ag.replays)
