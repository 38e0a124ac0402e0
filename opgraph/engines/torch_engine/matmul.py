"""Matmul in torch: torch.matmul over the last two axes, batch axes broadcast (cuBLAS on CUDA).

Float operands compute in float32 (exact fp32 on CUDA: TF32 off), or natively in fp16/bf16 when
`native_low_precision` is on and A, B and C all have that type (tensor cores, fp32 accumulation:
reduced-precision reductions are switched off around the call). Integer operands accumulate
exactly: in int64 on the CPU (torch's CPU matmul takes integers), in float64 on CUDA (cuBLAS has no
general integer GEMM), exact while partial sums stay below 2**53, as in the reference.
"""

from __future__ import annotations

from typing import Any

from ...dtypes import DataType
from .common import Call, implements

_LOW = (DataType.HALF, DataType.BFLOAT16)


@implements("matmul")
def matmul(call: Call) -> list[Any]:
    import torch

    a, b, c = call.desc("A"), call.desc("B"), call.out("C")
    assert a is not None and b is not None and c is not None
    if a.data_type.is_integer:
        dtype = torch.float64 if call.device.type == "cuda" else torch.int64
    elif (call.native_low_precision and call.compute is torch.float32 and a.data_type in _LOW
          and a.data_type is b.data_type is c.data_type):
        dtype = a.data_type.to_torch()
    else:
        dtype = call.compute
    return [torch.matmul(call.tensor("A", dtype), call.tensor("B", dtype))]
