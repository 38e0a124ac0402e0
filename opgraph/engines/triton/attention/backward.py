"""The generated flash-attention backward (FlashAttention-2 structure, deterministic: no atomics).

  1. preprocess: delta_i = sum_d dO_id * O_id per query row (fp32 scratch).
  2. dK/dV: one program per (BLOCK_N1 keys, batch, key head): k and v stay in registers; for each
     query head of the GQA group and each block of BLOCK_M1 query rows that sees these keys (fully
     masked blocks skipped, as in the forward), P^T is recomputed from the saved log-sum-exp,
     dV += Z^T dO (Z = P with dropout), dP^T = v dO^T, dS^T = P^T (dP^T - delta), through the score
     modifier's derivative, dK += dS^T q; dBias is written from dS^T here.
  3. dQ: one program per (BLOCK_M2 queries, batch, query head): walks the key blocks like the
     forward, dQ += dS k.
dK/dV sum over the GQA group inside one program, so every output element has one writer. A bias that
broadcasts gets its gradient from fp32 partials (scratch, one per [B, Hq, Sq, Skv] element) summed by
a 4th launch over the broadcast axes.

Rows that saw no key have P = 0: their saved log-sum-exp is +inf (a -inf is read as +inf too).
The band (right bound R, left bound W, either alignment) bounds each kernel's loop as in the forward.
A sink token leaves dQ, dK, dV as they are (Stats hold it; it has no value row); its gradient dSink
is summed per query head by a launch after the preprocess. Packed (ragged) tensors as in the forward (ragged.py): each kernel reads its sequence's first rows,
masks its loads and stores to the sequence's rows, and a launch before them zeroes packed dQ, dK, dV.
"""

from __future__ import annotations

from ....core.errors import expect
from ....memory.workspace import align_up
from ..templates.base import Arg, ArgKind, Generated
from .common import (
    LOG2E,
    UNIFORM_HELPER,
    KernelText,
    alibi_lines,
    and_mask,
    apply_keep,
    base_expr,
    cols_orient,
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
    score_mod_grad,
    seqlen_lines,
    times,
    tma_desc,
    tma_load,
    tma_ok,
    wide,
)
from .dbias import DbiasReduce, dbias_reduce
from .forward import block_loops, fwd_ranges, generated, needs_loops
from .ragged import exit_past_length, ragged_lines, row_base, rows_ok, zero_kernel
from .sized import divides, upper
from .spec import AttnSpec, BwdKnobs, Operand
from .tiles import check_tiles, tile_lines, tiles_ok
from .tiles import programs as tile_programs

__all__ = ["backward", "dbias_broadcast"]


def dbias_broadcast(spec: AttnSpec) -> bool:
    """Whether dBias sums over broadcast axes (so goes through fp32 partials)."""
    assert spec.bias_dims is not None
    full = (spec.B, spec.Hq, spec.Sq, spec.Skv)
    return any(d != f for d, f in zip(spec.bias_dims, full))


def _mask(mask: str | None, other: str = "0.0") -> str:
    return f", mask={mask}, other={other}" if mask else ""


def _row(name: str, w: bool) -> str:
    return f"{name}.to(tl.int64)" if w else name


def scratch_of(spec: AttnSpec) -> tuple[dict[str, Arg], int]:
    """The backward's scratch buffers by parameter name (delta; the dBias partials where dBias broadcasts),
    fp32 each from an aligned offset, and their bytes (a bucket kernel's at the bucket's largest shape)."""
    sizes = {"DELTA": spec.B * spec.Hq * spec.Sq}
    if spec.dbias is not None and dbias_broadcast(spec):
        sizes["DBP"] = spec.B * spec.Hq * spec.Sq * spec.Skv
        if partial_sums := DbiasReduce.of(spec).scratch_elements():
            sizes["DBS"] = partial_sums
    out, offset = {}, 0
    for name, numel in sizes.items():
        out[name] = Arg(ArgKind.SCRATCH, offset=offset, dtype="float32")
        offset += align_up(upper(numel) * 4)
    return out, offset


def backward(spec: AttnSpec, kn: BwdKnobs) -> Generated:
    if spec.Hk != spec.Hv:
        raise ValueError("the generated backward needs as many key heads as value heads")
    if kn.TILES:
        why = tiles_ok(spec, ("dq", "dk", "dv", "dbias"), ("q", "kv"))
        check_tiles(spec, why or ("the fused launch" if kn.FUSED else None))
    scratch, scratch_bytes = scratch_of(spec)
    pre = _preprocess(spec, kn, scratch)
    dkdv = _dkdv(spec, kn, scratch)
    nkv, nq = (spec.Skv + kn.BLOCK_N1 - 1) // kn.BLOCK_N1, (spec.Sq + kn.BLOCK_M2 - 1) // kn.BLOCK_M2
    # (each kernel's launch after every body: a bucket kernel's size parameters are all known then)
    if kn.FUSED:
        dq = _dq(spec, kn, scratch, fused=nkv)
        both = _fuse(dkdv, dq, nkv)
        functions = [pre.source(), both.source()]
        launches = [both.launch((nkv + spec.gk * nq, spec.B * spec.Hk), kn.W1, kn.S1)]
    else:
        dq = _dq(spec, kn, scratch)
        functions = [pre.source(), dkdv.source(), dq.source()]
        if kn.TILES:  # (tiles.py: a program per tile of the sequences' own blocks)
            grids = (
                (tile_programs(spec, kn.BLOCK_N1, nkv, ("dk", "dv")), spec.Hk),
                (tile_programs(spec, kn.BLOCK_M2, nq, ("dq",)), spec.Hq),
            )
        else:
            grids = ((nkv, spec.B * spec.Hk), (nq, spec.B * spec.Hq))
        launches = [dkdv.launch(grids[0], kn.W1, kn.S1), dq.launch(grids[1], kn.W2, kn.S2)]
    launches.insert(0, pre.launch(((spec.Sq + kn.PRE_BLOCK - 1) // kn.PRE_BLOCK, spec.B * spec.Hq), 4, 1))
    if spec.dsink is not None:
        ds = _dsink(spec, kn, scratch)
        functions.append(ds.source())
        launches.insert(1, ds.launch((spec.Hq,), 4, 1))  # (after the preprocess: it reads delta)
    if "DBP" in scratch:
        for red, grid in dbias_reduce(spec, scratch):
            functions.append(red.source())
            launches.append(red.launch(grid, 4, 1))
    zero = zero_kernel(spec, "kernel_attn_bwd_zero", ("dq", "dk", "dv"))
    if zero is not None:  # packed gradients: rows no sequence covers are 0
        functions.insert(0, zero[0].source())
        launches.insert(0, zero[0].launch(zero[1], 4, 1))
    if spec.dropout is not None:
        functions.insert(0, UNIFORM_HELPER)
    return generated(functions, launches, scratch_bytes, spec.sizes)


def _preprocess(spec: AttnSpec, kn: BwdKnobs, scratch: dict[str, Arg]) -> KernelText:
    """delta[b, h, i] = sum_d O * dO in fp32."""
    assert spec.o is not None and spec.do is not None
    k = KernelText("kernel_attn_bwd_pre", scratch, spec.sizes)
    pb, dvp = kn.PRE_BLOCK, pow2(spec.Dv)
    k.param(spec.o.name)
    k.param(spec.do.name)
    k.param("DELTA")
    k.add(
        "pid_bh = tl.program_id(1)",
        f"off_b = pid_bh // {spec.Hq}",
        f"off_h = pid_bh % {spec.Hq}",
        f"offs_m = tl.program_id(0) * {pb} + tl.arange(0, {pb})",
        f"offs_dv = tl.arange(0, {dvp})",
    )
    packed = tuple(r for r in ("o", "do") if spec.packed(r) is not None)
    if packed:
        k.add(*seqlen_lines(spec, k), *ragged_lines(spec, k, packed))
    row_ok = f"(offs_m[:, None] < {spec.Sq})" if not divides(pb, spec.Sq) else None
    dvmask = f"(offs_dv[None, :] < {spec.Dv})" if dvp != spec.Dv else None
    for var, op in (("o", spec.o), ("do", spec.do)):
        rows = _row("offs_m[:, None]", wide(extent(op, (1, 1, spec.Sq, spec.Dv))))
        mask = and_mask(rows_ok(spec, var, "offs_m[:, None]") or row_ok, dvmask)
        k.add(
            f"{var} = tl.load({op.name} + {row_base(spec, var, op, 'off_b', 'off_h')} + {rows} * {op.strides[2]}"
            f" + offs_dv[None, :]{_mask(mask)}).to(tl.float32)"
        )
    smask = f", mask=offs_m < {spec.Sq}" if not divides(pb, spec.Sq) else ""
    k.add(f"tl.store(DELTA + pid_bh.to(tl.int64) * {spec.Sq} + offs_m, tl.sum(o * do, 1){smask})")
    return k


def _dsink(spec: AttnSpec, kn: BwdKnobs, scratch: dict[str, Arg]) -> KernelText:
    """dSink[h] = -sum over b and the rows i within their sequence of exp(sink[h] - Stats) * delta (rows
    with finite Stats): one program a query head, after the preprocess (delta), no atomics."""
    assert spec.sink is not None and spec.dsink is not None and spec.stats is not None
    k = KernelText("kernel_attn_bwd_dsink", scratch, spec.sizes)
    pb, st = kn.PRE_BLOCK, spec.stats
    for name in (st.name, "DELTA", spec.sink.name, spec.dsink.name):
        k.param(name)
    k.add(
        "off_h = tl.program_id(0)",
        f"offs = tl.arange(0, {pb})",
        f"sink = tl.load({spec.sink.name} + {base_expr(spec.sink, 'off_h', 'off_h')}).to(tl.float32)",
        f"acc = tl.zeros([{pb}], tl.float32)",
        f"for b_i in range({spec.B}):",
    )
    ok = and_mask("(offs_m < q_len)", rows_ok(spec, "stats", "offs_m"))
    k.add(
        "off_b = off_h * 0 + b_i",  # (a tensor under the interpreter too, where b_i is a Python int)
        *seqlen_lines(spec, k),
        *ragged_lines(spec, k, ("stats",)),
        f"lse_base = {row_base(spec, 'stats', st, 'off_b', 'off_h')}",
        f"for start in range(0, q_len, {pb}):",
        depth=1,
    )
    k.add(
        "offs_m = start + offs",
        f"ok = {ok}",
        f'lse = tl.load({st.name} + lse_base + offs_m * {st.strides[2]}, mask=ok, other=float("inf")).to(tl.float32)',
        f"di = tl.load(DELTA + (off_b.to(tl.int64) * {spec.Hq} + off_h) * {spec.Sq} + offs_m, mask=ok, other=0.0)",
        'ok = ok & (lse > float("-inf")) & (lse < float("inf"))',
        "ps = tl.exp(sink - tl.where(ok, lse, 0.0))",
        'acc += tl.where(ok & (ps < float("inf")), ps * di, 0.0)',
        depth=2,
    )
    d = spec.dsink
    k.add(f"tl.store({d.name} + {base_expr(d, 'off_h', 'off_h')}, (0.0 - tl.sum(acc, 0)).to({d.dtype}))")
    return k


def _common_setup(spec: AttnSpec, k: KernelText, roles: tuple[str, ...], exit: list[str] | None = None) -> None:
    k.add(*seqlen_lines(spec, k))
    k.add(*(exit or []))  # (ragged.exit_past_length: a program past its sequence's rows)
    k.add(*ragged_lines(spec, k, roles))
    k.add(*scale_lines(spec, k))
    dropout_scale_params(spec, k)


def _per_head(spec: AttnSpec, k: KernelText, depth: int) -> None:
    """Values that depend on the query head off_h."""
    k.add(*alibi_lines(spec), depth=depth)
    k.add(*dropout_setup(spec), depth=depth)
    if spec.bias is not None:
        k.param(spec.bias.name)
        k.add(f"bias_base = {base_expr(spec.bias, 'off_b', 'off_h')}", depth=depth)
    if spec.block_mask is not None:
        k.param(spec.block_mask.name)
        k.add(f"bmask_base = {base_expr(spec.block_mask, 'off_b', 'off_h')}", depth=depth)


def _lse2(spec: AttnSpec, offs: str, mask: str | None) -> list[str]:
    st = spec.stats
    assert st is not None
    m = f", mask={mask}, other=0.0" if mask else ""
    return [
        f"lse = tl.load({st.name} + lse_base + {offs} * {st.strides[2]}{m}).to(tl.float32)",
        f'lse2 = tl.where(lse == float("-inf"), float("inf"), lse * {LOG2E!r})',
    ]


def _dkdv(spec: AttnSpec, kn: BwdKnobs, scratch: dict[str, Arg]) -> KernelText:
    assert spec.dk is not None and spec.dv is not None and spec.do is not None and spec.stats is not None
    k = KernelText("kernel_attn_bwd_dkdv", scratch, spec.sizes)
    bm, bn = kn.BLOCK_M1, kn.BLOCK_N1
    dp, dvp = pow2(spec.D), pow2(spec.Dv)
    dt = dot_dtype(spec)
    right = spec.right_bound
    for op in (spec.q, spec.k, spec.v, spec.do, spec.stats):
        k.param(op.name)
    k.param("DELTA")
    k.param(spec.dk.name)
    k.param(spec.dv.name)
    if kn.TILES:  # (key blocks: the lowest first under a causal band, where they see the most queries)
        nkv = (spec.Skv + bn - 1) // bn
        k.add(
            *tile_lines(
                spec, k, bn, nkv, side="kv", outs=("dk", "dv"), start="pid_n", head="off_hk", descending=right is None
            )
        )
    else:
        k.add(
            "pid_n = tl.program_id(0)",
            "pid_bh = tl.program_id(1)",
            f"off_b = pid_bh // {spec.Hk}",
            f"off_hk = pid_bh % {spec.Hk}",
        )
    k.add(
        "off_hv = off_hk",
        f"n0 = pid_n * {bn}",
        f"offs_n = n0 + tl.arange(0, {bn})",
        f"offs_m0 = tl.arange(0, {bm})",
        f"offs_d = tl.arange(0, {dp})",
        f"offs_dv = tl.arange(0, {dvp})",
    )
    # (not in the fused kernel: its dK/dV part is a branch)
    exit = exit_past_length(spec, "n0", "kv", ("dk", "dv", "dbias")) if not (kn.FUSED or kn.TILES) else None
    _common_setup(spec, k, ("q", "k", "v", "do", "stats", "dk", "dv"), exit)
    dmask = f"(offs_d[None, :] < {spec.D})" if dp != spec.D else None
    dvmask = f"(offs_dv[None, :] < {spec.Dv})" if dvp != spec.Dv else None
    key_ok = f"(offs_n[:, None] < {spec.Skv})" if not divides(bn, spec.Skv) else None
    wk, wv = (wide(extent(op, (1, 1, spec.Skv, d))) for op, d in ((spec.k, spec.D), (spec.v, spec.Dv)))
    k_ok, v_ok = (rows_ok(spec, r, "offs_n[:, None]") or key_ok for r in ("k", "v"))
    k.add(
        f"kt = tl.load({spec.k.name} + {row_base(spec, 'k', spec.k, 'off_b', 'off_hk')} + "
        f"{_row('offs_n[:, None]', wk)} * {spec.k.strides[2]} + offs_d[None, :]{_mask(and_mask(k_ok, dmask))})"
    )
    k.add(
        f"vt = tl.load({spec.v.name} + {row_base(spec, 'v', spec.v, 'off_b', 'off_hv')} + "
        f"{_row('offs_n[:, None]', wv)} * {spec.v.strides[2]} + offs_dv[None, :]{_mask(and_mask(v_ok, dvmask))})"
    )
    if spec.q.dtype != dt:
        k.add(f"kt = kt.to({dt})", f"vt = vt.to({dt})")
    k.add(f"dk = tl.zeros([{bn}, {dp}], tl.float32)", f"dv = tl.zeros([{bn}, {dvp}], tl.float32)")
    # query-row ranges of this key block: masked [lo, r1) (the band's right bound: the causal diagonal),
    # whole [r1, r2), masked [r2, hi) (window edge, padding, ragged ends)
    lines = ["hi = q_len"]
    if spec.window is not None:
        lines.append(f"hi = tl.minimum(hi, tl.maximum(n0 + {bn - 1 + spec.window} - diag, 0))")
    if right is not None:  # key j is seen by rows i >= j - diag - R
        r = f" - {right}" if right else ""
        lines += [
            f"lo = (tl.maximum(n0 - diag{r}, 0) // {bm}) * {bm}",
            f"r1 = ((tl.maximum(n0 + {bn - 1} - diag{r}, 0) + {bm - 1}) // {bm}) * {bm}",
        ]
    else:
        lines += ["lo = 0", "r1 = 0"]
    lines.append("hi = tl.where(n0 < kv_len, hi, lo)")
    lines.append(f"r2 = (q_len // {bm}) * {bm}")
    if spec.window is not None:
        lines.append(f"r2 = tl.minimum(r2, (tl.maximum(n0 + {spec.window} - diag, 0) // {bm}) * {bm})")
    lines.append(f"r2 = tl.where(n0 + {bn} <= kv_len, r2, r1)")  # a ragged key block is masked throughout
    lines += ["r1 = tl.minimum(tl.maximum(r1, lo), hi)", "r2 = tl.minimum(tl.maximum(r2, r1), hi)"]
    if spec.block_mask is not None:  # no block is whole: the block mask's bits are read in every one
        lines.append("r2 = r1")
    k.add(*lines)
    lead = right is not None
    trail = (
        spec.window is not None
        or spec.seq_len_q is not None
        or spec.seq_len_kv is not None
        or not divides(bm, spec.Sq)
        or not divides(bn, spec.Skv)
        or spec.block_mask is not None
    )
    wq, wdo = (wide(extent(op, (1, 1, spec.Sq, d))) for op, d in ((spec.q, spec.D), (spec.do, spec.Dv)))
    tma = (
        bool(kn.TMA)
        and spec.sizes is None  # (a descriptor's shape is the tensor's)
        and not spec.ragged
        and tma_ok(spec.q, (spec.B, spec.Hq, spec.Sq, spec.D))
        and tma_ok(spec.do, (spec.B, spec.Hq, spec.Sq, spec.Dv))
    )
    if tma:
        k.add(
            tma_desc(spec.q, "desc_q", (spec.B, spec.Hq, spec.Sq, spec.D), bm, dp),
            tma_desc(spec.do, "desc_do", (spec.B, spec.Hq, spec.Sq, spec.Dv), bm, dvp),
        )
    k.add(f"for g in range({spec.gk}):")
    k.add(f"off_h = off_hk * {spec.gk} + g", depth=1)
    _per_head(spec, k, 1)
    k.add(
        f"q_ptrs = {spec.q.name} + {row_base(spec, 'q', spec.q, 'off_b', 'off_h')} + "
        f"{_row('offs_m0[:, None]', wq)} * {spec.q.strides[2]} + offs_d[None, :]",
        f"do_ptrs = {spec.do.name} + {row_base(spec, 'do', spec.do, 'off_b', 'off_h')} + "
        f"{_row('offs_m0[:, None]', wdo)} * {spec.do.strides[2]} + offs_dv[None, :]",
        f"lse_base = {row_base(spec, 'stats', spec.stats, 'off_b', 'off_h')}",
        f"delta_ptr = DELTA + (off_b.to(tl.int64) * {spec.Hq} + off_h) * {spec.Sq}",
        depth=1,
    )
    db = _dbias_target(spec, k)
    if db is not None:
        k.add(f"db_base = {db[1]}", depth=1)
    k.add(
        *block_loops(
            lead,
            trail,
            bool(kn.ONELOOP),
            "start_m",
            bm,
            lambda masked: _dkdv_body(spec, k, kn, masked, wq, wdo, dmask, dvmask, key_ok, db, tma),
        ),
        depth=1,
    )
    if db is not None:  # blocks no key of this block sees: dBias is 0 there
        k.add(f"vis = tl.where(hi > lo, lo + ((hi - lo + {bm - 1}) // {bm}) * {bm}, lo)", depth=1)
        for rng in ("0, lo", f"vis, {spec.Sq}"):
            k.add(f"for start_m in range({rng}, {bm}):", depth=1)
            k.add("offs_m = start_m + offs_m0", depth=2)
            k.add(*_dbias_store(spec, db, f"tl.zeros([{bn}, {bm}], tl.float32)"), depth=2)
    k.add("dk = dk * sm")
    for op, val, rows_w, d, mask in (
        (spec.dk, "dk", spec.Skv, spec.D, dmask),
        (spec.dv, "dv", spec.Skv, spec.Dv, dvmask),
    ):
        w = wide(extent(op, (1, 1, rows_w, d)))
        m = and_mask(rows_ok(spec, val, "offs_n[:, None]") or key_ok, mask)
        base = row_base(spec, val, op, "off_b", "off_hk")
        k.add(
            f"tl.store({op.name} + {base} + {_row('offs_n[:, None]', w)} * {op.strides[2]}"
            f" + {'offs_d' if val == 'dk' else 'offs_dv'}[None, :], {val}.to({op.dtype}){', mask=' + m if m else ''})"
        )
    return k


def _dbias_target(spec: AttnSpec, k: KernelText) -> tuple[Operand, str] | None:
    """Where the dK/dV kernel writes dS: dBias itself (no broadcast) or the fp32 partials."""
    if spec.dbias is None:
        return None
    if dbias_broadcast(spec):
        k.param("DBP")
        part = Operand("DBP", "tl.float32", (spec.Hq * spec.Sq * spec.Skv, spec.Sq * spec.Skv, spec.Skv, 1))
        return part, base_expr(part, "off_b", "off_h")
    k.param(spec.dbias.name)
    return spec.dbias, base_expr(spec.dbias, "off_b", "off_h")


def _dbias_store(spec: AttnSpec, db: tuple[Operand, str], value: str) -> list[str]:
    op = db[0]
    wi = wide(extent(op, (spec.B, spec.Hq, spec.Sq, spec.Skv)))
    i = _row("offs_m[None, :]", wi)
    mask = and_mask(f"(offs_m[None, :] < {spec.Sq})", f"(offs_n[:, None] < {spec.Skv})" if spec.Skv else None)
    store = (
        f"tl.store({op.name} + db_base + {i} * {op.strides[2]} + offs_n[:, None] * {op.strides[3]}, "
        f"({value}).to({op.dtype}), mask={mask})"
    )
    return [store]


def _dkdv_body(
    spec: AttnSpec,
    k: KernelText,
    kn: BwdKnobs,
    masked: bool | str,
    wq: bool,
    wdo: bool,
    dmask: str | None,
    dvmask: str | None,
    key_ok: str | None,
    db: tuple[Operand, str] | None,
    tma: bool,
) -> list[str]:
    dt = dot_dtype(spec)
    do = expect(spec.do, "the backward attention spec's dO operand")
    dp, dvp = pow2(spec.D), pow2(spec.Dv)
    ragged_rows = masked and not divides(kn.BLOCK_M1, spec.Sq)
    row_ok = f"(offs_m[:, None] < {spec.Sq})" if ragged_rows else None
    start = "start_m.to(tl.int64)" if wq else "start_m"
    dstart = "start_m.to(tl.int64)" if wdo else "start_m"
    vec_mask = f"offs_m < {spec.Sq}" if ragged_rows else None
    q_ok, do_ok = (rows_ok(spec, r, "offs_m[:, None]") or row_ok for r in ("q", "do"))
    lines = [
        "offs_m = start_m + offs_m0",
        f"qt = {tma_load('desc_q', 'off_b', 'off_h', 'start_m', kn.BLOCK_M1, dp)}"
        if tma
        else f"qt = tl.load(q_ptrs + {start} * {spec.q.strides[2]}{_mask(and_mask(q_ok, dmask))})",
    ]
    if spec.q.dtype != dt:
        lines.append(f"qt = qt.to({dt})")
    lines += _lse2(spec, "offs_m", rows_ok(spec, "stats", "offs_m") or vec_mask)
    lines.append(f"qk = {dot(spec, 'kt', 'tl.trans(qt)')}")
    o = cols_orient(str(spec.Sq) if ragged_rows else None, str(spec.Skv) if (masked and key_ok) else None)
    f = exp2_factor(spec)  # (s2 without it: applied in exp2's argument, one fma a score)
    lines += score_lines(spec, k, o, masked, f is not None)
    lines.append(f"pt = tl.math.exp2(s2{times(f)} - lse2[None, :])")
    lines.append(
        f"dot_ = {tma_load('desc_do', 'off_b', 'off_h', 'start_m', kn.BLOCK_M1, dvp)}"
        if tma
        else f"dot_ = tl.load(do_ptrs + {dstart} * {do.strides[2]}{_mask(and_mask(do_ok, dvmask))})"
    )
    if do.dtype != dt:
        lines.append(f"dot_ = dot_.to({dt})")
    lines.append(f"di = tl.load(delta_ptr + offs_m{_mask(vec_mask)})")
    zt = "pt"
    if spec.dropout is not None:
        lines += dropout_lines(spec, k, o)
        zt = f"{apply_keep(spec, 'pt')} * drop_scale"
    lines.append(f"dv = {dot(spec, f'({zt}).to({dt})', 'dot_', 'dv')}")
    lines.append(f"dpt = {dot(spec, 'vt', 'tl.trans(dot_)')}")
    if spec.dropout is not None:
        lines.append(f"dpt = {apply_keep(spec, 'dpt')} * drop_scale")
    lines.append("dst = pt * (dpt - di[None, :])")
    if spec.score_mod is not None:
        lines += score_mod_grad(spec, o, "dst")
        lines.append("dst = tl.where(pt == 0.0, 0.0, dst)")
    if db is not None:
        lines += _dbias_store(spec, db, "dst")
    lines.append(f"dk = {dot(spec, f'dst.to({dt})', 'qt', 'dk')}")
    return lines


def _fuse(dkdv: KernelText, dq: KernelText, nkv: int) -> KernelText:
    """One kernel whose first `nkv` programs (per batch and key head) run the dK/dV kernel's body and
    the others the dQ kernel's: both kinds share the GPU, so neither launch's tail idles it."""
    k = KernelText("kernel_attn_bwd", sizes=dkdv.sizes)
    for part in (dkdv, dq):
        for name, arg in zip(part.params.names, part.params.args):
            k.params.add(name, arg)
    k.add(f"if tl.program_id(0) < {nkv}:")
    k.add(*dkdv.lines, depth=1)
    k.add("else:")
    k.add(*dq.lines, depth=1)
    return k


def _dq(spec: AttnSpec, kn: BwdKnobs, scratch: dict[str, Arg], fused: int | None = None) -> KernelText:
    """The dQ kernel; with `fused` (the count of dK/dV programs before it), the dQ part of the fused
    kernel, whose grid axis 1 is batch x key head and axis 0 past `fused` the GQA group's query blocks."""
    assert spec.dq is not None and spec.do is not None and spec.stats is not None
    k = KernelText("kernel_attn_bwd_dq", scratch, spec.sizes)
    bm, bn = kn.BLOCK_M2, kn.BLOCK_N2
    dp, dvp = pow2(spec.D), pow2(spec.Dv)
    dt = dot_dtype(spec)
    num_m = (spec.Sq + bm - 1) // bm
    causal = spec.right_bound is not None
    for op in (spec.q, spec.k, spec.v, spec.do, spec.stats):
        k.param(op.name)
    k.param("DELTA")
    k.param(spec.dq.name)
    if fused is not None:
        k.add(
            f"y = tl.program_id(0) - {fused}",
            "pid_bh = tl.program_id(1)",
            f"pid_m = y % {num_m}",
            f"off_b = pid_bh // {spec.Hk}",
            f"off_h = (pid_bh % {spec.Hk}) * {spec.gk} + y // {num_m}",
        )
    elif kn.TILES:
        k.add(*tile_lines(spec, k, bm, num_m, side="q", outs=("dq",)))
    else:
        k.add(
            "pid_m = tl.program_id(0)",
            "pid_bh = tl.program_id(1)",
            f"off_b = pid_bh // {spec.Hq}",
            f"off_h = pid_bh % {spec.Hq}",
        )
    if not kn.TILES or fused is not None:
        k.add(f"start_m = {num_m - 1} - pid_m" if causal else "start_m = pid_m")
    k.add(
        f"off_hk = off_h // {spec.gk}",
        f"off_hv = off_h // {spec.gv}",
        f"m0 = start_m * {bm}",
        f"offs_m = m0 + tl.arange(0, {bm})",
        f"offs_n0 = tl.arange(0, {bn})",
        f"offs_d = tl.arange(0, {dp})",
        f"offs_dv = tl.arange(0, {dvp})",
    )
    exit = exit_past_length(spec, "m0", "q", ("dq",)) if fused is None and not kn.TILES else None
    _common_setup(spec, k, ("q", "k", "v", "do", "stats", "dq"), exit)
    _per_head(spec, k, 0)
    dmask = f"(offs_d[None, :] < {spec.D})" if dp != spec.D else None
    dvmask = f"(offs_dv[None, :] < {spec.Dv})" if dvp != spec.Dv else None
    row_ok = f"(offs_m[:, None] < {spec.Sq})" if not divides(bm, spec.Sq) else None
    vec_ok = f"offs_m < {spec.Sq}" if not divides(bm, spec.Sq) else None
    wq, wdo, wk, wv = (
        wide(extent(op, (1, 1, s, d)))
        for op, s, d in (
            (spec.q, spec.Sq, spec.D),
            (spec.do, spec.Sq, spec.Dv),
            (spec.k, spec.Skv, spec.D),
            (spec.v, spec.Skv, spec.Dv),
        )
    )
    q_ok, do_ok = (rows_ok(spec, r, "offs_m[:, None]") or row_ok for r in ("q", "do"))
    k.add(
        f"qt = tl.load({spec.q.name} + {row_base(spec, 'q', spec.q, 'off_b', 'off_h')} + "
        f"{_row('offs_m[:, None]', wq)} * {spec.q.strides[2]} + offs_d[None, :]{_mask(and_mask(q_ok, dmask))})"
    )
    k.add(
        f"dot_ = tl.load({spec.do.name} + {row_base(spec, 'do', spec.do, 'off_b', 'off_h')} + "
        f"{_row('offs_m[:, None]', wdo)} * {spec.do.strides[2]} + offs_dv[None, :]{_mask(and_mask(do_ok, dvmask))})"
    )
    if spec.q.dtype != dt:
        k.add(f"qt = qt.to({dt})", f"dot_ = dot_.to({dt})")
    k.add(f"lse_base = {row_base(spec, 'stats', spec.stats, 'off_b', 'off_h')}")
    k.add(*_lse2(spec, "offs_m", rows_ok(spec, "stats", "offs_m") or vec_ok))
    k.add(f"di = tl.load(DELTA + (off_b.to(tl.int64) * {spec.Hq} + off_h) * {spec.Sq} + offs_m{_mask(vec_ok)})")
    k.add(
        f"k_ptrs = {spec.k.name} + {row_base(spec, 'k', spec.k, 'off_b', 'off_hk')} + "
        f"{_row('offs_n0[:, None]', wk)} * {spec.k.strides[2]} + offs_d[None, :]",
        f"v_ptrs = {spec.v.name} + {row_base(spec, 'v', spec.v, 'off_b', 'off_hv')} + "
        f"{_row('offs_n0[:, None]', wv)} * {spec.v.strides[2]} + offs_dv[None, :]",
    )
    tma = (
        bool(kn.TMA)
        and spec.sizes is None
        and not spec.ragged
        and tma_ok(spec.k, (spec.B, spec.Hk, spec.Skv, spec.D))
        and tma_ok(spec.v, (spec.B, spec.Hv, spec.Skv, spec.Dv))
    )
    if tma:
        k.add(
            tma_desc(spec.k, "desc_k", (spec.B, spec.Hk, spec.Skv, spec.D), bn, dp),
            tma_desc(spec.v, "desc_v", (spec.B, spec.Hv, spec.Skv, spec.Dv), bn, dvp),
        )
    k.add(f"dq = tl.zeros([{bm}, {dp}], tl.float32)")
    k.add(*fwd_ranges(spec, bm, bn))
    lead, trail = needs_loops(spec, bn)
    k.add(
        *block_loops(
            lead,
            trail,
            bool(kn.ONELOOP),
            "start_n",
            bn,
            lambda masked: _dq_body(spec, k, kn, masked, wk, wv, row_ok, dmask, dvmask, tma),
        )
    )
    k.add("dq = dq * sm")
    if spec.seq_len_q is not None:
        k.add("dq = tl.where((offs_m < q_len)[:, None], dq, 0.0)")
    op = spec.dq
    m = and_mask(rows_ok(spec, "dq", "offs_m[:, None]") or row_ok, dmask)
    k.add(
        f"tl.store({op.name} + {row_base(spec, 'dq', op, 'off_b', 'off_h')} + "
        f"{_row('offs_m[:, None]', wide(extent(op, (1, 1, spec.Sq, spec.D))))} * {op.strides[2]} + offs_d[None, :], "
        f"dq.to({op.dtype}){', mask=' + m if m else ''})"
    )
    return k


def _dq_body(
    spec: AttnSpec,
    k: KernelText,
    kn: BwdKnobs,
    masked: bool | str,
    wk: bool,
    wv: bool,
    row_ok: str | None,
    dmask: str | None,
    dvmask: str | None,
    tma: bool,
) -> list[str]:
    dt = dot_dtype(spec)
    dp, dvp = pow2(spec.D), pow2(spec.Dv)
    bn = kn.BLOCK_N2
    ragged = masked and not divides(bn, spec.Skv)
    key_ok = f"(offs_n[:, None] < {spec.Skv})" if ragged else None
    k_ok, v_ok = (rows_ok(spec, r, "offs_n[:, None]") or key_ok for r in ("k", "v"))
    if tma:
        loads = [
            f"kt = {tma_load('desc_k', 'off_b', 'off_hk', 'start_n', bn, dp)}",
            f"vt = {tma_load('desc_v', 'off_b', 'off_hv', 'start_n', bn, dvp)}",
        ]
    else:
        loads = [
            f"kt = tl.load(k_ptrs + {_row('start_n', wk)} * {spec.k.strides[2]}{_mask(and_mask(k_ok, dmask))})",
            f"vt = tl.load(v_ptrs + {_row('start_n', wv)} * {spec.v.strides[2]}{_mask(and_mask(v_ok, dvmask))})",
        ]
    lines = ["offs_n = start_n + offs_n0", *loads]
    if spec.q.dtype != dt:
        lines += [f"kt = kt.to({dt})", f"vt = vt.to({dt})"]
    lines.append(f"qk = {dot(spec, 'qt', 'tl.trans(kt)')}")
    o = rows_orient(str(spec.Sq) if row_ok else None, str(spec.Skv) if ragged else None)
    f = exp2_factor(spec)
    lines += score_lines(spec, k, o, masked, f is not None)
    lines.append(f"p = tl.math.exp2(s2{times(f)} - lse2[:, None])")
    lines.append(f"dp = {dot(spec, 'dot_', 'tl.trans(vt)')}")
    if spec.dropout is not None:
        lines += dropout_lines(spec, k, o)
        lines.append(f"dp = {apply_keep(spec, 'dp')} * drop_scale")
    lines.append("ds = p * (dp - di[:, None])")
    if spec.score_mod is not None:
        lines += score_mod_grad(spec, o, "ds")
        lines.append("ds = tl.where(p == 0.0, 0.0, ds)")
    lines.append(f"dq = {dot(spec, f'ds.to({dt})', 'kt', 'dq')}")
    return lines
