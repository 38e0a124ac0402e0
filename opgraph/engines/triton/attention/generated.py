"""A generated kernel set (`Source`) as the Triton engine runs it (`Generated`): the module source,
and launches whose arguments name bound buffers (p{uid}), pass-by-value scalars (s{uid}) or slices
of the step's scratch memory (the backward's delta and dBias partials)."""

from __future__ import annotations

from ..templates.base import Arg, ArgKind, Generated, Launch, module_source
from .spec import Source

ALIGN = 256


def launches_of(src: Source) -> Generated:
    offsets, size = {}, 0
    for s in src.scratch:
        offsets[s.name] = (size, s.dtype)
        size += -(-s.numel * 4 // ALIGN) * ALIGN

    def arg(name: str) -> Arg:
        if name in offsets:
            off, dt = offsets[name]
            return Arg(ArgKind.SCRATCH, offset=off, dtype=dt)
        kind = {"p": ArgKind.BUF, "s": ArgKind.SCALAR}[name[0]]
        return Arg(kind, int(name[1:]))

    launches = tuple(Launch(l.kernel, l.grid, tuple(arg(p) for p in l.params),
                            (("num_warps", l.num_warps), ("num_stages", l.num_stages))) for l in src.launches)
    source = module_source(*src.functions)
    notes = frozenset({"needs_allocator"}) if "tl.make_tensor_descriptor" in source else frozenset()
    return Generated(source, launches, size, notes)
