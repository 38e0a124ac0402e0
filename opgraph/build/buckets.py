"""Choosing a dynamic plan's buckets (docs/design/dynamic-shapes.md, "Buckets"): the policy.

Per dynamic dim, the range is cut into size classes: the value 1 on its own where the range starts at
1 (decode-like shapes want other kernels), then powers of 16 (`2..16`, `17..256`, `257..4096`, ...)
cut to the range, and a cut where the graph's offsets stop fitting int32 (the bucket below it keeps
int32 indexing). The buckets are the product of the dims' classes, merged down to `max_buckets` by
joining neighbouring classes of the dim with the most (the pair whose union spans the smallest
ratio). `build(buckets={"seq": [128, 1024]})` gives a dim's upper ends instead (kept as given);
`buckets="one"` one bucket for the whole range. Each bucket's hint is the geometric middle of its
sub-ranges, rounded to a multiple of 16 where that stays inside.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.bucket import Bucket
from ..core.errors import BuildOptionError
from ..core.ir import FinalGraph
from ..core.symbolic import Dim, Ranges, bounds

CLASS_BASE = 16  # size classes grow by this factor
MAX_BUCKETS = 8  # default build(max_buckets=)
INT32_LIMIT = 2**31 - 1
LANES = 2**16  # how far a kernel's last program may index past a tensor's end (templates/base.py)

Span = tuple[int, int]


def size_classes(lo: int, hi: int) -> list[Span]:
    """{1} where the range starts at 1, then powers of CLASS_BASE, cut to [lo, hi]."""
    classes: list[Span] = []
    start = lo
    if lo == 1:
        classes.append((1, 1))
        start = 2
    upper = CLASS_BASE
    while start <= hi:
        if upper >= start:
            end = min(upper, hi)
            classes.append((start, end))
            start = end + 1
        upper *= CLASS_BASE
    return classes


def _needs_int64(extents: set[tuple[Any, Any]], ranges: Ranges) -> bool:
    """Whether some tensor's offsets (its extent, or its element count plus a program's lanes: `_extents`)
    can pass int32 for a shape in `ranges`."""
    return any(
        bounds(reach, ranges)[1] > INT32_LIMIT or bounds(numel, ranges)[1] + LANES > INT32_LIMIT
        for reach, numel in extents
    )


def _extents(graph: FinalGraph) -> set[tuple[Any, Any]]:
    """(extent, element count) of the graph's tensors, each distinct pair once (most tensors of a model
    share a few shapes: their bounds are found once, not once a tensor and a call)."""
    return {(1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride)), math.prod(t.dim)) for t in graph.tensors.values()}


def int64_cut(graph: FinalGraph, dim: Dim) -> int | None:
    """The largest value of `dim` up to which the graph's offsets fit int32 with the other dims at their
    maxima, where that is inside its range (below its max); None where no cut helps."""
    whole = {n: (d.min, d.max) for n, d in graph.symbols.items()}
    extents = _extents(graph)
    if not _needs_int64(extents, whole) or _needs_int64(extents, {**whole, dim.name: (dim.min, dim.min)}):
        return None
    lo, hi = dim.min, dim.max - 1  # the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _needs_int64(extents, {**whole, dim.name: (dim.min, mid)}):
            hi = mid - 1
        else:
            lo = mid
    return lo


def _split(classes: list[Span], at: int) -> list[Span]:
    """`classes` with the one holding `at` cut after it."""
    out: list[Span] = []
    for lo, hi in classes:
        out += [(lo, at), (at + 1, hi)] if lo <= at < hi else [(lo, hi)]
    return out


def _merge_once(classes: list[Span]) -> list[Span]:
    """`classes` with the neighbouring pair whose union spans the smallest ratio joined (the class {1}
    last)."""
    pairs = range(len(classes) - 1)
    i = min(pairs, key=lambda k: (classes[k] == (1, 1), classes[k + 1][1] / classes[k][0]))
    return [*classes[:i], (classes[i][0], classes[i + 1][1]), *classes[i + 2 :]]


def hint_of(lo: int, hi: int) -> int:
    """The geometric middle of [lo, hi], rounded to a multiple of 16 where that stays inside."""
    middle = round(math.sqrt(lo * hi))
    rounded = round(middle / 16) * 16
    return rounded if lo <= rounded <= hi and rounded > 0 else min(max(middle, lo), hi)


def check_spec(spec: Any) -> str | tuple[tuple[str, tuple[int, ...]], ...] | None:
    """build(buckets=...) as kept in BuildOptions: None, "one", or (dim name, upper ends) pairs."""
    if spec is None or spec == "one":
        return spec
    if isinstance(spec, Mapping):
        spec = tuple(spec.items())
    bad = BuildOptionError(
        f"build option buckets={spec!r} is not a bucket choice",
        rule="build.buckets",
        hint='pass None (the default policy), "one", or {dim name: [upper ends]}, e.g. {"seq": [128, 1024]}',
    )
    if not isinstance(spec, tuple):
        raise bad
    out = []
    for item in spec:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise bad
        name, ends = item
        if isinstance(ends, (str, bytes)) or not isinstance(ends, Sequence):
            raise bad
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
            raise bad
        out.append((name, tuple(ends)))
    return tuple(out)


@dataclass(frozen=True)
class Buckets:
    """A plan's buckets: per dim (in the graph's symbol order) its classes' upper ends; the buckets in
    mixed-radix order of their classes (the last dim fastest)."""

    names: tuple[str, ...]
    uppers: tuple[tuple[int, ...], ...]
    buckets: tuple[Bucket, ...]

    def of(self, values: Sequence[int]) -> Bucket:
        """The bucket of a shape (the dims' values in symbol order): a bisect per dim."""
        index = 0
        for ends, v in zip(self.uppers, values):
            index = index * len(ends) + bisect.bisect_left(ends, v)
        return self.buckets[index]

    def __len__(self) -> int:
        return len(self.buckets)


def choose(graph: FinalGraph, spec: Any = None, max_buckets: int = MAX_BUCKETS) -> Buckets:
    """The buckets of a dynamic graph for build(buckets=spec, max_buckets=...)."""
    symbols = graph.symbols
    spec = check_spec(spec)
    given: dict[str, tuple[int, ...]] = dict(spec) if isinstance(spec, tuple) else {}
    for name in given:
        if name not in symbols:
            raise BuildOptionError(
                f"build option buckets names {name!r}, which is no dynamic dim of graph '{graph.name}'",
                rule="build.buckets",
                hint=f"its dynamic dims are {', '.join(repr(n) for n in symbols) or 'none'}",
            )
    classes: dict[str, list[Span]] = {}
    for name, d in symbols.items():
        if spec == "one":
            classes[name] = [(d.min, d.max)]
        elif name in given:
            ends = given[name]
            if list(ends) != sorted(set(ends)) or any(not d.min <= e < d.max for e in ends):
                raise BuildOptionError(
                    f"build option buckets={{{name!r}: {list(ends)}}}: upper ends must increase and lie in "
                    f"{d.min}..{d.max - 1} (the range's max {d.max} ends the last bucket)",
                    rule="build.buckets",
                    hint=f"e.g. buckets={{{name!r}: [{max(d.min, d.max // 8)}]}}",
                )
            lows = [d.min, *(e + 1 for e in ends)]
            classes[name] = list(zip(lows, [*ends, d.max]))
        else:
            found = size_classes(d.min, d.max)
            cut = int64_cut(graph, d)
            classes[name] = _split(found, cut) if cut is not None else found
    default = [n for n in symbols if spec != "one" and n not in given]
    while math.prod(len(c) for c in classes.values()) > max_buckets:
        mergeable = [n for n in default if len(classes[n]) > 1]
        if not mergeable:
            break
        name = max(mergeable, key=lambda n: len(classes[n]))
        classes[name] = _merge_once(classes[name])
    names = tuple(symbols)
    buckets = tuple(
        Bucket(
            i,
            tuple((n, lo, hi) for n, (lo, hi) in zip(names, combo)),
            tuple((n, hint_of(lo, hi)) for n, (lo, hi) in zip(names, combo)),
        )
        for i, combo in enumerate(itertools.product(*(classes[n] for n in names)))
    )
    return Buckets(names, tuple(tuple(hi for _, hi in classes[n]) for n in names), buckets)


__all__ = ["Buckets", "CLASS_BASE", "MAX_BUCKETS", "check_spec", "choose", "hint_of", "size_classes"]
