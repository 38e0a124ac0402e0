"""The pointwise template's walks as indexers (expr.py's Indexer protocol): the flat walk (`FlatIndexer`), a part
of the part walk (`PartIndexer`) and the tiled walks (`TileIndexer`); pointwise.py says when each is taken."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from ....core.tensor import TensorDesc, packed_strides
from ..sizes import above_one, divides
from ._flat_axes import packed_runs
from .base import program_id

PART_MIN = 8  # the narrowest part the part walk takes (16 bytes of a 16-bit type: one vector a part's run)


def _coordinate_offset(desc: TensorDesc, needed: set[int], text: Callable[[Any], str] = str) -> str:
    """Element offset of `desc` from the coordinates c<axis> of its non-broadcast axes (noted in
    `needed`, for the lines that compute them); `text` spells a stride (sizes.Sizes.text for a
    dynamic one)."""
    terms = []
    for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
        if above_one(d) and s != 0:
            needed.add(axis)
            terms.append(f"c{axis}" if s == 1 else f"c{axis} * {text(s)}")
    return " + ".join(terms) or "0"


class FlatIndexer:
    """Loads and stores at flat index `lin` of an iteration space, in a given axis order."""

    def __init__(self, dims: tuple[int, ...], order: tuple[int, ...], text: Callable[[Any], str] = str) -> None:
        self.dims = dims
        self.order = order
        self.packed = packed_strides(dims, order)
        self.needed: set[int] = set()
        self.merged: dict[str, tuple[int, ...]] = {}  # name -> a run of axes addressed as one (packed_runs)
        self.walked = [a for a in order if above_one(dims[a])]  # (axes of one element do not break a run)
        self.text = text  # spells a size (sizes.Sizes.text where sizes are run-time arguments)

    def offset(self, desc: TensorDesc) -> str:
        if desc.dim == self.dims and all(d == 1 or s == p for d, s, p in zip(desc.dim, desc.stride, self.packed)):
            return "lin"
        terms = []
        for run in packed_runs(self.walked, self.dims, desc):
            inner = run[-1]
            name = f"c{inner}" if len(run) == 1 else f"r{run[0]}_{inner}"
            if len(run) > 1 and run[0] == self.walked[0] and self.packed[inner] == 1:
                name = "lin"  # (the run of every walked axis: the flat index itself)
            elif len(run) == 1:
                self.needed.add(inner)
            else:
                self.merged[name] = run
            s = desc.stride[inner]
            terms.append(name if s == 1 else f"{name} * {self.text(s)}")
        return " + ".join(terms) or "0"

    def load(self, desc: TensorDesc, ptr: str) -> str:
        offset = "0" if desc.numel == 1 else self.offset(desc)
        if offset == "0":  # one element, or every axis broadcast in memory (stride 0): a scalar load
            return f"tl.load({ptr})"
        return f"tl.load({ptr} + {offset}, mask=mask, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        return f"tl.store({ptr} + {self.offset(desc)}, {value}, mask=mask)"

    def mask(self) -> str:
        return "mask"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1:
            return "tl.zeros_like(lin)"
        self.needed.add(axis)
        return f"c{axis}"

    def coordinate_lines(self) -> list[str]:
        lines = []
        for axis in sorted(self.needed):
            inner = self.packed[axis]
            outermost = axis == self.order[0]
            expr = "lin" if inner == 1 else f"(lin // {self.text(inner)})"
            if not outermost:
                expr = f"{expr} % {self.text(self.dims[axis])}"
            lines.append(f"c{axis} = {expr}")
        for name, run in self.merged.items():
            inner = self.packed[run[-1]]
            expr = "lin" if inner == 1 else f"(lin // {self.text(inner)})"
            if run[0] != self.walked[0]:
                expr = f"{expr} % {self.text(math.prod(self.dims[a] for a in run))}"
            lines.append(f"{name} = {expr}")
        return lines


_VIEW_PTR = re.compile(r"\((p\d+) \+ (-?\d+)\)")  # a view's pointer as _emit spells it: (p<base> + <offset>)


class PartIndexer:
    """One part of the part walk: the flat walk's addresses at the first part's coordinates (`flat`, over `lin`)
    plus the part's constant offset along `axis` (its start less the frame's shift, times the tensor's stride
    there), `span` the part's coordinate range. Loads go to `loads`, shared by the parts: one load an address
    (a buffer, the first part's offset, a constant), emitted before the parts (`hoisted`) and named where used,
    so that the rotary embedding's x[..., :W] read by both parts is loaded once."""

    def __init__(
        self, flat: FlatIndexer, axis: int, start: int, width: int, loads: dict[tuple[str, str, int], str]
    ) -> None:
        self.flat, self.axis, self.start, self.width, self.loads = flat, axis, start, width, loads
        self.text = flat.text
        self.hoisted: list[str] = []

    def _delta(self, desc: TensorDesc, shift: int) -> int:
        return (self.start - shift) * desc.stride[self.axis] if above_one(desc.dim[self.axis]) else 0

    def offset(self, desc: TensorDesc) -> str:
        delta = self._delta(desc, 0)
        return f"{self.flat.offset(desc)} + {delta}" if delta else self.flat.offset(desc)

    def load(self, desc: TensorDesc, ptr: str) -> str:
        return self.load_shifted(desc, ptr, 0)

    def load_shifted(self, desc: TensorDesc, ptr: str, shift: int) -> str:
        """The load of `desc` in a frame moved by `shift` along the part's axis (a concatenation's operand)."""
        offset = "0" if desc.numel == 1 else self.flat.offset(desc)
        if offset == "0":
            return f"tl.load({ptr})"
        view = _VIEW_PTR.fullmatch(ptr)
        base, const = (view.group(1), int(view.group(2))) if view else (ptr, 0)
        key = (base, offset, const + self._delta(desc, shift))
        if key not in self.loads:
            self.loads[key] = name = f"ld{len(self.loads)}"
            address = f"{base} + {offset}" + (f" + {key[2]}" if key[2] else "")
            self.hoisted.append(f"{name} = tl.load({address}, mask=mask, other=0)")
        return self.loads[key]

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        return f"tl.store({ptr} + {self.offset(desc)}, {value}, mask=mask)"

    def mask(self) -> str:
        return "mask"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        coord = self.flat.coord(axis, desc)
        return f"({coord} + {self.start})" if axis == self.axis and self.start and above_one(desc.dim[axis]) else coord

    def span(self, axis: int) -> tuple[int, int] | None:
        return (self.start, self.start + self.width) if axis == self.axis else None


class TileIndexer:
    """Loads and stores over [TILE_I, TILE_J] tiles of two axes i and j, j the first output's innermost;
    one program per tile and coordinate of the other axes (scalars of the program). Two uses:
    - transposed (knobs TILE_I / TILE_J): i the innermost of a transposed tensor (a cast of a weight's
      transpose), so that both tensors are read or written along their contiguous axis (Triton converts
      the tile's layout between the two through shared memory);
    - rows (knobs ROWS / COLS): i the first output's next axis, where the flat walk would compute
      coordinates per element (divisions by a dimension) and load per-row values per element (the
      softmax statistics and targets of a cross-entropy backward over [tokens, vocab] logits): here a
      column is an arange, a row value is loaded once per row and a value of the outer axes once per
      program.
    Each load is masked along the tile axes its offset depends on, and only where the tiles do not
    divide that axis."""

    def __init__(
        self,
        dims: tuple[Any, ...],
        i: int,
        j: int,
        order: tuple[int, ...],
        big: bool,
        ti: int,
        tj: int,
        text: Callable[[Any], str] = str,
    ) -> None:
        self.dims, self.i, self.j, self.big, self.ti, self.tj = dims, i, j, big, ti, tj
        self.outer = tuple(a for a in order if a not in (i, j) and above_one(dims[a]))
        self.ragged = {i: not divides(ti, dims[i]), j: not divides(tj, dims[j])}
        self.needed: set[int] = set()
        self.text = text  # spells a size (sizes.Sizes.text where sizes are run-time arguments)

    def offset(self, desc: TensorDesc) -> str:
        return _coordinate_offset(desc, self.needed, self.text)

    def _mask(self, desc: TensorDesc) -> str | None:
        """The mask of an access to `desc`: over the tile axes it varies along, where ragged."""
        axes = [a for a in (self.i, self.j) if above_one(desc.dim[a]) and desc.stride[a] != 0 and self.ragged[a]]
        return " & ".join(f"mask_{'i' if a == self.i else 'j'}" for a in axes) or None

    def load(self, desc: TensorDesc, ptr: str) -> str:
        offset = "0" if desc.numel == 1 else self.offset(desc)
        if offset == "0":
            return f"tl.load({ptr})"
        mask = self._mask(desc)  # none: per program (the other axes are in range), or the tiles divide
        return f"tl.load({ptr} + {offset})" if mask is None else f"tl.load({ptr} + {offset}, mask={mask}, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        mask = self._mask(desc)
        tail = "" if mask is None else f", mask={mask}"
        return f"tl.store({ptr} + {self.offset(desc)}, {value}{tail})"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1:
            return "0"
        self.needed.add(axis)
        return f"c{axis}"

    def grid(self) -> Any:
        """The programs: an int, or an expression of the dynamic dims where the sizes are run-time."""
        return (
            (self.dims[self.i] + self.ti - 1)
            // self.ti
            * ((self.dims[self.j] + self.tj - 1) // self.tj)
            * math.prod(self.dims[a] for a in self.outer)
        )

    def coordinate_lines(self) -> list[str]:
        i, j, dims, ti, tj, text = self.i, self.j, self.dims, self.ti, self.tj, self.text
        nj = (dims[j] + tj - 1) // tj
        ni = (dims[i] + ti - 1) // ti
        lines = [
            f"pid = {program_id(0, self.big)}",
            f"pid_j = pid % {text(nj)}",
            f"pid_i = (pid // {text(nj)}) % {text(ni)}",
            f"pid_o = pid // {text(nj * ni)}",
            f"c{i} = pid_i * {ti} + tl.arange(0, {ti})[:, None]",
            f"c{j} = pid_j * {tj} + tl.arange(0, {tj})[None, :]",
        ]
        lines += [f"mask_{n} = c{a} < {text(dims[a])}" for n, a in (("i", i), ("j", j)) if self.ragged[a]]
        inner: Any = 1
        for axis in reversed(self.outer):
            expr = "pid_o" if inner == 1 else f"(pid_o // {text(inner)})"
            lines.append(f"c{axis} = {expr} % {text(dims[axis])}")
            inner = inner * dims[axis]
        return lines
