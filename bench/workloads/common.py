"""Small helpers the workload modules share."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import opgraph as og

from ..case import Ctx

DT = og.DataType
TORCH_TO_OG = {"float16": DT.HALF, "bfloat16": DT.BFLOAT16, "float32": DT.FLOAT}


def torch_dtype(name: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def short(dtype: str) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype]


def nbytes(*tensors: Any) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def cl(t: Any) -> Any:
    import torch

    return t.to(memory_format=torch.channels_last)


def f64(*ts: Any) -> list[Any]:
    """float64 copies (contiguous) for references."""
    import torch

    return [t.detach().to(torch.float64).contiguous() for t in ts]


def lazy(fn: Callable[[], Sequence[Any]]) -> Callable[[], Sequence[Any]]:
    """A reference computed once."""
    memo: list[Sequence[Any]] = []

    def get() -> Sequence[Any]:
        if not memo:
            memo.append(fn())
        return memo[0]

    return get


def stat_shape(c: int) -> list[int]:
    return [1, c, 1, 1]


__all__ = ["Ctx", "DT", "TORCH_TO_OG", "torch_dtype", "short", "nbytes", "cl", "f64", "lazy", "stat_shape"]
