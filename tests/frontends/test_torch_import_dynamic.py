"""`from_torch(..., dynamic_shapes=...)`: torch.export's dynamic dims imported as opgraph Dims, one
import and one plan (a DynamicPlan) run at many shapes against PyTorch in float64 (outputs poisoned
first); the refusals (a size outside its range, unbounded dims, an op the importer cannot express at
dynamic sizes); a transformers model where its export allows."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim

import opgraph as og
from opgraph.frontends import from_torch
from opgraph.runtime.dynamic import DynamicPlan
from tests.frontends.zoo_models import TokenLogits
from tests.helpers import check_rule, requires_cuda

# -- modules ------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d: int = 8, h: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm decoder block: layernorm, causal attention (F.scaled_dot_product_attention), RMSNorm,
    a SiLU MLP; heads split with view/transpose on sizes read from the input."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm = RMSNorm(d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.silu(self.up(self.norm(x))))


class Decoder(nn.Module):
    """A small decoder LM: token and position embeddings (positions from arange of the length), two
    blocks, a final layernorm and an untied head."""

    def __init__(self, vocab: int = 32, d: int = 16, layers: int = 2, positions: int = 64) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


BATCH, SEQ = 6, 24
SHAPES = [(1, 1), (2, 7), (5, 13), (BATCH, SEQ), (1, SEQ), (BATCH, 1)]  # ones, primes, the range's ends


def dims() -> dict:
    return {0: Dim("batch", min=1, max=BATCH), 1: Dim("seq", min=1, max=SEQ)}


def run_poisoned(imported, *inputs):
    """The imported graph's outputs on `inputs` through its own plan, output buffers NaN first."""
    pack = imported.variant_pack(*inputs)
    for t in imported.outputs:
        pack[t.known_uid()].fill_(math.nan)
    imported.plan("cpu").execute(pack)
    return imported.unpack(pack)


@pytest.fixture(scope="module")
def mlp_import():
    torch.manual_seed(0)
    model = MLP().double().eval()
    imported = from_torch(model, (torch.randn(3, 5, 8, dtype=torch.float64),), dynamic_shapes=(dims(),))
    return model, imported


@pytest.fixture(scope="module")
def decoder_import():
    torch.manual_seed(0)
    model = Decoder().double().eval()
    ids = torch.randint(0, 32, (3, 5))
    imported = from_torch(model, (ids,), dynamic_shapes={"ids": dims()})
    return model, imported


# -- what an import gives -----------------------------------------------------------------------------


def test_dynamic_import_declares_dims_and_builds_a_dynamic_plan(mlp_import):
    _, imported = mlp_import
    assert imported.dynamic
    assert {n: (d.min, d.max) for n, d in imported.symbols.items()} == {"batch": (1, BATCH), "seq": (1, SEQ)}
    final = imported.graph.final
    (x,) = imported.inputs
    assert [str(d) for d in final.tensors[x.known_uid()].dim] == ["batch", "seq", "8"]
    (y,) = imported.outputs
    assert [str(d) for d in final.tensors[y.known_uid()].dim] == ["batch", "seq", "8"]
    assert all(  # the parameters keep their static shapes
        all(isinstance(d, int) for d in final.tensors[t.known_uid()].dim) for t, _ in imported.bound_inputs
    )
    assert isinstance(imported.plan("cpu"), DynamicPlan)
    assert "dynamic dims: 'batch' (range 1..6), 'seq' (range 1..24)" in imported.report.summary()


@pytest.mark.parametrize("shape", SHAPES)
def test_mlp_runs_at_every_shape_against_pytorch_fp64(mlp_import, shape):
    model, imported = mlp_import
    x = torch.randn(*shape, 8, dtype=torch.float64)
    want = model(x)
    got = run_poisoned(imported, x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(imported.run(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_decoder_runs_at_every_shape_against_pytorch_fp64(decoder_import, shape):
    model, imported = decoder_import
    ids = torch.randint(0, 32, shape)
    with torch.no_grad():
        want = model(ids)
    got = run_poisoned(imported, ids)
    assert got.shape == want.shape == (*shape, 32)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(imported.run(ids), want, rtol=1e-10, atol=1e-10)


def test_decoder_report_has_sizes_and_no_custom_ops(decoder_import):
    _, imported = decoder_import
    counts = imported.report.counts()
    assert "custom" not in counts and counts.get("size", 0) >= 2, imported.report.summary()


def test_one_plan_serves_every_shape_and_describes_them(decoder_import):
    _, imported = decoder_import
    plan = imported.plan("cpu")
    for shape in [(2, 3), (4, 9), (2, 3)]:
        imported.run(torch.randint(0, 32, shape))
    assert imported.plan("cpu") is plan
    text = plan.describe()
    assert "dynamic plan" in text and "batch 1..6, seq 1..24" in text
    assert "batch=2 seq=3" in text and "batch=4 seq=9" in text


def test_derived_dim_is_an_expression_of_its_root():
    class Pair(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.shape[0] * 2, 4) + y

    seq = Dim("seq", min=1, max=16)
    x, y = torch.randn(3, 8, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    imported = from_torch(Pair(), (x, y), dynamic_shapes=({0: seq}, {0: 2 * seq}))
    final = imported.graph.final
    assert [str(d) for d in final.tensors[imported.inputs[1].known_uid()].dim] == ["2*seq", "4"]
    for n in (1, 5, 16):
        x, y = torch.randn(n, 8, dtype=torch.float64), torch.randn(2 * n, 4, dtype=torch.float64)
        torch.testing.assert_close(run_poisoned(imported, x, y), Pair()(x, y))


class Broadcasts(nn.Module):
    """Expands of size-1 axes to dynamic sizes (positions to the batch, a first token to the length, a
    boolean mask), slices with dynamic stops (x[:, 1:] - x[:, :-1]) and torch.diff."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).unsqueeze(0).expand(b, t)
        x = self.emb(ids) + self.emb(pos)
        first = x[:, :1, :].expand(b, t, 8)
        keep = (ids[:, :1] > 20).unsqueeze(-1).expand(b, t, 8)
        y = torch.where(keep, x, first)
        steps = y[:, 1:] - y[:, :-1]
        return torch.cat([steps, torch.diff(y, dim=1)], dim=-1)


def test_expands_and_slices_at_dynamic_sizes():
    torch.manual_seed(0)
    model = Broadcasts().double().eval()
    imported = from_torch(
        model, (torch.randint(0, 40, (3, 5)),), dynamic_shapes=({0: dims()[0], 1: Dim("seq", min=3, max=SEQ)},)
    )
    assert "custom" not in imported.report.counts()
    for shape in [(1, 3), (5, 13), (BATCH, SEQ)]:
        ids = torch.randint(0, 40, shape)
        with torch.no_grad():
            want = model(ids)
        torch.testing.assert_close(run_poisoned(imported, ids), want, rtol=1e-12, atol=1e-12)


class Positions(nn.Module):
    """Indexing by the positions of each axis (aranges of the dynamic sizes, as transformers' mask
    functions do), in and out of the axes' order."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = x.shape
        rows, cols = torch.arange(b, device=x.device), torch.arange(t, device=x.device)
        return x[rows[:, None, None], cols[None, None, :]], x[rows[None, :], cols[:, None]]


def test_indexing_by_positions_at_dynamic_sizes():
    imported = from_torch(Positions(), (torch.randn(3, 5, dtype=torch.float64),), dynamic_shapes=(dims(),))
    assert "custom" not in imported.report.counts()
    for shape in [(1, 1), (2, 7), (BATCH, SEQ)]:
        x = torch.randn(*shape, dtype=torch.float64)
        for got, want in zip(run_poisoned(imported, x), Positions()(x)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_range_starting_at_zero_starts_at_one_with_a_note():
    x = torch.randn(3, 8, dtype=torch.float64)
    imported = from_torch(MLP().double(), (x,), dynamic_shapes=({0: Dim("rows", max=10)},))
    assert (imported.symbols["rows"].min, imported.symbols["rows"].max) == (1, 10)
    assert any("starts at 0" in n for n in imported.report.notes)


def test_static_import_is_unchanged():
    x = torch.randn(3, 8, dtype=torch.float64)
    imported = from_torch(MLP().double(), (x,))
    assert not imported.dynamic and not imported.symbols
    assert not isinstance(imported.plan("cpu"), DynamicPlan)


# -- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(BATCH + 1, 4), (2, SEQ + 1)])
def test_a_size_outside_its_range_is_a_typed_error(decoder_import, shape):
    _, imported = decoder_import
    name, axis = ("batch", 0) if shape[0] > BATCH else ("seq", 1)
    ids = torch.randint(0, 32, shape)
    for call in (imported.run, imported.variant_pack):
        with pytest.raises(og.VariantPackError) as err:
            call(ids)
        check_rule(err.value, "pack.dim_range", "ids", name)
        assert f"dim {axis}" in str(err.value) and f"1..{BATCH if axis == 0 else SEQ}" in str(err.value)


def test_an_input_of_another_rank_is_a_typed_error(mlp_import):
    _, imported = mlp_import
    with pytest.raises(og.VariantPackError) as err:
        imported.run(torch.randn(3, 8, dtype=torch.float64))
    check_rule(err.value, "import.input_shape", "x")


@pytest.mark.parametrize("hint", ["AUTO", "DYNAMIC", "unbounded"])
def test_unbounded_dims_are_refused_with_the_fix(hint):
    spec = Dim("rows") if hint == "unbounded" else getattr(Dim, hint)
    x = torch.randn(3, 8, dtype=torch.float64)
    with pytest.raises(og.UnsupportedGraphError) as err:
        from_torch(MLP().double(), (x,), dynamic_shapes=({0: spec},))
    check_rule(err.value, "import.dynamic_unbounded", "x")
    assert "max=" in str(err.value)


def test_an_op_needing_a_static_size_is_refused_naming_the_node():
    class Noise(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.rand(x.shape[0], 8, dtype=x.dtype)

    x = torch.randn(3, 8, dtype=torch.float64)
    with pytest.raises(og.UnsupportedGraphError) as err:
        from_torch(Noise(), (x,), dynamic_shapes=({0: Dim("rows", min=1, max=9)},))
    check_rule(err.value, "import.dynamic_op", "rand")
    assert "rows" in str(err.value) and "static" in err.value.hint


def test_a_constant_of_a_dynamic_size_is_spread_from_a_tensor_that_has_it():
    """zeros / ones / full of a dynamic size (an attention mask's default): the constant expanded along the
    dims a tensor of the graph has, at every shape."""

    class Filled(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.zeros(x.shape[0], 8, dtype=x.dtype) + torch.full((x.shape[0], 1), 1.5, dtype=x.dtype)

    model = Filled()
    imported = from_torch(
        model, (torch.randn(3, 8, dtype=torch.float64),), dynamic_shapes=({0: Dim("rows", min=1, max=9)},)
    )
    for rows in (1, 4, 9):
        x = torch.randn(rows, 8, dtype=torch.float64)
        torch.testing.assert_close(imported.run(x), model(x), rtol=1e-12, atol=1e-12)


def test_training_and_gradients_of_a_dynamic_import_keep_its_dims(mlp_import):
    """Gradients and training steps of a dynamic import are built once over its dims (their runs at
    many shapes: tests/training/test_train_step_dynamic.py); a backward rule that decides by a size
    it cannot know over the range is a typed error naming the op and the rule."""
    from opgraph.autodiff.rules import RULES, Rule
    from opgraph.training import SGD, train_step

    _, imported = mlp_import
    step = train_step(imported, loss="mse", optimizer=SGD(0.1))
    assert set(step.graph.final.symbols) == {"batch", "seq"}
    wrt = [t for t, _ in imported.bound_inputs]
    gg = og.grad(imported.graph, imported.outputs, wrt)
    assert set(gg.graph.final.symbols) == {"batch", "seq"}

    rule = RULES["matmul"]

    def by_size(ctx):
        if ctx.result_desc("C").dim[0] > 1:  # (an unconverted rule: a size compared with an int)
            raise AssertionError("not reached")
        return rule.fn(ctx)

    RULES.register("matmul", Rule("matmul", by_size, rule.inputs, rule.outputs, rule.broadcasts), replace=True)
    try:
        with pytest.raises(og.UnsupportedGraphError) as err:
            og.grad(imported.graph, imported.outputs, wrt)
    finally:
        RULES.register("matmul", rule, replace=True)
    check_rule(err.value, "autodiff.dynamic", "batch", "seq")
    assert "matmul" in str(err.value) and "at(" in err.value.hint


def test_an_example_of_size_one_on_a_dynamic_axis_says_why():
    x = torch.randn(1, 8, dtype=torch.float64)
    try:
        imported = from_torch(MLP().double(), (x,), dynamic_shapes=({0: Dim("rows", min=1, max=9)},))
    except og.UnsupportedGraphError as err:  # torch.export specialised the size 1
        check_rule(err, "import.trace")
        assert "size >= 2" in err.hint
    else:  # this torch keeps it dynamic
        assert imported.dynamic


# -- a transformers model ---------------------------------------------------------------------------


def _tiny_lm(arch: str) -> nn.Module:
    """A transformers causal LM from a config (random weights, no download), float64, returning logits."""
    transformers = pytest.importorskip("transformers")
    if arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            use_cache=False,
            attn_implementation="sdpa",
        )
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False, attn_implementation="sdpa"
        )
        cls = transformers.GPT2LMHeadModel
    torch.manual_seed(0)
    return TokenLogits(cls(config)).double().eval()


# Llama computes its RMSNorm and rotary tables in float32 (casts in the traced program, which the import
# keeps): its float64 comparison holds to float32's precision; GPT-2 is float64 throughout
TOLERANCES = {"llama": (1e-5, 1e-6), "gpt2": (1e-10, 1e-10)}


@pytest.mark.parametrize("arch", list(TOLERANCES))
def test_transformers_lm_with_dynamic_batch_and_length(arch):
    """transformers' causal mask under torch.export (aranges of the length, the positions expanded to
    the batch, torch.diff, cumsum, indexing by positions) imports at dynamic sizes."""
    model = _tiny_lm(arch)
    ids = torch.randint(0, 64, (2, 6))
    imported = from_torch(
        model, (ids,), dynamic_shapes=({0: Dim("batch", min=1, max=4), 1: Dim("seq", min=1, max=32)},)
    )
    assert "custom" not in imported.report.counts()
    rtol, atol = TOLERANCES[arch]
    for shape in [(1, 1), (3, 7), (4, 32)]:
        ids = torch.randint(0, 64, shape)
        with torch.no_grad():
            want = model(ids)
        torch.testing.assert_close(run_poisoned(imported, ids), want, rtol=rtol, atol=atol)


# -- on a GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
def test_gpu_decoder_dynamic_import_fp32():
    torch.manual_seed(0)
    model = Decoder().cuda().eval()
    ids = torch.randint(0, 32, (3, 5), device="cuda")
    imported = from_torch(model, (ids,), dynamic_shapes={"ids": dims()}, allow_tf32=False)
    plan = imported.plan("cuda")
    assert isinstance(plan, DynamicPlan)
    for shape in SHAPES:
        ids = torch.randint(0, 32, shape, device="cuda")
        with torch.no_grad():
            want = model(ids)
        pack = imported.variant_pack(ids)
        for t in imported.outputs:
            pack[t.known_uid()].fill_(math.nan)
        plan.execute(pack)
        torch.cuda.synchronize()
        torch.testing.assert_close(imported.unpack(pack), want, rtol=2e-3, atol=2e-3)
    assert plan.stats["shape_plans"] >= len(set(SHAPES))
