"""The forward's last steps, shared by the one-launch forward and split-KV's combining launch: the sink
joining the online softmax before any key, and the epilogue from the row statistics m (log2 units) and
l and the unnormalised O: O (and its fused epilogue), Stats, score_max, score_sum_exp. Rows that saw
nothing (l = 0) give O = 0 and the empty rows' Stats."""

from __future__ import annotations

from .common import KernelText, and_mask, base_expr, extent, wide
from .ragged import row_base, rows_ok
from .spec import LN2, LOG2E, AttnSpec, Coords

__all__ = ["finish", "sink_lines"]


def finish(
    spec: AttnSpec,
    k: KernelText,
    row_ok: str | None,
    dvmask: str | None,
    dropped: bool,
    head: str = "off_h",
) -> None:
    """The epilogue from m_i, l_i, acc of rows offs_m: O normalised (and its epilogue hook), Stats,
    score_max, score_sum_exp. `row_ok`: the predicate of the tile's rows in [0, Sq) (None: all are);
    `dropped`: acc already holds the dropout's 1/(1-p); `head`: the query head of a row's 1-D values
    (off_h: the program's; a vector where a tile packs several heads, gqa_pack.py)."""
    # epilogue: normalise; rows that saw nothing (l = 0) give 0 and LSE +inf
    k.add("seen = l_i > 0.0", "inv_l = tl.where(seen, 1.0 / tl.where(seen, l_i, 1.0), 0.0)")
    if spec.dropout is not None and not dropped:
        k.add("inv_l = inv_l * drop_scale")
    k.add("out = acc * inv_l[:, None]")
    if spec.seq_len_q is not None:
        k.add("out = tl.where((offs_m < q_len)[:, None], out, 0.0)")
    omask = and_mask(rows_ok(spec, "o", "offs_m[:, None]") or row_ok, dvmask)
    if spec.epilogue is not None:
        for p in spec.epilogue.params():
            k.param(p)
        lines, value = spec.epilogue.emit("out", Coords("off_b", "off_h", "offs_m[:, None]", "offs_dv[None, :]", omask))
        k.add(*lines)
    else:
        value = "out"
    if spec.o is not None and value is not None:
        o = spec.o
        orows = "offs_m[:, None].to(tl.int64)" if wide(extent(o, (1, 1, spec.Sq, spec.Dv))) else "offs_m[:, None]"
        k.add(
            f"tl.store({o.name} + {row_base(spec, 'o', o, 'off_b', 'off_h')} + {orows} * {o.strides[2]} + offs_dv[None, :], "
            f"({value}).to({o.dtype}){f', mask={omask}' if omask else ''})"
        )
    empty = f'float("{spec.empty_stats.lstrip("+")}")'  # (the Stats of a row with no key kept and no sink)
    stat_rows = (
        ("stats", spec.stats, "lse", f"(m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * {LN2!r}", empty),
        ("score_max", spec.score_max, "smax", f"m_i * {LN2!r}", 'float("-inf")'),
        ("score_sum_exp", spec.score_sum_exp, "ssum", "l_i", "0.0"),
    )
    for role, st_op, var, expr, none in stat_rows:
        if st_op is None:
            continue
        k.add(f"{var} = tl.where(seen, {expr}, {none})")
        if spec.seq_len_q is not None:
            k.add(f"{var} = tl.where(offs_m < q_len, {var}, {none})")
        st_ok = rows_ok(spec, role, "offs_m") or (f"offs_m < {spec.Sq}" if row_ok is not None else None)
        smask = f", mask={st_ok}" if st_ok else ""
        base = row_base(spec, role, st_op, "off_b", head)
        k.add(f"tl.store({st_op.name} + {base} + offs_m * {st_op.strides[2]}, {var}{smask})")


def sink_lines(spec: AttnSpec, k: KernelText, bm: int, head: str = "off_h") -> list[str]:
    """The sink joins the online softmax before any key: m = its logit (log2 units), l = exp2(0) = 1, on
    the rows within their sequence (a padded row takes no sink; a sink of -inf adds nothing). `head`:
    the query head (finish's)."""
    if spec.sink is None:
        return []
    k.param(spec.sink.name)
    lines = [
        f"sink2 = tl.load({spec.sink.name} + {base_expr(spec.sink, 'off_b', head)}).to(tl.float32) * {LOG2E!r}",
        f"m_i = tl.zeros([{bm}], tl.float32) + sink2",
    ]
    if spec.seq_len_q is not None:
        lines.append('m_i = tl.where(offs_m < q_len, m_i, float("-inf"))')
    return [*lines, 'l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)']
