"""The fallback: an aten node the translation table does not cover becomes a custom op that runs the
aten op itself, so that the import never fails on an op it does not know.

Each such node registers its own custom op (`torch_<op>_<n>`), with the node's non-tensor arguments
baked in:
- reference: the aten op on CPU tensors made from the float64 NumPy inputs (float inputs stay
  float64, integer and bool inputs get their traced dtype back), outputs returned as float64;
- device implementation (`torch=`, used by the torch engine): the aten op on the device tensors
  (integer and bool inputs in their traced dtypes, float inputs in the engine's compute type);
- infer: the traced output shapes and dtypes;
- a backward rule (`opgraph.autodiff.register_custom_grad`): a second custom op, ``<op>_vjp``, that
  recomputes the aten op under torch.autograd and returns the gradients of its floating inputs
  (vector-Jacobian product: float64 on the host for the reference engine, on the device in the
  engine's compute type for the torch engine), so that a module with untranslated ops still trains.
  It recomputes the forward (nothing is saved); a random op (dropout inside it) draws anew there.
Custom ops registered this way exist in this process only: a graph or plan saved to JSON names them
and loads only where the same module was imported first.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np

from ..core.errors import UnsupportedGraphError
from ..ops.custom import Custom, register_custom_op
from .torch_importer import Args, Importer, Value, og_dims

_COUNTER = itertools.count()


class _Slot:
    """Where the i-th tensor input goes in the rebuilt argument list."""

    def __init__(self, index: int) -> None:
        self.index = index


def _template(value: Any, slots: list[Value]) -> Any:
    if isinstance(value, Value):
        slots.append(value)
        return _Slot(len(slots) - 1)
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, slots) for v in value)
    return value


def _fill(value: Any, tensors: list[Any]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    return value


def custom_node(imp: Importer, node: Any, args: Args, reason: str) -> Any:
    """Emit a custom op computing `node`; returns its output tensor (or a list, one per result)."""
    import torch

    from .torch_ops import call_schema

    target = node.target
    meta = node.meta.get("val")
    multi = isinstance(meta, (list, tuple))
    metas = list(meta) if multi else [meta]
    if not all(m is None or isinstance(m, torch.Tensor) for m in metas):
        raise UnsupportedGraphError(
            f"node '{node.name}' ({target}) has no translation ({reason}) and returns non-tensor values",
            op=node.name,
            rule="import.unsupported",
            hint="compute it outside the module, or avoid the op",
        )
    slots: list[Value] = []
    template = {k: _template(v, slots) for k, v in args.items()}
    if not slots:
        raise UnsupportedGraphError(
            f"node '{node.name}' ({target}) has no tensor input",
            op=node.name,
            rule="import.unsupported",
            hint="compute it outside the module",
        )
    in_meta = [(v.shape, v.dtype) for v in slots]
    out_meta = [None if m is None else (tuple(int(d) for d in m.shape), m.dtype) for m in metas]

    def call(tensors: list[Any]) -> list[Any]:
        out = call_schema(target, _fill(template, tensors))
        return list(out) if multi else [out]

    typed: list[bool] = []  # (set once the op refused float64 operands)

    def reference(*arrays: np.ndarray) -> list[np.ndarray | None]:
        tensors = []
        for arr, (shape, dtype) in zip(arrays, in_meta):
            t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64)).reshape(shape)
            tensors.append(t if dtype.is_floating_point else t.to(dtype))
        traced = [t.to(dtype) for t, (_, dtype) in zip(tensors, in_meta)] if typed else None
        if traced is None:
            try:
                outs = call(tensors)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                # an op that takes only its traced types (torch._scaled_mm: fp8 operands, fp32 scales; PyTorch
                # 2.13 refuses others with a ValueError) runs in them from then on; the values came from those
                # types, so the conversion back is exact
                typed.append(True)
                traced = [t.to(dtype) for t, (_, dtype) in zip(tensors, in_meta)]
        if traced is not None:
            outs = call(traced)
        return [None if o is None else o.detach().to(torch.float64).reshape(og_dims(o.shape)).numpy() for o in outs]

    def device(*tensors: Any) -> list[Any]:
        # the torch engine passes operands in its compute type: integer and bool inputs (indices,
        # masks) get their traced dtype back, float inputs are computed in the type they come in
        shaped = [
            t.reshape(shape) if dtype.is_floating_point else t.reshape(shape).to(dtype)
            for t, (shape, dtype) in zip(tensors, in_meta)
        ]
        return [None if o is None else o.reshape(og_dims(o.shape)) for o in call(shaped)]

    def infer(*_descs: Any) -> list[Any]:
        return [((1,), torch.float32) if m is None else (og_dims(m[0]), m[1]) for m in out_meta]

    name = "torch_" + re.sub(r"\W", "_", str(target).removeprefix("aten.")) + f"_{next(_COUNTER)}"
    register_custom_op(
        name, num_inputs=len(slots), num_outputs=len(metas), reference=reference, infer=infer, torch=device
    )
    _register_vjp(name, call, in_meta, out_meta)
    used = imp.used.get(node, set(range(len(metas)))) if multi else {0}
    op = Custom(op_name=name, num_inputs=len(slots), num_outputs=len(metas))
    roles = [r for i, r in enumerate(op.output_roles()) if i in used and metas[i] is not None]
    outs = imp.g._add_op(op, [imp.tensor(v) for v in slots], name=imp.op_name(name), outputs=roles)
    if _draws_random(target, args):
        imp.note(f"{node.name}: {target} is random: the reference engine and PyTorch draw different values")
    return outs if multi else outs[0]


def _on_device(value: Any, device: Any) -> Any:
    import torch

    if isinstance(value, torch.device):
        return device
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not isinstance(value, _Slot):
        return type(value)(_on_device(v, device) for v in value)
    return value


def derived_node(imp: Importer, node: Any, args: Args) -> Value | None:
    """A node of one tensor result computed from buffers and constants alone (no parameter, no user
    input: a rotary embedding's cos/sin tables, an untranslated op on a buffer): a bound input computed
    at bind time by the aten op itself
    (`torch_runtime.DerivedSpec`: recomputed only when an input changes), not a graph op. None for
    other nodes (several results, non-tensor results)."""
    import torch

    from .torch_ops import call_schema

    if not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    slots: list[Value] = []
    template = {k: _template(v, slots) for k, v in args.items()}

    def compute(*tensors: Any) -> Any:
        # device arguments (a traced .to(device)) follow the bound tensors; a constant kept on the CPU
        # (Importer.constant) meets a module buffer on the GPU (a rotary table's positions and inv_freq)
        device = next((t.device for t in tensors if t.device.type != "cpu"), tensors[0].device)
        tensors = tuple(t.to(device) for t in tensors)
        return call_schema(node.target, _fill(_on_device(template, device), list(tensors)))

    return imp.derived_value(compute, slots, node.name)


def _draws_random(target: Any, args: dict[str, Any]) -> bool:
    """Whether the call draws random numbers: a seeded op (dropout, attention, rand...) unless its
    arguments turn the randomness off (dropout_p=0 or p=0, train=False: an eval-mode model)."""
    import torch

    if torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
        return False
    if "dropout_p" in args or ("p" in args and "train" in args):
        p = args.get("dropout_p", args.get("p"))
        if isinstance(p, (int, float)) and p == 0 or args.get("train", True) is False:
            return False
    return True


def _register_vjp(name: str, call: Any, in_meta: list[tuple[Any, Any]], out_meta: list[Any]) -> None:
    """The backward rule of custom op `name`: a `<name>_vjp` custom op per combination of outputs that
    receive a gradient and inputs that need one (made on first use), reading the op's inputs and those
    gradients and writing the inputs' gradients."""
    import torch

    from ..autodiff.rules import register_custom_grad

    floating = [i for i, (_, dtype) in enumerate(in_meta) if dtype.is_floating_point]
    made: set[str] = set()

    def vjp(tensors: list[Any], grads: list[Any], outs: list[int], wrt: list[int], f64: bool) -> list[Any]:
        with torch.enable_grad():
            ins = []
            for i, (t, (shape, dtype)) in enumerate(zip(tensors, in_meta)):
                t = t.reshape(shape)
                if not dtype.is_floating_point:
                    t = t.to(dtype)
                elif f64:
                    t = t.to(torch.float64)
                ins.append(t.detach().requires_grad_(i in wrt))
            results = call(ins)
            chosen = [results[k] for k in outs]
            dys = [g.reshape(r.shape).to(r.dtype) for g, r in zip(grads, chosen)]
            got = torch.autograd.grad(chosen, [ins[i] for i in wrt], dys, allow_unused=True)
        return [
            torch.zeros(og_dims(in_meta[i][0]), dtype=ins[i].dtype, device=ins[i].device)
            if d is None
            else d.reshape(og_dims(in_meta[i][0]))
            for i, d in zip(wrt, got)
        ]

    def op_for(outs: list[int], wrt: list[int]) -> str:
        vname = f"{name}_vjp_{'_'.join(map(str, outs))}_wrt_{'_'.join(map(str, wrt))}"
        if vname in made:
            return vname
        n = len(in_meta)

        def reference(*arrays: np.ndarray) -> list[np.ndarray]:
            ts = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)) for a in arrays]
            return [d.detach().to(torch.float64).numpy() for d in vjp(ts[:n], ts[n:], outs, wrt, True)]

        def device(*tensors: Any) -> list[Any]:
            return vjp(list(tensors[:n]), list(tensors[n:]), outs, wrt, False)

        def infer(*_descs: Any) -> list[Any]:
            return [og_dims(in_meta[i][0]) for i in wrt]

        register_custom_op(
            vname, num_inputs=n + len(outs), num_outputs=len(wrt), reference=reference, infer=infer, torch=device
        )
        made.add(vname)
        return vname

    def rule(ctx: Any) -> dict[str, Any]:
        node = ctx.node
        roles_in, roles_out = node.op.input_roles(), node.op.output_roles()
        outs = [k for k, r in enumerate(roles_out) if ctx.has_output(r) and ctx.grad(r) is not None]
        wrt = [i for i in floating if ctx.needs(roles_in[i])]
        vname = op_for(outs, wrt)
        op = Custom(op_name=vname, num_inputs=len(in_meta) + len(outs), num_outputs=len(wrt))
        inputs = [ctx.input(r) for r in roles_in] + [ctx.grad_full(roles_out[k]) for k in outs]
        dims = [og_dims(in_meta[i][0]) for i in wrt]
        grads = ctx.b.op(op, inputs, list(op.output_roles()), dims, tag="vjp", float_outputs=True)
        return {roles_in[i]: g for i, g in zip(wrt, grads)}

    register_custom_grad(name, rule, inputs=[f"input{i}" for i in floating])
