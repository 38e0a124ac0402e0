"""Tensor descriptors (TMA) for operand loads on Hopper: device-side ones and the scratch allocator they need,
the strides of host-side ones (kernel arguments, encoded at bind: engines/triton/tma_desc.py)."""

from __future__ import annotations

from ....core.tensor import TensorDesc

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
    with axis `inner` contiguous: unit inner stride, 16-byte aligned base and other strides."""
    size = desc.data_type.itemsize
    if desc.stride[inner] != 1 or (offset * size) % 16:
        return False
    return all((s * size) % 16 == 0 for a, (d, s) in enumerate(zip(desc.dim, desc.stride)) if a != inner and d > 1)


def tma_strides(shape: list[int], strides: list[int], itemsize: int) -> list[int]:
    """`strides` (elements, the last 1) with those of size-1 axes replaced by a 16-byte aligned value
    (a host-side descriptor checks every stride's alignment, even where no step along it is taken)."""
    out = list(strides)
    reach = 1
    for a in reversed(range(len(shape))):
        if a < len(shape) - 1 and shape[a] == 1:
            step = max(16 // itemsize, 1)
            out[a] = -(-reach // step) * step
        reach = max(reach, out[a] * shape[a])
    return out
