"""sdpa and sdpa_backward in torch (docs/attention.md has the formulas).

Two paths:
- F.scaled_dot_product_attention when it expresses the node: no Stats output, no score modifier,
  no padding mask, no dropout (PyTorch's own RNG is not the op's Philox stream), no sliding window,
  none of ops.attention.extensions (packed or paged tensors, a band's right bound, a sink token,
  a block mask, score_max / score_sum_exp / rng_dump), and no bottom-right causal mask with Sq > Skv (rows a mask empties are where PyTorch's backends
  disagree with the op's "O = 0"). Bias, ALiBi and a bottom-right diagonal become a float
  attn_mask; a tensor attn_scale is folded into q (no host read). It runs in the inputs' type on
  CUDA (flash / cuDNN / efficient kernels) and in float32 on the CPU. The backward recomputes the
  forward under autograd and differentiates it (the given o and stats are not read).
- otherwise the math path: the reference's formulas in float32 (float64 for DOUBLE inputs), with
  the score modifier evaluated by the pointwise modes' torch formulas and the Philox stream of
  `tl.rand` in int64 torch arithmetic (device tensors only: nothing reads a value on the host).
  Packed and paged tensors are gathered into dense [B, H, S, w] by index tensors built on the device
  from the offsets, lengths and page tables (out-of-range rows read 0), and packed outputs scattered
  back with index_add (rows no sequence covers are 0).
"""

from __future__ import annotations

import math
from typing import Any

from ...core.dtypes import DataType
from ...core.errors import expect
from ...ops import attention_ref as ref
from ...ops.attention import EMPTY_ROW_STATS, Sdpa, SdpaBackward, _Attention, extensions, ragged_role
from ...ops.pointwise import MODES, PointwiseMode
from ...ops.score_mod import ScoreMod, Src
from .common import Call, implements
from .pointwise import formula

_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85


def _torch():
    import torch

    return torch


# -- Philox (tl.rand) in int64 torch arithmetic --------------------------------------------------------


def _mulhilo(a: Any, b: int) -> tuple[Any, Any]:
    """(high, low) 32-bit words of a * b for 0 <= a, b < 2**32 without leaving int64."""
    b0, b1 = b & 0xFFFF, b >> 16
    p0, p1 = a * b0, a * b1  # < 2**48
    lo = (p0 & _M32) + ((p1 & 0xFFFF) << 16)
    hi = (p0 >> 32) + (p1 >> 16) + (lo >> 32)
    return hi & _M32, lo & _M32


def philox_uniform(seed: Any, counter: Any) -> Any:
    """tl.rand(seed, counter) for an int64 0-d `seed` tensor and int64 `counter` tensor: float32."""
    torch = _torch()
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    c0, c1 = counter & _M32, (counter >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(10):
        hi_b, lo_b = _mulhilo(c2, _ROUND_B)
        hi_a, lo_a = _mulhilo(c0, _ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    x = torch.where(c0 >= 2**31, _M32 - c0, c0)  # the word as int32, ~x when negative
    scale = torch.tensor(4.6566127342e-10, dtype=torch.float32, device=counter.device)
    return x.to(torch.float32) * scale


# -- pieces of the math path ------------------------------------------------------------------------


def _expand(x: Any, hq: int) -> Any:
    return x.repeat_interleave(hq // x.shape[1], dim=1) if x.shape[1] != hq else x


def _group_sum(x: Any, heads: int) -> Any:
    b, hq, s, d = x.shape
    return x.reshape(b, heads, hq // heads, s, d).sum(dim=2) if heads != hq else x


def evaluate(mod: ScoreMod, score: Any, inputs: list[Any], grad: Any = None) -> Any:
    """A score modifier in torch: the pointwise modes' torch formulas on the compute type."""
    torch = _torch()
    values: list[Any] = []

    def value(r):
        if r is None:
            return None
        if r.src is Src.SCORE:
            return score
        if r.src is Src.GRAD:
            return grad
        if r.src is Src.NODE:
            return values[r.index]
        if r.src is Src.INPUT:
            v = inputs[r.index]
            return v.reshape(()) if v.numel() == 1 else v
        return torch.tensor(r.const, dtype=score.dtype, device=score.device)

    for node in mod.nodes:
        info = MODES[node.mode]
        ops = [value(r) for r in node.operands]
        if node.mode is PointwiseMode.GEN_INDEX:
            axis = expect(node.axis, "GEN_INDEX's axis")
            shape = [1] * ops[0].dim()
            shape[axis] = ops[0].shape[axis]
            values.append(torch.arange(shape[axis], dtype=score.dtype, device=score.device).reshape(shape))
            continue
        params = {
            p: (torch.tensor(d, dtype=score.dtype, device=score.device) if v is None else v)
            for (p, d), v in zip(info.params, ops[info.arity :])
        }
        out = formula(node.mode)(*ops[: info.arity], **params)
        values.append(out.to(score.dtype) if out.dtype == torch.bool else out)
    return torch.broadcast_to(value(mod.result), score.shape)


def _ints(call: Call, role: str, n: int) -> Any:
    """An integer input (lengths, offsets) as int64 [n] on the device (None when absent); a ragged
    offset in rows (divided by its ragged_offset_strides entry)."""
    if not call.has(role):
        return None
    import torch

    x = call.tensor(role, torch.int64).reshape(-1)[:n]
    if role.endswith("_ragged_offset"):
        div = call.node.op_as(_Attention).offset_divisor(role.removesuffix("_ragged_offset"))
        x = torch.div(x, div, rounding_mode="floor") if div != 1 else x
    return x


def unpack(x: Any, off: Any, lens: Any, b: int, s: int) -> Any:
    """A packed [1, H, T, w] tensor as dense [B, H, S, w] (attention_ref.unpack, on the device)."""
    torch = _torch()
    t = x.shape[2]
    i = torch.arange(s, device=x.device)[None, :]
    tok = off[:, None] + i
    ok = (tok >= 0) & (tok < t)
    if lens is not None:
        ok = ok & (i < lens[:, None])
    g = x[0][:, tok.clamp(0, max(t - 1, 0))]  # [H, B, S, w]
    g = torch.where(ok[None, :, :, None], g, torch.zeros((), dtype=g.dtype, device=g.device))
    return g.permute(1, 0, 2, 3)


def pack(dense: Any, off: Any, lens: Any, t: int) -> Any:
    """Dense [B, H, S, w] into a zero [1, H, T, w], overlapping rows summed (attention_ref.pack)."""
    torch = _torch()
    b, h, s, w = dense.shape
    i = torch.arange(s, device=dense.device)[None, :]
    tok = off[:, None] + i
    ok = (tok >= 0) & (tok < t)
    if lens is not None:
        ok = ok & (i < lens[:, None])
    idx = torch.where(ok, tok, torch.full_like(tok, t)).reshape(-1)  # invalid rows land in a spare row t
    out = torch.zeros((h, t + 1, w), dtype=dense.dtype, device=dense.device)
    out.index_add_(1, idx, dense.permute(1, 0, 2, 3).reshape(h, b * s, w))
    return out[:, :t].unsqueeze(0)


def unpage(container: Any, table: Any, s: int) -> Any:
    """A paged cache [pages, H, block, w] read through table [B, P] as dense [B, H, S, w]
    (attention_ref.unpage)."""
    torch = _torch()
    pages, _, bs, _ = container.shape
    j = torch.arange(s, device=container.device)
    slot = j // bs
    page = table[:, slot.clamp(max=table.shape[1] - 1)]
    ok = (slot < table.shape[1])[None, :] & (page >= 0) & (page < pages)
    g = container[page.clamp(0, pages - 1), :, (j % bs)[None, :], :]  # [B, S, H, w]
    g = torch.where(ok[:, :, None, None], g, torch.zeros((), dtype=g.dtype, device=g.device))
    return g.permute(0, 2, 1, 3)


def _geometry(call: Call) -> tuple[int, int, int]:
    """(B, Sq, Skv) of the node (ops/attention.py Geometry)."""
    op = call.node.op_as(_Attention)
    q, k = call.tensor_desc("q"), call.tensor_desc("k")
    if call.has("q_ragged_offset"):
        b, sq = call.tensor_desc("seq_len_q").dim[0], int(expect(op.max_seq_len_q, "max_seq_len_q"))
    else:
        b, sq = q.dim[0], q.dim[2]
    if call.has("paged_attention_k_table"):
        table = call.tensor_desc("paged_attention_k_table")
        skv = op.max_seq_len_kv if op.max_seq_len_kv is not None else table.dim[2] * k.dim[2]
    elif call.has("k_ragged_offset"):
        skv = int(expect(op.max_seq_len_kv, "max_seq_len_kv"))
    else:
        skv = k.dim[2]
    return b, sq, int(skv)


def _dense(call: Call, role: str, b: int, sq: int, skv: int, cd: Any) -> Any:
    """Input `role` in dense logical dims [B, H, S, w] in type cd (unpacked or unpaged)."""
    torch = _torch()
    x = call.tensor(role, cd)
    kv = role in ("k", "v")
    rows = skv if kv else sq
    table_role = f"paged_attention_{role}_table"
    if call.has(table_role):
        pages = -(-rows // x.shape[2])
        table = call.tensor(table_role, torch.int64)
        if call.has(f"{table_role}_ragged_offset"):
            table = unpack(table, _ints(call, f"{table_role}_ragged_offset", b), None, b, pages)
        return unpage(x, table.reshape(b, -1), rows)
    if call.has(ragged_role(role)):
        lens = _ints(call, "seq_len_kv" if kv else "seq_len_q", b)
        return unpack(x, _ints(call, ragged_role(role), b), lens, b, rows)
    return x


def _packed(call: Call, role: str, dense: Any, out_role: str | None = None) -> Any:
    """A dense result packed as output `out_role` (default `role`) wants it (see ops/attention.py)."""
    out = call.out(out_role or role)
    if dense is None or out is None or not call.has(ragged_role(role)):
        return dense
    b = dense.shape[0]
    lens = _ints(call, "seq_len_kv" if role in ("dK", "dV") else "seq_len_q", b)
    return pack(dense, _ints(call, ragged_role(role), b), lens, out.dim[2])


def _keep(call: Call, b: int, sq: int, skv: int, device: Any) -> Any:
    """Boolean [B, 1, Sq, Skv] (or [B, H, Sq, Skv] with a block mask) of the built-in masks, or None."""
    torch = _torch()
    m = call.node.op_as(_Attention).masking
    keep = None
    if m.any:
        i = torch.arange(sq, device=device).reshape(1, 1, sq, 1)
        j = torch.arange(skv, device=device).reshape(1, 1, 1, skv)
        if m.padding:
            lq = _ints(call, "seq_len_q", b).reshape(b, 1, 1, 1)
            lkv = _ints(call, "seq_len_kv", b).reshape(b, 1, 1, 1)
            keep = (i < lq) & (j < lkv)
        else:
            lq = torch.full((1, 1, 1, 1), sq, device=device)
            lkv = torch.full((1, 1, 1, 1), skv, device=device)
            keep = torch.ones((1, 1, sq, skv), dtype=torch.bool, device=device)
        delta = lkv - lq if m.bottom_right else torch.zeros_like(lq)
        if m.right is not None:
            keep = keep & (j <= i + delta + m.right)
        if m.left is not None:
            keep = keep & (j > i + delta - m.left)
    if call.has("block_mask"):
        bits = _block_bits(call.tensor("block_mask", torch.int64), sq, skv)
        keep = bits if keep is None else keep & bits
    return keep


def _block_bits(mask: Any, sq: int, skv: int) -> Any:
    """attention_ref.block_mask_bits in torch."""
    torch = _torch()
    tile = ref.BLOCK_MASK_TILE
    shifts = torch.arange(8, device=mask.device)
    bits = ((mask[..., None] >> shifts) & 1).reshape(*mask.shape[:3], -1)[..., : -(-skv // tile)].bool()
    rows = (torch.arange(sq, device=mask.device) // tile).clamp(max=bits.shape[2] - 1)
    cols = torch.arange(skv, device=mask.device) // tile
    return bits[:, :, rows][:, :, :, cols]


def _compute_dtype(call: Call) -> Any:
    torch = _torch()
    return torch.float64 if call.tensor_desc("q").data_type is DataType.DOUBLE else torch.float32


_INT_ROLES = ("seq_len_q", "seq_len_kv", "dropout_seed", "dropout_offset", "block_mask")


def _inputs(call: Call, cd: Any) -> dict[str, Any]:
    return {
        r: (call.tensor(r, cd) if call.has(r) else None)
        for r in call.node.op.input_roles()
        if r not in _INT_ROLES and not r.endswith("_ragged_offset") and not r.startswith("paged_attention")
    }


def _scores(call: Call, a: dict[str, Any], cd: Any, b: int, sq: int, skv: int) -> tuple[Any, Any, Any]:
    """(s1, s, keep): pre-modifier, modified and masked scores, from dense a["q"], a["k"]."""
    torch = _torch()
    op = call.node.op_as(_Attention)
    q, k = a["q"], a["k"]
    hq = q.shape[1]
    scale = call.scalar("attn_scale", 1.0).to(cd)
    s1 = torch.matmul(q, _expand(k, hq).transpose(-1, -2)) * scale
    if a["bias"] is not None:
        s1 = s1 + a["bias"]
    if op.use_alibi_mask:
        slopes = torch.tensor(ref.alibi_slopes(hq), dtype=cd, device=q.device).reshape(1, hq, 1, 1)
        dist = torch.arange(skv, dtype=cd, device=q.device) - torch.arange(sq, dtype=cd, device=q.device)[:, None]
        s1 = s1 + slopes * dist
    s2 = s1
    if op.score_mod is not None:
        s2 = evaluate(op.score_mod, s1, [a[r] for r in op.score_mod.input_roles()])
    keep = _keep(call, b, sq, skv, q.device)
    s = s2.masked_fill(~keep, -math.inf) if keep is not None else s2
    return s1, s, keep


def _dropout_keep(call: Call, shape: tuple[int, ...]) -> Any:
    """The Philox keep mask (boolean), or None."""
    torch = _torch()
    op = call.node.op_as(_Attention)
    if op.dropout_probability is None:
        return None
    seed = call.tensor("dropout_seed", torch.int64).reshape(())
    offset = call.tensor("dropout_offset", torch.int64).reshape(())
    n = torch.arange(math.prod(shape), dtype=torch.int64, device=seed.device).reshape(shape)
    return philox_uniform(seed, offset + n) >= torch.tensor(
        op.dropout_probability, dtype=torch.float32, device=seed.device
    )


def _dropout(call: Call, shape: tuple[int, ...], a: dict[str, Any], cd: Any) -> Any:
    op = call.node.op_as(_Attention)
    keep = _dropout_keep(call, shape)
    if keep is not None:
        return keep.to(cd) * (1.0 / (1.0 - expect(op.dropout_probability, "the dropout probability")))
    if a.get("dropout_mask") is not None:
        return a["dropout_mask"] * call.scalar("dropout_scale", 1.0).to(cd)
    return None


def _softmax(s: Any, sink: Any = None, empty_stats: float = math.inf, rows: Any = None) -> tuple[Any, Any, Any, Any]:
    """P (0 on empty rows), Stats (`empty_stats` on empty rows), score_max and score_sum_exp, with the
    sink logits [1, H, 1, 1] in the denominator of the rows within their sequence (`rows`, boolean
    [B, 1, Sq, 1]; None: all) (attention_ref.softmax)."""
    torch = _torch()
    m = s.amax(dim=-1, keepdim=True)
    if sink is not None:
        sink = torch.broadcast_to(sink.reshape(1, -1, 1, 1).to(m.dtype), m.shape)
        if rows is not None:
            sink = sink.masked_fill(~rows, -math.inf)
        m = torch.maximum(m, sink)
    empty = m == -math.inf
    m0 = torch.where(empty, torch.zeros_like(m), m)
    e = torch.exp(s - m0)
    total = e.sum(dim=-1, keepdim=True)
    if sink is not None:
        total = total + torch.where(empty, torch.zeros_like(m), torch.exp(sink - m0))
    safe = torch.where(total == 0, torch.ones_like(total), total)
    stats = torch.where(empty, torch.full_like(m, empty_stats), m0 + torch.log(safe))
    return e / safe, stats, m, torch.where(empty, torch.zeros_like(total), total)


def _rows(call: Call, b: int, sq: int, device: Any) -> Any:
    """Boolean [B, 1, Sq, 1]: the query rows within their sequence (None without the padding mask)."""
    torch = _torch()
    if not call.node.op_as(_Attention).use_padding_mask:
        return None
    lq = _ints(call, "seq_len_q", b).reshape(b, 1, 1, 1)
    return torch.arange(sq, device=device).reshape(1, 1, sq, 1) < lq


# -- F.scaled_dot_product_attention ------------------------------------------------------------------


def fast_path(call: Call) -> bool:
    """Whether F.scaled_dot_product_attention runs the node (see the module docstring)."""
    op = call.node.op_as(_Attention)
    q, k = call.tensor_desc("q"), call.tensor_desc("k")
    backward = call.node.kind == "sdpa_backward"
    return (
        not extensions(call.node)
        and op.score_mod is None
        and not op.use_padding_mask
        and op.sliding_window_length is None
        and op.dropout_probability is None
        and not call.has("dropout_mask")
        and (backward or not call.wants("stats"))
        and not (op.use_causal_mask_bottom_right and q.dim[2] > k.dim[2])
    )


def _fast_args(call: Call, dt: Any, t: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """F.scaled_dot_product_attention's arguments from the tensors `t` (q, k, v, bias in type dt)."""
    torch = _torch()
    op = call.node.op_as(_Attention)
    q, k, v = t["q"], t["k"], t["v"]
    hq, sq, skv = q.shape[1], q.shape[2], k.shape[2]
    raw = call.raw("attn_scale")
    kw: dict[str, Any] = {"scale": 1.0}
    if isinstance(raw, (int, float)):
        kw["scale"] = float(raw)
    elif raw is not None:
        q = q * call.scalar("attn_scale", 1.0).to(dt)  # (set: raw is not None)
    if k.shape[1] != v.shape[1]:
        k, v = _expand(k, hq), _expand(v, hq)
    elif k.shape[1] != hq:
        kw["enable_gqa"] = True
    mask = t.get("bias")
    if op.use_alibi_mask:
        slopes = torch.tensor(ref.alibi_slopes(hq), dtype=dt, device=q.device).reshape(1, hq, 1, 1)
        dist = torch.arange(skv, dtype=dt, device=q.device) - torch.arange(sq, dtype=dt, device=q.device)[:, None]
        mask = slopes * dist if mask is None else mask + slopes * dist
    causal = op.use_causal_mask or op.use_causal_mask_bottom_right
    diag = skv - sq if op.use_causal_mask_bottom_right else 0
    if causal and (mask is not None or diag != 0):
        keep = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(diag)
        mask = torch.zeros(sq, skv, dtype=dt, device=q.device) if mask is None else mask
        mask = mask.masked_fill(~keep, -math.inf)
    elif causal:
        kw["is_causal"] = True
    if mask is not None:
        kw["attn_mask"] = mask
    return q, k, v, kw


def _fast_tensors(call: Call, dt: Any) -> dict[str, Any]:
    return {r: call.tensor(r, dt) for r in ("q", "k", "v", "bias") if call.has(r)}


def _fast_dtype(call: Call) -> Any:
    torch = _torch()
    dt = call.tensor_desc("q").data_type
    if dt is DataType.DOUBLE:
        return torch.float64
    if call.device.type == "cuda" and dt in (DataType.HALF, DataType.BFLOAT16):
        return dt.to_torch()
    return torch.float32


@implements("sdpa")
def sdpa(call: Call) -> list[Any]:
    torch = _torch()
    F = torch.nn.functional
    if fast_path(call):
        dt = _fast_dtype(call)
        q, k, v, kw = _fast_args(call, dt, _fast_tensors(call, dt))
        return [F.scaled_dot_product_attention(q, k, v, **kw), None, None, None, None]
    op = call.node.op_as(Sdpa)
    cd = _compute_dtype(call)
    b, sq, skv = _geometry(call)
    a = _inputs(call, cd)
    a.update({r: _dense(call, r, b, sq, skv, cd) for r in ("q", "k", "v")})
    _, s, _ = _scores(call, a, cd, b, sq, skv)
    p, stats, m, total = _softmax(
        s, a.get("sink_token"), EMPTY_ROW_STATS[op.empty_row_stats], _rows(call, b, sq, s.device)
    )
    keep = _dropout_keep(call, tuple(s.shape))
    drop = _dropout(call, tuple(s.shape), a, cd)
    if drop is not None:
        p = p * drop
    o = torch.matmul(p, _expand(a["v"], s.shape[1]))
    return [
        _packed(call, "o", o),
        _packed(call, "stats", stats if call.wants("stats") else None),
        _packed(call, "stats", m if call.wants("score_max") else None, "score_max"),
        _packed(call, "stats", total if call.wants("score_sum_exp") else None, "score_sum_exp"),
        keep.to(cd) if keep is not None and call.wants("rng_dump") else None,
    ]


@implements("sdpa_backward")
def sdpa_backward(call: Call) -> list[Any]:
    torch = _torch()
    if fast_path(call):
        return _fast_backward(call)
    cd = _compute_dtype(call)
    b, sq, skv = _geometry(call)
    a = _inputs(call, cd)
    a.update({r: _dense(call, r, b, sq, skv, cd) for r in ("q", "k", "v", "o", "dO", "stats")})
    q, k, v, o, do, stats = (a[r] for r in ("q", "k", "v", "o", "dO", "stats"))
    hq = q.shape[1]
    s1, s, keep = _scores(call, a, cd, b, sq, skv)
    p = torch.nan_to_num(torch.exp(s - stats).masked_fill(s == -math.inf, 0.0), nan=0.0, posinf=0.0)
    drop = _dropout(call, tuple(s.shape), a, cd)
    pd = p if drop is None else p * drop
    dv = _group_sum(torch.matmul(pd.transpose(-1, -2), do), v.shape[1])
    dp = torch.matmul(do, _expand(v, hq).transpose(-1, -2))
    if drop is not None:
        dp = dp * drop
    delta = (do * o).sum(dim=-1, keepdim=True)
    ds = p * (dp - delta)
    op = call.node.op_as(SdpaBackward)
    if op.score_mod_grad is not None:
        roles = expect(op.score_mod, "the score modifier of a score_mod_grad").input_roles()
        ds = evaluate(op.score_mod_grad, s1, [a[r] for r in roles], ds)
    if keep is not None:
        ds = ds.masked_fill(~keep, 0.0)
    scale = call.scalar("attn_scale", 1.0).to(cd)
    dq = torch.matmul(ds, _expand(k, hq)) * scale
    dk = _group_sum(torch.matmul(ds.transpose(-1, -2), q), k.shape[1]) * scale
    dbias = None
    out = call.out("dBias")
    if out is not None:
        axes = tuple(i for i, d in enumerate(out.dim) if d == 1 and ds.shape[i] != 1)
        dbias = ds.sum(dim=axes, keepdim=True) if axes else ds
    dsink = None
    if call.wants("dSink_token"):
        sink = a["sink_token"].reshape(1, -1, 1, 1)
        p_sink = torch.exp(sink - stats)
        ok = torch.isfinite(stats) & torch.isfinite(p_sink)
        rows = _rows(call, b, sq, q.device)
        if rows is not None:
            ok = ok & rows
        dsink = -torch.where(ok, p_sink * delta, torch.zeros_like(delta)).sum(dim=(0, 2), keepdim=True)
    return [_packed(call, "dQ", dq), _packed(call, "dK", dk), _packed(call, "dV", dv), dbias, dsink]


def _fast_backward(call: Call) -> list[Any]:
    """Recompute the forward with F.scaled_dot_product_attention under autograd; differentiate it."""
    torch = _torch()
    F = torch.nn.functional
    dt = _fast_dtype(call)
    wants_bias = call.wants("dBias")
    with torch.enable_grad():
        leaves = {r: x.detach().requires_grad_(r != "bias" or wants_bias) for r, x in _fast_tensors(call, dt).items()}
        q, k, v, kw = _fast_args(call, dt, leaves)
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        wrt = [leaves["q"], leaves["k"], leaves["v"]] + ([leaves["bias"]] if wants_bias else [])
        grads = torch.autograd.grad(out, wrt, call.tensor("dO", dt))
    return [*grads[:3], grads[3] if wants_bias else None, None]
