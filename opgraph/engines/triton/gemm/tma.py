"""Tensor descriptors (TMA) for operand loads on Hopper: device-side ones and the scratch allocator they need,
the strides of host-side ones (kernel arguments, encoded at bind: engines/triton/tma_desc.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ....core.symbolic import SymInt, as_symint
from ....core.tensor import TensorDesc
from ..sizes import above_one, divides

# Device-side tensor descriptors need a global scratch allocation at launch, which Triton asks of
# the allocator set with triton.set_allocator (a ContextVar: per thread). The engine should set one
# before launching a kernel that needs it; until then, the module installs a torch allocator at
# import when the importing thread has none (tests and benchmarks build and run in one thread).
TMA_PRELUDE = """
def _tma_scratch(size, alignment, stream):
    import torch
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _install_tma_scratch():
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_tma_scratch)


_install_tma_scratch()
"""


def tma_prelude(interpret: bool) -> list[str]:
    """Module-level source for kernels that build tensor descriptors (none under the interpreter)."""
    return [] if interpret else [TMA_PRELUDE]


def tma_ok(desc: TensorDesc, offset: int, inner: int) -> bool:
    """Whether a 2-D or 3-D descriptor can address `desc` (read from element `offset` of its buffer)
    with axis `inner` contiguous: unit inner stride, 16-byte aligned base and other strides (a bucket
    kernel's: at every shape of it)."""
    size = desc.data_type.itemsize
    if desc.stride[inner] != 1 or not divides(16, as_symint(offset) * size):
        return False
    return all(
        divides(16, as_symint(s) * size)
        for a, (d, s) in enumerate(zip(desc.dim, desc.stride))
        if a != inner and above_one(d)
    )


def tma_strides(shape: Sequence[SymInt], strides: Sequence[SymInt], itemsize: int) -> list[SymInt]:
    """`strides` (elements, the last 1) with those of size-1 axes replaced by a 16-byte aligned value
    (a host-side descriptor checks every stride's alignment, even where no step along it is taken). A
    bucket kernel's dynamic axes keep their strides (tma_ok found them aligned at every shape); a static
    size-1 axis outside a dynamic one raises TypeError (the kernel is then generated at each shape)."""
    out = list(strides)
    reach: SymInt = 1
    for a in reversed(range(len(shape))):
        if a < len(shape) - 1 and isinstance(shape[a], int) and shape[a] == 1:
            if not isinstance(reach, int):
                raise TypeError("a size-1 axis outside a dynamic one: its stride is aligned per shape")
            step = max(16 // itemsize, 1)
            out[a] = -(-reach // step) * step
        extent = out[a] * shape[a]
        reach = max(reach, extent) if isinstance(reach, int) and isinstance(extent, int) else extent
    return out
