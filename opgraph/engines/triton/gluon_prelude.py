"""The head of a generated Gluon module (a WS=1 matmul: templates/_matmul_ws.py).

Gluon (`triton.experimental.gluon`, Triton >= 3.6) writes a kernel with explicit layouts, shared memory,
barriers and warp partitions. The shared epilogue (gemm/epilogue.py) and the helpers it calls (expr.HELPERS)
are written in `tl.` names; in a Gluon module `tl` is a module of Gluon's own functions under those names
(Gluon has nearly all of them: `WRITTEN` are written here), so the same epilogue text runs
on the consumer warps' accumulator: its index vectors (`tl.arange`) take Gluon's automatic layout, resolved
from the accumulator's.

Triton 3.6 (the GPU image) and 3.9 differ in two names, bound here to whichever the installed one has: the
partition barrier (`sync_warps`: `thread_barrier` / `barrier`) and the TMA copies (`tma_load`:
`async_copy_global_to_shared` / `async_load`; `tma_store`: `async_copy_shared_to_global` / `async_store`), with
the same arguments in the same order. (Names without the `_og_` prefix: compile_worker wraps those as functions.)

A Gluon module may hold Triton kernels too (`triton_kernel`: a reduction's combine launch after the WS kernel),
written in `_og_tl.` (Triton's own language) and named in the module's `_OG_TRITON`, which compile_worker
makes Triton JITFunctions.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache

GLUON_MARK = "_OG_GLUON = True"  # (compile_worker.exec_generated: the module's functions are Gluon's)
TRITON_KERNELS = "_OG_TRITON"  # (compile_worker.exec_generated: these kernels of a Gluon module are Triton's)

GLUON_PRELUDE = (
    """import types as _og_types

import triton
import triton.language as _og_tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait
from triton.language.extra import libdevice

"""
    + GLUON_MARK
    + "\n"
    + TRITON_KERNELS
    + """ = ()
sync_warps = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global


@gluon.jit
def _og_gl_sigmoid(x):
    return 1.0 / (1.0 + gl.exp(-x))


@gluon.jit
def _og_gl_broadcast_to(x, shape: gl.constexpr):
    return x.broadcast_to(shape)


@gluon.jit
def _og_gl_tma_store(desc, smem, row, col, value):
    # one store at a time through the tile's buffer: the previous one has left it before it is written
    tma.store_wait(0)
    smem.store(value)
    fence_async_shared()
    tma_store(desc, [row, col], smem)


tl = _og_types.ModuleType("tl")
for _og_name in dir(gl):
    if not _og_name.startswith("_"):
        setattr(tl, _og_name, getattr(gl, _og_name))
tl.sigmoid = _og_gl_sigmoid
tl.broadcast_to = _og_gl_broadcast_to
tl.PropagateNan = _og_tl.PropagateNan  # (an enum the epilogue's maximum / minimum name: tl's own)
"""
)


# the epilogue's tl names the prelude's `tl` must resolve beyond Gluon's own (tests/engines/test_triton_matmul_ws.py
# checks every tl name the shared epilogue and HELPERS write)
WRITTEN = ("sigmoid", "broadcast_to", "PropagateNan")


_TL = re.compile(r"\btl\.")


def triton_kernel(source: str, name: str) -> str:
    """Kernel `name`'s source (written in `tl.` names, Triton's) as a Triton kernel of a Gluon module: its `tl.`
    names Triton's own (`_og_tl.`), its name added to the module's TRITON_KERNELS. (Its text must call no
    `_og_` helper: those are Gluon functions in a Gluon module.)"""
    assert "_og_" not in source, f"{name} calls a helper, which a Gluon module makes Gluon's"
    return _TL.sub("_og_tl.", source) + f"\n{TRITON_KERNELS} = {TRITON_KERNELS} + ({name!r},)\n"


@cache
def gluon_available() -> bool:
    """Whether the installed Triton has Gluon with the Hopper API this prelude names (Triton >= 3.6: `warp_specialize`
    taking (function, args) pairs, `NVMMASharedLayout.get_default_for`, host descriptors with a layout)."""
    if importlib.util.find_spec("triton") is None:
        return False
    import triton

    try:
        major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (3, 6) and importlib.util.find_spec("triton.experimental.gluon") is not None
