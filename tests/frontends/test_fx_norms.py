"""RMSNorms written out as ops (Hugging Face's LlamaRMSNorm and its kin) imported as one rmsnorm op
(frontends/fx_norms.py): the values PyTorch's, one rownorm kernel, and the look-alikes left as they are."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import opgraph as og  # noqa: E402
from opgraph.frontends.fx_norms import recognise_rms_norms  # noqa: E402


class WrittenOut(torch.nn.Module):
    """LlamaRMSNorm's forward, then a projection; `variant` changes one thing about the norm."""

    def __init__(self, d: int = 32, variant: str = "") -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(d))
        self.proj = torch.nn.Linear(d, 16, bias=False)
        self.variant = variant

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        square = h * h if self.variant == "mul" else h.pow(2)
        if self.variant == "first_axis":
            variance = square.mean(0, keepdim=True)
        elif self.variant == "no_keepdim":
            variance = square.mean(-1).unsqueeze(-1)
        else:
            variance = square.mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + 1e-6)
        y = self.proj(self.weight * h.to(dtype))
        if self.variant == "variance_read":  # the variance is read again: not only the norm's
            return y, variance
        return y


def _imported(module, x):
    with torch.no_grad():
        want = module(x)
        imp = og.from_torch(module, (x,))
        got = imp.run(x)
    return imp, want, got


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["", "mul"])
def test_a_written_out_rmsnorm_is_one_op_and_computes_as_pytorch(dtype, variant):
    torch.manual_seed(0)
    module = WrittenOut(variant=variant).to(dtype)
    x = torch.randn(2, 8, 32).to(dtype)
    imp, want, got = _imported(module, x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert any("1 RMSNorm(s)" in n for n in imp.report.notes), imp.report.notes
    kinds = [n.kind for n in imp.graph.final.nodes]
    assert "rmsnorm" in kinds and "reduction" not in kinds, kinds
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < tol
    plan = imp.graph.build(device="cpu", engines=["triton", "reference"])
    assert [s.config.knob("template", "") for s in plan.steps].count("rownorm") == 1, plan.describe()


@pytest.mark.parametrize("variant", ["first_axis", "variance_read"])
def test_look_alikes_stay_as_written(variant):
    """A mean over a leading axis is no RMSNorm; a variance read elsewhere too must stay computed."""
    torch.manual_seed(0)
    module = WrittenOut(variant=variant)
    x = torch.randn(2, 8, 32)
    imp, want, got = _imported(module, x)
    assert not any("RMSNorm(s)" in n for n in imp.report.notes)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, (list, tuple)) else (got,)
    for w, g in zip(want, got):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6)


def test_the_rewrite_leaves_an_exported_graph_that_runs_as_before():
    """On the FX graph alone: the recognised graph computes what the exported program computed."""
    torch.manual_seed(0)
    module = WrittenOut(variant="no_keepdim")
    x = torch.randn(4, 32)
    program = torch.export.export(module, (x,))
    gm = program.module()
    before = gm(x)
    count = recognise_rms_norms(program.graph_module)
    assert count == 0  # (a mean without keepdim, unsqueezed after: not the pattern)
    module = WrittenOut()
    program = torch.export.export(module, (x,))
    assert recognise_rms_norms(program.graph_module) == 1
    targets = [str(n.target) for n in program.graph_module.graph.nodes]
    assert "aten.rms_norm.default" in targets and "aten.rsqrt.default" not in targets
    assert torch.allclose(program.module()(x), module(x), rtol=1e-5, atol=1e-6)
    assert before.shape == (4, 16)


def test_the_torch_compile_backend_recognises_them_where_the_backward_does_not_read_them(monkeypatch):
    """backend="opgraph": an inference graph's written-out RMSNorm becomes the op (as from_torch's import); a
    training forward saves the rsqrt for AOTAutograd's backward, so it is left as written; both compute as eager."""
    import opgraph.frontends.dynamo_partition as dp

    counts = []
    recognise = dp.recognise_rms_norms
    monkeypatch.setattr(dp, "recognise_rms_norms", lambda gm, notes=None: counts.append(recognise(gm, notes)))
    torch.manual_seed(0)
    module = WrittenOut().double()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=og.torch_backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-6)
    assert counts == [1]
    x.requires_grad_(True)
    compiled(x).sum().backward()
    want = torch.autograd.grad(module(x).sum(), [x, module.weight])
    torch.testing.assert_close(x.grad, want[0], rtol=1e-5, atol=1e-6)
    assert counts[1:] and set(counts[1:]) == {0}, counts
    torch._dynamo.reset()


class Norm(torch.nn.Module):
    """The norm alone: `widen` casts x to fp32 first; `after` what reads the result: "cast" (back to x's type,
    Llama's), "fp32" (a multiply in fp32, Gemma's `* (1 + w.float())`)."""

    def __init__(self, widen: bool = True, after: str = "cast", eps: float = 1e-6) -> None:
        super().__init__()
        self.widen, self.after, self.eps = widen, after, eps
        self.weight = torch.nn.Parameter(0.1 * torch.randn(16))

    def forward(self, x):
        h = x.to(torch.float32) if self.widen else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) if self.after == "cast" else h * (1.0 + self.weight.float())


def _rewritten(module, x):
    program = torch.export.export(module, (x,))
    return recognise_rms_norms(program.graph_module), program


def test_a_result_read_in_fp32_keeps_the_widening_cast():
    """Gemma's norm result is multiplied in fp32: the norm then reads the fp32 cast (its result fp32, as the graph's
    metadata says), so PyTorch running the rewritten graph computes what eager does; Llama's, cast straight back,
    reads the bf16 input (one rounding either way)."""
    torch.manual_seed(0)
    x = (3 * torch.randn(2, 5, 16)).to(torch.bfloat16)
    for after in ("fp32", "cast"):
        module = Norm(after=after)
        count, program = _rewritten(module, x)
        norm = next(n for n in program.graph_module.graph.nodes if str(n.target) == "aten.rms_norm.default")
        assert count == 1 and norm.args[0].meta["val"].dtype == (torch.float32 if after == "fp32" else torch.bfloat16)
        got, want = program.module()(x), module(x)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-6 if after == "fp32" else 1e-2, atol=1e-6)


def test_what_rmsnorm_would_compute_otherwise_stays_as_written():
    """A 16-bit x never widened (each op rounds: fp16 x of 300 squares to inf, the ops give 0 where rmsnorm's
    fp32 gives 1), a negative eps (no rmsnorm's), a 0-d x (no axis to normalise): not rewritten."""
    x16 = torch.full((2, 16), 300.0, dtype=torch.float16)
    count, program = _rewritten(Norm(widen=False, after="none"), x16)
    assert count == 0 and torch.equal(program.module()(x16), Norm(widen=False, after="none")(x16))
    assert _rewritten(Norm(eps=-0.5), torch.randn(2, 16))[0] == 0

    class Scalar(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    assert _rewritten(Scalar(), torch.tensor(2.0))[0] == 0
