"""The backend's partitions: ops opgraph lacks (a torch.library op it cannot know), ops a translator
declines (a transposed convolution's backward) and plans that fail at run time are left to PyTorch,
never a failure, and each fallback is reported with its reason. Also the AOTAutograd-only
translations (aot_ops) on the activations' backward ops."""

from __future__ import annotations

import copy
import logging

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from opgraph.frontends.dynamo_backend import reports  # noqa: E402
from opgraph.frontends.dynamo_partition import PlanModule  # noqa: E402
from opgraph.frontends.fx_graph import import_fx  # noqa: E402


@torch.library.custom_op("opgraph_test::softsign", mutates_args=())
def softsign(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + x.abs())


@softsign.register_fake
def _(x):
    return torch.empty_like(x)


def _softsign_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _softsign_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad / (1 + x.abs()) ** 2


softsign.register_autograd(_softsign_backward, setup_context=_softsign_setup)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _check(model, *inputs, rtol=1e-12):
    """Compile `model`, run forward and backward against an eager copy; returns the new reports."""
    eager = copy.deepcopy(model)
    first = len(reports())
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = torch.compile(model, backend=og.torch_backend)(*leaves)
    out.sin().sum().backward()
    ref_leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ref = eager(*ref_leaves)
    ref.sin().sum().backward()
    torch.testing.assert_close(out, ref, rtol=rtol, atol=rtol)
    for a, b in zip(leaves, ref_leaves):
        if a.is_floating_point():
            torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=rtol)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=rtol, msg=name)
    return reports()[first:]


class WithCustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(softsign(self.a(x).tanh()) * 2.0)


def test_an_op_opgraph_lacks_is_left_to_pytorch():
    torch.manual_seed(0)
    made = _check(WithCustomOp().double(), torch.randn(5, 6, dtype=torch.float64))
    forward = next(r for r in made if r.kind == "forward")
    assert [f.target for f in forward.fallbacks] == ["opgraph_test.softsign.default"]
    assert "no opgraph translation" in forward.fallbacks[0].reason
    assert len(forward.partitions) == 2, forward  # before and after the custom op
    assert "fallback" in forward.summary()
    backward = next(r for r in made if r.kind == "backward")
    assert backward.partitions and not backward.fallbacks, backward  # its autograd formula is aten ops


class Activations(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.up = nn.ConvTranspose2d(2, 2, 3)

    def forward(self, x):
        h = self.lin(x)
        h = torch.sigmoid(h) + torch.tanh(h) * F.silu(h) + F.gelu(h, approximate="tanh")
        h = F.log_softmax(h, dim=-1) + F.softmax(h, dim=0)
        img = self.up(h.reshape(5, 2, 1, 3))
        return img.sum(dim=(2, 3)).repeat(1, 3) + h


def test_activation_backward_translations_and_a_declined_backward():
    torch.manual_seed(0)
    made = _check(Activations().double(), torch.randn(5, 6, dtype=torch.float64))
    backward = next(r for r in made if r.kind == "backward")
    targets = {op for p in backward.partitions for op, _ in p.ops}
    for op in (
        "sigmoid_backward",
        "tanh_backward",
        "silu_backward",
        "gelu_backward",
        "_log_softmax_backward_data",
        "_softmax_backward_data",
    ):
        assert f"aten.{op}.default" in targets, sorted(targets)
    declined = [f for f in backward.fallbacks if "convolution_backward" in f.target]
    assert declined and "transposed convolution" in declined[0].reason, backward


def test_a_plan_that_fails_at_run_time_falls_back(caplog, monkeypatch):
    torch.manual_seed(0)
    model = WithCustomOp().double()
    x = torch.randn(5, 6, dtype=torch.float64)
    calls = []
    original = PlanModule.__call__

    def failing(self, *args):
        if not self.failed:
            calls.append(self.name)
            self.plan = _Broken()
        return original(self, *args)

    monkeypatch.setattr(PlanModule, "__call__", failing)
    with caplog.at_level(logging.WARNING, logger="opgraph.dynamo"):
        out = torch.compile(model, backend=og.torch_backend)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-12, atol=1e-12)
    assert calls and "PyTorch runs it from now on" in caplog.text


class _Broken:
    def execute(self, pack):
        raise og.ExecutionError("a kernel failed", rule="test.broken")


def test_import_fx_names_the_node_that_fails(monkeypatch):
    from opgraph.frontends import torch_ops

    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: torch.ops.aten.relu(x) * 2)(torch.randn(3))

    def broken(imp, node, a):
        raise ValueError("boom")

    monkeypatch.setitem(torch_ops.TRANSLATORS, "relu", broken)
    with pytest.raises(og.UnsupportedGraphError, match="import.fx_node") as info:
        import_fx(gm)
    assert info.value.op.startswith("relu")


def test_import_fx_outputs_keep_pytorchs_strides():
    def f(x):
        return (x.t() + 1.0, x.permute(1, 0).contiguous())

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(torch.randn(3, 4))
    imported = import_fx(gm)
    final = imported.graph.final
    strides = [final.tensors[t.known_uid()].stride for t in imported.outputs]
    assert strides == [
        tuple(n.meta["val"].stride()) for n in next(n for n in gm.graph.nodes if n.op == "output").args[0]
    ]
    x = torch.randn(3, 4)
    a, b = imported.run(x)
    torch.testing.assert_close(a, x.t() + 1.0)
    torch.testing.assert_close(b, x.t())


class Convolutions(nn.Module):
    """Grouped, depthwise, dilated, strided and bias-free convolutions, 1-d and 2-d, eval-mode
    batchnorm and layernorm without affine parameters: convolution_backward, native_layer_norm."""

    def __init__(self) -> None:
        super().__init__()
        self.grouped = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.depthwise = nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6, bias=False)
        self.strided = nn.Conv2d(6, 4, 2, stride=2)
        self.bn = nn.BatchNorm2d(4)
        self.line = nn.Conv1d(4, 3, 3, padding=1)

    def forward(self, x):
        h = self.bn(self.strided(self.depthwise(self.grouped(x)).relu()))
        h = F.layer_norm(h.flatten(2), (h.shape[2] * h.shape[3],))
        return self.line(h)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_convolution_and_norm_backward_translations(train):
    torch.manual_seed(0)
    model = Convolutions().double().train(train)
    made = _check(model, torch.randn(2, 4, 6, 6, dtype=torch.float64))
    backward = next(r for r in made if r.kind == "backward")
    targets = {op for p in backward.partitions for op, _ in p.ops}
    assert "aten.convolution_backward.default" in targets, backward
    assert "aten.native_layer_norm_backward.default" in targets, backward
    if train:
        assert "aten.native_batch_norm_backward.default" in targets, backward
    assert not backward.fallbacks, backward


def test_an_error_naming_an_op_refuses_only_its_node():
    from opgraph.frontends.dynamo_partition import _culprit

    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: (x.relu() * 2).exp())(torch.randn(3))
    names = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    inner = og.ShapeError("bad strides", op="pointwise 'mul.scale#1'", rule="test.inner")
    try:
        raise og.UnsupportedGraphError("the imported graph is not valid", rule="import.invalid") from inner
    except og.UnsupportedGraphError as err:
        assert list(_culprit(err, gm, "import failed")) == ["mul"]
    assert sorted(_culprit(og.GraphError("no op named"), gm, "no plan")) == sorted(names)


def test_a_reserved_partition_keeps_no_buffer_of_its_call():
    """Before PyTorch's CUDA graph trees record a compiled graph (options={"cudagraphs": True}), the
    backend reserves its plans (PlanModule.reserve), and from then on each plan forgets its call's
    buffers after it: its binding would otherwise keep the last call's outputs and inputs alive, in
    the trees' pool, which must hold outputs only after a recorded call (issue 43). On the CPU the
    trees skip the graph, so the test reserves the partitions itself."""
    import gc
    import weakref

    calls = []
    original = PlanModule.__call__

    def recording(self, *args):
        out = original(self, *args)
        outs = out if isinstance(out, tuple) else (out,)
        calls.extend((self, weakref.ref(o._base if o._base is not None else o)) for o in outs)
        return out

    torch.manual_seed(0)
    model = WithCustomOp().double()
    x = torch.randn(5, 6, dtype=torch.float64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PlanModule, "__call__", recording)
        compiled = torch.compile(model, backend=og.torch_backend)
        for reserved in (False, True):
            if reserved:
                for module in {id(m): m for m, _ in calls}.values():
                    module.reserve()
            calls.clear()
            with torch.no_grad():
                out = compiled(x)
            torch.testing.assert_close(out, model(x), rtol=1e-12, atol=1e-12)
            del out  # (the graph's output is a view of the last partition's output)
            gc.collect()
            last, ref = calls[-1]
            assert (ref() is None) == reserved and last._release == reserved


def test_a_partition_keeps_the_order_of_the_graph_it_was_cut_from():
    """torch.fx's partitioner may lay a partition out breadth first, interleaving independent chains (a
    Llama layer's rotary embedding of queries and keys, op by op), which opgraph's partitioner would cut
    at every op: the partition gets the source graph's order back."""
    from torch.fx import symbolic_trace

    from opgraph.frontends.dynamo_partition import _in_program_order

    def f(q, k):
        return torch.exp(torch.sin(q) * 2), torch.exp(torch.cos(k) * 3)

    gm = symbolic_trace(f)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    position = {n.name: i for i, n in enumerate(calls)}
    program = [n.name for n in calls]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for n in (calls[0], calls[3], calls[1], calls[4], calls[2], calls[5]):  # breadth first
        output.prepend(n)
    gm.recompile()
    interleaved = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    assert interleaved != program
    q, k = torch.randn(3), torch.randn(3)
    want = f(q, k)
    _in_program_order(gm, position)
    assert [n.name for n in gm.graph.nodes if n.op == "call_function"] == program
    for got, w in zip(gm(q, k), want):
        torch.testing.assert_close(got, w)
