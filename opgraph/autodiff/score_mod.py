"""The derivative of an attention score modifier, from the pointwise backward rules.

`derivative(mod)` returns a ScoreMod of the score (SCORE) and the gradient arriving at the modified
score (GRAD) whose value is GRAD * d mod / d SCORE: reverse mode over the modifier's nodes, each
node's gradient built by the same rule `opgraph.grad` uses for that pointwise mode (rules_pointwise.py),
recorded into the sub-graph. The forward nodes the rules read are kept (recomputed in the kernel);
nodes nothing reads are dropped. Every value that depends on the score has the score's full dims, so
no gradient needs reducing. Gradients do not flow into the modifier's extra inputs (tensors of the
graph it reads): they are constants of the attention op.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from ..core.errors import UnsupportedGraphError, expect
from ..ops.pointwise import MODES, Pointwise, PointwiseMode
from ..ops.score_mod import Ref, ScoreMod, ScoreNode, Src
from .rules import POINTWISE_RULES


class _V:
    """A value of the sub-graph under construction (its reference)."""

    __slots__ = ("ref",)

    def __init__(self, ref: Ref) -> None:
        self.ref = ref


Value = Any  # _V or a Python float


class _Builder:
    """The part of GradBuilder's interface the pointwise rules use, recording ScoreNodes."""

    def __init__(self, nodes: list[ScoreNode]) -> None:
        self.nodes = nodes

    def _ref(self, v: Value) -> Ref | None:
        if v is None:
            return None
        if isinstance(v, _V):
            return v.ref
        return Ref(Src.CONST, const=float(v))

    def pw(self, mode: PointwiseMode, *operands: Value, tag: str = "", **params: Value) -> Value:
        info = MODES[mode]
        values = [params.get(p) for p, _ in info.params]
        if not any(isinstance(v, _V) for v in (*operands, *values)):
            with np.errstate(all="ignore"):
                kw = {p: (d if v is None else v) for (p, d), v in zip(info.params, values)}
                return float(np.asarray(info.fn(*(np.float64(o) for o in operands), **kw), dtype=np.float64))
        self.nodes.append(ScoreNode(mode, tuple(self._ref(v) for v in (*operands, *values))))
        return _V(Ref(Src.NODE, len(self.nodes) - 1))

    def add(self, a: Value, b: Value) -> Value:
        if not isinstance(b, _V) and b == 0:
            return a
        if not isinstance(a, _V) and a == 0:
            return b
        return self.pw(PointwiseMode.ADD, a, b)

    def sub(self, a: Value, b: Value) -> Value:
        if not isinstance(b, _V) and b == 0:
            return a
        return self.pw(PointwiseMode.SUB, a, b)

    def mul(self, a: Value, b: Value) -> Value:
        if not isinstance(b, _V) and b == 1:
            return a
        if not isinstance(a, _V) and a == 1:
            return b
        return self.pw(PointwiseMode.MUL, a, b)

    def div(self, a: Value, b: Value) -> Value:
        if not isinstance(b, _V) and b == 1:
            return a
        return self.pw(PointwiseMode.DIV, a, b)

    def neg(self, a: Value) -> Value:
        return self.pw(PointwiseMode.NEG, a)

    def select(self, a: Value, b: Value, mask: Value) -> Value:
        return self.pw(PointwiseMode.BINARY_SELECT, a, b, mask)

    def mask(self, mode: PointwiseMode, a: Value, b: Value) -> Value:
        return self.pw(mode, a, b)

    def sign(self, x: Value) -> Value:
        return self.sub(self.mask(PointwiseMode.CMP_GT, x, 0.0), self.mask(PointwiseMode.CMP_LT, x, 0.0))


class _Ctx:
    """The RuleContext a pointwise rule sees for one node of the modifier."""

    def __init__(self, node: ScoreNode, grad: Value, b: _Builder, depends: set[Ref]) -> None:
        self.node = SimpleNamespace(op=Pointwise(mode=node.mode, axis=node.axis))
        self.b = b
        self._grad = grad
        self._roles = dict(zip(self.node.op.input_roles(), node.operands))
        self._depends = depends

    def input(self, role: str) -> Value:
        r = self._roles.get(role)
        if r is None:
            return None
        return r.const if r.src is Src.CONST else _V(r)

    def grad(self, role: str) -> Value:
        return self._grad

    grad_full = grad

    def needs(self, role: str) -> bool:
        r = self._roles.get(role)
        return r is not None and r in self._depends

    def has_input(self, role: str) -> bool:
        return self._roles.get(role) is not None


def derivative(mod: ScoreMod, op_label: str = "sdpa_backward") -> ScoreMod:
    """GRAD * d mod / d SCORE as a ScoreMod over SCORE, GRAD and mod's extra inputs."""
    depends: set[Ref] = {Ref(Src.SCORE)}
    for i, node in enumerate(mod.nodes):
        if any(r in depends for r in node.operands if r is not None):
            depends.add(Ref(Src.NODE, i))
    if mod.result not in depends:
        return ScoreMod((), Ref(Src.CONST, const=0.0), mod.num_inputs)
    nodes = list(mod.nodes)
    b = _Builder(nodes)
    grads: dict[Ref, Value] = {mod.result: _V(Ref(Src.GRAD))}
    for i in reversed(range(len(mod.nodes))):
        key = Ref(Src.NODE, i)
        g = grads.pop(key, None)
        if g is None or key not in depends:
            continue
        node = mod.nodes[i]
        rule = POINTWISE_RULES.get(node.mode)
        if rule is None:
            raise UnsupportedGraphError(
                f"the score modifier's {node.mode.name} has no backward rule",
                op=op_label,
                rule="sdpa.score_mod_grad",
                hint="use pointwise modes that opgraph.grad differentiates",
            )
        ctx = _Ctx(node, g, b, depends)
        # the rules are duck-typed over this stand-in context (and its SimpleNamespace node)
        flows = rule.inputs(ctx.node)  # type: ignore[arg-type]  # a Node stand-in
        for role, gv in rule.fn(ctx).items():  # type: ignore[arg-type]  # a RuleContext stand-in
            r = ctx._roles.get(role)
            if role not in flows or r is None or r not in depends:
                continue
            grads[r] = b.add(grads[r], gv) if r in grads else gv
    result = expect(b._ref(grads.get(Ref(Src.SCORE), 0.0)), "the derivative's result")  # a gradient or 0.0
    return _prune(nodes, result, mod.num_inputs)


def _prune(nodes: list[ScoreNode], result: Ref, num_inputs: int) -> ScoreMod:
    """Drop the nodes the result does not read and renumber the rest."""
    live: set[int] = set()
    stack = [result]
    while stack:
        r = stack.pop()
        if r.src is Src.NODE and r.index not in live:
            live.add(r.index)
            stack.extend(x for x in nodes[r.index].operands if x is not None)
    order = sorted(live)
    renumber = {old: new for new, old in enumerate(order)}

    def fix(r: Ref | None) -> Ref | None:
        if r is not None and r.src is Src.NODE:
            return Ref(Src.NODE, renumber[r.index])
        return r

    kept = tuple(ScoreNode(nodes[i].mode, tuple(fix(r) for r in nodes[i].operands), nodes[i].axis) for i in order)
    out = fix(result)
    assert out is not None
    return ScoreMod(kept, out, num_inputs)
