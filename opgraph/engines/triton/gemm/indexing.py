"""Addressing tiles: each logical axis of a tensor is a row, a column or a per-program coordinate of the tile."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ....core.symbolic import SymInt
from ....core.tensor import TensorDesc
from ..sizes import above_one


class TileIndexer:
    """Addresses tensors over a 2-D tile (expr.py's Indexer protocol).

    `axes[a]` says what logical axis `a` is in the tile: ("r", expr) a row coordinate (a
    [rows] vector), ("c", expr) a column coordinate, ("s", expr) a per-program scalar, ("t", expr)
    a coordinate that depends on both (a [rows, cols] block: the input column of a conv whose K lanes
    run over filter columns too, conv_fprop's MERGE_TAPS); ("r", expr, shift) a row coordinate plus a
    per-program scalar shift, addressed as two terms (an unrolled stencil's tap: the rows' offsets stay
    the same from tap to tap and the shift, a constant, folds into the load's address). `rmask` /
    `cmask` bound the rows / columns (None: all in bounds). `flat_rows` = (expr, ((axis, size), ...)):
    the row axes flattened, outermost first; a tensor packed over them is addressed by the flat index
    (cheaper, and contiguity stays visible to the compiler); `flat_cols` the same for column axes (a
    product's columns split into heads x head dims, gemm/space.py).

    `select`: a mask (`rmask` or `cmask`) that loads leave out, operand_tile applying it by a select
    on the loaded tile; its axis' coordinates must then stay in bounds (the caller wraps them). A
    conv's ragged channel tail goes this way: Triton 3.6 on Hopper computed wrong sums for the ResNet
    stem (3 channels in a BLOCK_K of 16, split-K) with the channel mask in the loads, and with a tail
    clamped by tl.minimum gave sums that changed from run to run (MobileNetV2's 96-channel 1x1 conv,
    128 x 128 tiles), as reads past the tensor would; wrapped by `%`, both match (tests/engines).
    `tmask`: a [rows, cols] mask applied the same way (by a select, never in the loads). `text` spells
    a stride (sizes.Sizes.text where the kernel takes its sizes at run time: the descs' sizes are then
    `SymInt`s)."""

    def __init__(
        self,
        axes: Sequence[tuple[str, str] | tuple[str, str, str]],
        rmask: str | None,
        cmask: str | None,
        ptr: Callable[[int], str],
        shape: tuple[str, str],
        flat_rows: tuple[str, tuple[tuple[int, SymInt], ...]] | None = None,
        zero: tuple[str, str] = ("rm", "rn"),
        select: str | None = None,
        tmask: str | None = None,
        text: Callable[[SymInt], str] = str,
        flat_cols: tuple[str, tuple[tuple[int, SymInt], ...]] | None = None,
    ) -> None:
        self.text = text
        self.axes = tuple(axes)
        self.zero = zero  # a row and a column vector of the tile (for full-shape pointer blocks)
        self.rmask = rmask
        self.cmask = cmask
        assert select is None or select in (rmask, cmask)
        self.select = select
        self.tmask = tmask
        self.ptr = ptr
        self.shape = shape
        self.flat_rows = flat_rows
        self.flat_cols = flat_cols
        self.shifted = any(len(a) > 2 for a in self.axes)  # (no flat rows over a shifted axis)

    def _flat(self, desc: TensorDesc, flat: tuple[str, tuple[tuple[int, SymInt], ...]] | None) -> str | None:
        """The term addressing `desc` over the flattened axes of `flat`, where it is packed over them."""
        if flat is None or len(desc.dim) != len(self.axes) or self.shifted:
            return None
        expr, axes = flat
        step = inner = None
        for axis, size in reversed(axes):
            if desc.dim[axis] != size:
                return None
            if size == 1:
                continue
            if inner is None:
                step, inner = desc.stride[axis], desc.stride[axis] * size
            elif desc.stride[axis] != inner:
                return None
            else:
                inner *= size
        # (0: every row axis broadcast in memory; the rows drop out, as for dims of 1)
        if step is None or step == 0:
            return None
        return expr if step == 1 else f"{expr} * {self.text(step)}"

    def parts(self, desc: TensorDesc, full: bool = False) -> tuple[list[str], list[str], list[str], list[str]]:
        """Offset terms of `desc` at the tile's coordinates: (row terms, column terms, scalars, [rows,
        cols] terms). Broadcast axes (dim 1) drop out; `full` keeps both tile axes (a store's pointer
        block)."""
        rows: list[str] = []
        cols: list[str] = []
        scal: list[str] = []
        tile: list[str] = []
        flat = self._flat(desc, self.flat_rows)
        if flat is not None:
            rows.append(flat)
        flat_col = self._flat(desc, self.flat_cols)
        if flat_col is not None:
            cols.append(flat_col)
        for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
            where, expr, *shift = self.axes[axis]
            if (flat is not None and where == "r") or (flat_col is not None and where == "c") or s == 0 or d == 1:
                continue
            term = expr if s == 1 else f"{expr} * {self.text(s)}"
            {"r": rows, "c": cols, "s": scal, "t": tile}[where].append(term)
            scal += [shift[0] if s == 1 else f"{shift[0]} * {self.text(s)}"] if shift else []
        if full:  # a tile axis of extent "1" (a weight row of the depthwise kernel) stays broadcast
            if self.shape[0] != "1":
                rows = rows or [f"{self.zero[0]} * 0"]
            if self.shape[1] != "1":
                cols = cols or [f"{self.zero[1]} * 0"]
        return rows, cols, scal, tile

    def address(self, desc: TensorDesc, ptr: str, full: bool = False) -> tuple[str, str | None]:
        rows, cols, scal, tile = self.parts(desc, full)
        terms = []
        if rows:
            terms.append(f"({' + '.join(rows)})[:, None]")
        if cols:
            terms.append(f"({' + '.join(cols)})[None, :]")
        terms += [f"({t})" for t in tile] + scal
        masks = []
        if rows and self.rmask is not None and self.rmask != self.select:
            masks.append(f"{self.rmask}[:, None]")
        if cols and self.cmask is not None and self.cmask != self.select:
            masks.append(f"{self.cmask}[None, :]")
        return f"{ptr} + {' + '.join(terms)}" if terms else ptr, " & ".join(masks) or None

    def selected(self) -> str | None:
        """The masks that loads leave out (`select`, `tmask`) over the tile; None: none."""
        masks = (
            []
            if self.select is None
            else [f"{self.select}[:, None]" if self.select == self.rmask else f"{self.select}[None, :]"]
        )
        masks += [self.tmask] if self.tmask is not None else []
        return " & ".join(masks) or None

    def mask(self) -> str | None:
        masks = []
        if self.rmask is not None:
            masks.append(f"{self.rmask}[:, None]")
        if self.cmask is not None:
            masks.append(f"{self.cmask}[None, :]")
        if self.tmask is not None:
            masks.append(self.tmask)
        return " & ".join(masks) or None

    # -- expr.py's Indexer protocol --
    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1 or not any(above_one(d) and s != 0 for d, s in zip(desc.dim, desc.stride)):
            return f"tl.load({ptr})"  # one element, or one broadcast in memory (stride 0): before any loop too
        address, mask = self.address(desc, ptr)
        if mask is None:
            return f"tl.load({address})"
        return f"tl.load({address}, mask={mask}, other=0)"

    def load_tile(self, desc: TensorDesc, ptr: str) -> str:
        """A load of the whole tile (both tile axes, both masks), whatever axes `desc` broadcasts:
        what a GEMM operand needs (a size-1 K axis still gives a [rows, BLOCK_K] block, zero past K)."""
        address, mask = self.address(desc, ptr, full=True)
        if mask is None:
            return f"tl.load({address})"
        return f"tl.load({address}, mask={mask}, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        assert self.tmask is None and self.select is None, "a store's addresses are never wrapped"
        address, mask = self.address(desc, ptr, full=True)
        if mask is None:
            return f"tl.store({address}, {value})"
        return f"tl.store({address}, {value}, mask={mask})"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        where, expr, *shift = self.axes[axis]
        expr = f"{expr} + {shift[0]}" if shift else expr
        if desc.dim[axis] == 1:
            return "tl.zeros((1, 1), tl.int32)"
        if where == "r":
            return f"({expr})[:, None]"
        if where == "c":
            return f"({expr})[None, :]"
        if where == "t":
            return f"({expr})"
        return f"({expr} + tl.zeros((1, 1), tl.int32))"
