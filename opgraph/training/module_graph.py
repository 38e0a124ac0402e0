"""The step graph of an imported module: `module_step_graph(imported, loss, optimizer, ...)`, what
`train_step` builds before it binds and runs (opgraph.training.step).

Every parameter of the module that requires grad is trained, as the module's own tensor:
- a parameter the graph reads as it is, or through a view of all of it (linear's W^T), is bound as that
  view and updated through it;
- a parameter read through several views (a tied embedding, read as W and as W^T), or through a view of
  part of it or a broadcast (a learned position table read as pos[:T], a class token expanded over the
  batch), becomes one input, the tensor itself, and each view becomes ops on it (opgraph.training.forward):
  its gradient is the whole tensor's (zeros where nothing was read, summed over a broadcast), so the
  optimizer updates and decays all of it, with state of the tensor's dims, as torch.optim does.
The forward is prepared for training (training-form norms, autocast's casts with mixed_precision), the
loss added (its gradient formed directly where the loss has one: opgraph.training.losses), and the rest
is `step_graph`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.dtypes import DataType, as_data_type
from ..core.errors import AttributeValueError, GraphError
from ..core.tensor import Tensor
from .forward import READS_PART, TiedParam, prepare_forward
from .losses import Loss, as_loss
from .optimizers import AdamW, Optimizer
from .step_graph import (
    SCALER_DEFAULTS,
    AnalyticSeed,
    GradientHook,
    ParamSlot,
    StepGraph,
    handles_by_uid,
    step_graph,
)

MIXED = {
    None: None,
    "bf16": DataType.BFLOAT16,
    "bfloat16": DataType.BFLOAT16,
    "fp16": DataType.HALF,
    "float16": DataType.HALF,
    "half": DataType.HALF,
}


@dataclass(frozen=True, kw_only=True)
class ModuleStepGraph(StepGraph):
    """A `StepGraph` of an imported module: where its output and the loss's target are, the loss, the
    mixed-precision type, and the inputs of ones that broadcast expanded parameters (bind each to one
    element, expanded: `ones`, UID -> dims)."""

    out_uid: int
    target_uid: int
    loss_fn: Loss
    low: DataType | None
    ones: Mapping[int, tuple[int, ...]]


def module_step_graph(
    imported: Any,
    loss: Any = "cross_entropy",
    optimizer: Optimizer | None = None,
    mixed_precision: str | None = None,
    grad_clip_norm: float | None = None,
    *,
    target_like: Any = None,
    loss_scale: Mapping[str, float] | None = None,
    grad_data_type: Any = None,
    on_gradient: Sequence[GradientHook] = (),
    compute_copies: bool = False,
    name: str | None = None,
) -> ModuleStepGraph:
    """The step graph of module `imported` (opgraph.from_torch, train mode); the arguments are
    `train_step`'s (see opgraph.training.step)."""
    if mixed_precision not in MIXED:
        raise AttributeValueError(
            f"mixed_precision={mixed_precision!r} is not None, 'bf16' or 'fp16'",
            rule="training.mixed_precision",
            hint="pass None, 'bf16' or 'fp16'",
        )
    if grad_clip_norm is not None and not grad_clip_norm > 0:
        raise AttributeValueError(
            f"grad_clip_norm={grad_clip_norm!r} must be > 0",
            rule="training.clip",
            hint="pass a positive max norm, or None for no clipping",
        )
    loss_fn = as_loss(loss, target_like)
    opt = optimizer if optimizer is not None else AdamW(1e-3)
    if not isinstance(opt, Optimizer):
        raise AttributeValueError(
            f"optimizer={optimizer!r} is not an opgraph.training optimizer",
            rule="training.optimizer",
            hint="pass opgraph.training.SGD(...) or AdamW(...)",
        )
    unknown = set(loss_scale or {}) - set(SCALER_DEFAULTS)
    if unknown:  # (fp16's settings, checked whatever the precision)
        raise AttributeValueError(
            f"loss_scale has unknown keys {sorted(unknown)}",
            rule="training.loss_scale",
            hint=f"known: {sorted(SCALER_DEFAULTS)}",
        )
    low = MIXED[mixed_precision]
    fg = imported.graph.final
    module = imported.module
    groups: dict[str, list[tuple[Tensor, Any]]] = {}
    for t, source in imported.bound_inputs:
        if source.kind == "parameter" and module.get_parameter(source.key).requires_grad:
            groups.setdefault(source.key, []).append((t, source))
    if not groups:
        raise GraphError(
            "the module has no trainable parameter",
            rule="training.no_params",
            hint="import a module with parameters that require grad",
        )
    whole = []  # parameters that become one input of their own dims
    for key, members in groups.items():
        p = module.get_parameter(key)
        if not p.dtype.is_floating_point:
            continue
        if low is not None and p.dtype not in (_torch().float32, _torch().float64):
            raise GraphError(
                f"mixed precision keeps fp32 master weights, but parameter '{key}' is {p.dtype}",
                rule="training.master_type",
                hint="train the fp32 module (model.float()) with mixed_precision, or a 16-bit module without it",
            )
        if len(members) > 1 or any(_reads_part(s.views) for _, s in members):
            whole.append(
                TiedParam(
                    key,
                    [(t.known_uid(), s.views) for t, s in members],
                    tuple(p.shape) or (1,),
                    tuple(p.stride()) or (1,),
                    as_data_type(p.dtype),
                )
            )
    bound = {t.known_uid() for t, _ in imported.bound_inputs}
    outputs = imported.outputs
    if len(outputs) != 1:
        raise GraphError(
            f"train_step needs a module with one output (the one the loss reads); it has {len(outputs)}",
            rule="training.outputs",
            hint="wrap the module so that it returns the logits (or prediction) alone",
        )
    out_uid = outputs[0].known_uid()
    prep = prepare_forward(
        fg, bound=bound, tied=whole, low=low, internal=[out_uid], name=name or f"{fg.name}_train_step"
    )
    g = prep.graph
    slots = []
    for key, members in groups.items():
        if key in prep.tied:
            slots.append(ParamSlot(key, prep.tied[key].known_uid()))
        elif fg.tensors[members[0][0].known_uid()].data_type.is_floating:
            slots.append(ParamSlot(key, members[0][0].known_uid(), members[0][1]))
    out = handles_by_uid(g)[out_uid]
    out_desc = replace(fg.tensors[out_uid], data_type=out.data_type, is_virtual=True)
    next_uid = max(max(fg.tensors), max(t._uid for t in g._tensors if t._uid is not None)) + 1
    tdims, tdt = loss_fn.target(out_desc)
    target = g.tensor(dim=list(tdims), data_type=tdt, name="target", uid=next_uid)
    parts = loss_fn.forward(g, out, target, out_desc)
    loss_t = parts.loss.set_output(True).set_name("loss").set_data_type(fg.intermediate_data_type)
    g.validate()
    ld = g.final.tensors[loss_t.known_uid()]
    if ld.numel != 1 or not ld.data_type.is_floating:
        raise GraphError(
            f"the loss must be a 1-element floating tensor, got {ld.type_str()}",
            tensor=ld,
            rule="training.loss",
            hint="reduce the loss to one value (a mean or a sum)",
        )
    saved = {k: v.known_uid() for k, v in parts.saved.items()}
    target_uid = target.known_uid()
    seed = None
    if type(loss_fn).gradient is not Loss.gradient:  # the loss forms its gradient: seed the backward at the output

        def gradient(sg: Any, handles: Mapping[int, Tensor], scale: Any) -> Tensor:
            named = {k: handles[u] for k, u in saved.items()}
            d_out = loss_fn.gradient(sg, handles[out_uid], handles[target_uid], named, scale, out_desc)
            if d_out is None:
                raise GraphError(
                    f"{type(loss_fn).__name__}.gradient returned None",
                    rule="training.loss_gradient",
                    hint="return d(loss)/d(out) times seed, or do not override gradient (then "
                    "opgraph.grad differentiates forward)",
                )
            return d_out

        seed = AnalyticSeed(out_uid, gradient)
    sg = step_graph(
        g,
        loss_t,
        slots,
        opt,
        seed=seed,
        grad_clip_norm=grad_clip_norm,
        loss_scale=dict(loss_scale or {}) if low is DataType.HALF else None,
        grad_data_type=grad_data_type,
        forward_types=low is not None,
        virtual=prep.stats,
        on_gradient=on_gradient,
        compute_copies=compute_copies and low is not None,
        name=g.name,
    )
    return ModuleStepGraph(
        **{f: getattr(sg, f) for f in StepGraph.__dataclass_fields__},
        out_uid=out_uid,
        target_uid=target_uid,
        loss_fn=loss_fn,
        low=low,
        ones=dict(prep.ones),
    )


def _reads_part(views: tuple) -> bool:
    """Whether a chain of aten view ops reads part of a tensor, or broadcasts it (a slice, an expand)."""
    return any(getattr(op, "__name__", str(op)).split(".")[0] in READS_PART for op, _ in views)


def _torch() -> Any:
    import torch

    return torch
