"""opgraph.from_torch: PyTorch models imported as graphs match PyTorch.

On the CPU: the five torchvision architectures (torchvision's own models when it imports, the
state_dict-compatible replicas of tv_models.py otherwise) in eval and train mode on the reference
engine in float64 at 32x32, some in float32 channels_last on the torch engine, plus op coverage,
losses, custom-op fallbacks, rebinding and module-state updates. Marked gpu: the same models at
224x224 through the default CUDA engines.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import opgraph as og

from ..helpers import requires_cuda

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from opgraph.frontends import from_torch  # noqa: E402

from .tv_models import ARCHITECTURES, build  # noqa: E402


def _seed(rng: np.random.Generator) -> None:
    torch.manual_seed(int(rng.integers(2**31)))


def _randomize_norms(model: nn.Module) -> nn.Module:
    """Non-trivial batchnorm stats and affine parameters, so that eval-mode batchnorm is not ~identity."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def _deterministic(model: nn.Module) -> nn.Module:
    """Dropout and stochastic depth off, so that train mode is deterministic."""
    for m in model.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model


def _rel_err(got, want) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30))


def _assert_state_matches(model: nn.Module, ref: nn.Module, rtol: float) -> None:
    mine, theirs = model.state_dict(), ref.state_dict()
    for key, want in theirs.items():
        got = mine[key]
        if want.dtype.is_floating_point:
            assert _rel_err(got, want) <= rtol, key
        else:
            assert torch.equal(got, want), key


def _poisoned_run(imported, *inputs, engines=None):
    """What `run` does, with every output buffer (running stats included) poisoned first."""
    pack = imported.variant_pack(*inputs)
    for uid in imported.graph.final.outputs:
        t = pack[uid]
        t.fill_(float("nan") if t.dtype.is_floating_point else torch.iinfo(t.dtype).max)
    imported.plan("cuda" if inputs[0].is_cuda else "cpu", engines).execute(pack)
    imported.write_back(pack)
    return imported.unpack(pack)


def _check_model(model: nn.Module, x, *, engines=None, rtol: float, **options):
    """Import `model`, run it through opgraph (outputs poisoned first) and PyTorch (a copy) on x;
    outputs and module state (running stats, num_batches_tracked) must agree. Returns the
    ImportedGraph."""
    ref = copy.deepcopy(model)
    imported = from_torch(model, (x,), **options)
    got = _poisoned_run(imported, x, engines=engines)
    with torch.no_grad():
        want = ref(x)
    assert _rel_err(got, want) <= rtol, imported.report.summary()
    _assert_state_matches(model, ref, rtol)
    return imported


# -- the five architectures ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_architecture_matches_pytorch_fp64(name, mode, rng):
    _seed(rng)
    model = _deterministic(_randomize_norms(build(name))).double()
    getattr(model, mode)()
    # train-mode batchnorm over 2 values per channel (batch 2, the 1x1 deepest layers at 32x32) is
    # ill-conditioned (last-bit differences of the convolutions grow to 1e-7): batch 4 in train mode
    x = torch.randn(2 if mode == "eval" else 4, 3, 32, 32, dtype=torch.float64)
    imported = _check_model(model, x, rtol=1e-9)
    counts = imported.report.counts()
    assert "custom" not in counts, imported.report.summary()
    if mode == "train":
        assert imported.mutations and all(m.kind == "buffer" for m in imported.mutations)
    else:
        assert not imported.mutations


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_channels_last_fp32_on_the_torch_engine(name, mode, rng):
    _seed(rng)
    model = _deterministic(_randomize_norms(build(name)))
    getattr(model, mode)()
    # fp32 train-mode batchnorm needs a few values per channel in the deepest layers to be well
    # conditioned: 4 x 2 x 2 at 64x64
    size, batch = (32, 2) if mode == "eval" else (64, 4)
    x = torch.randn(batch, 3, size, size).to(memory_format=torch.channels_last)
    imported = _check_model(model, x, engines=["torch"], rtol=1e-4 if mode == "eval" else 1e-3)
    final = imported.graph.final
    assert final.tensors[imported.inputs[0].uid].layout == "nhwc"
    convs = [n for n in final.nodes if n.kind == "conv_fprop"]
    assert convs and all(final.tensors[n.outputs[0]].layout == "nhwc" for n in convs)


def test_train_mode_random_draws_match_pytorch_with_the_same_seed(rng):
    """EfficientNet's stochastic depth and the classifier's dropout become Bernoulli inputs drawn by
    variant_pack from torch's RNG, in the order PyTorch draws them (CPU)."""
    model = _randomize_norms(build("efficientnet_b0")).double().train()
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)
    ref = copy.deepcopy(model)
    imported = from_torch(model, (x,))
    assert len(imported.randoms) == 10  # 9 residual blocks with stochastic depth, 1 dropout
    assert any("dropout in train mode" in n for n in imported.report.notes)
    seed = int(rng.integers(2**31))
    torch.manual_seed(seed)
    got = imported.run(x)
    torch.manual_seed(seed)
    with torch.no_grad():
        want = ref(x)
    assert _rel_err(got, want) <= 1e-9
    torch.manual_seed(seed + 1)
    assert _rel_err(imported.run(x), want) > 1e-3  # other draws, other result


# -- ops and losses ---------------------------------------------------------------------------------------


class OpZoo(nn.Module):
    """Ops beyond the five architectures: every translator should take these (no custom op)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding="same", dilation=2)
        self.gconv = nn.Conv2d(6, 6, 3, stride=2, groups=3, bias=True)
        self.ln = nn.LayerNorm(6)
        self.fc = nn.Linear(6, 5)
        self.scale = nn.Parameter(torch.rand(6, 1, 1) + 0.5)
        self.register_buffer("offset", torch.randn(6))

    def forward(self, x, y):
        a = self.conv(x) * self.scale + self.offset.view(1, -1, 1, 1)
        a = F.leaky_relu(a, 0.1) + F.elu(a) - F.gelu(a) + F.gelu(a, approximate="tanh") + F.softplus(a, beta=2.0)
        a = torch.where(a > 0, F.mish(a), torch.tanh(a)).clamp(-2, 3) + F.hardtanh(a, -0.5, 0.5)
        b = F.avg_pool2d(a, 3, 2, 1, count_include_pad=False) + F.max_pool2d(a, 2, 2, ceil_mode=True)
        b = F.adaptive_avg_pool2d(self.gconv(a), 2) + F.adaptive_max_pool2d(b, 1)
        c = torch.cat([b[:, :3], b[:, 3:]], 1).permute(0, 2, 3, 1)  # [N, 2, 2, 6]
        d = self.fc(self.ln(c))  # linear over a 4-D input
        e, f = d.chunk(2, dim=-1)[0], d.select(3, -1)
        g = (e.transpose(2, 3) @ e).sum((1, 2, 3)) + f.amax(-1).mean(-1, keepdim=True).squeeze(-1)
        h = F.softmax(y, -1) * F.log_softmax(y, -1) + (y**2).sqrt() - y.abs().rsqrt().exp() / (1 + y.sigmoid())
        k = torch.stack([h.max(-1).values, h.min(-1)[0], h.sum(-1)], 1).to(torch.float32).double()
        return g, k.expand(2, 3), x.mean(), h.maximum(torch.zeros_like(h))


def test_op_zoo_translates_without_custom_ops(rng):
    _seed(rng)
    model = OpZoo().double().eval()
    x = torch.randn(2, 4, 9, 9, dtype=torch.float64)
    y = torch.randn(2, 7, dtype=torch.float64)
    imported = from_torch(model, (x, y))
    assert "custom" not in imported.report.counts(), imported.report
    got = imported.run(x, y)
    with torch.no_grad():
        want = model(x, y)
    assert len(got) == len(want)
    for g_, w_ in zip(got, want):
        assert g_.shape == w_.shape
        assert _rel_err(g_, w_) <= 1e-9
    assert got[2].dim() == 0  # a 0-d output comes back 0-d


class Losses(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 5)
        self.kw = kw

    def forward(self, x, t, target):
        z = self.fc(x)
        return (
            F.cross_entropy(z, t, **self.kw),
            F.nll_loss(F.log_softmax(z, 1), t, reduction="sum"),
            F.mse_loss(z, target),
        )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "none"},
        {"reduction": "sum"},
        {"ignore_index": 2},
        {"label_smoothing": 0.1},
        {"weight": "w"},
        {"weight": "w", "ignore_index": 1},
    ],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default",
)
def test_cross_entropy_nll_and_mse(kw, rng):
    _seed(rng)
    if kw.get("weight") == "w":
        kw = {**kw, "weight": torch.rand(5, dtype=torch.float64) + 0.5}
    model = Losses(**kw).double()
    x = torch.randn(6, 8, dtype=torch.float64)
    t = torch.tensor([0, 2, 4, 1, 2, 3])
    target = torch.randn(6, 5, dtype=torch.float64)
    imported = from_torch(model, (x, t, target))
    assert "custom" not in imported.report.counts(), imported.report
    for g_, w_ in zip(imported.run(x, t, target), model(x, t, target)):
        assert g_.shape == w_.shape
        assert _rel_err(g_, w_.detach()) <= 1e-10


# -- custom-op fallback ----------------------------------------------------------------------------------


@torch.library.custom_op("opgraph_test::scaled_cube", mutates_args=())
def scaled_cube(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * x * x * k


@scaled_cube.register_fake
def _(x, k):
    return torch.empty_like(x)


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, index):
        y = torch.relu(self.fc(x))
        v = torch.sort(y, dim=1).values  # a two-result op, one result used
        return torch.cumprod(v, 1) + scaled_cube(y, 0.5) + torch.special.i0(x) + torch.scatter(x, 1, index, 0.5)


@pytest.mark.parametrize("engines", [None, ["torch"]], ids=["reference", "torch"])
def test_untranslatable_ops_become_custom_ops(engines, rng):
    _seed(rng)
    model = Unsupported().double()
    x = torch.randn(3, 6, dtype=torch.float64)
    index = torch.randint(0, 6, (3, 6))
    imported = from_torch(model, (x, index))
    custom = {e.target for e in imported.report.custom_ops}
    assert custom == {
        "aten.sort.default",
        "aten.cumprod.default",
        "opgraph_test.scaled_cube.default",
        "aten.special_i0.default",
        "aten.scatter.value",
    }, imported.report
    assert "custom ops:" in imported.report.summary()
    assert _rel_err(imported.run(x, index, engines=engines), model(x, index).detach()) <= 1e-12
    kinds = [n.kind for n in imported.graph.final.nodes]
    assert kinds.count("custom") == 5 and "matmul" in kinds


def test_translator_gives_up_cleanly(rng):
    """Arguments a translator does not cover (dilated max pooling) fall back to a custom op, with
    nothing left behind from the attempt."""
    _seed(rng)

    class M(nn.Module):
        def forward(self, x):
            return F.max_pool2d(x, 2, dilation=2) + 1

    x = torch.randn(1, 2, 7, 7, dtype=torch.float64)
    imported = from_torch(M(), (x,))
    (entry,) = imported.report.custom_ops
    assert "dilated" in entry.note
    assert _rel_err(imported.run(x), M()(x)) <= 1e-12


# -- binding, rebinding and module state --------------------------------------------------------------


def test_parameters_are_named_inputs_bound_from_the_module(rng):
    _seed(rng)
    model = build("resnet18", num_classes=10).eval()
    imported = from_torch(model, (torch.randn(1, 3, 32, 32),))
    final = imported.graph.final
    names = {final.tensors[t.uid].name: s for t, s in imported.bound_inputs}
    assert {"conv1.weight", "layer1.0.bn1.folded_scale", "layer1.0.bn1.folded_shift", "fc.weight", "fc.bias"} <= set(
        names
    )
    assert names["layer1.0.bn1.folded_scale"].kind == "derived"
    assert "layer1.0.bn1.num_batches_tracked" not in names
    fc_weight = final.tensor("fc.weight")
    assert fc_weight.dim == (512, 10) and fc_weight.stride == (1, 512)  # W^T as a view
    params = imported.params
    assert params[fc_weight.uid].data_ptr() == model.fc.weight.data_ptr()  # zero-copy
    assert set(params) == {t.uid for t, s in imported.bound_inputs}


def test_rebinding_follows_the_module_and_params_override(rng):
    _seed(rng)
    model = _randomize_norms(build("mobilenet_v3_small", num_classes=10)).double().eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    imported = from_torch(model, (x,))
    with torch.no_grad():
        model.classifier[3].weight.mul_(2.0)  # in place
        model.features[1].block[0][1].running_var.mul_(3.0)  # a buffer
    model.classifier[0].weight = nn.Parameter(torch.randn_like(model.classifier[0].weight))  # reassigned
    with torch.no_grad():
        want = model(x)
    assert _rel_err(imported.run(x), want) <= 1e-9
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.classifier[3].bias.add_(1.0)
        want_other = other(x)
    pack = imported.variant_pack(x, params={"classifier.3.bias": other.classifier[3].bias})
    imported.plan("cpu").execute(pack)
    assert _rel_err(imported.unpack(pack), want_other) <= 1e-9


def test_variant_pack_execute_and_write_back(rng):
    _seed(rng)
    model = _deterministic(build("resnet18", num_classes=10)).double().train()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    ref = copy.deepcopy(model)
    imported = from_torch(model, (x,))
    before = copy.deepcopy(model.state_dict())
    pack = imported.variant_pack(x)
    imported.graph.build(device="cpu").execute(pack)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # nothing written yet
    imported.write_back(pack)
    with torch.no_grad():
        want = ref(x)
    assert _rel_err(imported.unpack(pack), want) <= 1e-6
    _assert_state_matches(model, ref, 1e-6)
    assert int(model.bn1.num_batches_tracked) == 1
    next_mean = imported.graph.final.tensor("bn1.running_mean@next")
    assert not next_mean.is_virtual and next_mean.dim == (1, 64, 1, 1)


def test_inputs_in_another_layout_are_copied_to_the_imported_one(rng):
    _seed(rng)
    model = _randomize_norms(build("resnet18", num_classes=10)).eval()
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    imported = from_torch(model, (x,))
    with torch.no_grad():
        want = model(x)
    assert _rel_err(imported.run(x.contiguous()), want) <= 1e-4


@pytest.mark.parametrize("form", ["folded", "scale_shift", "op"])
def test_eval_batchnorm_forms(form, rng):
    _seed(rng)
    model = _randomize_norms(build("resnet18", num_classes=10)).double().eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    imported = _check_model(model, x, rtol=1e-9, eval_batchnorm=form)
    kinds = [n.kind if n.kind != "pointwise" else n.op.mode.name for n in imported.graph.final.nodes]
    norms = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert kinds.count("batchnorm_inference") == (norms if form == "op" else 0)
    assert kinds.count("RSQRT") == (0 if form == "folded" else norms)
    # conv, x * s, + t, (+ residual,) relu: s and t are bound inputs when folded
    bound = {imported.graph.final.tensors[t.uid].name for t, s in imported.bound_inputs}
    assert ("bn1.folded_scale" in bound) == (form == "folded")


def test_folded_batchnorm_follows_the_module(rng):
    _seed(rng)
    model = _randomize_norms(build("resnet18", num_classes=10)).double().eval()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    imported = from_torch(model, (x,))
    scale = imported.graph.final.tensor("layer1.0.bn2.folded_scale").uid
    first, second = imported.variant_pack(x), imported.variant_pack(x)
    assert first[scale] is second[scale]  # computed once while the module does not change
    with torch.no_grad():
        model.layer1[0].bn2.running_var.mul_(4.0)  # in place: version counter
    model.layer2[0].bn1.weight = nn.Parameter(model.layer2[0].bn1.weight.detach() * 2)  # a new tensor
    assert imported.variant_pack(x)[scale] is not first[scale]
    with torch.no_grad():
        want = model(x)
    assert _rel_err(imported.run(x), want) <= 1e-9


def test_parameter_computations_come_before_the_activations(rng):
    """Computations on parameters alone (here batchnorm's coefficients as graph ops) are emitted first,
    so that the partitioner sees conv -> scale/shift -> relu as one uninterrupted run."""
    _seed(rng)
    model = build("resnet18", num_classes=10).eval()
    imported = from_torch(model, (torch.randn(1, 3, 32, 32),), eval_batchnorm="scale_shift")
    nodes = imported.graph.final.nodes
    first_conv = next(i for i, n in enumerate(nodes) if n.kind == "conv_fprop")
    params = {t.uid for t, _ in imported.bound_inputs}
    produced_from_params: set[int] = set()
    for n in nodes[:first_conv]:
        assert set(n.input_uids()) <= params | produced_from_params, n.label()
        produced_from_params |= set(n.output_uids())
    conv = nodes[first_conv]
    assert [n.kind for n in nodes[first_conv : first_conv + 4]] == ["conv_fprop", "pointwise", "pointwise", "pointwise"]
    assert nodes[first_conv + 1].input_uids()[0] == conv.outputs[0]


# -- report and errors -------------------------------------------------------------------------------------


def test_report_lists_every_node(rng):
    _seed(rng)
    model = build("mobilenet_v2", num_classes=10).eval()
    imported = from_torch(model, (torch.randn(1, 3, 32, 32),))
    report = imported.report
    statuses = report.counts()
    assert statuses["translated"] > 100 and statuses.get("alias") == 1  # the eval-mode dropout
    text = str(report)
    assert "aten.conv2d.default [translated] -> conv_fprop" in text
    assert "ImportedGraph" in repr(imported)


def test_errors_are_typed():
    with pytest.raises(og.UnsupportedGraphError) as err:
        from_torch(lambda x: x, (torch.ones(2),))
    assert err.value.rule == "import.module"
    with pytest.raises(og.AttributeValueError):
        from_torch(nn.ReLU(), (torch.ones(2),), eval_batchnorm="fold")

    class DataDependent(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    with pytest.raises(og.UnsupportedGraphError) as err:
        from_torch(DataDependent(), (torch.ones(2),))
    assert err.value.rule == "import.trace"
    imported = from_torch(nn.Linear(3, 2), (torch.ones(4, 3),))
    with pytest.raises(og.VariantPackError):
        imported.variant_pack(torch.ones(4, 3), torch.ones(1))
    with pytest.raises(og.VariantPackError):
        imported.variant_pack(torch.ones(4, 3, dtype=torch.float64))
    with pytest.raises(og.VariantPackError):
        imported.variant_pack(torch.ones(5, 3))


def test_in_place_writes_into_a_view_read_later_are_refused():
    class M(nn.Module):
        def forward(self, x):
            y = x * 2
            y[:, :1].relu_()
            return y + 1

    with pytest.raises(og.UnsupportedGraphError) as err:
        from_torch(M(), (torch.randn(2, 3),))
    assert err.value.rule == "import.view_mutation"


def test_module_returning_an_input_and_a_parameter():
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))

        def forward(self, x):
            return x, self.w, x + 1, None

    x = torch.randn(3)
    imported = from_torch(M(), (x,))
    a, w, b, none = imported.run(x)
    assert torch.equal(a, x) and torch.equal(w, imported.module.w.detach()) and torch.equal(b, x + 1)
    assert none is None


# -- on the GPU: full resolution through the default engines ----------------------------------------


@pytest.fixture
def exact_fp32_torch():
    """PyTorch's fp32 convolutions and matmuls without TF32, as the reference of the GPU tests."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_gpu_architecture_fp32_224(name, mode, exact_fp32_torch):
    torch.manual_seed(0)
    model = _deterministic(_randomize_norms(build(name))).cuda()
    getattr(model, mode)()
    x = torch.randn(2, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    # generated fp32 GEMMs run as TF32 by default (a numerical note of their configs): ~1e-3 relative per
    # layer, compounding through ResNet depth (eval at 5e-3 failed for resnet18/50 on an H200, 2026-11-22)
    imported = _check_model(model, x, rtol=2e-2)
    assert "custom" not in imported.report.counts()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_gpu_architecture_fp16_channels_last_eval(name, exact_fp32_torch):
    """fp16 NHWC through opgraph is as close to the fp32 model as PyTorch's own fp16 run is."""
    torch.manual_seed(0)
    model = _randomize_norms(build(name)).cuda().eval()
    x = torch.randn(2, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = model(x)
        half = copy.deepcopy(model).half().to(memory_format=torch.channels_last)
        torch_half = half(x.half())
    imported = from_torch(half, (x.half(),))
    got = imported.run(x.half())
    err, torch_err = _rel_err(got, want), _rel_err(torch_half, want)
    assert err <= max(3 * torch_err, 1e-2), (err, torch_err, imported.plan("cuda").describe())


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).reshape(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)


def test_eval_mode_attention_is_not_called_random(rng):
    """Attention is a seeded op, but without dropout it draws nothing (issue 20: an eval-mode model
    was told it 'is random')."""
    torch.manual_seed(0)
    m = _Attention().eval()
    x = torch.from_numpy(rng.standard_normal((2, 8, 16)).astype(np.float32))
    imported = from_torch(m, (x,))
    assert not any("is random" in n for n in imported.report.notes), imported.report.notes
    trained = from_torch(_Attention().train(), (x,))
    # train-mode dropout inside attention is flagged: it draws from the op's own stream
    assert any("is random" in n or "dropout" in n for n in trained.report.notes), trained.report.notes


def test_an_expanded_class_token_does_not_make_the_layout_batch_innermost(rng):
    """ViT's `cat([cls.expand(B, -1, -1), x], 1)`: the first operand's broadcast batch axis (stride 0)
    said nothing about memory order, yet laid the concatenation, the residual stream and every GEMM
    operand after it out batch-innermost (strides [1, T*B, B]): every GEMM load a gather, 8x slower on
    an H200. They are row-major, as in PyTorch."""

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
            self.pos = torch.nn.Parameter(torch.randn(1, 5, 8))
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.fc(torch.nn.functional.layer_norm(x, (8,)))

    model = Embed()
    x = torch.from_numpy(rng.standard_normal((3, 4, 8)).astype(np.float32))
    imported = from_torch(model, (x,))
    final = imported.graph.final
    for node in final.nodes:
        if node.kind in ("concatenate", "layernorm", "matmul"):
            t = final.tensors[node.output_uids()[0]]
            assert t.stride == og.core.tensor.packed_strides(t.dim), (node.name, t.stride)
    np.testing.assert_allclose(imported.run(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
