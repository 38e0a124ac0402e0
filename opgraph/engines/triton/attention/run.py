"""Running generated attention kernels directly on torch tensors, without a graph: for the kernel
tests (interpreter) and the GPU scripts. The templates run the same `Source` through the engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .spec import Source


def load(src: Source, interpret: bool) -> Any:
    from ..loader import load_module
    from ..templates.base import module_source

    return load_module(module_source(*src.functions), interpret=interpret)


def launch(src: Source, args: Mapping[str, Any], *, interpret: bool, module: Any = None) -> Any:
    """Run every launch of `src` with parameters from `args` (scratch buffers are allocated here
    unless `args` has them). Returns the loaded module (pass it back to skip the lookup)."""
    import torch

    module = module or load(src, interpret)
    args = dict(args)
    device = next(v.device for v in args.values() if isinstance(v, torch.Tensor))
    if any("make_tensor_descriptor" in f for f in src.functions):
        import triton

        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    for s in src.scratch:
        if s.name not in args:
            args[s.name] = torch.empty(s.numel, dtype=getattr(torch, s.dtype), device=device)
    for l in src.launches:
        fn = getattr(module, l.kernel)
        fn[l.grid](*[args[p] for p in l.params], num_warps=l.num_warps, num_stages=l.num_stages)
    return module
