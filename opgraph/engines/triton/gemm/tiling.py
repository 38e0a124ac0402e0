"""The tile grid: program ids, swizzle, persistent loops, split-K slices and the coordinates of output axes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....core.symbolic import Expr, SymInt
from ..sizes import above_one
from .indexing import TileIndexer
from .space import OutputSpace


def static(value: SymInt) -> int:
    """A size that must be an int here (scratch bytes, a heuristic's count): a dynamic one is a TypeError,
    which the templates take as "generate this piece at its shape" (sizes.symbolic_piece)."""
    if isinstance(value, Expr):
        raise TypeError(f"a dynamic size ({value}) where the kernel needs a static one")
    return value


@dataclass(frozen=True)
class Tiling:
    """A grid of output tiles: BLOCK_M x BLOCK_N tiles of `space`, group-M swizzled, times the
    per-program batch/groups, times `split` slices of the reduction (split-K)."""

    space: OutputSpace
    block_m: int
    block_n: int
    group_m: int = 8
    split: int = 1
    big: bool = False  # int64 offsets
    # spells a size in the kernel: its literal, or (a kernel taking its sizes at run time, sizes.py) the
    # size parameter holding a dynamic one (sizes.Sizes.text); the sizes are then `SymInt`s
    text: Callable[[SymInt], str] = field(default=str, compare=False, repr=False)

    @property
    def npm(self) -> SymInt:
        return (self.space.m + self.block_m - 1) // self.block_m

    @property
    def npn(self) -> SymInt:
        return (self.space.n + self.block_n - 1) // self.block_n

    @property
    def tiles(self) -> SymInt:
        return self.npm * self.npn

    @property
    def per_split(self) -> SymInt:
        return self.tiles * self.space.nbatch * self.space.groups

    @property
    def rmask(self) -> str | None:
        return None if self.space.m % self.block_m == 0 else "rmask"

    @property
    def cmask(self) -> str | None:
        return None if self.space.n % self.block_n == 0 else "cmask"

    # -- the program's header, in named parts (subclasses override a part, never edit the lines) --------
    def header(self, *, with_split: bool, pid: str = "tl.program_id(0)") -> list[str]:
        """pid -> ks, pb (g, bb), pid_m, pid_n, rm, rn, masks, col, and the output coordinates y{axis}.
        `pid` is the program's work item (a persistent kernel's loop variable)."""
        sp, text = self.space, self.text
        return [
            *self.program_lines(with_split, pid),
            *self.batch_lines(),
            *self.swizzle_lines(),
            *self.row_lines(),
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
            *self.row_mask_lines(),
            *self.col_mask_lines(),
            f"col = g * {text(sp.n)} + rn" if sp.groups > 1 else "col = rn",
            *self.row_coordinate_lines(),
            *self.batch_coordinate_lines(),
            *self.col_coordinate_lines(),
        ]

    def program_lines(self, with_split: bool, pid: str) -> list[str]:
        """pid (int64 where offsets need it), the split-K slice ks, and pb / t: the program's batch/group
        index and its tile."""
        text = self.text
        lines = [f"pid = {pid}"]
        if self.big:
            lines.append("pid = pid.to(tl.int64)")
        if with_split and self.split > 1:
            lines += [f"ks = pid // {text(self.per_split)}", f"pid = pid % {text(self.per_split)}"]
        if above_one(self.space.nbatch * self.space.groups):
            return lines + [f"pb = pid // {text(self.tiles)}", f"t = pid % {text(self.tiles)}"]
        return lines + ["pb = 0", "t = pid"]

    def batch_lines(self) -> list[str]:
        """pb -> the group g and the batch index bb."""
        sp = self.space
        return [
            f"g = pb % {sp.groups}" if sp.groups > 1 else "g = 0",
            f"bb = pb // {sp.groups}" if above_one(sp.nbatch) else "bb = 0",
        ]

    def swizzle_lines(self) -> list[str]:
        """t -> the tile's row and column pid_m, pid_n, group-M swizzled."""
        # (a dynamic row count: the group's width is GROUP_M at every shape; gsz clips the last group)
        npm, npn, text = self.npm, self.npn, self.text
        width = self.group_m if isinstance(npm, Expr) else min(self.group_m, npm)
        if width > 1 and above_one(npn):
            return [
                f"first_m = (t // {text(width * npn)}) * {width}",
                f"gsz = tl.minimum({text(npm)} - first_m, {width})",
                "pid_m = first_m + (t % gsz)",
                f"pid_n = (t % {text(width * npn)}) // gsz",
            ]
        return [f"pid_m = t // {text(npn)}", f"pid_n = t % {text(npn)}"]

    def row_lines(self) -> list[str]:
        """The tile's flat row indices rm (and, where they come first, the row coordinates)."""
        return ["rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)"]

    def row_mask_lines(self) -> list[str]:
        return [f"rmask = rm < {self.text(self.space.m)}"] if self.rmask else []

    def col_mask_lines(self) -> list[str]:
        return [f"cmask = rn < {self.text(self.space.n)}"] if self.cmask else []

    def row_coordinate_lines(self) -> list[str]:
        """rm -> the coordinates y{axis} of the row axes."""
        sp = self.space
        return decompose("rm", [(a, sp.dims[a]) for a in sp.rows], "y", self.text)

    def col_coordinate_lines(self) -> list[str]:
        """col -> the coordinates y{axis} of the column axes."""
        sp = self.space
        return decompose("col", [(a, sp.dims[a]) for a in sp.col_axes], "y", self.text)

    def batch_coordinate_lines(self) -> list[str]:
        """bb -> the coordinates y{axis} of the per-program batch axes."""
        sp = self.space
        return decompose("bb", [(a, sp.dims[a]) for a in sp.batch], "y", self.text)

    def tap_lines(self, j: int) -> list[str]:
        """Lines before the epilogue (or partial store) of the program's j-th accumulator: none where a
        program has one (TapTiling's programs have one per tap)."""
        return []

    def output_indexer(self, ptr: Callable[[int], str], cols: str = "BLOCK_N") -> TileIndexer:
        sp = self.space
        axes = [(sp.where(a), f"y{a}") for a in range(len(sp.dims))]
        flat = ("rm", tuple((a, sp.dims[a]) for a in sp.rows))
        flat_cols = ("col", tuple((a, sp.dims[a]) for a in sp.col_axes)) if sp.cols else None
        return TileIndexer(
            axes, self.rmask, self.cmask, ptr, ("BLOCK_M", cols), flat, text=self.text, flat_cols=flat_cols
        )


def input_taps(
    geo: Any, taps: Sequence[int], out_dims: Sequence[int], in_dims: Sequence[int], flip: bool, checks: list[str]
) -> list[str]:
    """A forward conv's taps t{i} (from `decompose`) at output positions o{i}: lines giving the input
    coordinate xi{i} and the filter tap wt{i} (flipped in CONVOLUTION mode), appending to `checks` the
    bounds tests that padding needs (none where no tap can leave the image)."""
    lines = []
    for i, r in enumerate(taps):
        d = geo.dilation[i]
        lines.append(
            f"xi{i} = o{i} + t{i} * {d}" if r > 1 and d != 1 else f"xi{i} = o{i} + t{i}" if r > 1 else f"xi{i} = o{i}"
        )
        if geo.pre[i] > 0:
            checks.append(f"(xi{i} >= 0)")
        top = (out_dims[2 + i] - 1) * geo.stride[i] - geo.pre[i] + (r - 1) * d
        if top > in_dims[2 + i] - 1:
            checks.append(f"(xi{i} < {in_dims[2 + i]})")
        lines.append(f"wt{i} = {r - 1} - t{i}" if flip and r > 1 else f"wt{i} = t{i}" if r > 1 else f"wt{i} = 0")
    return lines


def decompose(
    index: str, axes: Sequence[tuple[int, SymInt]], prefix: str, text: Callable[[SymInt], str] = str
) -> list[str]:
    """Lines giving {prefix}{axis} for a flat `index` over `axes` (outermost first, row-major); `text`
    spells a size (Tiling.text)."""
    axes = list(axes)
    if not axes:
        return []
    if len(axes) == 1:
        return [f"{prefix}{axes[0][0]} = {index}"]
    lines = []
    rest = index
    for i, (axis, size) in enumerate(reversed(axes)):
        if i == len(axes) - 1:
            lines.append(f"{prefix}{axis} = {rest}")
            break
        lines.append(f"{prefix}{axis} = {rest} % {text(size)}")
        nxt = f"q_{prefix}{axis}"
        lines.append(f"{nxt} = {rest} // {text(size)}")
        rest = nxt
    return lines
