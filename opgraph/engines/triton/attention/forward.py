"""The generated flash-attention forward (FlashAttention-2 structure).

One program per (BLOCK_M queries, batch, query head), the heaviest query blocks first under a causal
mask. q stays in registers; the program walks the key blocks its rows can see in up to three loops:
blocks crossing the sliding window's left edge (masked), blocks every row sees whole (no mask
arithmetic), blocks crossing the causal diagonal or the keys' end (masked); blocks nobody sees are
never loaded. Per key block: S = q k^T (tensor cores, fp32 accumulate), scale, bias, ALiBi, the score
modifier and the masks in fp32, then the online softmax in log2 units (exp2 with log2(e) folded into
the scale) and acc += P v. Rows that see no key end with l = 0: their output is 0 and their
log-sum-exp +inf (never NaN). GQA/MQA: key/value head = query head // group. The band: key j is seen
by query i when i + diag - W < j <= i + diag + R (W the sliding window / left bound, R the right bound,
0 for causal; diag = kv_len - q_len bottom-right aligned, else 0). Packed (ragged) tensors: ragged.py;
paged caches: paged.py. GQA head packing (knob PACK_GQA, decode): gqa_pack.py.
"""

from __future__ import annotations

from typing import Any

from ..templates.base import Generated, Launch, module_source
from .common import (
    UNIFORM_HELPER,
    KernelText,
    alibi_lines,
    and_mask,
    apply_keep,
    base_expr,
    descriptors_ok,
    dot,
    dot_dtype,
    dropout_lines,
    dropout_scale_params,
    dropout_setup,
    exp2_factor,
    extent,
    pow2,
    rows_orient,
    scale_lines,
    score_lines,
    seqlen_lines,
    times,
    tma_desc,
    tma_load,
    wide,
)
from .dump import rng_dump_kernel
from .epilogue import finish, sink_lines
from .gqa_pack import check_packable, pack_lines, query_span
from .paged import page_base, paged_load
from .ragged import exit_past_length, ragged_lines, row_base, rows_ok, zero_kernel
from .sized import divides
from .spec import AttnSpec, Coords, FwdKnobs
from .split import combine, partial_stores, partials, split_range
from .tiles import FORWARD_OUTPUTS, check_tiles, tile_lines, tiles_ok
from .tiles import programs as tile_programs
from .warpspec import ws_refusal

__all__ = ["block_loops", "forward", "fwd_ranges", "needs_loops"]


def needs_loops(spec: AttnSpec, bn: int) -> tuple[bool, bool]:
    """Whether the forward needs its leading masked loop (sliding window) and its trailing one
    (causal, padding or a ragged last key block)."""
    lead = spec.window is not None
    trail = (
        spec.right_bound is not None
        or spec.seq_len_kv is not None
        or not divides(bn, spec.Skv)
        or spec.block_mask is not None
    )
    return lead, trail


def fwd_ranges(spec: AttnSpec, bm: int, bn: int, m0: str = "m0") -> list[str]:
    """Key ranges of a block of query rows [m0, m0 + bm): masked [lo, r1), whole [r1, r2), masked
    [r2, hi), each a multiple of bn apart from hi. Rows beyond q_len see nothing."""
    right = spec.right_bound
    r = f" + {right}" if right else ""
    lines = ["hi = kv_len"]
    if right is not None:
        lines.append(f"hi = tl.minimum(hi, tl.maximum({m0} + {bm} + diag{r}, 0))")
    if spec.window is not None:
        w = spec.window
        lines.append(f"lo = (tl.maximum({m0} + diag - {w - 1}, 0) // {bn}) * {bn}")
        lines.append(f"r1 = ((tl.maximum({m0} + {bm} + diag - {w}, 0) + {bn - 1}) // {bn}) * {bn}")
    else:
        lines += ["lo = 0", "r1 = 0"]
    if spec.seq_len_q is not None:
        lines.append(f"hi = tl.where({m0} < q_len, hi, lo)")
    lines.append(f"r2 = (kv_len // {bn}) * {bn}")
    if right is not None:
        lines.append(f"r2 = tl.minimum(r2, (tl.maximum({m0} + diag{r} + 1, 0) // {bn}) * {bn})")
    lines += ["r1 = tl.minimum(tl.maximum(r1, lo), hi)", "r2 = tl.minimum(tl.maximum(r2, r1), hi)"]
    if spec.block_mask is not None:  # no block is whole: the block mask's bits are read in every one
        lines.append("r2 = r1")
    return lines


def generated(functions: list[str], launches: list[Launch], scratch_bytes: int = 0, sizes: Any = None) -> Generated:
    """Generated kernels as the engine runs them: the module (listing a bucket kernel's size parameters:
    `sizes`), its launches, the scratch bytes; "needs_allocator" where tensor descriptors take global
    scratch at launch."""
    source = module_source(*functions) if sizes is None else module_source(sizes.declaration(), *functions)
    notes = frozenset({"needs_allocator"}) if "tl.make_tensor_descriptor" in source else frozenset()
    # (a bucket kernel's scratch is laid out for the bucket's largest shape: backward.scratch_of, split.partials)
    return Generated(source, tuple(launches), scratch_bytes, notes, bucket_scratch=sizes is not None)


def forward(spec: AttnSpec, kn: FwdKnobs, name: str = "kernel_attn_fwd") -> Generated:
    """The forward kernel of `spec` with knobs `kn` (see module doc); with kn.SPLIT > 1, split-KV: the
    kernel over 1/SPLIT of the keys a program writing fp32 partials, then a combining launch (split.py)."""
    split = kn.SPLIT if kn.SPLIT is not None and kn.SPLIT > 1 else 0
    pack = bool(kn.PACK_GQA)
    if pack:
        check_packable(spec)
    listed = bool(kn.TILES)
    if listed:
        check_tiles(spec, tiles_ok(spec) or ("split-KV" if split else "GQA packing" if pack else None))
    scratch, scratch_bytes = partials(spec, split) if split else ({}, 0)
    k = KernelText(name, scratch, spec.sizes)
    bm, bn = kn.BLOCK_M, kn.BLOCK_N
    dp, dvp = pow2(spec.D), pow2(spec.Dv)
    tile_rows = spec.Sq * spec.gk if pack else spec.Sq  # a program column's tile rows (packed: queries x group)
    num_m = (tile_rows + bm - 1) // bm
    heads = spec.Hk if pack else spec.Hq  # (packed: a program per key/value head)
    causal = spec.right_bound is not None
    dt = dot_dtype(spec)
    for role in ("q", "k", "v"):
        if spec.hook(role) is None:  # an operand made by its prologue is no parameter
            k.param(getattr(spec, role).name)
    for op in (spec.o, spec.stats, spec.score_max, spec.score_sum_exp) if not split else ():
        if op is not None:
            k.param(op.name)
    for name_ in ("PM", "PL", "PO") if split else ():  # (split-KV: the partials in scratch)
        k.param(name_)
    # ORDER=1: the query blocks outermost (every head's heaviest block first, the best balance for few
    # waves); 0: each head's blocks together (its k/v shared in L2)
    axes = ("1", "0") if kn.ORDER else ("0", "1")
    if listed:  # (tiles.py: the program's tile of the list: start_m, off_b, off_h)
        k.add(*tile_lines(spec, k, bm, num_m, side="q", outs=FORWARD_OUTPUTS))
    else:
        k.add(f"pid_m = tl.program_id({axes[0]})", f"pid_bh = tl.program_id({axes[1]})")
        k.add(f"start_m = {num_m - 1} - pid_m" if causal else "start_m = pid_m")  # heaviest blocks first
    if split:
        k.add("pid_s = tl.program_id(2)")
    if pack:
        k.add(*pack_lines(spec, bm))
    else:
        k.add(
            *(() if listed else (f"off_b = pid_bh // {spec.Hq}", f"off_h = pid_bh % {spec.Hq}")),
            f"off_hk = off_h // {spec.gk}",
            f"off_hv = off_h // {spec.gv}",
            f"m0 = start_m * {bm}",
            f"offs_m = m0 + tl.arange(0, {bm})",
        )
    k.add(
        f"offs_n0 = tl.arange(0, {bn})",
        f"offs_d = tl.arange(0, {dp})",
        f"offs_dv = tl.arange(0, {dvp})",
    )
    k.add(*seqlen_lines(spec, k))
    if not split and not pack and not listed:
        k.add(*exit_past_length(spec, "m0", "q", (*FORWARD_OUTPUTS, "rng_dump")))
    k.add(*ragged_lines(spec, k, ("q", "k", "v") if split else None))
    k.add(*scale_lines(spec, k))
    k.add(*alibi_lines(spec))
    dropout_scale_params(spec, k)
    k.add(*dropout_setup(spec))
    if spec.bias is not None:
        k.add(f"bias_base = {base_expr(spec.bias, 'off_b', 'off_h')}")
    if spec.block_mask is not None:
        k.param(spec.block_mask.name)
        k.add(f"bmask_base = {base_expr(spec.block_mask, 'off_b', 'off_h')}")
    dmask = f"(offs_d[None, :] < {spec.D})" if dp != spec.D else None
    dvmask = f"(offs_dv[None, :] < {spec.Dv})" if dvp != spec.Dv else None
    row_ok = f"(offs_m[:, None] < {spec.Sq})" if not divides(bm, tile_rows) else None
    wq, wk, wv = (
        wide(extent(op, (1, 1, s, d)))
        for op, s, d in ((spec.q, spec.Sq, spec.D), (spec.k, spec.Skv, spec.D), (spec.v, spec.Skv, spec.Dv))
    )

    tma = bool(kn.TMA) and not pack and descriptors_ok(spec)
    # q: loaded (or computed by its prologue) once
    q_at = Coords("off_b", "off_h", "offs_m[:, None]", "offs_d[None, :]", and_mask(row_ok, dmask))
    if spec.hook("q") is not None:
        k.add(*_prologue(spec, k, "q", "q", q_at, dt))
    elif tma:
        k.add(
            tma_desc(spec.q, "desc_q", (spec.B, spec.Hq, spec.Sq, spec.D), bm, dp),
            tma_desc(spec.k, "desc_k", (spec.B, spec.Hk, spec.Skv, spec.D), bn, dp),
            tma_desc(spec.v, "desc_v", (spec.B, spec.Hv, spec.Skv, spec.Dv), bn, dvp),
            f"q = {tma_load('desc_q', 'off_b', 'off_h', 'm0', bm, dp)}",
        )
    else:
        rows = "offs_m[:, None].to(tl.int64)" if wq else "offs_m[:, None]"
        q_ok = rows_ok(spec, "q", "offs_m[:, None]") or row_ok
        k.add(
            f"q = tl.load({spec.q.name} + {row_base(spec, 'q', spec.q, 'off_b', 'off_h')} + {rows} * {spec.q.strides[2]}"
            f" + offs_d[None, :]{_mask(and_mask(q_ok, dmask))})"
        )
    if spec.hook("q") is None and spec.q.dtype != dt:
        k.add(f"q = q.to({dt})")
    krows = "offs_n0[:, None].to(tl.int64)" if wk else "offs_n0[:, None]"
    vrows = "offs_n0[:, None].to(tl.int64)" if wv else "offs_n0[:, None]"
    for role, h in (("k", "off_hk"), ("v", "off_hv")):
        if spec.page(role) is not None:
            k.add(*page_base(spec, k, role, h))
    if not tma and spec.hook("k") is None and spec.page("k") is None:
        k.add(
            f"k_ptrs = {spec.k.name} + {row_base(spec, 'k', spec.k, 'off_b', 'off_hk')} + {krows} * {spec.k.strides[2]}"
            " + offs_d[None, :]"
        )
    if not tma and spec.hook("v") is None and spec.page("v") is None:
        k.add(
            f"v_ptrs = {spec.v.name} + {row_base(spec, 'v', spec.v, 'off_b', 'off_hv')} + {vrows} * {spec.v.strides[2]}"
            " + offs_dv[None, :]"
        )
    k.add(
        f'm_i = tl.full([{bm}], float("-inf"), tl.float32)',
        f"l_i = tl.zeros([{bm}], tl.float32)",
        f"acc = tl.zeros([{bm}, {dvp}], tl.float32)",
    )
    head = "off_hr" if pack else "off_h"  # the query head of 1-D (per row) values
    if not split:  # (split-KV: the combining launch adds the sink)
        k.add(*sink_lines(spec, k, bm, head))
    k.add(*fwd_ranges(spec, query_span(bm, spec.gk) if pack else bm, bn))
    if split:
        k.add(*split_range(spec, bn, split))
    lead, trail = needs_loops(spec, bn)
    ws = bool(kn.WS) and tma and ws_refusal(spec) is None  # (FwdKnobs refuses WS beside SPLIT)
    k.add(
        *block_loops(
            lead,
            trail,
            bool(kn.ONELOOP),
            "start_n",
            bn,
            lambda masked: _body(spec, k, kn, masked, wk, wv, row_ok, dmask, dvmask, tma),
            ws=ws,
        )
    )

    if split:
        k.add(*partial_stores(spec, row_ok is not None, "off_hr" if pack else None))
    else:
        finish(spec, k, row_ok, dvmask, dropped=False, head=head)
    for hook in (h for _, h in spec.prologue):
        for p in hook.params():
            k.param(p)
    functions = [k.source()]
    if spec.dropout is not None:
        functions.insert(0, UNIFORM_HELPER)
    if listed:
        grid = (tile_programs(spec, bm, num_m, FORWARD_OUTPUTS), spec.Hq)
    else:
        grid = (spec.B * heads, num_m) if kn.ORDER else (num_m, spec.B * heads)
    launches = [k.launch((*grid, split) if split else grid, kn.num_warps, kn.num_stages)]
    if split:
        comb, comb_grid = combine(spec, f"{name}_combine", scratch, split)
        functions.append(comb.source())
        launches.append(comb.launch(comb_grid, 4, 1))
    dump = rng_dump_kernel(spec, f"{name}_rng_dump")
    if dump is not None:
        functions.append(dump[0].source())
        launches.append(dump[0].launch(dump[1], 4, 1))
    zero = zero_kernel(spec, f"{name}_zero", ("o", "stats", "score_max", "score_sum_exp"))
    if zero is not None:  # packed outputs: rows no sequence covers are 0
        functions.insert(0, zero[0].source())
        launches.insert(0, zero[0].launch(zero[1], 4, 1))
    return generated(functions, launches, scratch_bytes, spec.sizes)


def block_loops(lead: bool, trail: bool, one: bool, var: str, step: int, body, ws: bool = False) -> list[str]:
    """The loops over blocks [lo, hi): masked [lo, r1) (if `lead`), whole [r1, r2), masked [r2, hi)
    (if `trail`); or with `one`, a single loop whose body masks under a run-time test; or with `ws`, a
    single warp-specialised loop masking at every step (warpspec.py). `body(masked)` gives a loop body's
    lines (masked: True, False or the test)."""
    if ws:
        lo, hi = "lo" if lead else "r1", "hi" if trail else "r2"
        lines = body(lead or trail)
        return [f"for {var} in tl.range({lo}, {hi}, {step}, warp_specialize=True):", *("    " + x for x in lines)]
    if one and (lead or trail):
        test = " | ".join(([f"({var} < r1)"] if lead else []) + ([f"({var} >= r2)"] if trail else []))
        lo = "lo" if lead else "r1"
        hi = "hi" if trail else "r2"
        return [f"for {var} in range({lo}, {hi}, {step}):", *("    " + x for x in body(test))]
    lines = []
    for masked, rng, need in ((True, "lo, r1", lead), (False, "r1, r2", True), (True, "r2, hi", trail)):
        if need:
            lines += [f"for {var} in range({rng}, {step}):", *("    " + x for x in body(masked))]
    return lines


def _mask(mask: str | None, store: bool = False) -> str:
    if mask is None:
        return ""
    return f", mask={mask}" if store else f", mask={mask}, other=0.0"


def _prologue(spec: AttnSpec, k: KernelText, role: str, var: str, at: Coords, dt: str) -> list[str]:
    """`var`, the tile of `role` computed by its prologue hook, in the dot operand type."""
    hook = spec.hook(role)
    assert hook is not None
    for p in hook.params():
        k.param(p)
    lines, value = hook.emit(None, at)
    return [*lines, f"{var} = ({value}).to({dt})"]


def _load_or_prologue(spec: AttnSpec, k: KernelText, role: str, var: str, load: str, at: Coords, dt: str) -> list[str]:
    if spec.hook(role) is not None:
        return _prologue(spec, k, role, var, at, dt)
    op = getattr(spec, role)
    return [f"{var} = {load}", *([f"{var} = {var}.to({dt})"] if op.dtype != dt else [])]


def _body(
    spec: AttnSpec,
    k: KernelText,
    kn: FwdKnobs,
    masked: bool | str,
    wk: bool,
    wv: bool,
    row_ok: str | None,
    dmask: str | None,
    dvmask: str | None,
    tma: bool,
) -> list[str]:
    """One key block of the forward loop (masked or whole)."""
    bn = kn.BLOCK_N
    dt = dot_dtype(spec)
    ragged = masked and not divides(bn, spec.Skv)
    key_ok = rows_ok(spec, "k", "offs_n[:, None]") or (f"(offs_n[:, None] < {spec.Skv})" if ragged else None)
    start = "start_n.to(tl.int64)" if wk else "start_n"
    dp, dvp = pow2(spec.D), pow2(spec.Dv)
    kload = (
        tma_load("desc_k", "off_b", "off_hk", "start_n", bn, dp)
        if tma
        else f"tl.load(k_ptrs + {start} * {spec.k.strides[2]}{_mask(and_mask(key_ok, dmask))})"
    )
    lines = ["offs_n = start_n + offs_n0"]
    # a paged cache's keys past the sequence or Skv read zeros (their pages may be anyone's)
    page_ok = and_mask(
        f"(offs_n[:, None] < {spec.Skv})" if ragged else None,
        "(offs_n[:, None] < kv_len)" if spec.seq_len_kv is not None else None,
    )
    if spec.page("k") is not None:
        setup, kload = paged_load(spec, "k", bn, "offs_d", page_ok, dmask)
        lines += setup
    lines += _load_or_prologue(
        spec,
        k,
        "k",
        "kt",
        kload,
        Coords("off_b", "off_hk", "offs_n[:, None]", "offs_d[None, :]", and_mask(key_ok, dmask)),
        dt,
    )
    lines.append(f"qk = {dot(spec, 'q', 'tl.trans(kt)')}")
    o = rows_orient(str(spec.Sq) if row_ok else None, str(spec.Skv) if ragged else None)
    f = exp2_factor(spec)
    lines += score_lines(spec, k, o, masked, f is not None)
    lines += [
        f"m_ij = tl.maximum(m_i, tl.max(s2, 1){times(f)})",
        'm_s = tl.where(m_ij == float("-inf"), 0.0, m_ij)',
        f"p = tl.math.exp2(s2{times(f)} - m_s[:, None])",
        "alpha = tl.math.exp2(m_i - m_s)",
        "l_i = l_i * alpha + tl.sum(p, 1)",
        "acc = acc * alpha[:, None]",
        "m_i = m_ij",
    ]
    if spec.dropout is not None:
        lines += dropout_lines(spec, k, o)
        lines.append(f"p = {apply_keep(spec, 'p')}")
    vstart = "start_n.to(tl.int64)" if wv else "start_n"
    vkey_ok = rows_ok(spec, "v", "offs_n[:, None]") or (f"(offs_n[:, None] < {spec.Skv})" if ragged else None)
    vload = (
        tma_load("desc_v", "off_b", "off_hv", "start_n", bn, dvp)
        if tma
        else f"tl.load(v_ptrs + {vstart} * {spec.v.strides[2]}{_mask(and_mask(vkey_ok, dvmask))})"
    )
    if spec.page("v") is not None:
        setup, vload = paged_load(spec, "v", bn, "offs_dv", page_ok, dvmask)
        lines += setup
    lines += _load_or_prologue(
        spec,
        k,
        "v",
        "vt",
        vload,
        Coords("off_b", "off_hv", "offs_n[:, None]", "offs_dv[None, :]", and_mask(vkey_ok, dvmask)),
        dt,
    )
    lines.append(f"acc = {dot(spec, f'p.to({dt})', 'vt', 'acc')}")
    return lines
