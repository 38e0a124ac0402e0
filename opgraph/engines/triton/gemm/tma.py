"""Tensor descriptors (TMA) for operand loads on Hopper, and the scratch allocator they need."""

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
