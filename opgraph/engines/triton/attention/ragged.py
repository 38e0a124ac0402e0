"""Packed (ragged, THD) tensors in the generated forward and backward: sequence b of a packed tensor
[1, H, T, w] starts at row floor(offsets[b] / per_row) of axis 2 (spec.Ragged). A program of (block,
b, h) loads its sequence's start per packed tensor once (`{role}_tok0`) and the local rows that lie in
[0, T) and in the sequence (`{role}_lo` <= i < `{role}_hi`): loads outside read zeros (as the reference
engine's unpacking), stores outside are dropped, so a sequence never reads or writes its neighbours'
rows past its length. Rows of a packed output (O, Stats, score_max, score_sum_exp; dQ, dK, dV) that no
sequence covers are zeroed by a launch before the attention kernels (the reference engine's packing
writes them 0). Sequences of a packed output are taken not to overlap: the reference sums the rows
of overlapping sequences, the kernels write each row once per sequence (the last write wins)."""

from __future__ import annotations

from typing import Any

from .common import KernelText, base_expr, pow2
from .sized import symint
from .spec import AttnSpec, Operand

ZERO_ROWS = 64  # rows of a packed output one program of the zeroing launch clears

_LENGTH = {
    "q": "q_len",
    "o": "q_len",
    "stats": "q_len",
    "score_max": "q_len",
    "score_sum_exp": "q_len",
    "do": "q_len",
    "dq": "q_len",
    "k": "kv_len",
    "v": "kv_len",
    "dk": "kv_len",
    "dv": "kv_len",
}
# a packed output's heads and row width (spec fields) by role
_SHAPE = {
    "o": ("Hq", "Dv"),
    "stats": ("Hq", None),
    "score_max": ("Hq", None),
    "score_sum_exp": ("Hq", None),
    "dq": ("Hq", "D"),
    "dk": ("Hk", "D"),
    "dv": ("Hv", "Dv"),
}


def ragged_lines(spec: AttnSpec, k: KernelText, roles: tuple[str, ...] | None = None) -> list[str]:
    """`{role}_tok0`, `{role}_lo`, `{role}_hi` of each packed tensor (of `roles`; None: all) for batch
    entry off_b (after seqlen_lines: the sequence lengths q_len, kv_len)."""
    lines = []
    for role, r in spec.ragged:
        if roles is not None and role not in roles:
            continue
        off = r.offsets
        k.param(off.name)
        at = f"{off.offset} + " if off.offset else ""
        lines += first_row_lines(f"{role}_tok0", f"tl.load({off.name} + {at}off_b * {off.strides[0]})", r.per_row)
        lines += [
            f"{role}_lo = tl.maximum(-{role}_tok0, 0)",
            f"{role}_hi = tl.minimum({_LENGTH[role]}.to(tl.int64), {r.tokens} - {role}_tok0)",
        ]
    return lines


def first_row_lines(var: str, load: str, per_row: int) -> list[str]:
    """`var` = the row a ragged offset `load` (in units of 1/per_row row) starts at, int64: floor division
    of an integer of either sign (// of a negative one differs between backends)."""
    lines = [f"{var} = {load}.to(tl.int64)"]
    if per_row != 1:
        n = per_row
        lines.append(f"{var} = tl.where({var} >= 0, {var} // {n}, -(({n - 1} - {var}) // {n}))")
    return lines


def exit_past_length(spec: AttnSpec, first: str, side: str, outputs: tuple[str, ...]) -> list[str]:
    """`if {first} >= q_len: return` (`side` "q"; "kv": kv_len): a program whose rows (from `first`) all
    lie past its sequence's length has nothing to write where every output it writes (`outputs`, spec
    fields) is packed, its stores bounded by the sequence's rows; else nothing. Most programs of a packed
    launch are such: its grid spans max_seq_len's blocks (32 query blocks of a 4096 maximum for
    sequences of 150 to 1,900 tokens), each otherwise running its setup, loads and stores masked off."""
    lengths = spec.seq_len_q if side == "q" else spec.seq_len_kv
    written = [r for r in outputs if getattr(spec, r, None) is not None]
    if lengths is None or not written or any(spec.packed(r) is None for r in written):
        return []
    return [f"if {first} >= {side}_len:", "    return"]


def row_base(spec: AttnSpec, role: str, op: Operand, b: str, h: str) -> str:
    """The element offset of (b, h) in `op` (the tensor under `role`), in int64: of the sequence's
    first row where the tensor is packed."""
    base = base_expr(op, b, h)
    if spec.packed(role) is None:
        return base
    return f"{base} + {role}_tok0 * {op.strides[2]}"


def rows_ok(spec: AttnSpec, role: str, rows: str) -> str | None:
    """The predicate of local rows `rows` that lie in a packed tensor and its sequence (None: dense)."""
    if spec.packed(role) is None:
        return None
    return f"(({rows} >= {role}_lo) & ({rows} < {role}_hi))"


def zero_kernel(spec: AttnSpec, name: str, roles: tuple[str, ...]) -> tuple[KernelText, tuple[int, int]] | None:
    """The launch clearing the packed outputs under `roles` before the attention kernels write their
    sequences' rows (None where none is packed and written)."""
    outs = [(r, op) for r in roles if spec.packed(r) is not None and (op := getattr(spec, r, None)) is not None]
    if not outs:
        return None
    k = KernelText(name, sizes=spec.sizes)
    heads = max(getattr(spec, _SHAPE[r][0]) for r, _ in outs)
    k.add(
        f"rows = tl.program_id(0) * {ZERO_ROWS} + tl.arange(0, {ZERO_ROWS})",
        "off_h = tl.program_id(1)",
        f"offs_dv = tl.arange(0, {pow2(spec.Dv)})",
    )
    if any(_SHAPE[r][1] == "D" for r, _ in outs):
        k.add(f"offs_d = tl.arange(0, {pow2(spec.D)})")
    distinct: list[Any] = []
    for c in (spec.packed(r).tokens for r, _ in outs):  # type: ignore[union-attr]
        if not any(symint(c) == symint(d) for d in distinct):
            distinct.append(c)
    # programs for the most rows of an output; a bucket kernel's counts of different dynamic sizes (packed
    # queries and keys of their own token counts): their sum, which bounds the largest (the rest masked)
    if all(isinstance(d, int) for d in distinct):
        tokens = max(distinct)
    else:
        tokens = sum(distinct[1:], distinct[0])
    for role, op in outs:
        k.param(op.name)
        t = spec.packed(role).tokens  # type: ignore[union-attr]
        h, width = _SHAPE[role]
        # (dK, dV under GQA; the head broadcast to the rows: a scalar term in a mask fails under the interpreter)
        hmask = f" & ((rows * 0 + off_h) < {getattr(spec, h)})" if getattr(spec, h) != heads else ""
        base = f"{op.name} + {base_expr(op, 'off_h', 'off_h')}"
        if width is not None:
            w = getattr(spec, width)
            offs = "offs_dv" if width == "Dv" else "offs_d"
            cols = f" & ({offs}[None, :] < {w})" if pow2(w) != w else ""
            rmask = f"((rows < {t}){hmask})[:, None]" if hmask else f"(rows[:, None] < {t})"
            k.add(
                f"tl.store({base} + rows[:, None].to(tl.int64) * {op.strides[2]} + {offs}[None, :], "
                f"tl.zeros([{ZERO_ROWS}, {pow2(w)}], {op.dtype}), mask={rmask}{cols})"
            )
        else:
            mask = f"(rows < {t}){hmask}" if hmask else f"rows < {t}"
            k.add(
                f"tl.store({base} + rows.to(tl.int64) * {op.strides[2]}, tl.zeros([{ZERO_ROWS}], {op.dtype}), mask={mask})"
            )
    return k, (-(-tokens // ZERO_ROWS), heads)
