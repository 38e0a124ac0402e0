"""Indexing over flat positions, for the reduction template (and pooling's): `FlatAxes` names the
coordinates and offsets of tensors over one flat index that walks some axes of a space; a
`ReductionIndexer` is the Emitter's view of a reduction tile of kept x reduced positions
(reduction.py says how the template walks them). Sizes are spelled by `text` (sizes.Sizes.text where
they are run-time arguments of a dynamic plan's kernel)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ....core.tensor import TensorDesc
from ..sizes import above_one

# -- indexing over flat positions ---------------------------------------------------------------


def packed_runs(axes: Sequence[int], dims: Sequence[Any], desc: TensorDesc) -> list[tuple[int, ...]]:
    """The axes (of `axes`, outer to inner: walked one after another over a space of `dims`) that `desc`
    is addressed along, in runs of neighbours over which it is packed as the space is (stride of the outer
    = stride of the inner x the space's dim): each run is one coordinate of the flat index, `(flat //
    inner) % (the run's sizes' product)`, where each axis apart would take a division and a remainder."""
    runs: list[list[int]] = []
    previous = None
    for axis in axes:
        if not above_one(desc.dim[axis]) or desc.stride[axis] == 0:
            previous = None
            continue
        if previous is not None and desc.stride[previous] == desc.stride[axis] * dims[axis]:
            runs[-1].append(axis)
        else:
            runs.append([axis])
        previous = axis
    return [tuple(r) for r in runs]


class FlatAxes:
    """Coordinates and offsets over one flat index `var` that walks `axes` (outer to inner) of a
    space of dims `dims`. Sub-expressions are named once (`{prefix}N`) and collected in `lines`."""

    def __init__(
        self, var: str, axes: Sequence[int], dims: Sequence[int], prefix: str, text: Callable[[Any], str] = str
    ) -> None:
        self.var = var
        self.axes = tuple(axes)
        self.dims = tuple(dims)
        self.prefix = prefix
        self.text = text  # spells a size (sizes.Sizes.text where sizes are run-time arguments)
        self.inner: dict[int, int] = {}
        step = 1
        for a in reversed(self.axes):
            self.inner[a] = step
            step *= self.dims[a]
        self.size = step
        self.lines: list[str] = []
        self._names: dict[str, str] = {}

    def _name(self, expr: str) -> str:
        if expr == self.var:
            return expr
        if expr not in self._names:
            self._names[expr] = f"{self.prefix}{len(self._names)}"
            self.lines.append(f"{self._names[expr]} = {expr}")
        return self._names[expr]

    def part(self, inner: int, size: int) -> str:
        """Name of `(var // inner) % size` (no modulo for the outermost run: lanes past the end are
        masked anyway)."""
        expr = self.var if inner == 1 else f"({self.var} // {self.text(inner)})"
        if inner * size != self.size:
            expr = f"{expr} % {self.text(size)}"
        return self._name(expr)

    def coord(self, axis: int) -> str:
        return self.part(self.inner[axis], self.dims[axis])

    def offset(self, desc: TensorDesc) -> str | None:
        """Offset expression of `desc` over this flat index; None when it does not depend on it."""
        if desc.numel == 1:
            return None
        terms = []
        for run in packed_runs(self.axes, self.dims, desc):
            last = run[-1]
            p = self.part(self.inner[last], math.prod(self.dims[a] for a in run))
            s = desc.stride[last]
            terms.append(p if s == 1 else f"{p} * {self.text(s)}")
        if not terms:
            return None
        return terms[0] if len(terms) == 1 and " " not in terms[0] else self._name(" + ".join(terms))


class ReductionIndexer:
    """The Emitter's view of a [BLOCK_M, BLOCK_K] tile (or [BLOCK_K, BLOCK_M] when `k_fast` is
    False): loads of tensors that do not depend on k are [BLOCK_M] vectors (hoisted by the caller),
    of tensors that do not depend on m [BLOCK_K] vectors, of the rest full tiles."""

    def __init__(self, mflat: FlatAxes, kflat: FlatAxes, k_fast: bool, space: tuple[int, ...]) -> None:
        self.mflat = mflat
        self.kflat = kflat
        self.k_fast = k_fast
        self.space = space

    def em(self, e: str) -> str:
        return f"{e}[:, None]" if self.k_fast else f"{e}[None, :]"

    def ek(self, e: str) -> str:
        return f"{e}[None, :]" if self.k_fast else f"{e}[:, None]"

    def k_invariant(self, desc: TensorDesc) -> bool:
        return desc.numel == 1 or self.kflat.offset(desc) is None

    def load(self, desc: TensorDesc, ptr: str) -> str:
        om, ok = (None, None) if desc.numel == 1 else (self.mflat.offset(desc), self.kflat.offset(desc))
        if om is None and ok is None:  # one element, or broadcast in memory (stride 0) along m and k
            return f"tl.load({ptr})"
        if ok is None:
            return self.em(f"tl.load({ptr} + {om}, mask=m_mask, other=0)")
        if om is None:
            return self.ek(f"tl.load({ptr} + {ok}, mask=k_mask, other=0)")
        return f"tl.load({ptr} + {self.em(om)} + {self.ek(ok)}, mask=mask, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        om = self.mflat.offset(desc) or "tl.zeros_like(m)"
        ok = self.kflat.offset(desc) or "tl.zeros_like(k)"
        mask = "mask"
        # a broadcast-smaller output is written by the lanes at coordinate 0 of its size-1 axes only
        for axis, (d, full) in enumerate(zip(desc.dim, self.space)):
            if d == 1 and above_one(full):
                mask += f" & ({self._coord(axis)} == 0)"
        return f"tl.store({ptr} + {self.em(om)} + {self.ek(ok)}, {value}, mask={mask})"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1:
            return self.em("tl.zeros_like(m)")
        return self._coord(axis)

    def _coord(self, axis: int) -> str:
        if self.space[axis] == 1:
            return self.em("tl.zeros_like(m)")
        if axis in self.mflat.inner:
            return self.em(self.mflat.coord(axis))
        return self.ek(self.kflat.coord(axis))
