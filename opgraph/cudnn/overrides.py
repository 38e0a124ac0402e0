"""Execute-time shape overrides of `cudnn.pygraph.execute` where opgraph can honour them without dynamic
shapes (issue 42): an override that restates a tensor's built shape is accepted; a packed (ragged)
tensor may change its padded sequence length S (its memory is the packed buffer, whatever S): the
graph is replayed with the new S (the packed tensors' rows and the attention ops' max_seq_len) and
built once per set of lengths, cached on the graph. Anything else is refused with a typed error."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.errors import AttributeValueError
from ..core.ir import Const
from ..core.tensor import Tensor
from ..graph.builder import Graph
from ..ops.attention import Sdpa, SdpaBackward
from . import ragged

_MAX_PLANS = 16


def changes(pg: Any, graph: Any, uids: Any, shapes: Any, strides: Any) -> dict[int, tuple[int, ...]]:
    """{UID: new padded dims} of the packed tensors whose S the overrides change ({} when they restate the
    built shapes); raises for an override opgraph cannot honour."""
    out: dict[int, tuple[int, ...]] = {}
    for i, uid in enumerate(uids or []):
        uid = int(uid)
        desc = graph.tensors.get(uid)
        layout = pg._ragged_layouts.get(uid)
        shape = tuple(int(d) for d in shapes[i]) if shapes is not None and i < len(shapes) else None
        stride = tuple(int(s) for s in strides[i]) if strides is not None and i < len(strides) else None
        want = layout.declared_dim if layout is not None else (desc.dim if desc is not None else None)
        if want is not None and (shape is None or shape == tuple(want)):
            if (
                layout is not None
                or stride is None
                or len(stride) != len(desc.dim)
                or all(d <= 1 or a == b for d, a, b in zip(desc.dim, stride, desc.stride))
            ):
                continue
        elif (
            layout is not None
            and shape is not None
            and len(shape) == 4
            and (shape[0], shape[1], shape[3]) == tuple(layout.declared_dim[i] for i in (0, 1, 3))
        ):
            out[uid] = shape
            continue
        raise AttributeValueError(
            f"override of UID {uid} to shape {list(shape or [])} and strides {list(stride or [])}: the plan was built "
            f"for {list(want or [])}",
            rule="cudnn.override_shapes",
            hint="a packed (ragged) tensor may change its sequence length; other shapes need a graph per shape "
            "(execute-time shape overrides are issue 42, dynamic shapes)",
        )
    return out


def respecialize(pg: Any, plan: Any, new: dict[int, tuple[int, ...]]) -> tuple[Any, dict[int, ragged.RaggedLayout]]:
    """(plan, ragged layouts) of `pg` with the packed tensors' padded dims `new` (cached per `new`)."""
    key = tuple(sorted(new.items()))
    hit = pg._override_plans.get(key)
    if hit is not None:
        return hit
    uid_of = pg._handle_uid
    final = pg.final
    g = Graph(pg.name, pg.io_data_type, pg.intermediate_data_type, pg.compute_data_type)
    copies: dict[int, Tensor] = {}
    seq: dict[str, Any] = {}  # attribute -> new S of the attention ops' packed q / kv
    layouts = dict(pg._ragged_layouts)

    def copy(t: Any, produced: bool) -> Any:
        if isinstance(t, Const):
            return t.value
        if not isinstance(t, Tensor):
            return t
        if id(t) in copies:
            return copies[id(t)]
        uid = uid_of[id(t)]
        d = final.tensors[uid]
        dim, stride = (None, None) if d.is_virtual or produced else (d.dim, d.stride)
        if uid in new:
            b, h, s, w = new[uid]
            dim, stride = (
                (1, h, b * s, w),
                (max(h * d.stride[1], b * s * d.stride[2], w * d.stride[3], 1), *d.stride[1:]),
            )
            lay = layouts[uid]
            layouts[uid] = dataclasses.replace(lay, max_rows=s, declared_dim=new[uid])
        elif produced and not d.is_virtual:
            dim, stride = d.dim, d.stride
        c = Tensor(
            g,
            dim=dim,
            stride=stride,
            data_type=d.data_type,
            name=d.name,
            uid=uid,
            is_virtual=d.is_virtual,
            is_pass_by_value=d.is_pass_by_value,
        )
        g._tensors.append(c)
        copies[id(t)] = c
        return c

    for rec in pg._records:
        op = rec.op
        if isinstance(op, (Sdpa, SdpaBackward)):
            ins = dict(zip(op.input_roles(), rec.inputs))
            for role, attr in (("q", "max_seq_len_q"), ("k", "max_seq_len_kv"), ("v", "max_seq_len_kv")):
                t = ins.get(role)
                if isinstance(t, Tensor) and uid_of.get(id(t)) in new:
                    seq[attr] = new[uid_of[id(t)]][2]
            op = dataclasses.replace(op, **{a: s for a, s in seq.items()})
            for role in ("o", "dQ", "dK", "dV", "stats"):  # packed outputs take the rows of their side
                out = dict(zip(op.output_roles(), rec.outputs)).get(role)
                if isinstance(out, Tensor) and uid_of.get(id(out)) in new:
                    copy(out, False)
        inputs = [copy(v, False) for v in rec.inputs]
        outs = [None if t is None else copy(t, True) for t in rec.outputs]
        g._add_op(op, inputs, name=rec.name, compute_data_type=rec.compute_data_type, out_handles=outs)
    built = (g.build(device=plan.device, engines=list(dict.fromkeys(s.config.engine for s in plan.steps))), layouts)
    if len(pg._override_plans) >= _MAX_PLANS:
        pg._override_plans.pop(next(iter(pg._override_plans)))
    pg._override_plans[key] = built
    return built


__all__ = ["changes", "respecialize"]
