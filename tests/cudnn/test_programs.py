"""cuDNN frontend programs through opgraph.cudnn, one per graph family the issue names (conv, matmul,
normalization, reduction, genstats, slice, pointwise), checked against PyTorch in float64; the
module-level API (enums, handles, versions, cudnn.Graph, graph/jit/graph_cache); the GPU tier."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph import cudnn

from ..helpers import requires_cuda

torch = pytest.importorskip("torch")


def _dev(device):
    return cudnn.create_handle(device), device


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_cuda])])
def env(request):
    return _dev(request.param)


def _run(g, pack, handle, device):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    g.execute(pack, torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=device), handle=handle)
    if device == "cuda":
        torch.cuda.synchronize()


def test_conv_dgrad_wgrad(env):
    handle, device = env
    x = torch.randn(2, 4, 7, 7, device=device)
    dy = torch.randn(2, 6, 4, 4, device=device)
    w = torch.randn(6, 4, 3, 3, device=device)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, DY, W = g.tensor_like(x), g.tensor_like(dy), g.tensor_like(w)
    DX = g.conv_dgrad(loss=DY, filter=W, padding=[1, 1], stride=[2, 2], dilation=[1, 1])
    DW = g.conv_wgrad(image=X, loss=DY, padding=[1, 1], stride=[2, 2], dilation=[1, 1])
    DX.set_output(True).set_dim(list(x.shape))
    DW.set_output(True).set_dim(list(w.shape))
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    _run(g, {X: x, DY: dy, W: w, DX: dx, DW: dw}, handle, device)
    want_dx = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), stride=2, padding=1)
    want_dw = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), stride=2, padding=1)
    tol = 1e-4 if str(device) == "cpu" else 3e-2  # fp32 convolutions run as TF32 on the GPU (a numerical note)
    torch.testing.assert_close(dx.double(), want_dx, rtol=tol, atol=tol)
    torch.testing.assert_close(dw.double(), want_dw, rtol=tol, atol=tol)


def test_matmul_bias_gelu(env):
    handle, device = env
    a, b = torch.randn(3, 8, 16, device=device), torch.randn(1, 16, 12, device=device)
    bias = torch.randn(1, 1, 12, device=device)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    A, B, BIAS = g.tensor_like(a), g.tensor_like(b), g.tensor_like(bias)
    C = g.gelu(input=g.bias(input=g.matmul(A=A, B=B), bias=BIAS))
    C.set_output(True)
    c = torch.empty(3, 8, 12, device=device)
    _run(g, {A: a, B: b, BIAS: bias, C: c}, handle, device)
    want = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    tol = 2e-4 if str(device) == "cpu" else 3e-2  # fp32 matmuls run as TF32 on the GPU (a numerical note)
    torch.testing.assert_close(c.double(), want, rtol=tol, atol=tol)


def test_batchnorm_training_updates_running_stats_in_place(env):
    handle, device = env
    x = torch.randn(4, 6, 5, 5, device=device)
    scale, bias = torch.rand(1, 6, 1, 1, device=device) + 0.5, torch.randn(1, 6, 1, 1, device=device)
    rm, rv = torch.randn(1, 6, 1, 1, device=device), torch.rand(1, 6, 1, 1, device=device) + 0.5
    want_rm, want_rv = rm.clone().reshape(-1).double(), rv.clone().reshape(-1).double()  # torch updates these
    want_y = torch.nn.functional.batch_norm(
        x.double(),
        want_rm,
        want_rv,
        scale.reshape(-1).double(),
        bias.reshape(-1).double(),
        training=True,
        momentum=0.1,
        eps=1e-5,
    )
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, S, B, RM, RV = (g.tensor_like(t) for t in (x, scale, bias, rm, rv))
    eps, mom = g.tensor_like(torch.full((1, 1, 1, 1), 1e-5)), g.tensor_like(torch.full((1, 1, 1, 1), 0.1))
    y, mean, inv, nrm, nrv = g.batchnorm(
        input=X, scale=S, bias=B, in_running_mean=RM, in_running_var=RV, epsilon=eps, momentum=mom
    )
    for t in (y, mean, inv, nrm, nrv):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    out = torch.empty_like(x)
    saved = [torch.empty_like(scale) for _ in range(2)]
    _run(
        g,
        {
            X: x,
            S: scale,
            B: bias,
            RM: rm,
            RV: rv,
            eps: torch.full((1, 1, 1, 1), 1e-5),
            mom: torch.full((1, 1, 1, 1), 0.1),
            y: out,
            mean: saved[0],
            inv: saved[1],
            nrm: rm,
            nrv: rv,
        },
        handle,
        device,
    )
    torch.testing.assert_close(out.double(), want_y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rm.reshape(-1).double(), want_rm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rv.reshape(-1).double(), want_rv, rtol=1e-5, atol=1e-5)


def test_layernorm_and_backward(env):
    handle, device = env
    x = torch.randn(4, 6, 32, device=device, requires_grad=True)
    w, b = torch.randn(1, 1, 32, device=device), torch.randn(1, 1, 32, device=device)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, W, B = g.tensor_like(x.detach()), g.tensor_like(w), g.tensor_like(b)
    eps = g.tensor_like(torch.full((1, 1, 1), 1e-5))
    Y, M, IV = g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=W, bias=B, epsilon=eps)
    for t in (Y, M, IV):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    y, m, iv = (
        torch.empty(4, 6, 32, device=device),
        torch.empty(4, 6, 1, device=device),
        torch.empty(4, 6, 1, device=device),
    )
    _run(g, {X: x.detach(), W: w, B: b, eps: torch.full((1, 1, 1), 1e-5), Y: y, M: m, IV: iv}, handle, device)
    want = torch.nn.functional.layer_norm(x.double(), [32], w.reshape(-1).double(), b.reshape(-1).double(), 1e-5)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
    dy = torch.randn_like(y)
    want.backward(dy.double())
    bwd = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    DY, X2, W2 = bwd.tensor_like(dy), bwd.tensor_like(X), bwd.tensor_like(W)
    M2, IV2 = bwd.tensor_like(M), bwd.tensor_like(IV)
    DX, DW, DB = bwd.layernorm_backward(grad=DY, input=X2, scale=W2, mean=M2, inv_variance=IV2)
    for t in (DX, DW, DB):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    dx, dw, db = torch.empty_like(y), torch.empty_like(w), torch.empty_like(b)
    _run(bwd, {DY: dy, X2: x.detach(), W2: w, M2: m, IV2: iv, DX: dx, DW: dw, DB: db}, handle, device)
    torch.testing.assert_close(dx.double(), x.grad.double(), rtol=1e-4, atol=1e-4)


def test_rmsnorm_instancenorm(env):
    handle, device = env
    x = torch.randn(3, 5, 4, 4, device=device)
    s, b = torch.randn(1, 5, 1, 1, device=device), torch.randn(1, 5, 1, 1, device=device)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, S, B = g.tensor_like(x), g.tensor_like(s), g.tensor_like(b)
    Yi = g.instancenorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, epsilon=1e-5)[
        0
    ]
    ONES = g.tensor_like(torch.ones(1, 5, 4, 4))
    Yr = g.rmsnorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=ONES, epsilon=1e-5)[0]
    Yi.set_output(True)
    Yr.set_output(True)
    yi, yr = torch.empty_like(x), torch.empty_like(x)
    _run(g, {X: x, S: s, B: b, ONES: torch.ones(1, 5, 4, 4, device=device), Yi: yi, Yr: yr}, handle, device)
    want_i = torch.nn.functional.instance_norm(
        x.double(), weight=s.reshape(-1).double(), bias=b.reshape(-1).double(), eps=1e-5
    )
    xd = x.double()
    want_r = xd / torch.sqrt((xd * xd).mean(dim=(1, 2, 3), keepdim=True) + 1e-5)
    torch.testing.assert_close(yi.double(), want_i, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(yr.double(), want_r, rtol=1e-4, atol=1e-4)


def test_reduction_genstats_slice_pointwise(env):
    handle, device = env
    x = torch.randn(2, 6, 5, 5, device=device)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    X = g.tensor_like(x)
    R = g.reduction(input=X, mode=cudnn.reduction_mode.MAX)
    R.set_output(True).set_dim([2, 1, 5, 5])
    S, SQ = g.genstats(input=X)
    S.set_output(True)
    SQ.set_output(True)
    SL = g.slice(X, [slice(None), slice(1, 5, 2)], name="sl")
    P = g.cmp_gt(input=g.tanh(input=SL), comparison=0.25)
    P.set_output(True)
    r, s, sq = (
        torch.empty(2, 1, 5, 5, device=device),
        torch.empty(1, 6, 1, 1, device=device),
        torch.empty(1, 6, 1, 1, device=device),
    )
    p = torch.empty(2, 2, 5, 5, dtype=torch.bool, device=device)
    _run(g, {X: x, R: r, S: s, SQ: sq, P: p}, handle, device)
    xd = x.double()
    torch.testing.assert_close(r.double(), xd.amax(1, keepdim=True))
    torch.testing.assert_close(s.double(), xd.sum((0, 2, 3), keepdim=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sq.double(), (xd * xd).sum((0, 2, 3), keepdim=True), rtol=1e-5, atol=1e-5)
    assert torch.equal(p, torch.tanh(xd[:, 1:5:2]) > 0.25)


def test_enums_are_opgraphs_values():
    assert cudnn.data_type.HALF is og.DataType.HALF and cudnn.data_type.NOT_SET is None
    assert cudnn.heur_mode.A is og.HeurMode.A and cudnn.reduction_mode.ADD is og.ReductionMode.ADD
    assert cudnn.norm_forward_phase.TRAINING is og.NormForwardPhase.TRAINING
    assert cudnn.behavior_note.RUNTIME_COMPILATION is og.BehaviorNote.RUNTIME_COMPILATION
    assert cudnn.numerical_note.TENSOR_CORE is og.NumericalNote.TENSOR_CORE
    assert (
        cudnn.pointwise_mode.ADD is og.PointwiseMode.ADD
        and cudnn.convolution_mode.CONVOLUTION in cudnn.convolution_mode
    )
    assert og.DataType.FLOAT in cudnn.data_type and len(list(cudnn.heur_mode)) == 4
    assert "INT4" in repr(cudnn.data_type.INT4) and cudnn.data_type.INT4 not in list(og.DataType)
    assert cudnn.build_plan_policy.ALL.name == "ALL" and cudnn.knob_type.KERNEL_CFG.name == "KERNEL_CFG"
    assert cudnn.resample_mode.MAXPOOL is og.ResampleMode.MAX


def test_handles_and_versions():
    h = cudnn.create_handle("cpu")
    assert h.device.kind == "cpu" and cudnn.get_stream(h) is None
    cudnn.set_stream(handle=h, stream=7)
    assert cudnn.get_stream(h) == 7
    cudnn.destroy_handle(h)
    with pytest.raises(og.GraphError, match="destroyed") as ei:
        cudnn.get_stream(h)
    assert isinstance(ei.value, RuntimeError)
    with pytest.raises(RuntimeError, match="handle"):
        cudnn.set_stream(handle=None, stream=0)
    assert cudnn.backend_version() >= 90000 and cudnn.backend_version_string().startswith("9.")
    assert cudnn.get_last_error_string() == "" and cudnn.__version__


def test_graph_wrapper():
    x = torch.randn(2, 3, 4, 4)
    w = torch.randn(5, 3, 3, 3)
    with cudnn.Graph(io_data_type=cudnn.data_type.FLOAT, handle=cudnn.create_handle("cpu")) as g:
        y = g.conv_fprop(image=x, weight=w, padding=[1, 1], name="conv")
        y.set_output(True)
    given = {"conv::image": x, "conv::weight": w}
    out = g(given)["conv::0"]
    assert given["conv::Y"] is out  # the output allocated under cuDNN's name too (notebook 01's reading)
    torch.testing.assert_close(
        out.double(), torch.nn.functional.conv2d(x.double(), w.double(), padding=1), rtol=1e-4, atol=1e-4
    )
    g.set_io_tuples(["conv::image", "conv::weight"], ["conv::0"])
    torch.testing.assert_close(g(x, w), out)
    with pytest.raises(og.VariantPackError):
        g(x)
    with pytest.raises(og.VariantPackError, match="is not given"):
        g({"conv::image": x})
    with pytest.raises(AttributeError, match="does not forward"):
        getattr(g, "build_plans")  # noqa: B009 (the attribute access is the test)


def test_graph_jit_and_cache():
    calls = []

    @cudnn.graph_cache(key_fn=lambda n: n, maxsize=2)
    @cudnn.jit(heur_modes=cudnn.heur_mode.A)
    def make(n):
        calls.append(n)
        with cudnn.graph(cudnn.create_handle("cpu"), io_data_type=cudnn.data_type.FLOAT) as (g, _):
            x = g.tensor(name="x", dim=[n], stride=[1])
            y = g.exp(input=x)
            y.set_output(True)
            return g, [x, y]

    g, (xu, yu) = make(3)
    assert make(3)[0] is g and calls == [3]
    make(4), make(5), make(3)
    assert calls == [3, 4, 5, 3]  # 3 was evicted
    x, y = torch.randn(3), torch.empty(3)
    g.execute({xu: x, yu: y}, None)
    torch.testing.assert_close(y, torch.exp(x))


@pytest.mark.gpu
@requires_cuda
def test_gpu_raw_pointers_streams_and_cuda_graphs():
    handle = cudnn.create_handle("cuda")
    stream = torch.cuda.Stream()
    cudnn.set_stream(handle=handle, stream=stream.cuda_stream)
    x = torch.randn(2, 8, 6, 6, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, handle=handle)
    X, W = g.tensor_like(x), g.tensor_like(w)
    Y = g.relu(input=g.conv_fprop(image=X, weight=W, padding=[1, 1]))
    Y.set_output(True)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    y = torch.empty_like(x)
    ws = torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
    g.execute({X: x.data_ptr(), W: w, Y: y.data_ptr()}, ws.data_ptr(), handle=handle)
    stream.synchronize()
    want = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), padding=1))
    torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=5e-2)
    y2 = torch.empty_like(x)
    graph = g.populate_cuda_graph(handle, {X: x, W: w, Y: y2}, ws)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, y)
    y3 = torch.empty_like(x)
    g.update_cuda_graph(handle, {X: x, W: w, Y: y3}, ws, graph)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y3, y)
