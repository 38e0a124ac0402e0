"""Running generated attention kernels directly on torch tensors, without a graph: for the kernel
tests (interpreter) and the GPU scripts. The templates run the same `Generated` through the engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..templates.base import ArgKind, Generated, host_scalar


def load(gen: Generated, interpret: bool) -> Any:
    from ..loader import load_module

    return load_module(gen.source, interpret=interpret)


def launch(gen: Generated, buffers: Mapping[int, Any], *, interpret: bool, module: Any = None) -> Any:
    """Run every launch of `gen` on `buffers` (by uid: tensors for p{uid}, numbers for s{uid}); its scratch
    is allocated here. Returns the loaded module (pass it back to skip the lookup)."""
    import torch

    module = module or load(gen, interpret)
    device = next(v.device for v in buffers.values() if isinstance(v, torch.Tensor))
    if "needs_allocator" in gen.notes:
        import triton

        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    scratch = torch.empty(max(gen.scratch_bytes, 1), dtype=torch.int8, device=device)

    def value(arg: Any) -> Any:
        if arg.kind == ArgKind.SCRATCH:
            return scratch[arg.offset :].view(getattr(torch, arg.dtype))
        v = buffers[arg.uid]
        return host_scalar(arg, v) if arg.kind == ArgKind.SCALAR else v

    for l in gen.launches:
        meta = dict(l.meta)
        module_fn = getattr(module, l.kernel)
        module_fn[l.grid](*[value(a) for a in l.args], **meta)
    return module
