"""How a convolution or matmul runs in torch, from its operand and output types.

integer operands                      float64 (exact while partial sums stay below 2**53; torch
                                      has no general integer conv/GEMM on CUDA); on the CPU,
                                      matmul uses int64
fp16/bf16 operands, output of that    that type: tensor cores with fp32 accumulation (CUDA only,
same type (`tensor_cores`)            see `Call.tensor_cores`)
operands of at most 10 mantissa bits  float32 with TF32 allowed: TF32 holds fp16/bf16/fp8 values
(fp16/bf16/fp8), any other output     exactly and tensor cores accumulate in fp32, so this is
(`tensor_cores`)                      the exact fp32 result at tensor-core speed
anything else                         the compute type with TF32 off (exact fp32 / fp64)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from ...core.dtypes import DataType
from ...core.tensor import TensorDesc
from ..shared.native_gemm import NATIVE_16
from .common import Call
from .precision import set_cudnn_tf32

# The TF32 path relies on cuDNN/cuBLAS computing products of TF32-representable values exactly and
# accumulating in fp32 (implicit-GEMM algorithms do; a transform-based algorithm would not be exact):
# switch it off here if the GPU tests of fp16/bf16 operands with fp32 outputs show otherwise.
TF32_FOR_EXACT_INPUTS = True
_TF32_EXACT = frozenset({DataType.HALF, DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2})


def plan(call: Call, a: TensorDesc, b: TensorDesc, out: TensorDesc, *, int_dtype: Any = None) -> tuple[Any, bool]:
    """(torch dtype to run in, whether TF32 may be used) for operands `a`, `b` and output `out`."""
    import torch

    if a.data_type.is_integer or not a.data_type.is_floating:
        return (int_dtype or torch.float64), False
    if call.tensor_cores and call.compute is torch.float32:
        if a.data_type in NATIVE_16 and a.data_type is b.data_type is out.data_type:
            return a.data_type.to_torch(), False
        if TF32_FOR_EXACT_INPUTS and a.data_type in _TF32_EXACT and b.data_type in _TF32_EXACT:
            return torch.float32, True
    return call.compute, False


def widened(a: Any, b: Any, out: Any = None) -> Any:
    """The fp32 product of fp16/bf16 CUDA tensors `a` @ `b` as cuBLAS writes it while it accumulates
    (`out_dtype=torch.float32`: exact, no fp32 copies of the operands, the tensor cores' 16-bit rate), into
    `out` where given; None where PyTorch has no such call for these shapes or this version (2-D, batched
    3-D and a 2-D B under batch axes of A only), or where `out`'s batch axes do not merge into rows."""
    import torch

    f32 = torch.float32
    if 2 < b.dim() <= a.dim() and all(d == 1 for d in b.shape[:-2]):
        b = b.reshape(b.shape[-2:])  # (a weight broadcast over A's batch)
    try:
        if a.dim() == 2 and b.dim() == 2:
            return torch.mm(a, b, out_dtype=f32, out=out)
        if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
            return torch.bmm(a, b, out_dtype=f32, out=out)
        if a.dim() > 2 and b.dim() == 2:
            rows = a.reshape(-1, a.shape[-1])
            if out is None:
                return torch.mm(rows, b, out_dtype=f32).reshape(*a.shape[:-1], b.shape[-1])
            merged = _rows_view(out)
            if merged is None:
                return None  # (out's batch axes do not merge: the caller's general path)
            torch.mm(rows, b, out_dtype=f32, out=merged)
            return out
    except (TypeError, NotImplementedError):
        return None  # (a PyTorch without out_dtype, or a device without the call)
    return None


def _rows_view(out: Any) -> Any:
    """`out` with its batch axes merged into rows, as a view of it; None where its strides do not allow."""
    try:
        return out.view(-1, out.shape[-1])
    except RuntimeError:
        return None


def uses_tensor_cores(a: DataType, b: DataType, out: DataType, wide: bool) -> bool:
    """Whether `plan` picks a tensor-core path (with `tensor_cores` on) for these types."""
    if wide or not a.is_floating:
        return False
    return (a in NATIVE_16 and a is b is out) or (TF32_FOR_EXACT_INPUTS and a in _TF32_EXACT and b in _TF32_EXACT)


@contextmanager
def _tf32() -> Iterator[None]:
    """TF32 allowed for cuDNN convs and cuBLAS fp32 GEMMs, restored afterwards (see precision.py)."""
    import torch

    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # inconsistent legacy/new TF32 flags of the caller: leave them, stay exact
        yield
        return
    matmul = torch.backends.cuda.matmul
    old_matmul = matmul.fp32_precision if hasattr(matmul, "fp32_precision") else None
    undo: list[Any] = []
    set_cudnn_tf32(torch, True, undo)
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(legacy)
        if old_matmul is not None:
            matmul.fp32_precision = old_matmul
        for restore in reversed(undo):
            restore()


def math_mode(call: Call, allow_tf32: bool) -> Any:
    """The context a GEMM-class call runs in: TF32 allowed (CUDA, exact inputs), else as pinned."""
    return _tf32() if allow_tf32 and call.device.type == "cuda" else nullcontext()
