"""Pooling's backward: the ops `resample_max_backward` and `resample_avg_backward` of
ops/pooling_backward.py (what autodiff emits for `resample`) as generated kernels. Gathers, not
scatters: every dx element is written once by one program, with no atomics, so the result does not
depend on scheduling.

    avg   one kernel over dx:  dx[i] = sum over the windows o that hold i of dy[o] / count(o)
    max   two kernels. The first walks dy's windows and writes each window's first-maximum tap (as
          the forward pooling template picks it: window order, padding -inf, the first NaN wins) to
          scratch at the window's offset in dy, one byte a window for windows of up to 127 taps. The
          second walks dx: dx[i] = the sum of dy[o] over the windows o that hold i and whose tap is
          i's place in o.

Per spatial axis d an input coordinate i lies in at most ceil(window / stride) windows: o = (i + pre)
// stride - j for j = 0, 1, ..., valid where 0 <= o < out and the tap k = i + pre - o * stride is
inside the window (k >= 0 by construction). ResNet's stem pool (3x3/2, padding 1) has 2 per axis, 4
windows a dx element. Both kernels walk their tensor in its memory order (channels fastest in NHWC:
coalesced, vectorised loads and stores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ....core.config import Support
from ....core.device import Device
from ....core.dtypes import DataType
from ....core.errors import GraphError
from ....core.ir import Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc, stride_order
from ....ops.pooling import ResampleMode
from ....ops.pooling_backward import PoolBackward, ResampleAvgBackward, ResampleMaxBackward
from ..casts import from_storage, to_storage
from ..expr import compute_type, piece_types
from ..knobs import FlatKnobs
from ._flat_axes import FlatAxes
from .base import (
    Arg,
    ArgKind,
    Generated,
    Launch,
    Match,
    Template,
    extent,
    external_params,
    indent,
    module_source,
    offsets_need_int64,
    program_id,
)
from .pooling import UNROLL_TAPS, block_candidates, tap_coords

FLOATS = (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT, DataType.DOUBLE)
UNROLL_WINDOWS = 64  # the gather loop over the windows holding an element is unrolled up to this many


@dataclass(frozen=True)
class PoolGrad:
    node: Node
    is_max: bool
    dy: TensorDesc
    x: TensorDesc | None  # max: the forward's input
    dx: TensorDesc
    window: tuple[int, ...]
    stride: tuple[int, ...]
    pre: tuple[int, ...]
    exclude_padding: bool  # avg: count(o) is the window's taps inside the input, not prod(window)


MAIN_KINDS = (ResampleMaxBackward.kind, ResampleAvgBackward.kind)  # the op kinds of the pooling backward ops


def pooling_backward(node: Node) -> PoolBackward | Support:
    """The pooling backward op of `node`, or why it is not one: the one place that knows how these ops are
    represented."""
    if not isinstance(node.op, PoolBackward):
        return Support.no("the pooling backward template runs one resample backward op alone")
    return node.op


def analyze(piece: Piece) -> PoolGrad | Support:
    if len(piece.nodes) != 1:
        return Support.no("the pooling backward template runs one resample backward op alone")
    node = piece.nodes[0]
    op = pooling_backward(node)
    if isinstance(op, Support):
        return op
    dy = piece.tensor(node.input_uids()[0])
    dx = piece.tensor(node.output_uids()[0])
    x = piece.tensor(node.input_uids()[1]) if isinstance(op, ResampleMaxBackward) else None
    for t in (dy, dx) if x is None else (dy, x, dx):
        if t.data_type not in FLOATS or t.is_pass_by_value:
            return Support.no(
                f"{t.label()} is {'a pass-by-value scalar' if t.is_pass_by_value else t.data_type.value}"
                f"; the pooling backward kernels take buffers of {', '.join(f.value for f in FLOATS)}",
                node,
            )
    mode = op.mode if isinstance(op, ResampleAvgBackward) else ResampleMode.MAX
    if x is None and mode not in (ResampleMode.AVG_INCLUDE_PADDING, ResampleMode.AVG_EXCLUDE_PADDING):
        return Support.no(f"average pooling backward of mode {mode.name}", node)
    try:  # (the op's infer checked it when the graph was built; a plan file's graph too)
        geo = op.geometry(dy.dim, dx.dim)
    except GraphError as err:
        return Support.no(err.detail, node)
    w, s, pre = geo.window, geo.stride, geo.pre_padding
    exclude = mode is ResampleMode.AVG_EXCLUDE_PADDING
    return PoolGrad(node, x is not None, dy, x, dx, tuple(w), tuple(s), tuple(pre), exclude)


def _flat(desc: TensorDesc) -> FlatAxes:
    """A flat index `lin` over `desc`'s axes in its memory order (size-1 axes left out)."""
    return FlatAxes("lin", [a for a in stride_order(desc.stride) if desc.dim[a] > 1], desc.dim, "c")


TAP_BYTES = {"int8": 1, "int16": 2, "int32": 4}


def tap_type(taps: int) -> str:
    """The scratch type of the argmax taps of a window of `taps` taps."""
    return "int8" if taps <= 127 else "int16" if taps <= 32767 else "int32"


class PoolBackwardTemplate(Template):
    name = "pool_backward"
    priority = 20
    main_kinds = MAIN_KINDS
    knob_class = FlatKnobs

    def match(self, piece: Piece, device: Device) -> Support | PoolBackwardMatch:
        p = analyze(piece)
        return p if isinstance(p, Support) else PoolBackwardMatch(self, piece, device, p)


class PoolBackwardMatch(Match[FlatKnobs]):
    def __init__(self, template: PoolBackwardTemplate, piece: Piece, device: Device, grad: PoolGrad) -> None:
        super().__init__(template, piece, device)
        self.grad = grad

    def candidates(self) -> list[FlatKnobs]:
        return block_candidates(self.grad.dx.numel, 1024)

    def generate(self, knobs: FlatKnobs) -> Generated:
        p, piece = self.grad, self.piece
        block = knobs.BLOCK
        big = offsets_need_int64((p.dy, p.dx, *(() if p.x is None else (p.x,))), lanes=block)
        compute = compute_type(piece_types(piece))
        warps = (("num_warps", knobs.warps),)
        params, args = external_params(piece, [*piece.inputs, *piece.outputs])
        kernels, launches = [], []
        taps = math.prod(p.window)
        if p.is_max:
            scratch = Arg(ArgKind.SCRATCH, offset=0, dtype=tap_type(taps))
            kernels.append(_argmax(p, block, big, compute, ["taps", *params]))
            launches.append(Launch("kernel_argmax", (-(-p.dy.numel // block),), (scratch, *args), warps))
            params, args = ["taps", *params], [scratch, *args]
        kernels.append(_gather(p, block, big, compute, params))
        launches.append(Launch("kernel_gather", (-(-p.dx.numel // block),), tuple(args), warps))
        scratch_bytes = extent(p.dy) * TAP_BYTES[tap_type(taps)] if p.is_max else 0
        return Generated(module_source(*kernels), tuple(launches), scratch_bytes)


def _argmax(p: PoolGrad, block: int, big: bool, compute: str, params: list[str]) -> str:
    """Each dy window's first-maximum tap into `taps`, at dy's offset of the window."""
    assert p.x is not None
    yflat = _flat(p.dy)
    coords = tap_coords(p.window, p.stride, p.pre, p.x.dim, p.dy.dim, yflat.coord)
    terms = [f"{yflat.coord(a)} * {p.x.stride[a]}" for a in (0, 1) if p.dy.dim[a] > 1]
    terms += [f"i{d} * {p.x.stride[2 + d]}" for d in range(len(p.window)) if p.x.dim[2 + d] > 1]
    x_ptr = f"p{p.x.uid} + " + (" + ".join(terms) or "0")
    taps = math.prod(p.window)
    loop = f"for t in tl.static_range({taps}):" if taps <= UNROLL_TAPS else f"for t in range({taps}):"
    body = [
        f"v = {from_storage(f'tl.load({x_ptr}, mask=ok, other=0)', p.x.data_type, compute)}",
        "v = tl.where(ok, v, float('-inf'))",
        "upd = (v > best) | ((v != v) & (best == best))",
        "best = tl.where(upd, v, best)",
        "bidx = tl.where(upd, t, bidx)",
    ]
    lines = [
        f"best = tl.full([{block}], float('-inf'), {compute})",
        f"bidx = tl.zeros([{block}], tl.int32)",
        loop,
        *indent([*coords, *body]).split("\n"),
        f"tl.store(taps + {yflat.offset(p.dy) or '0'}, bidx.to(tl.{tap_type(taps)}), mask=mask)",
    ]
    return _kernel("kernel_argmax", params, p.dy.numel, block, big, yflat, lines)


def _gather(p: PoolGrad, block: int, big: bool, compute: str, params: list[str]) -> str:
    """dx over its memory order: the sum over the windows holding each element."""
    xflat = _flat(p.dx)
    nsp = len(p.window)
    per_axis = [-(-w // s) for w, s in zip(p.window, p.stride)]
    combos = math.prod(per_axis)
    inner = [math.prod(per_axis[d + 1 :]) for d in range(nsp)]
    # the window's offset in dy, where the argmax kernel also put its tap
    dy_terms = [f"{xflat.coord(a)} * {p.dy.stride[a]}" for a in (0, 1) if p.dx.dim[a] > 1 and p.dy.dim[a] > 1]
    body, valid = [], ["mask"]
    for d in range(nsp):
        w, s, pre, out = p.window[d], p.stride[d], p.pre[d], p.dy.dim[2 + d]
        i = xflat.coord(2 + d) if p.dx.dim[2 + d] > 1 else "tl.zeros_like(lin)"
        j = "j" if inner[d] == 1 else f"(j // {inner[d]})"
        if inner[d] * per_axis[d] != combos:
            j = f"{j} % {per_axis[d]}"
        h = f"({i} + {pre})" if pre else i
        body += [f"o{d} = {h} // {s} - {j}" if s != 1 else f"o{d} = {h} - {j}", f"k{d} = {h} - o{d} * {s}"]
        valid += [f"(o{d} >= 0)", f"(o{d} < {out})"] + ([f"(k{d} < {w})"] if per_axis[d] * s > w else [])
        if out > 1:
            dy_terms.append(f"o{d} * {p.dy.stride[2 + d]}")
    body.append(f"hit = {' & '.join(valid)}")
    dy_off = " + ".join(dy_terms) or "0"
    dy_val = from_storage(f"tl.load(p{p.dy.uid} + {dy_off}, mask=hit, other=0)", p.dy.data_type, compute)
    if p.is_max:
        tap = " + ".join(f"k{d} * {math.prod(p.window[d + 1 :])}" if d < nsp - 1 else f"k{d}" for d in range(nsp))
        # both loads under the window mask alone (constant over a channel run: vectorised), the
        # tap test a select after them
        body += [f"won = tl.load(taps + {dy_off}, mask=hit, other=-1) == {tap}", f"acc += tl.where(won, {dy_val}, 0.0)"]
    else:
        if p.exclude_padding:
            counts = []
            for d in range(nsp):
                lo = f"o{d} * {p.stride[d]} - {p.pre[d]}"
                counts.append(f"(tl.minimum({lo} + {p.window[d]}, {p.dx.dim[2 + d]}) - tl.maximum({lo}, 0))")
            body.append(f"count = ({' * '.join(counts)}).to({compute})")
        else:
            body.append(f"count = {float(math.prod(p.window))!r}")
        body.append(f"acc += tl.where(hit, {dy_val} / count, 0.0)")
    loop = f"for j in tl.static_range({combos}):" if combos <= UNROLL_WINDOWS else f"for j in range({combos}):"
    dx_off = xflat.offset(p.dx) or "0"
    lines = [
        f"acc = tl.zeros([{block}], {compute})",
        loop,
        *indent(body).split("\n"),
        f"tl.store(p{p.dx.uid} + {dx_off}, {to_storage('acc', p.dx.data_type, compute)}, mask=mask)",
    ]
    return _kernel("kernel_gather", params, p.dx.numel, block, big, xflat, lines)


def _kernel(name: str, params: list[str], numel: int, block: int, big: bool, flat: FlatAxes, body: list[str]) -> str:
    """A kernel over `numel` elements, BLOCK a program, walked by `flat`'s index `lin`: its coordinates
    (named while `body` was written) defined before `body`."""
    head = [f"lin = {program_id(0, big)} * {block} + tl.arange(0, {block})", f"mask = lin < {numel}", *flat.lines]
    return f"def {name}({', '.join(params)}):\n{indent([*head, *body])}\n"


TEMPLATE = PoolBackwardTemplate()
