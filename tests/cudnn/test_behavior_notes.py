"""Behaviour notes of opgraph.cudnn plans say how their kernels come to be. RUNTIME_COMPILATION: some
step's kernel is generated and compiled while the plan is built (Triton templates, cuDNN's runtime
fusion, the library engine's generated prologue/epilogue); never for the reference engine (NumPy on
the host) nor op-by-op PyTorch, whose kernels exist before the build. cuDNN frontend's own matmul+bias
test asserts the note for plan 0: on a GPU, opgraph's plan 0 for that graph is a generated kernel."""

from __future__ import annotations

import pytest

from opgraph import cudnn

from ..helpers import requires_cuda, requires_interpreter

torch = pytest.importorskip("torch")

RC = cudnn.behavior_note.RUNTIME_COMPILATION
COMPILING_ENGINES = ("triton", "cudnn", "library")  # engines whose configs generate or compile kernels


def _matmul_bias(handle, b, s, e, dtype, **options):
    """cuDNN frontend's matmul_bias graph: Y = X @ W + B, W and B broadcast over the batch."""
    x = torch.randn(b, s, e, dtype=dtype, device=handle.device.torch_name)
    w = torch.randn(1, e, 2 * e, dtype=dtype, device=x.device)
    bias = torch.randn(1, 1, 2 * e, dtype=dtype, device=x.device)
    g = cudnn.pygraph(
        intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT, handle=handle, **options
    )
    X, W, B = (
        g.tensor(name=n, dim=t.size(), stride=t.stride(), data_type=t.dtype)
        for n, t in (("X", x), ("W", w), ("B", bias))
    )
    Y = g.bias(name="bias", input=g.matmul(name="matmul", A=X, B=W), bias=B)
    Y.set_output(True).set_data_type(dtype)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    want = (x.double() @ w.double() + bias.double()).to(dtype)
    return g, (X, W, B, Y), (x, w, bias), want


def _execute(g, tensors, buffers, want):
    X, W, B, Y = tensors
    y = torch.full_like(want, float("nan"))
    g.execute(
        dict(zip((X, W, B, Y), (*buffers, y))), torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=y.device)
    )
    if y.is_cuda:
        torch.cuda.synchronize()
    return y


def _compiles(plan_name: str) -> bool:
    return any(part.strip().startswith(COMPILING_ENGINES) for part in plan_name.split("|"))


def test_reference_plans_are_not_runtime_compiled():
    g, tensors, buffers, want = _matmul_bias(cudnn.create_handle("cpu"), 2, 8, 16, torch.float32)
    assert g.get_plan_name_at_index(0) == "reference"
    notes = g.get_behavior_notes_for_plan_at_index(0)
    assert RC not in notes and cudnn.behavior_note.HOST_EXECUTION in notes
    g.check_support()
    g.build_plans()
    assert RC not in g.get_behavior_notes()
    y = _execute(g, tensors, buffers, want)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


@requires_interpreter
@pytest.mark.interpreter
def test_generated_kernels_are_runtime_compiled():
    g, tensors, buffers, want = _matmul_bias(cudnn.create_handle("cpu"), 1, 16, 16, torch.float32, engines=["triton"])
    assert g.get_plan_name_at_index(0).startswith("triton")
    notes = g.get_behavior_notes_for_plan_at_index(0)
    assert RC in notes and cudnn.behavior_note.INTERPRETED in notes  # Triton's interpreter on the CPU
    g.check_support()
    g.build_plans()
    assert RC in g.get_behavior_notes()
    y = _execute(g, tensors, buffers, want)
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_notes_follow_each_plans_engines_on_cuda(dtype):
    """The upstream assertions (plan 0 and the built plan are runtime compiled), and for every plan:
    the note exactly when one of its steps runs a compiling engine."""
    g, tensors, buffers, want = _matmul_bias(cudnn.create_handle("cuda"), 1, 128, 256, dtype)
    assert RC in g.get_behavior_notes_for_plan_at_index(0), g.get_plan_name_at_index(0)
    for i in range(g.get_execution_plan_count()):
        name = g.get_plan_name_at_index(i)
        assert (RC in g.get_behavior_notes_for_plan_at_index(i)) == _compiles(name), name
    g.check_support()
    g.build_plans()
    assert RC in g.get_behavior_notes()
    y = _execute(g, tensors, buffers, want)
    tol = 2e-2 if dtype is torch.bfloat16 else 1e-2
    torch.testing.assert_close(y.double(), want.double(), rtol=tol, atol=tol * 16)
