"""From a piece to the kernel generator's spec: which pieces the attention templates take (one sdpa
with pointwise prologues on q/k/v and a pointwise epilogue on O; one sdpa_backward alone; either
reading q/k/v (and the backward's o/dO) as slices, transposes and reshapes of tensors in memory, in
place: the heads of a fused qkv projection; the backward writing dQ/dK/dV through transposes and
reshapes, and into their slots of a concatenation: the fused projection's input gradient), the
Operands of its tensors (kernel parameters p{uid} / s{uid}), packed and paged tensors, the band,
and the hooks (hooks.py) that emit the fused pointwise code: prologue and epilogue nodes, and the
recorded score modifier (ops/score_mod.py) with its derivative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, overload

from ....core.config import Support
from ....core.dtypes import DataType
from ....core.errors import InternalError, expect
from ....core.ir import Const, Node
from ....core.piece import Piece
from ....core.tensor import TensorDesc
from ....ops.attention import _Attention
from ....ops.attention_layout import BWD_RAGGED, FWD_RAGGED, Feature, extensions, ragged_role
from ....ops.pointwise import MODES, PointwiseMode
from ...shared.views import ROLES, gradient_targets, operand_views
from ..expr import TL_DTYPE, _mode_expr, elementwise
from ..gemm import VIEW_KINDS, View
from .hooks import NodesHook, ScoreModCode, Text, TileIndexer
from .spec import (
    AttnSpec,
    Causal,
    MaskDropout,
    Operand,
    Paged,
    PhiloxDropout,
    Ragged,
    Scalar,
)

MAX_HEAD_DIM = 256
# what the generated kernels run of the features beyond dense tensors and the causal / window masks
# (EXTRA_OUTPUT: score_max, score_sum_exp, rng_dump and dSink_token)
RUNS = {
    "sdpa": frozenset(
        {
            Feature.PACKED,
            Feature.PAGED,
            Feature.BAND_RIGHT,
            Feature.BAND_BOTTOM_RIGHT,
            Feature.SINK,
            Feature.EXTRA_OUTPUT,
            Feature.EMPTY_ROW_STATS,
            Feature.BLOCK_MASK,
        }
    ),
    "sdpa_backward": frozenset(
        {
            Feature.PACKED,
            Feature.BAND_RIGHT,
            Feature.BAND_BOTTOM_RIGHT,
            Feature.SINK,
            Feature.EXTRA_OUTPUT,
            Feature.BLOCK_MASK,
        }
    ),
}
# the spec's name of each tensor role that may be packed (the op's role -> AttnSpec field)
_SPEC_ROLE = {"dO": "do", "dQ": "dq", "dK": "dk", "dV": "dv"}


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
    views = operand_views(piece, node, template, also=("bias",))  # (a Swin window's relative position bias)
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
        if role not in ROLES and isinstance(v, int) and v in made and v not in views:
            return Support.no(
                f"input '{role}' of {node.label()} is computed in the piece; the {template} template "
                "fuses prologues on q, k and v only",
                made[v],
            )
    stats = node.output("stats")
    row_stats = {u for u in (stats, node.output("score_max"), node.output("score_sum_exp")) if u is not None}
    o_uid = node.output("o")
    assert o_uid is not None
    o_dims = piece.tensor(o_uid).dim
    epilogue = []
    for n in piece.nodes:
        if n is node or id(n) in taken or id(n) in viewing:
            continue
        if row_stats & set(n.input_uids()):
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
    """A scalar input: a number (Const), Scalar("arg") for a pass-by-value tensor (an int64 kernel
    argument for `kind` "int", a float64 one else), Scalar("ptr") for a 1-element device tensor."""
    if v is None:
        return None
    if isinstance(v, Const):
        return float(v.value) if kind == "float" else int(v.value)
    t = piece.tensor(v)
    if t.is_pass_by_value:
        return Scalar("arg", f"s{v}", "tl.int64") if kind == "int" else Scalar("arg", f"s{v}")
    return Scalar("ptr", f"p{v}", TL_DTYPE[t.data_type])


def support_of(piece: Piece, f: Fusion, template: str) -> Support:
    """The memory-layout, type and size rules of the generated kernels."""
    node = f.node
    label = node.label()
    extra = extensions(node, RUNS[node.kind])  # (issue 41: the torch engine runs these)
    if extra:
        return Support.no(f"{label}: {'; '.join(extra)}: not in the {template} template yet", node)
    packed = [r for r in ("q", "k", "v", "o") if node.input(ragged_role(r)) is not None]
    packed += [r for r in ("k", "v") if node.kind == "sdpa" and node.input(f"paged_attention_{r}_table") is not None]
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


# -- the spec ----------------------------------------------------------------------------------------


def build_spec(piece: Piece, f: Fusion, *, interpret: bool, fp32_precision: str = "ieee", text: Text = str) -> AttnSpec:
    """The AttnSpec of an analysed, supported piece (`text`: how the hooks spell a size, hooks.TileIndexer)."""
    node = f.node
    op = node.op_as(_Attention)  # Sdpa or SdpaBackward
    uid: dict[str, Any] = {r: node.input(r) for r in op.input_roles()}
    q_uid, k_uid, v_uid = uid["q"], uid["k"], uid["v"]
    q, k, v = (piece.tensor(u) for u in (q_uid, k_uid, v_uid))
    B, Hq, Sq, D = q.dim
    Hk, Skv = k.dim[1], k.dim[2]
    Hv, Dv = v.dim[1], v.dim[3]
    ragged = []
    outputs = {r: node.output(r) for r in op.output_roles()}
    roles = [(r, r) for r in (FWD_RAGGED if node.kind == "sdpa" else BWD_RAGGED)]
    if node.kind == "sdpa":  # (score_max and score_sum_exp lie as Stats, at its offsets)
        roles += [("score_max", "stats"), ("score_sum_exp", "stats")]
    for role, at in roles:
        off = uid.get(ragged_role(at))
        if isinstance(off, int):
            t = uid[role] if role in uid else outputs.get(role)
            if t is None:
                continue
            r = Ragged(operand(piece, off), op.offset_divisor(at), piece.tensor(t).dim[2])
            ragged.append((_SPEC_ROLE.get(role, role), r))
    if "q" in dict(ragged):  # packed: the problem's dims are the lengths' batch and the maxima
        B, Sq = piece.tensor(uid["seq_len_q"]).dim[0], expect(op.max_seq_len_q, "max_seq_len_q of packed q")
    if "k" in dict(ragged):
        Skv = expect(op.max_seq_len_kv, "max_seq_len_kv of packed k")
    paged = []
    for role in ("k", "v") if node.kind == "sdpa" else ():
        table = uid.get(f"paged_attention_{role}_table")
        if isinstance(table, int):
            c, t = piece.tensor(uid[role]), piece.tensor(table)
            if role == "k":
                Skv = op.max_seq_len_kv if op.max_seq_len_kv is not None else t.dim[2] * c.dim[2]
            toff, rows = uid.get(f"paged_attention_{role}_table_ragged_offset"), None
            slots = t.dim[2]
            if isinstance(toff, int):  # packed: the pages of max_seq_len_kv from each sequence's offset
                rows = Ragged(operand(piece, toff), op.offset_divisor(f"paged_attention_{role}_table"), t.dim[2])
                slots = -(-expect(op.max_seq_len_kv, "max_seq_len_kv of a packed page table") // c.dim[2])
            paged.append((role, Paged(operand(piece, table), c.dim[0], c.dim[2], slots, rows)))
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
        kw["bias"] = operand(piece, uid["bias"], f.views)
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
        kw["score_mod"] = ScoreModCode(piece, node, text)
    if isinstance(uid.get("sink_token"), int):
        kw["sink"] = operand(piece, uid["sink_token"])
    if isinstance(uid.get("block_mask"), int):
        kw["block_mask"] = operand(piece, uid["block_mask"])
    ops: dict[str, Any] = {r: operand(piece, u, f.views) for r, u in (("q", q_uid), ("k", k_uid), ("v", v_uid))}
    if node.kind == "sdpa":
        o_uid, st_uid = node.output("o"), node.output("stats")
        assert o_uid is not None
        kw["o"] = operand(piece, o_uid) if o_uid in piece.outputs else None
        kw["stats"] = operand(piece, st_uid) if st_uid is not None and st_uid in piece.outputs else None
        for role in ("score_max", "score_sum_exp", "rng_dump"):
            u = node.output(role)
            kw[role] = operand(piece, u) if u is not None and u in piece.outputs else None
        kw["empty_stats"] = op.empty_row_stats  # type: ignore[attr-defined]
        hooks = []
        for role, nodes in f.prologue:
            hooks.append((role, NodesHook(piece, nodes, uid[role], f"v{role}", epilogue=False, text=text)))
        kw["prologue"] = tuple(hooks)
        if f.epilogue:
            kw["epilogue"] = NodesHook(piece, f.epilogue, o_uid, "ve", epilogue=True, text=text)
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
        ds = node.output("dSink_token")
        if ds is not None:
            kw["dsink"] = operand(piece, ds)
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
