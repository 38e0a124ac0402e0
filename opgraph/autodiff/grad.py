"""Gradient graphs: `grad(graph, outputs, wrt)` builds the backward graph of a forward graph.

The algorithm (reverse mode, on the finalized forward graph):

1. A forward tensor *requires grad* when it is one of `wrt`, or a floating output of an op one of
   whose differentiable inputs requires grad (a comparison's BOOLEAN output, or any output of an op
   whose rule declares no differentiable input, stops the flow).
2. Each tensor of `outputs` gets its incoming gradient, a new input of the backward graph named
   ``grad_<name>`` (same dims, strides and type as the output).
3. Ops are visited in reverse topological order. An op with incoming gradients and an input that
   requires grad runs its backward rule (rules*.py); each gradient it returns is reduced to the
   input's dims (gradients of broadcast operands are summed) and added to the input's
   contributions. A tensor read several times sums its contributions (pointwise ADD).
4. Each `wrt` tensor's summed gradient becomes an output of the backward graph named
   ``grad_<name>``, with the dims, strides and type of the forward tensor.

Forward tensors the rules read are *saved* or *recomputed* (split mode, the default):

- a forward input or a non-virtual forward output is saved: it is an input of the backward graph
  with the same UID, name, dims, strides and type, so the forward pack's buffer binds to it as is;
- a virtual tensor produced by a heavy op (conv, matmul, normalization, reduction, pooling, custom)
  is saved; the forward graph must then output it: `GradGraph.must_keep` lists these UIDs and
  `GradGraph.keep_in(forward_graph)` marks them (set_output) in the user's forward graph;
- a virtual tensor produced by a cheap op (pointwise, reshape, transpose, slice, concatenate) is
  recomputed in the backward graph from the chain of cheap ops that makes it, back to tensors that
  are kept anyway, when the tensors this forces to be kept take fewer bytes than the tensor
  itself (always when they are forward inputs, outputs or already saved: conv -> relu -> conv
  keeps the first conv's output, which relu's backward reads, and recomputes the relu). Otherwise
  it is saved. Decisions are taken in forward order once all rules ran, so a tensor saved for one
  rule is free for the next. `recompute=False` saves every tensor read;
- a training batchnorm's y (when the op outputs mean and inv_variance) counts as cheap too: it is
  recomputed as (x - mean) * inv_variance * scale + bias, pointwise ops that fuse into the kernel of
  the batchnorm backward that reads them, so conv -> batchnorm -> relu keeps only the conv output
  and the per-channel stats (the stats are read as stored, FLOAT by default, where the forward
  normalised with its unrounded ones).

Batchnorm, layernorm, rmsnorm and instancenorm backward read the saved mean / inv_variance when the
forward op outputs them (small), else recompute them from the input and epsilon.

`combined=True` builds one graph with the forward ops (same UIDs, names and outputs) followed by
the backward ops, which read forward tensors directly: the training-step graph. Nothing is saved or
recomputed there; `saved` lists the forward tensors the backward part reads (virtual ones stay
virtual: the partitioner materialises them where they cross pieces).

New tensors get UIDs above every forward UID, so forward and backward buffers can share one pack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import DataTypeError, GraphError, UnsupportedGraphError, expect
from ..core.ir import Const, FinalGraph, Node, Operand
from ..core.symbolic import bounds
from ..core.tensor import Tensor, TensorDesc
from ..graph.builder import Graph
from ..ops.pointwise import Pointwise, PointwiseMode
from .rules import GradBuilder, RuleContext, Value, call_rule, rule_for, unsupported
from .splits import joined

CHEAP_KINDS = frozenset({"pointwise", "reshape", "transpose", "slice", "concatenate"})
MAX_RECOMPUTE_OPS = 32  # a longer cheap chain is saved rather than recomputed


@dataclass
class GradGraph:
    """The result of `grad`.

    graph        the backward graph (or forward + backward with combined=True)
    grad_inputs  forward output UID -> the incoming-gradient input tensor ``grad_<name>``
    grads        wrt UID -> the gradient output tensor ``grad_<name>``
    saved        forward UID -> its handle in `graph`: in split mode an input of the backward graph
                 with the forward tensor's UID (bind the forward buffer); in combined mode the
                 forward tensor the backward part reads
    recomputed   forward UIDs recomputed in the backward graph (split mode)
    must_keep    saved forward tensors that are virtual in the forward graph: the forward plan must
                 output them (`keep_in`)
    """

    graph: Graph
    forward: FinalGraph
    grad_inputs: dict[int, Tensor]
    grads: dict[int, Tensor]
    saved: dict[int, Tensor]
    recomputed: tuple[int, ...] = ()
    combined: bool = False
    must_keep: tuple[int, ...] = field(default=())

    def __repr__(self) -> str:
        """A summary (the dataclass default printed the forward graph and every handle: thousands of
        characters); `print(gg.graph)` shows the ops."""

        def names(uids: Any, limit: int = 6) -> str:
            labels = [f"'{self.forward.tensors[u].name}'" for u in list(uids)[:limit]]
            more = len(list(uids)) - limit
            return ", ".join(labels) + (f" and {more} more" if more > 0 else "")

        ops = len(self.graph._records)
        mode = "forward + backward" if self.combined else "backward"
        text = (
            f"<GradGraph '{self.graph.name}' ({mode}, {ops} ops): gradients of {names(self.grads)}; "
            f"incoming gradients for {names(self.grad_inputs)}; {len(self.saved)} saved forward tensor(s)"
        )
        if self.recomputed:
            text += f", {len(self.recomputed)} recomputed"
        if self.must_keep:
            text += f"; the forward plan must output {names(self.must_keep)} (keep_in)"
        return text + ">"

    def grad_of(self, key: Any) -> Tensor:
        """The gradient output of a wrt tensor (handle, UID or name of the forward tensor)."""
        uid = resolve(self.forward, key, "key")
        if uid not in self.grads:
            raise GraphError(
                f"no gradient was asked for {self.forward.tensors[uid].label()}",
                rule="autodiff.key",
                hint=f"pass it in wrt; gradients exist for UIDs {sorted(self.grads)}",
            )
        return self.grads[uid]

    def grad_input_of(self, key: Any) -> Tensor:
        """The incoming-gradient input of a forward output (handle, UID or name)."""
        uid = resolve(self.forward, key, "key")
        if uid not in self.grad_inputs:
            raise GraphError(
                f"{self.forward.tensors[uid].label()} is not one of the outputs",
                rule="autodiff.key",
                hint=f"incoming gradients exist for UIDs {sorted(self.grad_inputs)}",
            )
        return self.grad_inputs[uid]

    def keep_in(self, forward: Graph) -> Graph:
        """Mark the `must_keep` tensors as outputs of the user's forward graph (and pin every UID the
        forward graph was finalized with, so the saved UIDs stay valid). Returns `forward`."""
        if any(handle.graph is not forward for handle, _ in self.forward.handles.values()):
            raise GraphError(
                "keep_in got another graph than the one differentiated",
                rule="autodiff.keep_in",
                hint="pass the forward Graph given to grad()",
            )
        for handle, uid in list(self.forward.handles.values()):
            if handle._uid is None:
                handle.set_uid(uid)
        keep = set(self.must_keep)
        for handle, uid in list(self.forward.handles.values()):
            if uid in keep and handle.is_virtual:
                d = self.forward.tensors[uid]  # as saved: a virtual tensor's type is the intermediate one
                handle.set_output(True).set_data_type(d.data_type).set_stride(d.stride)
        return forward

    def describe(self) -> str:
        f = self.forward
        lines = [f"gradient graph '{self.graph.name}' ({'forward + backward' if self.combined else 'backward'})"]
        lines += [
            f"  incoming gradient {t.name} (uid {t.uid}) of {f.tensors[u].label()}" for u, t in self.grad_inputs.items()
        ]
        lines += [f"  gradient {t.name} (uid {t.uid}) of {f.tensors[u].label()}" for u, t in self.grads.items()]
        lines += [
            f"  saved {f.tensors[u].label()}" + (" (forward must output it)" if u in self.must_keep else "")
            for u in self.saved
        ]
        lines += [f"  recomputed {f.tensors[u].label()}" for u in self.recomputed]
        return "\n".join(lines)


def resolve(fg: FinalGraph, key: Any, what: str) -> int:
    """The UID of a forward tensor given as a handle, descriptor, UID or name."""
    if isinstance(key, Tensor):
        uid = fg.handle_uid(key)
        if uid is None:
            raise GraphError(
                "the tensor handle is not part of the differentiated graph",
                tensor=key,
                rule="autodiff.unknown_tensor",
                hint=f"pass {what} as handles of that graph, UIDs or names",
            )
        return uid
    if isinstance(key, TensorDesc):
        key = key.uid
    if isinstance(key, int) and not isinstance(key, bool):
        if key not in fg.tensors:
            raise GraphError(
                f"UID {key} is not a tensor of graph '{fg.name}'",
                rule="autodiff.unknown_tensor",
                hint=f"known UIDs: {sorted(fg.tensors)}",
            )
        return key
    if isinstance(key, str):
        matches = [u for u, t in fg.tensors.items() if t.name == key]
        if len(matches) != 1:
            raise GraphError(
                f"{len(matches)} tensors are named {key!r}",
                rule="autodiff.unknown_tensor",
                hint="pass the tensor handle or its UID",
            )
        return matches[0]
    raise GraphError(
        f"{what} must hold tensors, UIDs or names, got {type(key).__name__}",
        rule="autodiff.key",
        hint="pass the Tensor handles the builders returned",
    )


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def grad(
    graph: Graph | FinalGraph,
    outputs: Any,
    wrt: Any,
    *,
    combined: bool = False,
    recompute: bool = True,
    allow_unused: bool = False,
    intermediate_data_type: Any = None,
    forward_types: bool = False,
    name: str | None = None,
) -> GradGraph:
    """The gradient graph of `graph`: the gradients of `wrt` given incoming gradients of `outputs`.

    outputs, wrt: a tensor or a list of tensors (handles, UIDs or names of the forward graph).
    combined: one graph holding the forward ops and then the backward ops (a training step).
    recompute: recompute cheap virtual tensors rather than saving them (split mode; see the module).
    allow_unused: a wrt tensor with no (nonzero) path to the outputs gets zeros instead of an error.
    intermediate_data_type: the type of the backward graph's virtual tensors (the gradients between
        ops); the forward graph's intermediate type by default. HALF halves the memory traffic of
        the gradients that cross kernels, at fp16 precision.
    forward_types: each gradient takes the type of the forward tensor it is the gradient of, as in
        PyTorch's autograd: a bf16 activation's gradient is bf16 (mixed precision), an fp32 one's
        fp32 (a gradient a rule makes, or a sum of gradients, is typed so; one passed through
        unchanged, an add's, is cast); other backward intermediates keep intermediate_data_type.
    """
    fg = graph.final if isinstance(graph, Graph) else graph
    if not isinstance(fg, FinalGraph):
        raise GraphError(
            f"grad takes a Graph or FinalGraph, got {type(graph).__name__}",
            rule="autodiff.graph",
            hint="pass the forward opgraph.Graph",
        )
    return _Pass(
        fg,
        _as_list(outputs),
        _as_list(wrt),
        combined=combined,
        recompute=recompute,
        allow_unused=allow_unused,
        intermediate=intermediate_data_type,
        forward_types=forward_types,
        name=name,
    ).run()


class _Ctx(RuleContext):
    def __init__(self, p: _Pass, node: Node, needed: Sequence[str]) -> None:
        self.p = p
        self.node = node
        self.graph = p.fg
        self.b = p.b
        self._needed = frozenset(needed)

    def needs(self, role: str) -> bool:
        return role in self._needed

    def input(self, role: str) -> Value | None:
        v = self.node.input(role)
        if v is None:
            return None
        if isinstance(v, Const):
            return v.value
        return self.p.fwd(v)

    def output(self, role: str) -> Tensor:
        uid = self.node.output(role)
        assert uid is not None, f"{self.node.label()} has no output {role}"
        return self.p.fwd(uid)

    def grad(self, role: str) -> Tensor | None:
        uid = self.node.output(role)
        if uid is None or not self.p.contrib.get(uid):
            return None
        return self.p.total(uid)

    def grad_full(self, role: str) -> Tensor:
        uid = self.node.output(role)
        assert uid is not None
        return self.p.total_full(uid)


class _Pass:
    def __init__(
        self,
        fg: FinalGraph,
        outputs: list[Any],
        wrt: list[Any],
        *,
        combined: bool,
        recompute: bool,
        allow_unused: bool,
        intermediate: Any,
        name: str | None,
        forward_types: bool = False,
    ) -> None:
        self.fg = fg
        self.outputs = list(dict.fromkeys(resolve(fg, k, "outputs") for k in outputs))
        self.wrt = list(dict.fromkeys(resolve(fg, k, "wrt") for k in wrt))
        if not self.outputs or not self.wrt:
            raise GraphError(
                "grad needs at least one output and one wrt tensor",
                rule="autodiff.empty",
                hint="pass outputs=[loss] and wrt=[weights, ...]",
            )
        for uid in self.wrt:
            d = fg.tensors[uid]
            if not d.data_type.is_floating:
                raise DataTypeError(
                    f"the gradient of a {d.data_type.name} tensor is not defined",
                    tensor=d,
                    rule="autodiff.wrt_type",
                    hint="differentiate with respect to floating tensors",
                )
        self.combined = combined
        self.recompute = recompute
        self.allow_unused = allow_unused
        self.forward_types = forward_types
        suffix = "train_step" if combined else "grad"
        self.g = Graph(
            name or f"{fg.name or 'graph'}_{suffix}",
            io_data_type=fg.io_data_type,
            intermediate_data_type=intermediate or fg.intermediate_data_type,
            compute_data_type=fg.compute_data_type,
        )
        self.b = GradBuilder(self.g)
        self.b.next_uid = max(fg.tensors, default=0) + 1
        self.handles: dict[int, Tensor] = {}  # forward UID -> handle in self.g
        self.requested: dict[int, None] = {}  # forward UIDs the backward reads (ordered set)
        self.contrib: dict[int, list[Tensor]] = {}
        self.requires: set[int] = set()

    # -- the pass -----------------------------------------------------------------------------------
    def run(self) -> GradGraph:
        if self.combined:
            self._copy_forward()
        self.requires = self._requires_grad()
        grad_inputs: dict[int, Tensor] = {}
        for uid in self.outputs:
            if uid not in self.requires:  # no wrt tensor reaches it: no gradient to take in
                continue
            d = self.fg.tensors[uid]
            t = self.g.tensor(
                dim=d.dim, stride=d.stride, data_type=d.data_type, name=f"grad_{_name(d)}", uid=self.b.new_uid()
            )
            grad_inputs[uid] = self.b.note(t)
            self.contrib.setdefault(uid, []).append(t)
        for node in reversed(self.fg.nodes):
            self._backward(node)
        self.b.prefix = "grad"
        grads = {uid: self._grad_output(uid) for uid in self.wrt}
        recomputed: tuple[int, ...] = ()
        if not self.combined:
            recomputed = self._resolve_saved()
        saved = {u: self.handles[u] for u in self.requested if u not in recomputed}
        must_keep = () if self.combined else tuple(u for u in saved if self.fg.tensors[u].is_virtual)
        return GradGraph(self.g, self.fg, grad_inputs, grads, saved, recomputed, self.combined, must_keep)

    def _requires_grad(self) -> set[int]:
        req = set(self.wrt)
        for node in self.fg.nodes:
            rule = rule_for(node)
            diff = rule.inputs(node) if rule is not None else frozenset(node.op.input_roles())
            if any(
                isinstance(v, int) and v in req and role in diff for role, v in zip(node.op.input_roles(), node.inputs)
            ):
                req.update(u for u in node.output_uids() if self.fg.tensors[u].data_type.is_floating)
        return req

    def _backward(self, node: Node) -> None:
        arriving = [
            (role, uid)
            for role, uid in zip(node.op.output_roles(), node.outputs)
            if uid is not None and self.contrib.get(uid)
        ]
        if not arriving:
            return
        rule = rule_for(node)
        diff = rule.inputs(node) if rule is not None else frozenset(node.op.input_roles())
        needed = [
            role
            for role, v in zip(node.op.input_roles(), node.inputs)
            if isinstance(v, int) and v in self.requires and role in diff
        ]
        if not needed:
            return
        if rule is None:
            what = f"pointwise mode {node.op.mode.name}" if isinstance(node.op, Pointwise) else node.kind
            raise unsupported(
                node,
                f"no backward rule for {what}, but a gradient flows through it (into {', '.join(needed)})",
                "differentiate a graph without this op, or add a rule (opgraph.autodiff."
                "register_rule / register_custom_grad)",
            )
        outs = rule.outputs(node)
        bad = [role for role, _ in arriving if role not in outs]
        if bad:
            raise unsupported(
                node,
                f"a gradient arrives at output '{bad[0]}', through which {node.kind} is not differentiated",
                "do not use that output on the path to the differentiated outputs",
                rule="autodiff.output",
            )
        self.b.prefix = f"d{node.name}"
        first_new = len(self.g._tensors)
        result = call_rule(rule, _Ctx(self, node, needed))
        over = self.fg.tensors[arriving[0][1]].dim if rule.broadcasts else None
        for role in needed:
            g = result.get(role)
            if g is None:
                raise unsupported(
                    node,
                    f"the backward rule gave no gradient for input '{role}'",
                    "this input is not differentiated by the rule",
                    rule="autodiff.no_input_grad",
                )
            uid = node.input(role)
            assert isinstance(uid, int)
            g = self.b.unbroadcast(g, self.fg.tensors[uid].dim, over)
            if self.forward_types and isinstance(g, Tensor):
                g = self._in_forward_type(g, uid, first_new)
            self.contrib.setdefault(uid, []).append(g)

    def _in_forward_type(self, g: Tensor, uid: int, first_new: int) -> Tensor:
        """Gradient `g` of forward tensor `uid` in that tensor's type: a tensor the rule just made
        takes it; one passed through (an add's) is cast, as PyTorch's autograd casts it."""
        want = self.fg.tensors[uid].data_type
        if g.is_virtual and any(t is g for t in self.g._tensors[first_new:]):
            g.set_data_type(want)
            return g
        if (g._data_type or self.g.intermediate_data_type) is want:
            return g
        cast = self.b.pw(PointwiseMode.IDENTITY, g)
        return cast.set_data_type(want)

    def total(self, uid: int) -> Tensor:
        """The summed gradient of forward tensor `uid` (possibly in broadcast dims)."""
        parts = self.contrib[uid]
        if len(parts) > 1:
            parts[:] = joined(self.g, self.b, parts)
            if len(parts) == 1 and self.forward_types and isinstance(parts[0], Tensor):
                # the concatenate of the slices' gradients writes the forward type, as the sum below
                # does (else the type-less concat counts as the intermediate type, and its reader casts
                # it with an identity op: a copy of the whole gradient where the types are equal)
                parts[0].set_data_type(self.fg.tensors[uid].data_type)
        if len(parts) > 1:
            acc = parts[0]
            for p in parts[1:]:
                acc = self.b.add(acc, p)
                if self.forward_types and isinstance(acc, Tensor):
                    acc.set_data_type(self.fg.tensors[uid].data_type)
            parts[:] = [acc]
        return parts[0]

    def total_full(self, uid: int) -> Tensor:
        t = self.b.expand(self.total(uid), self.fg.tensors[uid].dim, carrier=lambda: self.fwd(uid))
        self.contrib[uid] = [t]
        return t

    def _grad_output(self, uid: int) -> Tensor:
        d = self.fg.tensors[uid]
        if not self.contrib.get(uid):
            if not self.allow_unused:
                raise GraphError(
                    "no gradient reaches this wrt tensor from the outputs (it is not used on a path to them, or "
                    "only through ops with zero gradient such as comparisons)",
                    tensor=d,
                    rule="autodiff.unused",
                    hint="drop it from wrt, or pass allow_unused=True to get zeros",
                )
            full = self.b.expand(0.0, d.dim, carrier=lambda: self.fwd(uid))
        else:
            full = self.total_full(uid)
        out = full if self._claimable(full, d) else self.b.pw(PointwiseMode.IDENTITY, full)
        out.set_output(True).set_name(f"grad_{_name(d)}")
        out.set_data_type(d.data_type).set_stride(d.stride)
        return out

    def _claimable(self, t: Value, d: TensorDesc) -> bool:
        """Can the gradient tensor itself be the output (else an identity copies it)? It must be
        made by a backward op and not be another gradient already; its type may change to the wrt
        tensor's when no other op reads its value (so the op writes the output type directly)."""
        if not (isinstance(t, Tensor) and t.is_virtual and id(t) in self.b.produced):
            return False
        return (t._data_type or self.g.intermediate_data_type) is d.data_type or self.b.value_readers(t) == 0

    # -- forward tensors ------------------------------------------------------------------------------
    def fwd(self, uid: int) -> Tensor:
        """The handle standing for forward tensor `uid` in the backward graph."""
        self.requested.setdefault(uid, None)
        if uid not in self.handles:
            assert not self.combined
            d = self.fg.tensors[uid]
            self.handles[uid] = self.g.tensor(
                dim=d.dim,
                stride=d.stride,
                data_type=d.data_type,
                name=d.name,
                uid=uid,
                is_pass_by_value=d.is_pass_by_value,
            )
        return self.handles[uid]

    def _copy_forward(self) -> None:
        fg, g = self.fg, self.g
        for uid in fg.inputs:
            d = fg.tensors[uid]
            self.handles[uid] = g.tensor(
                dim=d.dim,
                stride=d.stride,
                data_type=d.data_type,
                name=d.name,
                uid=uid,
                is_pass_by_value=d.is_pass_by_value,
                is_by_reference=d.is_by_reference,
            )
        for node in fg.nodes:
            self._replay(node, node.output_uids())

    def _replay(self, node: Node, uids: Iterable[int]) -> list[Tensor]:
        """Add `node` to self.g with outputs `uids` (its other outputs absent) described as in the forward."""
        keep = set(uids)
        kept = [(r, u) for r, u in zip(node.op.output_roles(), node.outputs) if u is not None and u in keep]
        roles = [r for r, _ in kept]
        ins = [None if v is None else v.value if isinstance(v, Const) else self.handles[v] for v in node.inputs]
        outs = self.g._add_op(node.op, ins, name=node.name, compute_data_type=node.compute_data_type, outputs=roles)
        placed = [t for t in outs if t is not None]
        for t, (_, uid) in zip(placed, kept):
            self._place(t, uid)
        return placed

    def _place(self, t: Tensor, uid: int) -> None:
        """Make `t` stand for forward tensor `uid` (same UID, name, dims, strides, type)."""
        d = self.fg.tensors[uid]
        t.set_uid(d.uid).set_name(d.name).set_dim(d.dim).set_stride(d.stride).set_data_type(d.data_type)
        t.set_is_virtual(d.is_virtual if self.combined else True)
        if d.uid in self.handles:  # a placeholder read before the recomputation was decided
            self.handles[d.uid].set_is_virtual(True)
        else:
            self.handles[d.uid] = t

    # -- save or recompute (split mode) ---------------------------------------------------------------
    def _recipe(self, uid: int) -> tuple[tuple[Operand, ...], Callable[[], Tensor]] | None:
        """How to recompute forward tensor `uid` cheaply: (the forward operands it reads, a function
        adding the ops and returning the result), or None. A cheap op is replayed; a batchnorm's y is
        recomputed from its saved stats as (x - mean) * inv_variance * scale + bias, pointwise ops
        that fuse into the kernel of the batchnorm backward reading them."""
        node = self.fg.producer(uid)
        if node is None:
            return None
        if node.kind in CHEAP_KINDS:
            return node.inputs, lambda: self._replay(node, [uid])[0]
        ins = (
            (
                node.input("input"),
                node.output("mean"),
                node.output("inv_variance"),
                node.input("scale"),
                node.input("bias"),
            )
            if node.kind == "batchnorm"
            else ()
        )
        tensors = tuple(v for v in ins if isinstance(v, int))  # (batchnorm's operands are tensors)
        if node.kind == "batchnorm" and uid == node.output("y") and len(tensors) == 5:

            def build() -> Tensor:
                b = self.b
                x, mean, inv, scale, bias = (self.handles[v] for v in tensors)
                y = b.add(b.mul(b.mul(b.sub(x, mean), inv), scale), bias)
                self._place(y, uid)
                return y

            return tensors, build
        return None

    def _resolve_saved(self) -> tuple[int, ...]:
        fg = self.fg

        def free(u: int) -> bool:
            return not fg.tensors[u].is_virtual

        kept = {u for u in self.requested if free(u) or self._recipe(u) is None or not self.recompute}
        chosen: set[int] = set()

        def position(u: int) -> int:
            return expect(fg.producer_index(u), f"the producer of recomputed UID {u}")

        pending = sorted((u for u in self.requested if u not in kept), key=position)
        for uid in pending:
            if uid in chosen:
                continue
            chain, leaves = self._chain(uid, kept, chosen)
            extra = sum(_bytes(fg.tensors[u]) for u in leaves if u not in kept and not free(u))
            if chain is not None and extra < _bytes(fg.tensors[uid]):
                chosen |= chain
                kept |= leaves
            else:
                kept.add(uid)
        order = sorted(chosen, key=position)
        for u in order:
            inputs, build = expect(self._recipe(u), f"the recipe of chosen UID {u}")
            for v in inputs:
                if isinstance(v, int) and v not in chosen:
                    self.fwd(v)
            build()
        return tuple(order)

    def _chain(self, uid: int, kept: set[int], chosen: set[int]) -> tuple[set[int] | None, set[int]]:
        """The tensors to recompute for `uid` (by their recipes), and the tensors they start from."""
        chain: set[int] = set()
        leaves: set[int] = set()
        stack = [uid]
        while stack:
            u = stack.pop()
            if u in chain or u in chosen:
                continue
            recipe = self._recipe(u)
            if u != uid and (u in kept or not self.fg.tensors[u].is_virtual or recipe is None):
                leaves.add(u)
                continue
            assert recipe is not None
            chain.add(u)
            if len(chain) > MAX_RECOMPUTE_OPS:
                return None, leaves
            stack.extend(v for v in recipe[0] if isinstance(v, int))
        return chain, leaves


def _bytes(d: TensorDesc) -> int:
    """A tensor's bytes; at the range's maximum for dynamic dims (what saving it costs at worst)."""
    n = d.nbytes
    return n if isinstance(n, int) else bounds(n)[1]


def _name(d: TensorDesc) -> str:
    return d.name or f"uid{d.uid}"


def saved_pack(result: GradGraph, forward_pack: Mapping[Any, Any]) -> dict[int, Any]:
    """The saved tensors' buffers out of a forward variant pack keyed by UID (a convenience)."""
    missing = [u for u in result.saved if u not in forward_pack]
    if missing and not result.combined:
        labels = ", ".join(result.forward.tensors[u].label() for u in missing)
        raise UnsupportedGraphError(
            f"the forward pack lacks saved tensors {labels}",
            rule="autodiff.saved",
            hint="mark them as forward outputs (GradGraph.keep_in) and run the forward plan",
        )
    return {u: forward_pack[u] for u in result.saved if u in forward_pack}
