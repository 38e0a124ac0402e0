"""cuDNN's bit-packed booleans: a BOOLEAN tensor bound to a uint8 (or int8) buffer of an eighth of its
elements holds eight values per byte, the first in the lowest bit, in the tensor's memory order (a ReLU
bitmask [N, C, H, W] channels-last is a [N, C/8, H, W] byte tensor). The plan computes on a one-byte-per-
value scratch tensor; an input is unpacked into it before the run, an output packed from it after."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..core.dtypes import DataType
from ..core.errors import VariantPackError
from ..core.tensor import TensorDesc

_BYTES = ("torch.uint8", "torch.int8")


def is_packed(desc: TensorDesc, value: Any) -> bool:
    """Whether `value` holds `desc`'s booleans bit-packed: a torch byte tensor of an eighth of the elements."""
    if desc.data_type is not DataType.BOOLEAN or str(getattr(value, "dtype", "")) not in _BYTES:
        return False
    n = desc.numel
    return n % 8 == 0 and value.numel() * 8 == n and value.numel() != n


def _memory_order(dim: tuple[int, ...] | list[int], stride: tuple[int, ...] | list[int]) -> list[int]:
    return sorted(range(len(dim)), key=lambda i: (-stride[i], i))


def _flat(t: Any, what: str, desc: TensorDesc) -> Any:
    """`t`'s elements in its memory order, as a view (a dense tensor in some axis order)."""
    view = t.permute(_memory_order(t.shape, t.stride()))
    if not view.is_contiguous():
        raise VariantPackError(
            f"the bit-packed {what} buffer of {desc.label()} is not dense",
            rule="pack.bitmask",
            hint="pass a dense uint8 tensor (contiguous in some axis order)",
        )
    return view.reshape(-1)


def scratch(desc: TensorDesc, like: Any) -> Any:
    """A one-byte-per-value boolean tensor in `desc`'s layout, on `like`'s device."""
    import torch

    return torch.empty_strided(tuple(desc.dim), tuple(desc.stride), dtype=torch.bool, device=like.device)


def _weights(like: Any) -> Any:
    """The bits' values 1, 2, ..., 128 on `like`'s device (made once per device)."""
    return _weights_on(like.device)


@functools.lru_cache(maxsize=16)
def _weights_on(device: Any) -> Any:
    import torch

    return torch.tensor([1 << b for b in range(8)], dtype=torch.int32, device=device)


def unpack(desc: TensorDesc, packed: Any) -> Any:
    """The boolean tensor `packed` holds, in `desc`'s layout."""
    out = scratch(desc, packed)
    w = _weights(packed)
    bits = _flat(packed, "input", desc).to(w.dtype).view(-1, 1) & w
    _flat(out, "scratch", desc).copy_((bits != 0).reshape(-1))
    return out


def pack_into(desc: TensorDesc, values: Any, packed: Any) -> None:
    """Write the booleans `values` (in `desc`'s layout) bit-packed into `packed`."""
    w = _weights(values)
    byte = (_flat(values, "scratch", desc).view(-1, 8).to(w.dtype) * w).sum(dim=1)
    _flat(packed, "output", desc).copy_(byte.to(packed.dtype))


def bind(desc: TensorDesc, value: Any, is_output: bool, finish: list[Callable[[], None]] | None) -> Any:
    """What the plan binds for a bit-packed buffer: the unpacked input, or a scratch output whose packing
    into `value` is appended to `finish` (run after the plan; an input appends a no-op, so the caller
    sees that PyTorch's stream did work the plan's stream must be ordered with)."""
    if finish is None:
        raise VariantPackError(
            f"{desc.label()} is bound to a bit-packed buffer, which a captured CUDA graph cannot (un)pack",
            rule="pack.bitmask",
            hint="bind a torch.bool tensor of the tensor's dims for CUDA graphs",
        )
    if not is_output:
        finish.append(lambda: None)
        return unpack(desc, value)
    out = scratch(desc, value)
    finish.append(lambda: pack_into(desc, out, value))
    return out


__all__ = ["bind", "is_packed", "pack_into", "unpack"]
