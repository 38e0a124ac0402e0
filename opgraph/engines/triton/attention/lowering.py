"""From a piece to the kernel generator's spec: which pieces the attention templates take (one sdpa
with pointwise prologues on q/k/v and a pointwise epilogue on O; one sdpa_backward alone; either
reading q/k/v (and the backward's o/dO) as slices, transposes and reshapes of tensors in memory, in
place: the heads of a fused qkv projection; the backward writing dQ/dK/dV through transposes and
reshapes, and into their slots of a concatenation: the fused projection's input gradient), the
Operands of its tensors (kernel parameters p{uid} / s{uid}), and the hooks that emit the fused
pointwise code through the expression emitter (expr.py): prologue and epilogue nodes, and the
recorded score modifier (ops/score_mod.py) with its derivative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, overload

from ....core.config import Support
from ....core.dtypes import DataType
from ....core.errors import InternalError, expect
from ....core.ir import Const, Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.attention import _Attention
from ....ops.attention_layout import Feature, extensions, ragged_role
from ....ops.pointwise import MODES, Pointwise, PointwiseMode
from ....ops.score_mod import Ref, ScoreMod, Src
from ...shared.views import ROLES, gradient_targets, operand_views
from ..expr import TL_DTYPE, Emitter, _mode_expr, elementwise, literal, round_in_compute
from ..gemm import VIEW_KINDS, View
from .spec import (
    AttnSpec,
    Causal,
    Coords,
    MaskDropout,
    Operand,
    Paged,
    PhiloxDropout,
    Ragged,
    Scalar,
)

MAX_HEAD_DIM = 256
# what the generated kernels run of the features beyond dense tensors and the causal / window masks
RUNS = {
    "sdpa": frozenset({Feature.PACKED, Feature.PAGED, Feature.BAND_RIGHT, Feature.BAND_BOTTOM_RIGHT}),
    "sdpa_backward": frozenset[Feature](),
}


@dataclass(frozen=True)
class Fusion:
    """A piece as prologues (per q/k/v role, nodes in order) -> one attention node -> epilogue; `views`:
    operands read in place as views of tensors in memory (by operand UID)."""

    node: Node
    prologue: tuple[tuple[str, tuple[Node, ...]], ...]
    epilogue: tuple[Node, ...]
    views: tuple[tuple[int, View], ...] = ()

    def nodes_of(self, role: str) -> tuple[Node, ...]:
        return next((n for r, n in self.prologue if r == role), ())


def _producers(piece: Piece) -> dict[int, Node]:
    return {u: n for n in piece.nodes for u in n.output_uids()}


def _chain(uid: int, made: dict[int, Node]) -> list[Node]:
    """The piece's nodes that tensor `uid` depends on (transitively), in piece order."""
    seen: dict[int, Node] = {}
    todo = [uid]
    while todo:
        u = todo.pop()
        n = made.get(u)
        if n is not None and id(n) not in seen:
            seen[id(n)] = n
            todo.extend(n.input_uids())
    return list(seen.values())


def _broadcasts(desc: TensorDesc, dims: tuple[int, ...]) -> bool:
    return desc.numel == 1 or (len(desc.dim) == len(dims) and all(d in (1, f) for d, f in zip(desc.dim, dims)))


def analyze(piece: Piece, kind: str, template: str) -> Fusion | Support:
    """The piece as a Fusion, or Support.no with the reason."""
    if not piece.kind_set & {"sdpa", "sdpa_backward"}:  # known without a pass: the partitioner asks per op
        return Support.no(f"the {template} template runs one {kind} op per kernel (attention ops here: none)")
    attn = [n for n in piece.nodes if n.kind in ("sdpa", "sdpa_backward")]
    others = [n for n in piece.nodes if n.kind not in ("sdpa", "sdpa_backward")]
    if len(attn) != 1 or attn[0].kind != kind:
        what = ", ".join(n.label() for n in attn) or "none"
        return Support.no(f"the {template} template runs one {kind} op per kernel (attention ops here: {what})")
    node = attn[0]
    views = operand_views(piece, node, template)
    if isinstance(views, Support):
        return views
    at = piece.nodes.index(node)
    viewing = {id(n) for n in piece.nodes[:at] if n.kind in VIEW_KINDS}  # (checked by operand_views)
    if kind == "sdpa_backward":
        targets = gradient_targets(piece, node, template)
        if isinstance(targets, Support):
            return targets
        views.update(targets)
        viewing |= {id(n) for n in piece.nodes[at + 1 :]}  # (each one checked by gradient_targets)
    others = [n for n in others if id(n) not in viewing]
    bad = next((n for n in others if not elementwise(n)), None)
    if bad is not None:
        return Support.no(
            f"the {template} template fuses pointwise ops around {node.label()}; {bad.label()} is not pointwise", bad
        )
    if kind == "sdpa_backward":
        if others:
            return Support.no(
                f"the {template} template runs {node.label()} alone (no prologue or epilogue); "
                f"{others[0].label()} makes its own piece",
                others[0],
            )
        return Fusion(node, (), (), tuple(views.items()))
    made = _producers(piece)
    taken: dict[int, str] = {}
    prologue = []
    for role in ROLES:
        uid = node.input(role)
        assert isinstance(uid, int)
        chain = [] if uid in views else _chain(uid, made)
        if not chain:
            continue
        dims = piece.tensor(uid).dim
        for n in chain:
            if taken.get(id(n), role) != role:
                return Support.no(
                    f"{n.label()} feeds both {taken[id(n)]} and {role} of {node.label()}; the {template} "
                    "template computes each operand's prologue on its own tile",
                    n,
                )
            taken[id(n)] = role
            why = _tile_node(piece, n, dims, f"the {role} prologue")
            if why is not None:
                return why
        prologue.append((role, tuple(n for n in piece.nodes if id(n) in {id(c) for c in chain})))
    for role in node.op.input_roles():
        v = node.input(role)
        if role not in ROLES and isinstance(v, int) and v in made:
            return Support.no(
                f"input '{role}' of {node.label()} is computed in the piece; the {template} template "
                "fuses prologues on q, k and v only",
                made[v],
            )
    stats = node.output("stats")
    o_uid = node.output("o")
    assert o_uid is not None
    o_dims = piece.tensor(o_uid).dim
    epilogue = []
    for n in piece.nodes:
        if n is node or id(n) in taken or id(n) in viewing:
            continue
        if stats is not None and stats in n.input_uids():
            return Support.no(
                f"{n.label()} reads the Stats of {node.label()}; the {template} template fuses no epilogue on Stats", n
            )
        if piece.nodes.index(n) < piece.nodes.index(node):
            return Support.no(
                f"{n.label()} feeds none of q, k, v of {node.label()}: not a prologue the {template} template fuses", n
            )
        if any(id(made[u]) in taken for u in n.input_uids() if u in made):
            return Support.no(
                f"{n.label()} reads a prologue value of {node.label()}; the {template} template "
                "computes prologues only on their operand's tiles",
                n,
            )
        why = _tile_node(piece, n, o_dims, "the O epilogue")
        if why is not None:
            return why
        epilogue.append(n)
    return Fusion(node, tuple(prologue), tuple(epilogue), tuple(views.items()))


def _tile_node(piece: Piece, n: Node, dims: tuple[int, ...], where: str) -> Support | None:
    """Why pointwise node `n` cannot be computed on tiles of a tensor of `dims`, or None."""
    for u in (*n.input_uids(), *n.output_uids()):
        t = piece.tensor(u)
        if not _broadcasts(t, dims):
            return Support.no(
                f"{n.label()} in {where}: {t.label()} dims {list(t.dim)} do not broadcast to {list(dims)}", n
            )
    for u in n.output_uids():
        t = piece.tensor(u)
        if u in piece.outputs and t.dim != dims:
            return Support.no(
                f"{n.label()} in {where} writes {t.label()} of dims {list(t.dim)}, smaller than the "
                f"tile space {list(dims)}; it makes its own piece",
                n,
            )
        if u in piece.outputs and where != "the O epilogue":
            return Support.no(
                f"{n.label()} in {where}: {t.label()} is needed outside the piece, but a prologue is "
                "computed per tile, not stored",
                n,
            )
    return None


# -- operands --------------------------------------------------------------------------------------------


def operand(piece: Piece, uid: int, views: tuple[tuple[int, View], ...] = ()) -> Operand:
    """The Operand of tensor `uid` (parameter p{uid}; stride 0 along axes of length 1); of the tensor
    in memory it views, at the view's offset and strides, where `views` has it."""
    view = dict(views).get(uid)
    t = piece.tensor(uid) if view is None else view.desc
    strides = tuple(0 if d == 1 else s for d, s in zip(t.dim, t.stride))
    if view is None:
        return Operand(f"p{uid}", TL_DTYPE[t.data_type], strides)
    return Operand(f"p{view.base}", TL_DTYPE[t.data_type], strides, view.offset)


@overload
def scalar_value(piece: Piece, v: int | Const, kind: Literal["int"]) -> int | Scalar: ...
@overload
def scalar_value(piece: Piece, v: int | Const | None, kind: Literal["float"] = "float") -> float | Scalar | None: ...
def scalar_value(piece: Piece, v: int | Const | None, kind: str = "float") -> float | int | Scalar | None:
    """A scalar input: a number (Const), Scalar("arg") for a pass-by-value tensor, Scalar("ptr") for a
    1-element device tensor."""
    if v is None:
        return None
    if isinstance(v, Const):
        return float(v.value) if kind == "float" else int(v.value)
    t = piece.tensor(v)
    if t.is_pass_by_value:
        return Scalar("arg", f"s{v}")
    return Scalar("ptr", f"p{v}", TL_DTYPE[t.data_type])


def support_of(piece: Piece, f: Fusion, template: str) -> Support:
    """The memory-layout, type and size rules of the generated kernels."""
    node = f.node
    label = node.label()
    if extra := extensions(node, RUNS[node.kind]):  # (issue 41: the torch engine runs these)
        return Support.no(f"{label}: {'; '.join(extra)}: not in the {template} template yet", node)
    packed = [r for r in ("q", "k", "v", "o") if node.input(ragged_role(r)) is not None]
    packed += [r for r in ("k", "v") if node.kind == "sdpa" and node.input(f"paged_attention_{r}_table") is not None]
    if node.kind == "sdpa" and any(node.input(f"paged_attention_{r}_table_ragged_offset") is not None for r in "kv"):
        return Support.no(f"{label}: a packed (ragged) page table: not in the {template} template yet", node)
    if hooked := [r for r, _ in f.prologue if r in packed] + (["o"] if f.epilogue and "o" in packed else []):
        return Support.no(
            f"{label}: the {template} template fuses no prologue or epilogue on a packed (ragged) or paged "
            f"tensor ({', '.join(hooked)}); they make their own pieces",
            node,
        )
    q = piece.tensor(node.input("q"))  # type: ignore[arg-type]
    k = piece.tensor(node.input("k"))  # type: ignore[arg-type]
    v = piece.tensor(node.input("v"))  # type: ignore[arg-type]
    if q.data_type not in (DataType.HALF, DataType.BFLOAT16, DataType.FLOAT):
        return Support.no(
            f"{label}: the {template} template multiplies HALF, BFLOAT16 or FLOAT q/k/v, not "
            f"{q.data_type.name}; the torch or reference engine runs it",
            node,
        )
    if max(q.dim[3], v.dim[3]) > MAX_HEAD_DIM:
        return Support.no(
            f"{label}: head dims {q.dim[3]}/{v.dim[3]} exceed the {MAX_HEAD_DIM} a program holds in "
            "registers; the torch or cudnn engine runs it",
            node,
        )
    if min(q.dim) == 0 or k.dim[2] == 0:
        return Support.no(f"{label}: empty tensors (dims {list(q.dim)}, {list(k.dim)})", node)
    prologued = {r for r, _ in f.prologue}
    memory = [r for r in ROLES if r not in prologued]
    roles = {"sdpa": ("o",), "sdpa_backward": ("o", "dO")}[node.kind]
    views = dict(f.views)
    for role in memory + list(roles):
        uid = node.input(role) if role in node.op.input_roles() else node.output(role)
        view = views.get(uid) if isinstance(uid, int) else None
        if view is not None and view.desc.stride[3] != 1:
            return Support.no(
                f"{label}: '{role}' is a view with strides {list(view.desc.stride)}; the {template} "
                "template reads attention tensors with a unit last stride",
                node,
            )
        if isinstance(uid, int) and piece.tensor(uid).stride[3] != 1 and uid in (*piece.inputs, *piece.outputs):
            t = piece.tensor(uid)
            return Support.no(
                f"{label}: {t.label()} has strides {list(t.stride)}; the {template} template reads and "
                "writes attention tensors with a unit last stride (BSHD or BHSD)",
                node,
            )
    if node.kind == "sdpa_backward":
        for role in ("dQ", "dK", "dV"):
            g = node.output(role)
            t = views[g].desc if g in views else piece.tensor(g)  # type: ignore[arg-type]
            if t.stride[3] != 1:
                return Support.no(
                    f"{label}: {t.label()} has strides {list(t.stride)}; the gradients are written with "
                    "a unit last stride",
                    node,
                )
        if k.dim[1] != v.dim[1]:
            return Support.no(
                f"{label}: {k.dim[1]} key heads but {v.dim[1]} value heads; the generated backward sums "
                "dK and dV over one GQA grouping",
                node,
            )
        db = node.output("dBias")
        if (
            db is not None
            and 4 * q.dim[0] * q.dim[1] * q.dim[2] * k.dim[2] > 2**31
            and piece.tensor(db).dim != (q.dim[0], q.dim[1], q.dim[2], k.dim[2])
        ):
            return Support.no(
                f"{label}: a broadcast dBias is summed from fp32 partials of every score, more than "
                "2 GiB here; the torch engine runs it",
                node,
            )
    for role in ("dropout_seed", "dropout_offset"):
        s = node.input(role)
        if isinstance(s, int) and piece.tensor(s).is_pass_by_value:
            return Support.no(
                f"{label}: '{role}' is a pass-by-value scalar, which kernels receive as fp32; give "
                "a 1-element INT64 device tensor or a number",
                node,
            )
    op = node.op_as(_Attention)
    mod = op.score_mod
    if mod is not None:
        for sm in (mod, getattr(op, "score_mod_grad", None)):
            for n in sm.nodes if sm is not None else ():
                if n.mode is not PointwiseMode.GEN_INDEX:
                    try:
                        _mode_expr(n.mode, ["a", "b", "c"], {p: "0.0" for p, _ in MODES[n.mode].params})
                    except NotImplementedError:
                        return Support.no(f"{label}: score_mod op {n.mode.value} has no Triton form", node)
    return Support.yes()


# -- hooks -----------------------------------------------------------------------------------------------


class TileIndexer:
    """Loads and stores of tensors broadcast to a tile whose elements have coordinates `at`."""

    def __init__(self, at: Coords) -> None:
        self.at = at

    def offset(self, desc: TensorDesc) -> str:
        terms = []
        for a in range(4):
            if desc.dim[a] > 1 and desc.stride[a]:
                c = self.at.axis(a)
                if a < 2:
                    c = f"{c}.to(tl.int64)"
                terms.append(f"{c} * {desc.stride[a]}")
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

    def __init__(self, piece: Piece, nodes: tuple[Node, ...], target: int, prefix: str, *, epilogue: bool) -> None:
        self.piece, self.nodes, self.target, self.prefix, self.epilogue = piece, nodes, target, prefix, epilogue
        made = {u for n in nodes for u in n.output_uids()}
        ext = [u for n in nodes for u in n.input_uids() if u not in made and u != target]
        self._params = tuple(dict.fromkeys(_param(piece, u) for u in ext))
        if epilogue:
            self._params += tuple(f"p{u}" for n in nodes for u in n.output_uids() if u in piece.outputs)
        # a value that depends on no tile-shaped tensor is broadcast to the tile explicitly
        self.scalar_only = (
            not epilogue
            and not any(piece.tensor(u).dim[2] > 1 or piece.tensor(u).dim[3] > 1 for u in ext)
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
            TileIndexer(at),
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

    def __init__(self, piece: Piece, node: Node) -> None:
        self.piece = piece
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
            lines.append(f"{name} = {TileIndexer(at).load(desc, f'p{u}')}.to(tl.float32)")
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


# -- the spec ----------------------------------------------------------------------------------------


def build_spec(piece: Piece, f: Fusion, *, interpret: bool, fp32_precision: str = "ieee") -> AttnSpec:
    """The AttnSpec of an analysed, supported piece."""
    node = f.node
    op = node.op_as(_Attention)  # Sdpa or SdpaBackward
    uid: dict[str, Any] = {r: node.input(r) for r in op.input_roles()}
    q_uid, k_uid, v_uid = uid["q"], uid["k"], uid["v"]
    q, k, v = (piece.tensor(u) for u in (q_uid, k_uid, v_uid))
    B, Hq, Sq, D = q.dim
    Hk, Skv = k.dim[1], k.dim[2]
    Hv, Dv = v.dim[1], v.dim[3]
    ragged = []
    outputs = {"o": node.output("o"), "stats": node.output("stats")} if node.kind == "sdpa" else {}
    for role in ("q", "k", "v", "o", "stats"):
        off = uid.get(ragged_role(role))
        if isinstance(off, int):
            t = uid[role] if role in uid else outputs.get(role)
            if t is None:
                continue
            ragged.append((role, Ragged(operand(piece, off), op.offset_divisor(role), piece.tensor(t).dim[2])))
    if "q" in dict(ragged):  # packed: the problem's dims are the lengths' batch and the maxima
        B, Sq = piece.tensor(uid["seq_len_q"]).dim[0], expect(op.max_seq_len_q, "max_seq_len_q of packed q")
    if "k" in dict(ragged):
        Skv = expect(op.max_seq_len_kv, "max_seq_len_kv of packed k")
    paged = []
    for role in ("k", "v") if node.kind == "sdpa" else ():
        table = uid.get(f"paged_attention_{role}_table")
        if isinstance(table, int):
            c, t = piece.tensor(uid[role]), piece.tensor(table)
            paged.append((role, Paged(operand(piece, table), c.dim[0], c.dim[2], t.dim[2])))
            if role == "k":
                Skv = op.max_seq_len_kv if op.max_seq_len_kv is not None else t.dim[2] * c.dim[2]
    causal = (
        Causal.BOTTOM_RIGHT
        if op.use_causal_mask_bottom_right
        else (Causal.TOP_LEFT if op.use_causal_mask else Causal.NONE)
    )
    kw: dict = {}
    scale = scalar_value(piece, uid.get("attn_scale"))
    kw["scale"] = 1.0 if scale is None else scale
    if op.use_padding_mask:
        kw["seq_len_q"] = operand(piece, uid["seq_len_q"])
        kw["seq_len_kv"] = operand(piece, uid["seq_len_kv"])
    if isinstance(uid.get("bias"), int):
        kw["bias"] = operand(piece, uid["bias"])
        kw["bias_dims"] = piece.tensor(uid["bias"]).dim
    if op.dropout_probability is not None:
        # the op's checks make the seed and offset (with a probability) and the scale (with a mask) present
        kw["dropout"] = PhiloxDropout(
            op.dropout_probability,
            scalar_value(piece, expect(uid["dropout_seed"], "the dropout seed"), "int"),
            scalar_value(piece, expect(uid["dropout_offset"], "the dropout offset"), "int"),
        )
    elif isinstance(uid.get("dropout_mask"), int):
        mask_scale = scalar_value(piece, uid["dropout_scale"])
        if mask_scale is None:  # (expect() cannot narrow a union: mypy joins its members to object)
            raise InternalError(
                "the dropout mask's scale is missing",
                op=node.label(),
                rule="internal.invariant",
                hint="this is an opgraph bug: please report it",
            )
        kw["dropout"] = MaskDropout(operand(piece, uid["dropout_mask"]), mask_scale)
    if op.score_mod is not None:
        kw["score_mod"] = ScoreModCode(piece, node)
    ops: dict[str, Any] = {r: operand(piece, u, f.views) for r, u in (("q", q_uid), ("k", k_uid), ("v", v_uid))}
    if node.kind == "sdpa":
        o_uid, st_uid = node.output("o"), node.output("stats")
        assert o_uid is not None
        kw["o"] = operand(piece, o_uid) if o_uid in piece.outputs else None
        kw["stats"] = operand(piece, st_uid) if st_uid is not None and st_uid in piece.outputs else None
        hooks = []
        for role, nodes in f.prologue:
            hooks.append((role, NodesHook(piece, nodes, uid[role], f"v{role}", epilogue=False)))
        kw["prologue"] = tuple(hooks)
        if f.epilogue:
            kw["epilogue"] = NodesHook(piece, f.epilogue, o_uid, "ve", epilogue=True)
    else:
        grads = {
            r.lower(): operand(piece, expect(node.output(r), f"{r} of {node.label()}"), f.views)
            for r in ("dQ", "dK", "dV")
        }
        kw.update(
            o=operand(piece, uid["o"], f.views),
            stats=operand(piece, uid["stats"]),
            do=operand(piece, uid["dO"], f.views),
            **grads,
        )
        db = node.output("dBias")
        if db is not None:
            kw["dbias"] = operand(piece, db)
    return AttnSpec(
        B,
        Hq,
        Hk,
        Hv,
        Sq,
        Skv,
        D,
        Dv,
        **ops,
        causal=causal,
        window=op.sliding_window_length,
        right=None if causal is not Causal.NONE else op.diagonal_band_right_bound,
        bottom_right=causal is Causal.NONE and op.bottom_right,
        ragged=tuple(ragged),
        paged=tuple(paged),
        alibi=op.use_alibi_mask,
        interpret=interpret,
        fp32_precision=fp32_precision,
        **kw,
    )


def flops(spec: AttnSpec) -> float:
    """Multiply-add work of the forward (both products) over the keys a row sees: half of them under
    a right bound alone (causal), the band's width under a left bound."""
    keys = float(spec.Skv)
    if spec.window is not None:
        keys = min(keys, spec.window + (spec.right_bound if spec.right_bound is not None else keys))
    elif spec.right_bound is not None:
        keys *= 0.5
    return 2.0 * spec.B * spec.Hq * spec.Sq * keys * (spec.D + spec.Dv)


__all__ = [
    "Fusion",
    "NodesHook",
    "ScoreModCode",
    "TileIndexer",
    "analyze",
    "build_spec",
    "flops",
    "operand",
    "support_of",
]
