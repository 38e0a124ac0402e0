"""from_torch on what real models' forwards contain: torch.export's wrapper higher-order ops (no_grad
and autocast(enabled=False) regions), masks built in place from constants (Swin's shifted windows),
the ops that build masks and positions (bool and/or/xor, diff, indexing and gather by arange
positions), untranslated ops on buffers computed at bind time, errors that name the module and the
source line, and the float32 precision read from PyTorch's settings."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.config import NumericalNote

torch = pytest.importorskip("torch")
nn = torch.nn


def _check(model, *inputs, rtol=1e-12):
    imported = og.from_torch(model, inputs)
    assert not imported.report.custom_ops, imported.report
    torch.testing.assert_close(imported.run(*inputs), model(*inputs), rtol=rtol, atol=rtol)
    return imported


class Rotary(nn.Module):
    """A no_grad region reading a buffer (transformers' rotary embedding) and an autocast-off region."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)
        self.register_buffer("freq", torch.linspace(0.1, 1.0, 4, dtype=torch.float64))

    def forward(self, x):
        with torch.no_grad():
            table = (torch.arange(x.shape[0], dtype=torch.float64)[:, None] * self.freq).cos()
        with torch.autocast("cpu", enabled=False):
            y = self.lin(x) * table
        return y.sin()


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_wrapper_regions_are_inlined(mode):
    model = getattr(Rotary(), mode)()
    x = torch.randn(6, 4, dtype=torch.float64)
    program = torch.export.export(model, (x,), strict=False)
    if mode == "train":  # the training IR keeps the regions as higher-order ops
        assert any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in program.graph.nodes)
    _check(model, x)


def test_no_grad_region_on_parameters_is_noted():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, dtype=torch.float64))

        def forward(self, x):
            with torch.no_grad():
                s = self.w * 2
            return x * s

    imported = _check(M().train(), torch.randn(3, 4, dtype=torch.float64))
    assert any("torch.no_grad() region" in n and "differentiates through it" in n for n in imported.report.notes)


def test_enabled_autocast_region_is_refused_with_its_module_and_line():
    class Inner(nn.Module):
        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.mm(x, x)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Inner()

        def forward(self, x):
            return self.block(x) + 1

    with pytest.raises(og.UnsupportedGraphError, match="import.autocast") as err:
        og.from_torch(M().train(), (torch.randn(4, 4),))
    assert "in module 'block' (Inner)" in str(err.value)
    assert "test_torch_import_real.py:" in str(err.value)


def test_control_flow_op_names_its_module():
    class Branch(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Branch()])

        def forward(self, x):
            return self.layers[0](x)

    with pytest.raises(og.UnsupportedGraphError, match="import.higher_order") as err:
        og.from_torch(M(), (torch.randn(3),))
    assert "in module 'layers.0' (Branch)" in str(err.value)


def _window_mask(h, w, window, shift):
    """torchvision's shifted-window mask: region numbers written into slices of new_zeros."""
    mask = torch.zeros((h, w))
    count = 0
    for hs in ((0, -window), (-window, -shift), (-shift, None)):
        for ws in ((0, -window), (-window, -shift), (-shift, None)):
            mask[hs[0] : hs[1], ws[0] : ws[1]] = count
            count += 1
    return mask


class ShiftedWindows(nn.Module):
    def forward(self, x):
        mask = x.new_zeros((x.shape[-2], x.shape[-1]))  # written in place: a constant at import
        count = 0
        for hs in (slice(0, -4), slice(-4, -2), slice(-2, None)):
            for ws in (slice(0, -4), slice(-4, -2), slice(-2, None)):
                mask[hs, ws] = count
                count += 1
        return x + mask * 10.0


def test_in_place_writes_into_views_of_a_fresh_tensor_are_folded():
    x = torch.randn(2, 8, 8, dtype=torch.float64)
    imported = _check(ShiftedWindows(), x)
    assert imported.report.counts().get("constant", 0) >= 1
    assert not any(n.kind == "custom" for n in imported.graph.final.nodes)
    torch.testing.assert_close(imported.run(torch.zeros_like(x))[0], _window_mask(8, 8, 4, 2).double() * 10)


def test_write_of_an_input_into_a_view_is_still_refused_with_its_line():
    class M(nn.Module):
        def forward(self, x):
            buf = torch.zeros(4, 4, dtype=x.dtype)
            buf[1:3] = x  # a non-constant value into a view, the base read afterwards
            return buf * 2

    with pytest.raises(og.UnsupportedGraphError, match="import.view_mutation") as err:
        og.from_torch(M(), (torch.randn(2, 4),))
    assert "test_torch_import_real.py:" in str(err.value)


def test_bool_logic_and_diff():
    class M(nn.Module):
        def forward(self, a, b, x, k):
            m = (a & b) | (a ^ ~b)
            m = torch.bitwise_or(m, torch.logical_xor(a, b))
            d = torch.diff(x, dim=1) + torch.diff(x, n=2, dim=1, prepend=x[:, :2]).sum()
            return torch.where(m, d[:, :4].sum(1, keepdim=True), -1.0), torch.diff(k, dim=-1), torch.diff(a, dim=1)

    a, b = torch.rand(3, 4) > 0.5, torch.rand(3, 4) > 0.4
    x, k = torch.randn(3, 5, dtype=torch.float64), torch.randint(0, 9, (3, 5))
    _check(M(), a, b, x, k)


def test_index_and_gather_at_arange_positions_are_views():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("types", torch.zeros(1, 16, dtype=torch.long))

        def forward(self, mask, x):
            b, s = mask.shape
            rows = torch.arange(b)[:, None, None, None]
            cols = torch.arange(s)[None, None, None, :]
            pad = mask.bool()[rows, cols]  # [B, 1, 1, S], transformers' padding mask
            t = x[torch.arange(s - 1, -1, -2)]  # every other row backwards: not a view with positive steps
            g = torch.gather(x, 1, torch.arange(2)[None].expand(s, 2) + 1)
            types = torch.gather(self.types.expand(b, -1), 1, torch.arange(s)[None].expand(b, s))
            return pad.to(x.dtype) * 2 + types[:, None, None, :], g.sum() + t.sum()

    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    x = torch.randn(6, 5, dtype=torch.float64)
    imported = og.from_torch(M(), (mask, x))
    custom = [e.target for e in imported.report.custom_ops]
    assert custom == ["aten.index.Tensor"], imported.report  # the backwards rows only
    views = {n.kind for n in imported.graph.final.nodes if n.name.startswith(("index.", "gather"))}
    assert views and views <= {"slice", "reshape", "transpose"}, views
    got = imported.run(mask, x)
    want = M()(mask, x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_untranslated_op_on_buffers_is_computed_at_bind_time():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ids", torch.tensor([3, 1, 2, 0]))

        def forward(self, x):
            return x * torch.argsort(self.ids).to(x.dtype)

    model = M()
    x = torch.randn(2, 4, dtype=torch.float64)
    imported = _check(model, x)
    assert imported.report.counts().get("derived") == 2  # argsort, and the cast of its result
    model.ids.copy_(torch.tensor([0, 1, 3, 2]))  # a changed buffer is recomputed
    torch.testing.assert_close(imported.run(x), model(x))


def test_fp32_precision_follows_pytorch_and_build_options():
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    before = torch.get_float32_matmul_precision()
    try:
        imported = og.from_torch(model, (x,))
        assert not imported.allow_tf32
        assert any("full precision" in n for n in imported.report.notes)
        options = imported.numeric_options(deselect_numeric_notes=["TENSOR_CORE"])
        assert options["deselect_numeric_notes"] == ["TENSOR_CORE", NumericalNote.DOWN_CONVERT_INPUTS]
        assert imported.numeric_options(allow_tf32=True) == {}
        torch.set_float32_matmul_precision("high")
        assert og.from_torch(model, (x,)).allow_tf32
        assert not og.from_torch(model, (x,), allow_tf32=False).allow_tf32
    finally:
        torch.set_float32_matmul_precision(before)
    torch.testing.assert_close(imported.run(x, allow_tf32=True), model(x))


def test_gather_and_index_at_computed_positions_are_embeddings():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("types", torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]]))
            self.register_buffer("index", torch.tensor([[2, 0], [1, 1], [0, 3]]))
            self.table = nn.Parameter(torch.randn(5, 3, dtype=torch.float64))

        def forward(self, ids, x):
            positions = torch.cumsum((ids != 0).int(), dim=1) * (ids != 0).long()  # RoBERTa's position ids
            types = torch.gather(self.types.expand(ids.shape[0], -1), 1, positions)
            bias = self.table[self.index.view(-1)].view(3, 2, 3)  # a relative-position bias table
            return x * types.unsqueeze(-1).to(x.dtype) + bias.sum(), positions

    ids = torch.tensor([[5, 2, 0, 0, 0], [1, 1, 1, 1, 1]])
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    model = M()
    imported = og.from_torch(model, (ids, x))
    assert not imported.report.custom_ops, imported.report
    kinds = [n.kind for n in imported.graph.final.nodes]
    assert kinds.count("embedding") == 2 and "cumsum" in kinds
    for got, want in zip(imported.run(ids, x), model(ids, x)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pattern", ["causal-bool", "causal-float", "window-bool", "all-true", "banded"])
def test_constant_attention_masks_become_the_ops_own(pattern):
    """A mask built from arange (transformers' without padding) is the sdpa op's causal / sliding-window
    mask, no mask tensor; another pattern stays a mask."""
    F = torch.nn.functional

    class M(nn.Module):
        def forward(self, q, k, v):
            s = q.shape[-2]
            i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
            allowed = {
                "causal-bool": j <= i,
                "causal-float": j <= i,
                "window-bool": (j <= i) & (j > i - 3),
                "all-true": j >= 0,
                "banded": (j - i).abs() <= 1,
            }[pattern]
            mask = allowed[None, None].expand(q.shape[0], 1, s, s)
            if pattern == "causal-float":
                mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, torch.finfo(q.dtype).min)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(2, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    imported = _check(M(), q, k, v)
    (node,) = [n for n in imported.graph.final.nodes if n.kind == "sdpa"]
    op = node.op
    recognised = pattern != "banded"
    assert len(imported.bound_inputs) == (0 if recognised else 1)  # the mask, when it stays one
    assert op.use_causal_mask == (pattern not in ("all-true", "banded"))
    assert op.sliding_window_length == (3 if pattern == "window-bool" else None)


def test_zero_pads_before_convolutions_become_their_padding():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, stride=2, dtype=torch.float64)

        def forward(self, x):
            same = self.conv(torch.nn.functional.pad(x, (0, 1, 1, 2)))  # TF 'same': asymmetric zeros
            kept = torch.nn.functional.pad(x, (1, 1), value=2.0)  # not zeros: a concatenation
            return same.sum() + kept.sum(), kept

    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    imported = _check(M(), x)
    kinds = [n.kind for n in imported.graph.final.nodes]
    assert kinds.count("concatenate") == 1
    (conv,) = [n for n in imported.graph.final.nodes if n.kind == "conv_fprop"]
    assert (list(conv.op.pre_padding), list(conv.op.post_padding)) == ([1, 0], [2, 1])


def test_computations_on_buffers_alone_run_at_bind_time():
    """A rotary table from a buffer (inv_freq) and constant positions: computed when bound (and again
    when the buffer changes), no graph ops."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 4, dtype=torch.float64))

        def forward(self, x):
            freqs = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * self.inv_freq
            table = torch.cat([freqs, freqs], -1)
            return x * table.cos() + x.roll(1, -1) * table.sin()

    model = M()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    imported = _check(model, x)
    on_x = [n for n in imported.graph.final.nodes if n.kind != "concatenate"]  # (the roll of x)
    assert {n.kind for n in on_x} <= {"pointwise", "slice"} and len(on_x) == 5, on_x  # 2 slices, 2 mul, add
    assert imported.report.counts().get("derived", 0) >= 3  # the product, the cat, cos, sin
    model.inv_freq.mul_(3.0)
    torch.testing.assert_close(imported.run(x), model(x), rtol=1e-12, atol=1e-12)
