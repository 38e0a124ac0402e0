"""Shared machinery of the GEMM-class templates: matmul, conv_fprop (implicit GEMM), conv_dgrad,
conv_wgrad and depthwise conv generate through it.

What a GEMM-class piece is (`analyze`): one *main op* plus

* a **prologue** per operand: pointwise ops, and slice/transpose views of tensors in memory, that
  compute the operand. They run on every tile as it is loaded, and a padded (out-of-image) position
  is zeroed *after* them, as the unfused graph would have it;
* an **epilogue**: pointwise ops on the main op's result and on tensors broadcast to it (bias,
  residual in any layout, activations, casts, masks), any number of them stored;
* optionally **reductions** at the very end: genstats, or `reduction` along the tile's rows or
  columns (the per-channel statistics of a conv, the channel reduction of a conv, a row reduction of
  a matmul).

Generated kernels give each program one output tile, BLOCK_M rows x BLOCK_N columns of the
*output space* (`OutputSpace`): the main op's output with some logical axes flattened into the
rows, one axis along the columns (optionally split into independent groups: grouped conv) and some
fixed per program (matmul batch). Everything after the main loop (epilogue, stores, reductions,
split-K, the combine launches) is derived from the space alone, so a new main op brings only its
main loop: a function that leaves the accumulator `acc` of the tile.

Names in generated code (a template's main loop may rely on them):
    pid_m, pid_n   the tile's position (group-M swizzled); pb the per-program batch/group index,
                   g its group part and bb its batch part; ks the split-K slice
    rm, rn         row and column indices of the tile ([BLOCK_M], [BLOCK_N]); rmask / cmask their
                   bounds (absent when the sizes divide the blocks); col = the global column
                   (g * N + rn)
    y{axis}        the coordinate of output axis `axis` (a row vector, `col`, or a scalar)
    acc            the accumulator; v{uid} the value of tensor uid (expr.py's convention)
A tile's tensors are addressed by a `TileIndexer`: each logical axis of a tensor is a row, a column
or a per-program coordinate, so broadcast operands (per-channel bias: a [1, BLOCK_N] load), any
layout (NCHW or NHWC residuals, column-major or gapped matmul operands) and views come out of the
strides alone.

Operand tiles are pointer loads with masks, written in one place (`TileIndexer.load_tile`); the
matmul template swaps in device-side tensor descriptors (TMA) there when the operand allows.

Knobs every tile template understands (`TileKnobs`, knobs.py, gives each its meaning): BLOCK_M,
BLOCK_N (BLOCK_K for the GEMMs), GROUP_M (group-M swizzle of the tile order, for L2 reuse), SPLIT_K (the
main loop split over programs; fp32/int32 partial accumulators in scratch, summed in fixed order by a
second kernel that runs the epilogue on its own finer tiles, ~2 programs per SM (`epilogue_tiling`;
EPI_M / EPI_N set them): deterministic), PERSISTENT (0: one tile per program; P: P programs loop over the
tiles), FLATTEN (1: a persistent kernel's tile and K loops pipelined as one, the next tile's loads
overlapping this tile's epilogue), EPILOGUE_SUBTILE (2: the epilogue runs on column halves, for heavy
epilogues on 128x256 tiles), num_warps, num_stages, fp32_precision ("tf32" | "ieee", fp32 operands only).

Reductions write one fp32 partial per program and kept position to scratch; a combine launch
(`ReductionPlan.combine_source`: a program per block of positions and output array, all slots each)
reduces them in fixed order: deterministic, no atomics. When one program covers all partials of a
position (e.g. N <= BLOCK_N for a row sum) it writes the result. A program that visits several row
tiles (the depthwise row strips) folds its partials in registers and stores once
(`epilogue(..., accumulate=)`, `ReductionPlan.init_lines` / `store_lines`).

Adding a main op (the template protocol of templates/base.py, in the GEMM family's form): subclass
`TileTemplate` (name, priority, `main_kinds`, `space`: how its output maps onto tiles, `dot_roles`) and
`TileMatch` (set the template's `match_class`); the match holds the analysis (`gp`, a GemmPiece) and
overrides the hooks it needs (template.py's docstring lists them in the order the shared path calls them):
`check` (the verdict), `candidates` (`gemm_candidates` ranks tile shapes with the `estimate_us` cost
model), `cost`, `dot`, `iterations`, `tiling`, and `lines`, its plain main loop (build `TileIndexer`s
for the operand tiles, get them from `operand_tile`, which also runs their prologues, and accumulate into
`acc`); `setup` / `prelude` add per-program and module-level code (tensor descriptors). A variant of the
main loop chosen by a knob is a `TileLoop` the match returns from `loop(knobs)`; a variant of the whole
run (the prologue as its own pass) a `Strategy` from `strategy(knobs)`.
"""

from __future__ import annotations

from ...shared.views import View, memory_views
from .analysis import (
    GemmPiece,
    Reduce,
    analyze,
)
from .constants import (
    INT32_LIMIT,
    REDUCE_KINDS,
    VIEW_KINDS,
)
from .dots import (
    FP8_TYPES,
    DotKind,
    dot_kind,
    fp32_knobs,
    operand_bytes,
    stencil_dot,
    stencil_support,
    uses_fp32,
)
from .epilogue import (
    Context,
    ReductionPlan,
    add_combines,
    can_subtile,
    epilogue,
    make_context,
    needs_int64,
    operand_tile,
    preload_lines,
    sibling_acc,
)
from .indexing import (
    TileIndexer,
)
from .scratch import (
    Scratch,
    Signature,
)
from .space import (
    OutputSpace,
)
from .splitk import (
    epilogue_tiling,
    slice_block,
    split_range,
    split_store,
    split_sum,
    split_sum_blocked,
)
from .template import (
    BlockedCombine,
    Combine,
    MainLoop,
    Strategy,
    TileLoop,
    TileMatch,
    TileTemplate,
)
from .tiling import (
    Tiling,
    decompose,
    input_taps,
    static,
)
from .tma import (
    TMA_PRELUDE,
    tma_ok,
    tma_prelude,
    tma_strides,
)
from .tuning import (
    estimate_us,
    finish_candidates,
    fp8_join_cost,
    gemm_candidates,
    prologue_share,
    row_reduced,
    with_subtile,
)

__all__ = [
    "BlockedCombine",
    "Combine",
    "MainLoop",
    "Strategy",
    "TileLoop",
    "TileMatch",
    "Context",
    "DotKind",
    "GemmPiece",
    "INT32_LIMIT",
    "OutputSpace",
    "REDUCE_KINDS",
    "Reduce",
    "ReductionPlan",
    "Scratch",
    "Signature",
    "TMA_PRELUDE",
    "TileIndexer",
    "TileTemplate",
    "Tiling",
    "VIEW_KINDS",
    "View",
    "add_combines",
    "analyze",
    "can_subtile",
    "decompose",
    "FP8_TYPES",
    "dot_kind",
    "epilogue",
    "epilogue_tiling",
    "estimate_us",
    "finish_candidates",
    "fp8_join_cost",
    "fp32_knobs",
    "gemm_candidates",
    "input_taps",
    "static",
    "make_context",
    "memory_views",
    "needs_int64",
    "operand_bytes",
    "operand_tile",
    "preload_lines",
    "split_range",
    "split_store",
    "split_sum",
    "split_sum_blocked",
    "slice_block",
    "stencil_dot",
    "stencil_support",
    "tma_ok",
    "tma_prelude",
    "tma_strides",
    "uses_fp32",
    "prologue_share",
    "row_reduced",
    "sibling_acc",
    "with_subtile",
]
