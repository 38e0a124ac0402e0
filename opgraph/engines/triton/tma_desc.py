"""Host-side TMA tensor descriptors as kernel arguments (ArgKind.DESC).

How Triton (3.6 and 3.9 alike) passes one: a kernel parameter typed `tensordesc<fp16[128, 64]>` (the
element type and the block) compiles, where the target lowers it to TMA (sm_90+: the binary's metadata
then holds a `tensordesc_meta` entry per descriptor: swizzle, element size and type, block), to the
parameters

    CUtensorMap (128 bytes, 64-byte aligned, by value: a __grid_constant__), shape (rank x i32),
    strides (rank x i64, elements)

in place of the one. Triton's launcher encodes the CUtensorMap from a `TensorDescriptor` at every launch
(`make_tensordesc_arg` in triton/backends/nvidia/driver.py: cuTensorMapEncodeTiled, the shape and strides
innermost first, strides in bytes, L2 promotion 128B, no OOB NaN fill). opgraph's native launcher does the
same once, at bind (`encode`), writes the 128 bytes into the launch's argument slot, and encodes again only
when the bound buffer moves (`TritonLauncher.rebind`); a replay of a captured CUDA graph sees the
descriptor that was current at capture, exactly as it sees a pointer argument (the runtime re-captures when
a by-value argument changes). Buffers read through the plan's address table (double buffering under CUDA
graphs) never reach here: `indirect.make_indirect` makes their descriptors in the kernel.

Triton's JIT launch (the fallback path, OPGRAPH_LAUNCH=jit) and its interpreter take a
`triton.tools.tensor_descriptor.TensorDescriptor` object instead (`descriptor_object`).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core.errors import ExecutionError
from .templates.base import Arg

MAP_BYTES = 128  # sizeof(CUtensorMap)
MAP_ALIGN = 64
# Triton's element-type enum of a descriptor (the metadata's elem_type) -> CUtensorMapDataType: equal but
# for three (TMA_DTYPE_DEVICE_TO_HOST in Triton's NVIDIA driver)
_HOST_TYPE = {8: 10, 9: 8, 10: 9}
_L2_PROMOTION_128B = 2
_INTERLEAVE_NONE = 0
_OOB_FILL_NONE = 0
_TYPE = re.compile(r"tensordesc<([^\[>]+)\[([^\]]*)\]")


def signature_type(element: str, block: Sequence[int], gluon: bool = False) -> str:
    """The kernel parameter's Triton type: `element` is Triton's name of the element type (fp16, bf16, ...).
    A Gluon kernel's (`gluon`) names its shared-memory layout too: Gluon's default for the block, the layout
    the kernel's buffers take from the parameter."""
    layout = f",{gluon_layout(element, block)}" if gluon else ""
    return f"tensordesc<{element}[{', '.join(str(b) for b in block)}]{layout}>"


def gluon_layout(element: str, block: Sequence[int]) -> str:
    """Gluon's default shared-memory layout of a descriptor's block of `element`s, as its signature spells it."""
    from triton.language import str_to_ty

    return repr(_default_layout(block, str_to_ty(element, None)))


def _default_layout(block: Sequence[int], dtype: Any) -> Any:
    """Gluon's default NVMMASharedLayout (the swizzle wgmma and TMA read) of a block of Triton `dtype` elements:
    the layout a Gluon kernel's parameter type names and its descriptor object carries."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def rank_of(ty: str) -> int:
    """The rank of a descriptor parameter's type (its block's), 0 where `ty` is not a descriptor's."""
    found = _TYPE.match(ty)
    return 0 if found is None else found.group(2).count(",") + 1


def launchable(meta: Any, count: int) -> bool:
    """Whether the native launcher can encode a kernel's `count` descriptors from its `tensordesc_meta`:
    one entry per descriptor (the kernel uses TMA), tiled (not im2col), no fp4 padding."""
    if count == 0:
        return True
    if not isinstance(meta, list) or len(meta) != count:
        return False
    need = ("swizzle", "elem_size", "elem_type", "block_size")
    return all(
        isinstance(m, Mapping) and all(k in m for k in need) and not m.get("fp4_padded") and not m.get("is_im2col")
        for m in meta
    )


def address(arg: Arg, base: int, itemsize: int) -> int:
    """The descriptor's global address: the bound buffer's plus the argument's element offset."""
    return base + arg.offset * itemsize


def encode_args(arg: Arg, global_address: int, meta: Mapping[str, Any]) -> tuple[Any, ...]:
    """cuTensorMapEncodeTiled's arguments after the tensor map pointer, in the driver's order (innermost
    axis first, strides in bytes, the innermost stride left out), as Triton's launcher gives them."""
    kind, rank, *rest = _geometry(
        tuple(arg.shape),
        tuple(arg.strides),
        int(meta["elem_size"]),
        tuple(int(b) for b in meta["block_size"]),
        int(meta["elem_type"]),
        int(meta["swizzle"]),
    )
    return (kind, rank, global_address, *rest)


# a descriptor geometry's arguments, shared by every descriptor of that geometry (the driver only reads the
# arrays during the call): a dynamic plan encodes ~100 descriptors at each new shape, most of them alike
# (a model's identical layers), and each array made would be an object the garbage collector tracks
_GEOMETRIES: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _geometry(
    shape: tuple[int, ...], strides: tuple[int, ...], elem: int, block: tuple[int, ...], elem_type: int, swizzle: int
) -> tuple[Any, ...]:
    key = (shape, strides, elem, block, elem_type, swizzle)
    found = _GEOMETRIES.get(key)
    if found is not None:
        return found
    rank = len(shape)
    if len(block) != rank or len(strides) != rank:
        raise ExecutionError(
            f"a tensor descriptor of rank {rank} got a block of {len(block)} axes",
            rule="triton.tma_desc",
            hint="run with OPGRAPH_LAUNCH=jit and report it",
        )
    dims = (ctypes.c_uint64 * rank)(*reversed(shape))
    byte_strides = (ctypes.c_uint64 * max(rank - 1, 1))(*[s * elem for s in reversed(strides[:-1])])
    box = (ctypes.c_uint32 * rank)(*reversed(block))
    ones = (ctypes.c_uint32 * rank)(*([1] * rank))
    kind = _HOST_TYPE.get(elem_type, elem_type)
    found = (kind, rank, dims, byte_strides, box, ones, _INTERLEAVE_NONE, swizzle, _L2_PROMOTION_128B, _OOB_FILL_NONE)
    if len(_GEOMETRIES) >= 4096:
        _GEOMETRIES.clear()
    _GEOMETRIES[key] = found
    return found


def encoder(lib: Any) -> Callable[..., int]:
    """libcuda's cuTensorMapEncodeTiled with its argument types."""
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return fn


class TensorMapSlot:
    """A kernel argument's 128 bytes of CUtensorMap, 64-byte aligned (cuTensorMapEncodeTiled requires it)."""

    def __init__(self) -> None:
        self.buffer = (ctypes.c_uint8 * (MAP_BYTES + MAP_ALIGN))()
        self.address = -(-ctypes.addressof(self.buffer) // MAP_ALIGN) * MAP_ALIGN
        # (arg, meta, encode_args' tuple): a slot re-encodes one argument at each new address (a moved
        # buffer), its dims, strides and box arrays made once
        self._made: tuple[Arg, Mapping[str, Any], tuple[Any, ...]] | None = None

    def encode(
        self,
        fn: Callable[..., int],
        check: Callable[[int, str], None],
        arg: Arg,
        global_address: int,
        meta: Mapping[str, Any],
    ) -> None:
        made = self._made
        if made is None or made[0] is not arg or made[1] is not meta:
            made = self._made = (arg, meta, encode_args(arg, global_address, meta))
        kind, rank, _, *rest = made[2]
        rc = fn(self.address, kind, rank, global_address, *rest)
        if rc:  # (the message made only for a failure: this runs at every bind of a moved buffer)
            check(rc, f"encode a TMA descriptor of shape {list(arg.shape)} at {global_address:#x}")

    def holds(self, arg: Arg) -> bool:
        """Whether the slot was last encoded for `arg` (only its address may have changed since)."""
        return self._made is not None and self._made[0] is arg

    def raw(self) -> bytes:
        return ctypes.string_at(self.address, MAP_BYTES)


def descriptor_object(arg: Arg, buffer: Any, gluon: bool = False) -> Any:
    """The descriptor as Triton's JIT and interpreter take it: a TensorDescriptor over `buffer` (a torch
    tensor: the bound buffer) from the argument's element offset; for a Gluon kernel (`gluon`) Gluon's, with the
    shared-memory layout its signature names (`gluon_layout`)."""
    import torch

    base = torch.as_strided(buffer, (1,), (1,), buffer.storage_offset() + arg.offset)
    if base.data_ptr() % 16:
        raise ExecutionError(
            f"a TMA descriptor's buffer starts at {base.data_ptr():#x}, not on a 16-byte boundary",
            rule="triton.tma_desc",
            hint="bind 16-byte aligned buffers (fresh allocations are), or build with a config without TMA / TMA_HOST",
        )
    if gluon:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        layout = _default_layout(arg.block, _GL_DTYPES[buffer.dtype])
        return GluonDescriptor(base, list(arg.shape), list(arg.strides), list(arg.block), layout)
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(base, list(arg.shape), list(arg.strides), list(arg.block))


class _GluonDtypes(dict[Any, Any]):
    """torch dtype -> Triton's (Gluon's) element type of a descriptor, made at the first lookup."""

    def __missing__(self, key: Any) -> Any:
        import torch
        import triton.language as tl

        self.update(
            {
                torch.float16: tl.float16,
                torch.bfloat16: tl.bfloat16,
                torch.float32: tl.float32,
                torch.float8_e4m3fn: tl.float8e4nv,
                torch.float8_e5m2: tl.float8e5,
            }
        )
        return dict.__getitem__(self, key)


_GL_DTYPES = _GluonDtypes()
