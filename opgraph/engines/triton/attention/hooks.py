"""The hooks through which the attention kernels emit fused pointwise code (lowering.py builds them
from a piece): q/k/v prologues and the O epilogue (`NodesHook`, through the expression emitter at a
tile's coordinates) and the recorded score modifier with its derivative (`ScoreModCode`), with the
tile loop's faster forms of a few modes (`_hot_loop_form`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ....core.errors import expect
from ....core.ir import Const, Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.attention import _Attention
from ....ops.pointwise import MODES, Pointwise, PointwiseMode
from ....ops.score_mod import Ref, ScoreMod, Src
from ..expr import Emitter, _mode_expr, literal, round_in_compute
from ..sizes import above_one
from .spec import Coords

Text = Callable[[Any], str]  # spells a size: str, or sizes.Sizes.text in a bucket kernel (sized.py)


class TileIndexer:
    """Loads and stores of tensors broadcast to a tile whose elements have coordinates `at`; `text`
    spells a size (a dynamic one as its size parameter in a bucket kernel)."""

    def __init__(self, at: Coords, text: Text = str) -> None:
        self.at, self.text = at, text

    def offset(self, desc: TensorDesc) -> str:
        terms = []
        for a in range(4):
            s = desc.stride[a]
            if above_one(desc.dim[a]) and (not isinstance(s, int) or s != 0):
                c = self.at.axis(a)
                if a < 2:
                    c = f"{c}.to(tl.int64)"
                terms.append(f"{c} * {self.text(s)}")
        return " + ".join(terms) or "0"

    def load(self, desc: TensorDesc, ptr: str) -> str:
        if desc.numel == 1:
            return f"tl.load({ptr})"
        if desc.dim[2] == 1 and desc.dim[3] == 1:  # per batch / head: one scalar (b, h always in range)
            return f"tl.load({ptr} + {self.offset(desc)})"
        m = f", mask={self.at.mask}, other=0" if self.at.mask else ""
        return f"tl.load({ptr} + {self.offset(desc)}{m})"

    def store(self, desc: TensorDesc, ptr: str, value: str) -> str:
        m = f", mask={self.at.mask}" if self.at.mask else ""
        return f"tl.store({ptr} + {self.offset(desc)}, {value}{m})"

    def coord(self, axis: int, desc: TensorDesc) -> str:
        return "0" if desc.dim[axis] == 1 else self.at.axis(axis)


class PrefixEmitter(Emitter):
    """An Emitter whose value names carry a prefix (one per hook, so that tiles of different shapes
    never share a name)."""

    def __init__(self, *args, prefix: str, **kw) -> None:
        super().__init__(*args, **kw)
        self.prefix = prefix

    def operand(self, v: int | Const | None) -> str:
        if v is None or isinstance(v, Const) or v in self.values:
            return super().operand(v)
        desc = self.tensors[v]
        name = f"{self.prefix}{v}"
        if desc.is_pass_by_value:
            self.lines.append(f"{name} = {self.scalar(v)}")
        else:
            self.lines.append(f"{name} = {self.indexer.load(desc, self.ptr(v))}.to({self.compute})")
        self.values[v] = name
        return name

    def assign(self, uid: int, value: str, typ: str | None = None) -> None:
        # (fp32 hooks: no node computes in another type)
        name = f"{self.prefix}{uid}"
        self.lines.append(f"{name} = {value}")
        rounded = round_in_compute(name, self.tensors[uid].data_type, self.compute)
        if rounded is not None:
            self.lines.append(f"{name} = {rounded}")
        self.values[uid] = name


def _param(piece: Piece, uid: int) -> str:
    return f"s{uid}" if piece.tensor(uid).is_pass_by_value else f"p{uid}"


class NodesHook:
    """A prologue (nodes computing operand `target`) or an epilogue (nodes on O, `target` the O
    uid) emitted by the expression emitter at the tile's coordinates."""

    def __init__(
        self, piece: Piece, nodes: tuple[Node, ...], target: int, prefix: str, *, epilogue: bool, text: Text = str
    ) -> None:
        self.piece, self.nodes, self.target, self.prefix, self.epilogue = piece, nodes, target, prefix, epilogue
        self.text = text
        made = {u for n in nodes for u in n.output_uids()}
        ext = [u for n in nodes for u in n.input_uids() if u not in made and u != target]
        self._params = tuple(dict.fromkeys(_param(piece, u) for u in ext))
        if epilogue:
            self._params += tuple(f"p{u}" for n in nodes for u in n.output_uids() if u in piece.outputs)
        # a value that depends on no tile-shaped tensor is broadcast to the tile explicitly
        self.scalar_only = (
            not epilogue
            and not any(above_one(piece.tensor(u).dim[2]) or above_one(piece.tensor(u).dim[3]) for u in ext)
            and not any(
                isinstance(n.op, Pointwise) and n.op.mode is PointwiseMode.GEN_INDEX and n.op.axis in (2, 3)
                for n in nodes
            )
        )

    def params(self) -> tuple[str, ...]:
        return self._params

    def emit(self, value: str | None, at: Coords) -> tuple[list[str], str | None]:
        em = PrefixEmitter(
            self.piece.graph.tensors,
            "tl.float32",
            TileIndexer(at, self.text),
            ptr=lambda u: f"p{u}",
            scalar=lambda u: f"s{u}",
            prefix=self.prefix,
        )
        if self.epilogue:
            assert value is not None
            em.assign(self.target, value)  # O as the unfused graph sees it (rounded to its type)
        for n in self.nodes:
            em.emit(n)
        if self.epilogue:
            for n in self.nodes:
                for u in n.output_uids():
                    if u in self.piece.outputs:
                        em.store(u)
            return em.lines, value
        result = em.values[self.target]
        if self.scalar_only:
            result = f"({result} + 0.0 * ({at.i} + {at.j}).to(tl.float32))"
        return em.lines, result


class ScoreModCode:
    """A recorded score modifier (and its derivative) emitted as straight-line fp32 code, extra inputs
    read at the score tile's coordinates."""

    def __init__(self, piece: Piece, node: Node, text: Text = str) -> None:
        self.piece, self.text = piece, text
        op = node.op_as(_Attention)
        self.mod: ScoreMod = expect(op.score_mod, f"the score modifier of {node.label()}")
        self.grad: ScoreMod | None = getattr(op, "score_mod_grad", None)
        self.inputs = [node.input(r) for r in self.mod.input_roles()]
        self._params = tuple(dict.fromkeys(_param(piece, u) for u in self.inputs if isinstance(u, int)))

    def params(self) -> tuple[str, ...]:
        return self._params

    def _input(self, i: int, at: Coords, lines: list[str], cache: dict[int, str], prefix: str) -> str:
        if i in cache:
            return cache[i]
        u = self.inputs[i]
        if isinstance(u, Const):
            return literal(u.value)
        desc = self.piece.tensor(expect(u, f"score_mod input {i}"))
        name = f"{prefix}in{i}"
        if desc.is_pass_by_value:
            lines.append(f"{name} = s{u}")
        else:
            lines.append(f"{name} = {TileIndexer(at, self.text).load(desc, f'p{u}')}.to(tl.float32)")
        cache[i] = name
        return name

    def _emit(self, mod: ScoreMod, score: str, grad: str | None, at: Coords, prefix: str) -> tuple[list[str], str]:
        lines: list[str] = []
        cache: dict[int, str] = {}
        names: list[str] = []

        def value(r: Ref | None) -> str:
            if r is None:
                return ""
            if r.src is Src.SCORE:
                return score
            if r.src is Src.GRAD:
                assert grad is not None
                return grad
            if r.src is Src.NODE:
                return names[r.index]
            if r.src is Src.INPUT:
                return self._input(r.index, at, lines, cache, prefix)
            return literal(r.const)

        for i, n in enumerate(mod.nodes):
            info = MODES[n.mode]
            ins = [value(r) for r in n.operands]
            name = f"{prefix}{i}"
            if n.mode is PointwiseMode.GEN_INDEX:
                expr = f"({at.axis(n.axis or 0)})"
            elif (fast := _hot_loop_form(n.mode, n.operands, ins)) is not None:
                expr = fast
            else:
                params = {
                    p: (ins[info.arity + j] if info.arity + j < len(ins) and ins[info.arity + j] else literal(default))
                    for j, (p, default) in enumerate(info.params)
                }
                expr = _mode_expr(n.mode, ins[: info.arity], params)
            lines.append(f"{name} = ({expr}).to(tl.float32)")
            names.append(name)
        return lines, value(mod.result)

    def forward(self, score: str, at: Coords) -> tuple[list[str], str]:
        return self._emit(self.mod, score, None, at, "smf")

    def backward(self, score: str, grad: str, at: Coords) -> tuple[list[str], str]:
        assert self.grad is not None
        return self._emit(self.grad, score, grad, at, "smb")


def _hot_loop_form(mode: PointwiseMode, refs: tuple[Ref | None, ...], ins: list[str]) -> str | None:
    """The form of a score-modifier op inside the tile loop, where it runs once per score element
    beside the tensor-core work, or None for the pointwise template's own: division by a power of two
    as the (exact) product with its reciprocal; tanh as libdevice's tanhf (2 ulp) and its derivative as
    1 - tanh^2 (absolute error ~eps: relative accuracy is lost for |x| > ~4, where it is below 1e-3;
    in a backward kernel the compiler may share the tanh with the recomputed forward's). A fraction of
    the pointwise forms' instructions and registers: the soft-capped score tile spilled registers at
    the tile sizes plain attention runs best at. (Other divisions stay divisions: x * fl(1/c) is not
    x / c, and floor(j * fl(1/41)) misplaces bucket edges.)"""
    if mode is PointwiseMode.DIV and len(refs) > 1 and refs[1] is not None and refs[1].src is Src.CONST:
        c = refs[1].const
        if c != 0 and math.isfinite(c) and math.frexp(c)[0] in (0.5, -0.5) and math.isfinite(1.0 / c):
            return f"{ins[0]} * {literal(1.0 / c)}"
    if mode is PointwiseMode.TANH_FWD:
        return f"_og_tanh_fast({ins[0]})"
    if mode is PointwiseMode.TANH_BWD:
        return f"({ins[0]} * _og_sech2_fast({ins[1]}))"
    return None
