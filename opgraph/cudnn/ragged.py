"""cuDNN's ragged tensors in opgraph's terms, for `cudnn.pygraph` (see attention docs, "cuDNN's names").

cuDNN declares a packed (THD) tensor with padded logical dims [B, H, S, w] and strides whose batch
stride is ignored: element (b, h, i, x) lies at ragged_offset[b] + h*sH + i*sS + x*sX (offsets count
elements). opgraph's attention ops take the same memory as a [1, H, B*S, w] tensor of rows with the
offsets divided by sS (the op's `ragged_offset_strides`). `to_rows` rewrites a declared tensor so.

At execute the user's buffer is whatever cuDNN would have accepted: a pointer to the packed rows,
often smaller than B*S rows (a [total_tokens, H, w] tensor). `bind` gives the plan a view of it with
the rewritten dims where it spans them, else a zero-padded copy; an output is computed into a scratch
tensor and only the rows of the sequences are copied into the user's buffer afterwards (`finish`),
so its other rows keep their contents, as with cuDNN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import VariantPackError
from ..core.tensor import Tensor, TensorDesc, storage_extent, strided_view


@dataclass(frozen=True)
class RaggedLayout:
    """One packed tensor of an attention op: its UID, its ragged offset's UID, the UID of the lengths
    of its sequences (None: every row of a page table), the rows a sequence may have and the stride
    of a row in elements; output or input."""

    uid: int
    offset_uid: int
    lens_uid: int | None
    max_rows: int
    row_stride: int
    is_output: bool
    declared_dim: tuple[int, ...] = ()  # the dims declared to cuDNN ([B, H, S, w])


def to_rows(t: Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int, int] | None:
    """(new dims, new strides, max rows S, row stride) of a declared cuDNN ragged tensor [B, H, S, w],
    or None when its dims or strides are not known yet."""
    dim, stride = t._dim, t._stride
    if dim is None or stride is None or len(dim) != 4 or len(stride) != 4:
        return None
    b, h, s, w = dim
    rows = b * s
    lead = max(h * stride[1], rows * stride[2], w * stride[3], 1)
    return (1, h, rows, w), (lead, stride[1], stride[2], stride[3]), s, stride[2]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _span(value: Any) -> int:
    """Elements from the buffer's first element to its last (its own extent; strides >= 0)."""
    return storage_extent(
        tuple(value.shape), tuple(abs(int(s)) for s in (value.stride() if _is_torch(value) else _np_strides(value)))
    )


def _np_strides(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def _flat(value: Any, n: int) -> Any:
    """A 1-D view of the first n elements of the buffer's memory (from its first element)."""
    if _is_torch(value):
        return value.as_strided((n,), (1,), value.storage_offset())
    return strided_view(value, (n,), (1,))


def bind(value: Any, desc: TensorDesc) -> Any:
    """The user's buffer of a packed input as a tensor of `desc` (a view, or a zero-padded copy)."""
    if isinstance(value, int) or not hasattr(value, "shape"):
        raise VariantPackError(
            f"a packed (ragged) tensor is bound to a {type(value).__name__}",
            tensor=desc,
            rule="cudnn.ragged_buffer",
            hint="bind a PyTorch tensor or NumPy array",
        )
    need = storage_extent(desc.dim, desc.stride)
    have = _span(value)
    if have >= need:
        flat = _flat(value, need)
    else:
        flat = _zeros_like(value, need)
        flat[:have] = _flat(value, have)
    return _view(flat, desc)


def scratch(value: Any, desc: TensorDesc) -> Any:
    """A zero tensor of `desc` on the buffer's device, for a packed output."""
    return _view(_zeros_like(value, storage_extent(desc.dim, desc.stride)), desc)


def _zeros_like(value: Any, n: int) -> Any:
    if _is_torch(value):
        import torch

        return torch.zeros(n, dtype=value.dtype, device=value.device)
    return np.zeros(n, dtype=value.dtype)


def _view(flat: Any, desc: TensorDesc) -> Any:
    if _is_torch(flat):
        return flat.as_strided(desc.dim, desc.stride)
    return strided_view(flat, desc.dim, desc.stride)


def finish(user: Any, computed: Any, layout: RaggedLayout, offsets: Any, lens: Any, desc: TensorDesc) -> None:
    """Copy the rows of the sequences from `computed` (a tensor of `desc`) into the user's buffer."""
    h, rows, w = desc.dim[1], desc.dim[2], desc.dim[3]
    have = _span(user)
    if _is_torch(user):
        import torch

        dev = user.device
        off = torch.as_tensor(offsets, device=dev).reshape(-1).to(torch.int64)
        n = off.shape[0] if lens is None else torch.as_tensor(lens).reshape(-1).shape[0]
        start = off[:n] // layout.row_stride
        count = (
            torch.full_like(start, layout.max_rows)
            if lens is None
            else torch.as_tensor(lens, device=dev).reshape(-1)[:n].to(torch.int64).clamp(0, layout.max_rows)
        )
        r = torch.arange(rows, device=dev)
        covered = ((r[None, :] >= start[:, None]) & (r[None, :] < start[:, None] + count[:, None])).any(0)
        idx = (
            r[:, None, None] * desc.stride[2]
            + torch.arange(h, device=dev)[None, :, None] * desc.stride[1]
            + torch.arange(w, device=dev)[None, None, :] * desc.stride[3]
        )
        keep = covered[:, None, None] & (idx < have)
        src = computed[0].permute(1, 0, 2)  # [rows, H, w]
        _flat(user, have).index_put_((idx[keep],), src[keep].to(user.dtype))
        return
    _finish_numpy(user, computed, layout, offsets, lens, desc, have)


def _finish_numpy(
    user: np.ndarray, computed: Any, layout: RaggedLayout, offsets: Any, lens: Any, desc: TensorDesc, have: int
) -> None:
    h, rows, w = desc.dim[1], desc.dim[2], desc.dim[3]
    off = np.asarray(offsets).reshape(-1).astype(np.int64)
    n = off.shape[0] if lens is None else np.asarray(lens).reshape(-1).shape[0]
    start = off[:n] // layout.row_stride
    count = (
        np.full_like(start, layout.max_rows)
        if lens is None
        else np.clip(np.asarray(lens).reshape(-1)[:n].astype(np.int64), 0, layout.max_rows)
    )
    r = np.arange(rows)
    covered: np.ndarray = np.any(
        (r[None, :] >= start[:, None]) & (r[None, :] < start[:, None] + count[:, None]), axis=0
    )
    idx = (
        r[:, None, None] * desc.stride[2]
        + np.arange(h)[None, :, None] * desc.stride[1]
        + np.arange(w)[None, None, :] * desc.stride[3]
    )
    keep = covered[:, None, None] & (idx < have)
    src = np.moveaxis(np.asarray(computed)[0], 1, 0)
    _flat(user, have)[idx[keep]] = src[keep]


def prepare(
    layouts: Mapping[int, RaggedLayout], descs: Mapping[int, TensorDesc], pack: dict[Any, Any]
) -> Callable[[], None]:
    """Replace the packed tensors' buffers in `pack` (keyed by UID) by what the plan binds; returns
    the function that copies the outputs' sequence rows back into the user's buffers afterwards."""
    todo = []
    for uid, layout in layouts.items():
        if uid not in pack:
            continue
        user, desc = pack[uid], descs[uid]
        if layout.is_output:
            pack[uid] = scratch(user, desc)
            todo.append((user, pack[uid], layout, desc))
        else:
            pack[uid] = bind(user, desc)

    def done() -> None:
        for user, computed, layout, desc in todo:
            finish(
                user,
                computed,
                layout,
                pack.get(layout.offset_uid),
                None if layout.lens_uid is None else pack.get(layout.lens_uid),
                desc,
            )

    return done


__all__ = ["RaggedLayout", "bind", "finish", "prepare", "scratch", "to_rows"]
