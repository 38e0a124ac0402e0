"""Matmul in torch: torch.matmul over the last two axes, batch axes broadcast (cuBLAS on CUDA), any
operand strides. Types as in gemm.py; integer operands accumulate exactly, in int64 on the CPU
(torch's CPU matmul takes integers) and in float64 on CUDA (exact while partial sums stay below
2**53, as in the reference). On CUDA an fp32 result of fp16/bf16 operands is cuBLAS's fp32 output
(gemm.widened) where PyTorch has the call for the shapes.
"""

from __future__ import annotations

from typing import Any

from ..shared.native_gemm import widening_types
from . import gemm
from .common import Call, implements


@implements("matmul")
def matmul(call: Call) -> list[Any]:
    import torch

    a, b, c = call.desc("A"), call.desc("B"), call.out("C")
    assert a is not None and b is not None and c is not None
    if call.device.type == "cuda" and call.tensor_cores and call.compute is torch.float32:
        if widening_types(a.data_type, b.data_type, c.data_type):
            product = gemm.widened(call.tensor("A", a.data_type.to_torch()), call.tensor("B", b.data_type.to_torch()))
            if product is not None:
                return [product]
    int_dtype = torch.float64 if call.device.type == "cuda" else torch.int64
    dtype, tf32 = gemm.plan(call, a, b, c, int_dtype=int_dtype)
    with gemm.math_mode(call, tf32):
        return [torch.matmul(call.tensor("A", dtype), call.tensor("B", dtype))]
