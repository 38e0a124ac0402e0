"""Paged KV caches in the generated forward (spec.Paged): k or v is a container of pages
[pages, H, block, w] read through a page table [B, 1, slots, 1]. Per key block the program looks up
the pages of its keys: one page a block where a page holds whole key blocks (block a multiple of
BLOCK_N: contiguous rows, one table read), else one a key (a gather). A page index outside
[0, pages), a slot past the table, a key past the sequence (or past Skv) reads zeros. A packed table
(one [1, 1, T, 1] tensor, each sequence's slots from its ragged offset on) is read the same way from
the sequence's first row."""

from __future__ import annotations

from .common import KernelText, and_mask
from .spec import AttnSpec


def page_base(spec: AttnSpec, k: KernelText, role: str, h: str) -> list[str]:
    """`{role}_base`: the head's offset in the container, `{role}_tab`: the sequence's table row."""
    pg = spec.page(role)
    assert pg is not None
    op, t = getattr(spec, role), pg.table
    k.param(t.name)
    head = f"{op.offset} + " if op.offset else ""
    tab = f"{t.offset} + " if t.offset else ""
    lines = [f"{role}_base = {head}{h}.to(tl.int64) * {op.strides[1]}"]
    if pg.rows is None:
        return [*lines, f"{role}_tab = {t.name} + {tab}off_b.to(tl.int64) * {t.strides[0]}"]
    off = pg.rows.offsets
    k.param(off.name)
    at = f"{off.offset} + " if off.offset else ""
    n = pg.rows.per_row
    lines.append(f"{role}_t0 = tl.load({off.name} + {at}off_b * {off.strides[0]}).to(tl.int64)")
    if n != 1:  # floor division of an integer of either sign (as ragged.py)
        lines.append(f"{role}_t0 = tl.where({role}_t0 >= 0, {role}_t0 // {n}, -(({n - 1} - {role}_t0) // {n}))")
    return [*lines, f"{role}_tab = {t.name} + {tab}0"]


def _entry(spec: AttnSpec, role: str, slot: str) -> list[str]:
    """`{role}_pg`: the table's entries at `slot` (a packed table's rows outside it read page 0)."""
    pg = spec.page(role)
    assert pg is not None and pg.rows is not None
    t, tokens = pg.table, pg.rows.tokens
    return [
        f"{role}_row = {role}_t0 + {slot}",
        f"{role}_pg = tl.load({role}_tab + tl.minimum(tl.maximum({role}_row, 0), {tokens - 1}) * {t.strides[2]}).to(tl.int64)",
        f"{role}_pg = tl.where(({role}_row >= 0) & ({role}_row < {tokens}), {role}_pg, 0)",
    ]


def paged_load(
    spec: AttnSpec, role: str, bn: int, cols: str, key_ok: str | None, col_ok: str | None
) -> tuple[list[str], str]:
    """(lines, the load expression) of key block [start_n, start_n + bn) of the paged `role`, columns
    `cols`; `key_ok`, `col_ok`: further predicates of the block's rows and columns."""
    pg = spec.page(role)
    assert pg is not None
    op, t = getattr(spec, role), pg.table
    if pg.block % bn == 0 and pg.rows is not None:  # the block lies in one page of a packed table
        lines = [
            f"{role}_slot = start_n // {pg.block}",
            *_entry(spec, role, f"{role}_slot"),
            f"{role}_pg = tl.zeros([{bn}], tl.int64) + tl.where({role}_slot < {pg.slots}, {role}_pg, -1)",
            f"{role}_rows = {role}_pg * {op.strides[0]} + ((start_n % {pg.block}) + offs_n0).to(tl.int64) * {op.strides[2]}",
            f"{role}_ok = (({role}_pg >= 0) & ({role}_pg < {pg.pages}))[:, None]",
        ]
        ok = f"{role}_ok"
    elif pg.rows is not None:
        lines = [
            f"{role}_slot = offs_n // {pg.block}",
            *_entry(spec, role, f"{role}_slot"),
            f"{role}_pg = tl.where({role}_slot < {pg.slots}, {role}_pg, -1)",
            f"{role}_rows = {role}_pg * {op.strides[0]} + (offs_n % {pg.block}).to(tl.int64) * {op.strides[2]}",
            f"{role}_ok = (({role}_pg >= 0) & ({role}_pg < {pg.pages}))[:, None]",
        ]
        ok = f"{role}_ok"
    elif pg.block % bn == 0:  # the block lies in one page
        lines = [
            f"{role}_slot = start_n // {pg.block}",
            f"{role}_pg = tl.load({role}_tab + tl.minimum({role}_slot, {pg.slots - 1}) * {t.strides[2]}).to(tl.int64)",
            # (the page broadcast to the block: a scalar term in a load mask fails under the interpreter)
            f"{role}_pg = tl.zeros([{bn}], tl.int64) + tl.where({role}_slot < {pg.slots}, {role}_pg, -1)",
            f"{role}_rows = {role}_pg * {op.strides[0]} + ((start_n % {pg.block}) + offs_n0).to(tl.int64) * {op.strides[2]}",
            f"{role}_ok = (({role}_pg >= 0) & ({role}_pg < {pg.pages}))[:, None]",
        ]
        ok = f"{role}_ok"
    else:
        lines = [
            f"{role}_slot = offs_n // {pg.block}",
            f"{role}_pg = tl.load({role}_tab + {role}_slot * {t.strides[2]}, mask={role}_slot < {pg.slots}, other=-1).to(tl.int64)",
            f"{role}_rows = {role}_pg * {op.strides[0]} + (offs_n % {pg.block}).to(tl.int64) * {op.strides[2]}",
            f"{role}_ok = (({role}_pg >= 0) & ({role}_pg < {pg.pages}))[:, None]",
        ]
        ok = f"{role}_ok"
    mask = and_mask(ok, key_ok, col_ok)
    return lines, f"tl.load({op.name} + {role}_base + {role}_rows[:, None] + {cols}[None, :], mask={mask}, other=0.0)"
