"""Pooling pieces: an optional pointwise prologue on the input, one `resample` (max with optional
index, average including or excluding padding; 1-D/2-D/3-D windows, strides, asymmetric padding),
an optional pointwise epilogue on its output, as one kernel.

One program per BLOCK output elements, walked in the output's memory order (so in NHWC the channel
is the fast axis: coalesced, vectorised loads and stores). For each output element the kernel loops
over the window's taps (unrolled when the window is small), computes the tap's input coordinates
`o * stride - pre + k` per spatial axis, loads the prologue's inputs there (masked at padding), runs
the prologue, and folds the value in. Padding is applied *after* the prologue (-inf for MAX, 0 for
the averages), as the unfused graph computes it. Tensors of the prologue that do not vary along the
spatial axes (per-channel scales, scalars) are loaded once per program. MAX keeps the first
maximum and the first NaN (the reference's argmax order: taps in row-major window order, padding
counted as -inf).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ....core.config import Support
from ....core.device import Device
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc, stride_order
from ....ops.pooling import PoolGeometry, Resample, ResampleMode
from ..expr import TL_DTYPE, Emitter, compute_type, elementwise, piece_types, round_in_compute, to_storage
from ..knobs import FlatKnobs
from ._flat_axes import FlatAxes
from .base import (
    INT32_LIMIT,
    Generated,
    Launch,
    Match,
    Template,
    external_params,
    indent,
    module_source,
    offsets_need_int64,
    pow2_at_least,
    program_id,
    unique,
)

UNROLL_TAPS = 27  # windows up to 3x3x3 are unrolled


@dataclass(frozen=True)
class PoolPiece:
    node: Node
    op: Resample
    x: TensorDesc  # the resample's input
    y: TensorDesc  # its output
    index: TensorDesc | None
    geo: PoolGeometry
    prologue: tuple[Node, ...]
    epilogue: tuple[Node, ...]


def _fits(dims: tuple[int, ...], space: tuple[int, ...]) -> bool:
    return len(dims) == len(space) and all(a == b or a == 1 for a, b in zip(dims, space))


def analyze(piece: Piece) -> PoolPiece | Support:
    if "resample" not in piece.kind_set:  # (without a pass over a long piece)
        return Support.no("the piece has no resample node")
    pools = [n for n in piece.nodes if isinstance(n.op, Resample)]
    if len(pools) != 1:
        return Support.no(
            "the piece has no resample node"
            if not pools
            else "the piece has several resample nodes; one kernel pools once",
            pools[-1] if pools else None,
        )
    for n in piece.nodes:
        if not (elementwise(n) or isinstance(n.op, Resample)):
            return Support.no(f"the pooling template runs pointwise ops and one resample, not {n.kind}", n)
    node = pools[0]
    op = node.op
    assert isinstance(op, Resample)
    src = node.inputs[0]
    assert isinstance(src, int)
    x = piece.tensor(src)
    y_uid = node.outputs[0]
    assert y_uid is not None
    y = piece.tensor(y_uid)
    index = piece.tensor(node.outputs[1]) if len(node.outputs) > 1 and node.outputs[1] is not None else None
    at = piece.nodes.index(node)
    prologue, epilogue = piece.nodes[:at], piece.nodes[at + 1 :]
    pro_uids = {u for n in prologue for u in n.output_uids()} | {src}
    for n in prologue:
        for u in n.output_uids():
            t = piece.tensor(u)
            if u in piece.outputs:
                return Support.no(
                    f"{t.label()} of the pooling prologue is needed outside the piece; the kernel "
                    "computes it window by window and cannot store it",
                    n,
                )
            if not (t.numel == 1 or _fits(t.dim, x.dim)):
                return Support.no(
                    f"{t.label()} dims {list(t.dim)} do not broadcast to the pooling input's {list(x.dim)}", n
                )
    for n in epilogue:
        for u in n.input_uids():
            if u in pro_uids and u != y_uid:
                return Support.no(
                    f"{n.label()} after the resample reads {piece.tensor(u).label()} of the "
                    "pooling input's space; the kernel walks the output's",
                    n,
                )
        for u in n.output_uids():
            t = piece.tensor(u)
            if not ((t.numel == 1 and u not in piece.outputs) or _fits(t.dim, y.dim)):
                return Support.no(
                    f"{t.label()} dims {list(t.dim)} do not broadcast to the pooling output's {list(y.dim)}", n
                )
    return PoolPiece(node, op, x, y, index, op.geometry(None, x.dim), tuple(prologue), tuple(epilogue))


class TapIndexer:
    """The prologue's view: loads at the current tap's input position (`i{d}` per spatial axis,
    `ok` its mask); tensors constant over the spatial axes at the output's n, c."""

    def __init__(self, yflat: FlatAxes, y: TensorDesc) -> None:
        self.yflat = yflat
        self.y = y

    def _nc(self, axis: int) -> str | None:
        return self.yflat.coord(axis) if self.y.dim[axis] > 1 else None

    def invariant(self, desc: TensorDesc) -> bool:
        return desc.numel == 1 or all(d == 1 or s == 0 for d, s in zip(desc.dim[2:], desc.stride[2:]))

    def _offset(self, desc: TensorDesc) -> str:
        terms = []
        for axis, (d, s) in enumerate(zip(desc.dim, desc.stride)):
            if d == 1 or s == 0:
                continue
            c = self._nc(axis) if axis < 2 else f"i{axis - 2}"
            if c is not None:
                terms.append(c if s == 1 else f"{c} * {s}")
        return " + ".join(terms) or "tl.zeros_like(lin)"

    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1:
            return f"tl.load({ptr})"
        mask = "mask" if self.invariant(desc) else "ok"
        return f"tl.load({ptr} + {self._offset(desc)}, mask={mask}, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        raise AssertionError("the pooling prologue stores nothing")  # match() declines such pieces

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1:
            return "tl.zeros_like(lin)"
        if axis >= 2:
            return f"i{axis - 2}"
        return self._nc(axis) or "tl.zeros_like(lin)"


class OutIndexer:
    """The epilogue's view: loads and stores at flat output position `lin`."""

    def __init__(self, yflat: FlatAxes, space: tuple[int, ...]) -> None:
        self.yflat = yflat
        self.space = space

    def _offset(self, desc: TensorDesc) -> str:
        return self.yflat.offset(desc) or "tl.zeros_like(lin)"

    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1:
            return f"tl.load({ptr})"
        return f"tl.load({ptr} + {self._offset(desc)}, mask=mask, other=0)"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        mask = "mask"
        for axis, (d, full) in enumerate(zip(desc.dim, self.space)):
            if d == 1 and full > 1:  # broadcast-smaller outputs: written once, at coordinate 0
                mask += f" & ({self.yflat.coord(axis)} == 0)"
        return f"tl.store({ptr} + {self._offset(desc)}, {value}, mask={mask})"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        if desc.dim[axis] == 1 or self.space[axis] == 1:
            return "tl.zeros_like(lin)"
        return self.yflat.coord(axis)


class PoolingTemplate(Template):
    name = "pooling"
    priority = 20
    main_kinds = ("resample",)
    knob_class = FlatKnobs

    def match(self, piece: Piece, device: Device) -> Support | PoolingMatch:
        p = analyze(piece)
        return p if isinstance(p, Support) else PoolingMatch(self, piece, device, p)


class PoolingMatch(Match[FlatKnobs]):
    def __init__(self, template: PoolingTemplate, piece: Piece, device: Device, pool: PoolPiece) -> None:
        super().__init__(template, piece, device)
        self.pool = pool

    def candidates(self) -> list[FlatKnobs]:
        # ~4 outputs per thread; big windows do more work per output, so smaller blocks
        return block_candidates(self.pool.y.numel, 1024 if math.prod(self.pool.geo.window) <= 16 else 512)

    def generate(self, knobs: FlatKnobs) -> Generated:
        p, piece = self.pool, self.piece
        block = knobs.BLOCK
        g = piece.graph
        externals = [*piece.inputs, *piece.outputs]
        ny = p.y.numel
        big = ny + block > INT32_LIMIT or offsets_need_int64(g.tensors[u] for u in externals)
        types = piece_types(piece)
        compute = compute_type(types)
        space = p.y.dim
        order = [a for a in stride_order(p.y.stride) if space[a] > 1]
        yflat = FlatAxes("lin", order, space, "c")

        # prologue, evaluated per tap
        tap_idx = TapIndexer(yflat, p.y)
        pro = Emitter(g.tensors, compute, tap_idx, ptr=lambda u: f"p{u}", scalar=lambda u: f"s{u}")
        for u in piece.inputs:
            t = g.tensors[u]
            if (
                not t.is_pass_by_value
                and tap_idx.invariant(t)
                and any(u in n.input_uids() for n in p.prologue + (p.node,))
            ):
                pro.operand(u)
        hoisted, pro.lines = pro.lines, []
        for n in p.prologue:
            pro.emit(n)
        x_uid = p.node.inputs[0]
        assert isinstance(x_uid, int)
        xv = pro.operand(x_uid)
        tap_lines = tap_coords(p.geo.window, p.geo.stride, p.geo.pre_padding, p.x.dim, p.y.dim, yflat.coord) + pro.lines
        is_max = p.op.mode is ResampleMode.MAX
        if is_max:
            init = [f"best = tl.full([{block}], float('-inf'), {compute})", f"bidx = tl.zeros([{block}], tl.int32)"]
            tap_lines += [
                f"v = tl.where(ok, {xv}, float('-inf'))",
                "upd = (v > best) | ((v != v) & (best == best))",
                "best = tl.where(upd, v, best)",
                "bidx = tl.where(upd, t, bidx)",
            ]
            result = "best"
        else:
            init = [f"total = tl.zeros([{block}], {compute})"]
            tap_lines.append(f"total += tl.where(ok, {xv}, 0.0)")
            if p.op.mode is ResampleMode.AVG_EXCLUDE_PADDING:
                init.append(f"count = tl.zeros([{block}], {compute})")
                tap_lines.append(f"count += ok.to({compute})")
                result = "total / tl.maximum(count, 1.0)"  # count is 0 on masked lanes only
            else:
                result = f"total / {float(math.prod(p.geo.window))!r}"

        # the pooled value, its index, and the epilogue over the output's space
        post = [f"yv = {result}"]
        rounded = round_in_compute("yv", p.y.data_type, compute)
        if rounded is not None:
            post.append(f"yv = {rounded}")
        out_idx = OutIndexer(yflat, space)
        epi = Emitter(g.tensors, compute, out_idx, ptr=lambda u: f"p{u}", scalar=lambda u: f"s{u}")
        epi.values[p.y.uid] = "yv"
        if p.index is not None:
            epi.values[p.index.uid] = f"bidx.to({compute})"
        if p.y.uid in piece.outputs:
            post.append(out_idx.store(p.y, f"p{p.y.uid}", to_storage("yv", p.y.data_type, compute)))
        if p.index is not None and p.index.uid in piece.outputs:
            post.append(out_idx.store(p.index, f"p{p.index.uid}", f"bidx.to({TL_DTYPE[p.index.data_type]})"))
        for n in p.epilogue:
            epi.emit(n)
        for u in piece.outputs:
            if any(u in n.output_uids() for n in p.epilogue):
                epi.store(u)
        post += epi.lines

        taps = math.prod(p.geo.window)
        loop = f"for t in tl.static_range({taps}):" if taps <= UNROLL_TAPS else f"for t in range({taps}):"
        head = [f"lin = {program_id(0, big)} * {block} + tl.arange(0, {block})", f"mask = lin < {ny}"]
        body = [*head, *yflat.lines, *hoisted, *init, loop, *indent(tap_lines).split("\n"), *post]
        params, args = external_params(piece, externals)
        source = module_source(f"def kernel({', '.join(params)}):\n{indent(body)}\n")
        launch = Launch("kernel", (-(-ny // block),), tuple(args), (("num_warps", knobs.warps),))
        return Generated(source, (launch,))


def block_candidates(numel: int, first: int) -> list[FlatKnobs]:
    """BLOCK / num_warps configs of a kernel over `numel` flat elements, `first` elements a program first,
    then half, double and 256 (at most the elements' power of two, a warp per 128 lanes at most)."""
    top = pow2_at_least(numel, 16)
    return unique(
        [
            FlatKnobs(BLOCK=min(b, top), num_warps=max(1, min(w, min(b, top) // 128)))
            for b, w in ((first, 4), (first // 2, 4), (first * 2, 8), (256, 2))
        ]
    )


def tap_coords(
    window: Sequence[int],
    stride: Sequence[int],
    pre: Sequence[int],
    x_dims: Sequence[int],
    y_dims: Sequence[int],
    coord: Callable[[int], str],
    mask: str = "mask",
) -> list[str]:
    """Per window tap `t` (row-major over the window): the offset `k{d}` per spatial axis, the input
    coordinate `i{d}` of output coordinate coord(2 + d), and `ok`: `mask` and the tap inside the input."""
    nsp = len(window)
    lines, checks = [], [mask]
    inners = [math.prod(window[d + 1 :]) for d in range(nsp)]
    for d in range(nsp):
        w, s, p = window[d], stride[d], pre[d]
        k = "t" if inners[d] == 1 else f"(t // {inners[d]})"
        if inners[d] * w != math.prod(window):
            k = f"{k} % {w}"
        lines.append(f"k{d} = {k}")
        size = y_dims[2 + d]
        o = coord(2 + d) if size > 1 else "tl.zeros_like(lin)"
        shift = f"(k{d} - {p})" if p else f"k{d}"
        lines.append(f"i{d} = {o} * {s} + {shift}" if s != 1 else f"i{d} = {o} + {shift}")
        if p > 0:
            checks.append(f"(i{d} >= 0)")
        if (size - 1) * s - p + w - 1 >= x_dims[2 + d]:
            checks.append(f"(i{d} < {x_dims[2 + d]})")
    lines.append(f"ok = {' & '.join(checks)}")
    return lines


TEMPLATE = PoolingTemplate()
