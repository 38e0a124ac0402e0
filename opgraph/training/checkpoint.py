"""Checkpoints of a training step: `TrainStep.state_dict()` and `TrainStep.load_state_dict(sd)`.

    torch.save(step.state_dict(), "ckpt.pt")               # 10 steps in
    ...                                                     # a new process, the same model and train_step
    step.load_state_dict(torch.load("ckpt.pt"))            # continues bit for bit

The layout is PyTorch's, so that a checkpoint moves between a training step and torch.optim:

    {"model": module.state_dict(),                   parameters and buffers, the module's own keys
     "optimizer": {"state": {i: {...}},              as torch.optim.AdamW / SGD's state_dict(): i is the
                   "param_groups": [{...}]},           parameter's position in module.parameters()
     "loss_scale": GradScaler.state_dict() or None,  fp16's dynamic loss scale
     "step": int or None}                            AdamW's step counter (None for SGD, which has none)

`torch.optim.AdamW(model.parameters()).load_state_dict(sd["optimizer"])` accepts the optimizer part, and
a step loads `{"model": model.state_dict(), "optimizer": opt.state_dict()}` (plus `"loss_scale":
scaler.state_dict()` for fp16) made by an eager loop. The per-parameter state is AdamW's `step`,
`exp_avg`, `exp_avg_sq` or SGD's `momentum_buffer`; the group's hyper-parameters are the optimizer's,
and loading sets them (`optimizer.set`), as torch.optim's load does. What is structural in the step
graph (SGD's momentum, Nesterov and weight decay being on; the loss scaler's growth settings) must
match: a checkpoint that differs, another optimizer's, one with several parameter groups, wrong keys
or wrong shapes raise StateDictError naming the key and the fix, before anything is changed.

As torch's state dicts, `state_dict()` holds the live tensors (parameters, moments): `torch.save` it, or
`copy.deepcopy` it to keep a snapshot in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import StateDictError
from .optimizers import SGD, AdamW, Optimizer

TrainStep = Any  # opgraph.training.step.TrainStep (which imports this module)

KEYS = ("model", "optimizer", "loss_scale", "step")
_SCALER_KEYS = ("growth_factor", "backoff_factor", "growth_interval")


def state_dict(step: TrainStep) -> dict[str, Any]:
    """The step's checkpoint (see the module docstring)."""
    torch = _torch()
    module = step.imported.module
    params = list(module.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    opt = step.optimizer
    count = _count(step)
    state: dict[int, dict[str, Any]] = {}
    for slot in step.params:
        kept = step._state.get(slot.key)
        if not kept:
            continue
        entry: dict[str, Any] = {}
        if opt.COUNTS_STEPS:
            entry["step"] = torch.tensor(float(count or 0), dtype=_step_dtype())
        entry.update({name: kept[name] for name in opt.state_names()})
        state[index[id(module.get_parameter(slot.key))]] = entry
    groups = _torch_optimizer(opt, params).state_dict()["param_groups"]
    return {
        "model": module.state_dict(),
        "optimizer": {"state": state, "param_groups": groups},
        "loss_scale": _scaler_state(step),
        "step": count,
    }


def load_state_dict(step: TrainStep, sd: Mapping[str, Any]) -> None:
    """Load `sd` into the step: the module's tensors, the optimizer's state and hyper-parameters, the
    step counter and the loss scale. Everything is checked before anything is written."""
    loaded = _parse(step, sd)
    torch = _torch()
    module = step.imported.module
    with torch.no_grad():
        module.load_state_dict(sd["model"])
    device = step._device_of(())
    if step._pack is None or step._device != device:
        step._make_pack(device)
    pack = step._pack
    assert pack is not None
    step._bind_module(pack, device)  # (constants made from the module's tensors are made again)
    with torch.no_grad():
        for slot in step.params:
            p = module.get_parameter(slot.key).detach()
            values = loaded.state.get(slot.key, {})
            for name in step.optimizer.state_names():
                buf = step._param_state(slot.key, name, p)
                if name in values:
                    buf.copy_(values[name])
                else:
                    buf.zero_()  # torch's fresh state
    scalars = step.scalars
    for name, value in loaded.scalars.items():
        pack[scalars[name]].fill_(value)
    step.optimizer.set(**loaded.hyper)


# -- checking -----------------------------------------------------------------------------------------------


@dataclass
class _Loaded:
    """What a checked state dict sets: state tensors per parameter key, device scalars by name, and
    hyper-parameters."""

    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    hyper: dict[str, float] = field(default_factory=dict)


def _error(message: str, key: str, hint: str) -> StateDictError:
    return StateDictError(f"state dict key {key!r}: {message}", rule="training.state_dict", hint=hint)


def _parse(step: TrainStep, sd: Any) -> _Loaded:
    if not isinstance(sd, Mapping):
        raise _error(f"a training step loads a dict, got {type(sd).__name__}", "", "pass what state_dict() returned")
    unknown = [k for k in sd if k not in KEYS]
    if unknown:
        raise _error(
            f"unknown key(s) {unknown}", str(unknown[0]), f"a training step's checkpoint has the keys {list(KEYS)}"
        )
    for key in ("model", "optimizer"):
        if key not in sd:
            raise _error(
                "missing",
                key,
                "pass {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), "
                "...}, or what TrainStep.state_dict() returned",
            )
    _check_model(step, sd["model"])
    out = _Loaded()
    _check_optimizer(step, sd["optimizer"], out)
    _check_step(step, sd.get("step"), out)
    _check_scaler(step, sd, out)
    return out


def _check_model(step: TrainStep, model: Any) -> None:
    if not isinstance(model, Mapping):
        raise _error(f"a module state dict, got {type(model).__name__}", "model", "pass module.state_dict()")
    own = step.imported.module.state_dict()
    missing = [k for k in own if k not in model]
    unexpected = [k for k in model if k not in own]
    if missing or unexpected:
        what = "; ".join(
            part
            for part in (
                f"missing {missing[:5]}" if missing else "",
                f"unexpected {unexpected[:5]}" if unexpected else "",
            )
            if part
        )
        raise _error(
            f"the module's keys do not match: {what}",
            f"model.{(missing or unexpected)[0]}",
            "load a checkpoint of this model (the same module class and configuration); a torch.compile'd "
            "module's keys start with '_orig_mod.': strip it",
        )
    for key, value in model.items():
        mine = own[key]
        if hasattr(value, "shape") and tuple(value.shape) != tuple(mine.shape):
            raise _error(
                f"shape {list(value.shape)}, the module's tensor is {list(mine.shape)}",
                f"model.{key}",
                "load a checkpoint of a model of the same configuration (sizes)",
            )


def _kind(group: Mapping[str, Any]) -> str:
    if "betas" in group:
        return "Adam" if group.get("decoupled_weight_decay") is False else "AdamW"
    if "momentum" in group:
        return "SGD"
    return "an unknown optimizer"


def _check_optimizer(step: TrainStep, osd: Any, out: _Loaded) -> None:
    opt = step.optimizer
    mine = type(opt).__name__
    if not isinstance(osd, Mapping) or set(osd) != {"state", "param_groups"}:
        got = sorted(osd) if isinstance(osd, Mapping) else type(osd).__name__
        raise _error(
            f"a torch.optim state dict has the keys ['param_groups', 'state'], got {got}",
            "optimizer",
            "pass optimizer.state_dict() (torch.optim) or TrainStep.state_dict()['optimizer']",
        )
    groups = osd["param_groups"]
    if not isinstance(groups, (list, tuple)) or len(groups) != 1 or not isinstance(groups[0], Mapping):
        n = len(groups) if isinstance(groups, (list, tuple)) else type(groups).__name__
        raise _error(
            f"a training step has one parameter group (one set of hyper-parameters), the checkpoint has {n}",
            "optimizer.param_groups",
            "train the eager model with one group (torch.optim.AdamW(model.parameters(), ...))",
        )
    group = groups[0]
    kind = _kind(group)
    weight_decay = float(group.get("weight_decay", 0.0))
    if kind != mine and not (kind == "Adam" and mine == "AdamW" and weight_decay == 0.0):
        raise _error(
            f"the checkpoint is {kind}'s, this step's optimizer is {mine}",
            "optimizer.param_groups",
            f"build the step with the checkpoint's optimizer (opgraph.training.{kind}(...)) or load a "
            f"checkpoint of {mine}",
        )
    for flag in ("amsgrad", "maximize"):
        if group.get(flag):
            raise _error(
                f"{flag}=True, which opgraph's {mine} does not have",
                f"optimizer.param_groups.{flag}",
                f"train with {flag}=False",
            )
    if isinstance(opt, SGD):
        _check_sgd(opt, group)
    params = list(step.imported.module.parameters())
    ids = group.get("params")
    if not isinstance(ids, (list, tuple)) or len(ids) != len(params):
        n = len(ids) if isinstance(ids, (list, tuple)) else "no"
        raise _error(
            f"the group has {n} parameters, the module {len(params)}",
            "optimizer.param_groups.params",
            "make the torch optimizer over all of model.parameters(), in their order (frozen ones too)",
        )
    out.hyper = _hyper(opt, group)
    _check_param_state(step, osd["state"], list(ids), params, out)


def _check_sgd(opt: SGD, group: Mapping[str, Any]) -> None:
    if float(group.get("dampening", 0.0)) != 0.0:
        raise _error(
            f"dampening={group['dampening']}, opgraph's SGD has none",
            "optimizer.param_groups.dampening",
            "train with dampening=0",
        )
    structure = {
        "momentum": (float(group["momentum"]) != 0.0, opt.has_momentum),
        "nesterov": (bool(group.get("nesterov", False)), opt.nesterov),
        "weight_decay": (float(group.get("weight_decay", 0.0)) != 0.0, opt.has_decay),
    }
    for name, (theirs, ours) in structure.items():
        if theirs != ours:
            raise _error(
                f"{name} is {'on' if theirs else 'off'} in the checkpoint and {'on' if ours else 'off'} in "
                "the step (fixed when the step graph is built)",
                f"optimizer.param_groups.{name}",
                f"build the step with SGD(..., {name}={group[name]!r}) to load this checkpoint",
            )


def _hyper(opt: Optimizer, group: Mapping[str, Any]) -> dict[str, float]:
    values = {}
    for name in opt.HYPER:
        if name in ("beta1", "beta2"):
            value = group["betas"][0 if name == "beta1" else 1]
        elif name in group:
            value = group[name]
        else:
            raise _error("missing", f"optimizer.param_groups.{name}", f"a {type(opt).__name__} group has {name}")
        values[name] = float(value)
    return values


def _check_param_state(step: TrainStep, state: Any, ids: list[Any], params: list[Any], out: _Loaded) -> None:
    if not isinstance(state, Mapping):
        raise _error(
            f"a dict of per-parameter state, got {type(state).__name__}",
            "optimizer.state",
            "pass optimizer.state_dict()",
        )
    strays = [k for k in state if k not in ids]
    if strays:
        raise _error(
            f"state for {strays[:5]}, which the group's params {list(ids)[:8]} do not list",
            "optimizer.state",
            "pass the optimizer's state dict as torch.optim made it (integer keys)",
        )
    module = step.imported.module
    opt = step.optimizer
    names = set(opt.state_names())
    allowed = names | ({"step"} if opt.COUNTS_STEPS else set())
    position = {id(p): i for i, p in enumerate(params)}
    steps: dict[str, float] = {}
    for slot in step.params:
        p = module.get_parameter(slot.key)
        sid = ids[position[id(p)]]
        entry = state.get(sid)
        if entry is None:
            continue
        where = f"optimizer.state[{sid}]"
        if not isinstance(entry, Mapping):
            raise _error(f"a dict of state tensors, got {type(entry).__name__}", where, "pass optimizer.state_dict()")
        entry = {k: v for k, v in entry.items() if v is not None}  # (torch's SGD once kept momentum_buffer=None)
        extra = sorted(set(entry) - allowed)
        if extra:
            raise _error(
                f"state {extra} of parameter '{slot.key}' is not {type(opt).__name__}'s "
                f"({sorted(allowed) or 'no state'}): another optimizer's checkpoint",
                where,
                f"load a checkpoint of {opt!r}, or build the step with the checkpoint's optimizer",
            )
        if not entry:
            continue
        lacking = sorted(names - set(entry)) + (["step"] if opt.COUNTS_STEPS and "step" not in entry else [])
        if lacking:
            raise _error(
                f"parameter '{slot.key}' lacks state {lacking}",
                where,
                "pass a complete optimizer state dict (all of a parameter's state, or none)",
            )
        for name in names:
            value = entry[name]
            if not hasattr(value, "shape") or tuple(value.shape) != tuple(p.shape):
                shape = list(value.shape) if hasattr(value, "shape") else type(value).__name__
                raise _error(
                    f"{name} of parameter '{slot.key}' is {shape}, the parameter {list(p.shape)}",
                    f"{where}.{name}",
                    "load the optimizer state of the same model (sizes and parameter order: module.parameters())",
                )
        out.state[slot.key] = {name: entry[name] for name in names}
        if opt.COUNTS_STEPS:
            steps[slot.key] = float(entry["step"])
    if opt.COUNTS_STEPS:
        if len(set(steps.values())) > 1 or (steps and len(steps) != len(step.params)):
            counts = {k: steps.get(k) for k in [s.key for s in step.params][:6]}
            raise _error(
                f"the parameters' step counts differ ({counts}); a training step has one counter",
                "optimizer.state",
                "load a checkpoint in which every trained parameter took the same number of steps",
            )
        out.scalars["optimizer.step"] = next(iter(steps.values()), 0.0)


def _check_step(step: TrainStep, count: Any, out: _Loaded) -> None:
    if count is None or not step.optimizer.COUNTS_STEPS:
        return
    if isinstance(count, bool) or not isinstance(count, (int, float)) or count < 0 or count != int(count):
        raise _error(f"a step count (an int >= 0), got {count!r}", "step", "pass what state_dict() returned")
    if out.state and float(count) != out.scalars["optimizer.step"]:
        raise _error(
            f"{count}, the optimizer state's step is {out.scalars['optimizer.step']:g}",
            "step",
            "pass the step count saved with the optimizer state (or leave 'step' out)",
        )
    out.scalars["optimizer.step"] = float(count)


def _check_scaler(step: TrainStep, sd: Mapping[str, Any], out: _Loaded) -> None:
    scaler = step.scaler
    value = sd.get("loss_scale")
    if scaler is None:
        if value:
            raise _error(
                "this step has no loss scale (it is not fp16 mixed precision)",
                "loss_scale",
                "set sd['loss_scale'] = None to load the rest, or build the step with mixed_precision='fp16'",
            )
        return
    if "loss_scale" not in sd:
        raise _error(
            "missing: the step scales its fp16 loss",
            "loss_scale",
            "pass GradScaler.state_dict() (or TrainStep.state_dict()'s), or None to keep the step's scale",
        )
    if not value:
        return
    if not isinstance(value, Mapping) or "scale" not in value:
        raise _error(
            f"GradScaler.state_dict()'s layout ({{'scale': ..., '_growth_tracker': ...}}), got {value!r}",
            "loss_scale",
            "pass GradScaler.state_dict() or TrainStep.state_dict()['loss_scale']",
        )
    for name in _SCALER_KEYS:
        if name in value and float(value[name]) != float(scaler[name]):
            raise _error(
                f"{value[name]}, the step's is {scaler[name]} (fixed when the step graph is built)",
                f"loss_scale.{name}",
                f"build the step with loss_scale={{'{name}': {value[name]!r}}}",
            )
    out.scalars["loss_scale"] = float(value["scale"])
    out.scalars["loss_scale.growth_tracker"] = float(value.get("_growth_tracker", 0))


# -- helpers ------------------------------------------------------------------------------------------------


def _count(step: TrainStep) -> int | None:
    if not step.optimizer.COUNTS_STEPS:
        return None
    value = step.step_count
    return 0 if value is None else int(value)


def _scaler_state(step: TrainStep) -> dict[str, Any] | None:
    if step.scaler is None:
        return None
    c = step.scaler
    scale = step.loss_scale
    tracker = step._scalar_value("loss_scale.growth_tracker")
    return {
        "scale": float(c["init_scale"]) if scale is None else scale,
        "growth_factor": float(c["growth_factor"]),
        "backoff_factor": float(c["backoff_factor"]),
        "growth_interval": int(c["growth_interval"]),
        "_growth_tracker": 0 if tracker is None else int(tracker),
    }


def _torch_optimizer(opt: Optimizer, params: list[Any]) -> Any:
    """The torch.optim optimizer with `opt`'s hyper-parameters (its state_dict's param_groups are the layout)."""
    torch = _torch()
    h = opt.hyper
    if isinstance(opt, AdamW):
        return torch.optim.AdamW(
            params, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"], weight_decay=h["weight_decay"]
        )
    if isinstance(opt, SGD):
        return torch.optim.SGD(
            params, lr=h["lr"], momentum=h["momentum"], nesterov=opt.nesterov, weight_decay=h["weight_decay"]
        )
    raise _error(f"{type(opt).__name__} has no torch.optim layout", "optimizer", "checkpoint an SGD or AdamW step")


def _step_dtype() -> Any:
    torch = _torch()
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _torch() -> Any:
    import torch

    return torch
