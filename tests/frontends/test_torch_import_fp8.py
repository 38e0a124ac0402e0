"""torch._scaled_mm (cuBLAS's fp8 GEMM; torchao's float8 linears) through from_torch and torch.compile's
backend: per-tensor and row-wise scales, a bias, bf16 and fp32 results, against float64 over the fp8 values;
the product, scales and bias one generated kernel under the interpreter; scale_result left to PyTorch, the
report saying why."""

from __future__ import annotations

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
F8 = torch.float8_e4m3fn


class ScaledLinear(torch.nn.Module):
    """y = x8 @ w8^T * scale_x * scale_w (+ bias): w stored [N, K] row-major, read column-major."""

    def __init__(self, rowwise: bool, bias: bool, out_dtype=torch.bfloat16, n: int = 24, k: int = 32) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randn(n, k, generator=gen).to(F8))
        self.register_buffer("sw", torch.rand(1, n, generator=gen) + 0.5 if rowwise else torch.tensor(0.25))
        self.bias = torch.nn.Parameter(torch.randn(n, generator=gen).to(out_dtype)) if bias else None
        self.out_dtype = out_dtype

    def forward(self, x, sx):
        return torch._scaled_mm(x, self.w.t(), scale_a=sx, scale_b=self.sw, bias=self.bias, out_dtype=self.out_dtype)


def _inputs(rowwise: bool, m: int = 16, k: int = 32):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(m, k, generator=gen).to(F8)
    sx = torch.rand(m, 1, generator=gen) + 0.5 if rowwise else torch.tensor(0.5)
    return x, sx


def _want(model, x, sx):
    y = (x.double() @ model.w.double().t()) * sx.double() * model.sw.double()
    return y + model.bias.double() if model.bias is not None else y


@pytest.mark.parametrize(
    "rowwise,bias,out_dtype",
    [(False, False, torch.bfloat16), (True, True, torch.bfloat16), (True, False, torch.float32)],
    ids=["tensorwise", "rowwise_bias", "fp32_out"],
)
def test_scaled_mm_imports(rowwise, bias, out_dtype):
    model = ScaledLinear(rowwise, bias, out_dtype)
    x, sx = _inputs(rowwise)
    imported = og.from_torch(model, (x, sx))
    got = imported.run(x, sx)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert got.dtype == out_dtype
    want = _want(model, x, sx)
    tol = 2.0**-8 if out_dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.interpreter
def test_scaled_mm_is_one_generated_kernel():
    model = ScaledLinear(rowwise=True, bias=True)
    x, sx = _inputs(True)
    imported = og.from_torch(model, (x, sx))
    plan = imported.plan("cpu", engines=["triton"])
    assert [s.config.knob("template") for s in plan.steps] == ["matmul"], plan.describe()


def test_scaled_mm_through_the_torch_compile_backend():
    torch._dynamo.reset()
    model = ScaledLinear(rowwise=False, bias=True)
    x, sx = _inputs(False)
    try:
        with torch.no_grad():  # (_scaled_mm has no autograd formula in PyTorch: inference, as torchao runs it)
            got = torch.compile(model, backend=og.torch_backend)(x, sx)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got.double(), _want(model, x, sx), rtol=2.0**-8, atol=2.0**-8)


def test_scale_result_is_left_to_pytorch_with_the_reason():
    class Quantized(ScaledLinear):
        def forward(self, x, sx):
            return torch._scaled_mm(x, self.w.t(), scale_a=sx, scale_b=self.sw, scale_result=sx, out_dtype=F8)

    model = Quantized(False, False)
    x, sx = _inputs(False)
    imported = og.from_torch(model, (x, sx))
    report = str(imported.report)
    assert "aten._scaled_mm.default [custom]" in report and "scale_result" in report, report
    got = imported.run(x, sx)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert torch.equal(got.view(torch.uint8), model(x, sx).view(torch.uint8))  # (PyTorch ran it)
