"""Optimizers for training-step graphs: SGD and AdamW as ops that update parameters and their state in
place (the formulas of torch.optim.SGD and torch.optim.AdamW).

Every hyper-parameter is a 1-element device tensor read at run time, and AdamW's step counter too
(bias correction computed on the device), so one captured CUDA graph serves a whole schedule:
`opt.set(lr=...)` writes the new value into the device scalar; nothing is re-captured. What is
structural is fixed when the step graph is built: SGD's momentum buffer exists when momentum is not 0
(a schedule may then change it, not switch it off or on), the weight-decay term when weight_decay is
not 0 (AdamW always has it), and Nesterov.

    SGD        g = dW + weight_decay * W
               buf = momentum * buf + g            (a zero buffer gives torch's first step, buf = g)
               g = g + momentum * buf if nesterov else buf
               W = W - lr * g
    AdamW      t = t + 1
               m = m + (1 - beta1) * (dW - m)                     (torch's lerp)
               v = v + (1 - beta2) * (dW^2 - v)                   (= beta2 * v + (1 - beta2) dW^2)
               W = W - (lr * weight_decay * W + lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps))

An in-place update is written as `old + delta` (or `old - delta`): the op that writes a buffer reads
its old value itself (see opgraph/finalize.py). When a step may be skipped (fp16 loss scaling found
an inf or NaN), every write is `skip ? old : new`, so nothing changes, the counter included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.dtypes import DataType
from ..core.errors import AttributeValueError
from ..core.tensor import Tensor
from ..graph.builder import Graph


@dataclass
class UpdateScope:
    """What the optimizer's ops read: the step graph, its hyper-parameter inputs (`hyper`, 1-element),
    the step counter input (`step`, AdamW), `skip` (1-element, nonzero where the step is skipped, or
    None), and per-step quantities computed once (`shared`)."""

    g: Graph
    hyper: dict[str, Tensor]
    step: Tensor | None = None
    skip: Tensor | None = None
    shared: dict[str, Tensor] = field(default_factory=dict)


def commit(g: Graph, old: Tensor, delta: Any, skip: Tensor | None, *, subtract: bool = False, name: str = "") -> Tensor:
    """The in-place update old <- old + delta (or - delta), unchanged where `skip`: an output with
    old's UID, name and type, made by an op that reads `old` itself."""
    new = (g.sub if subtract else g.add)(old, delta, name=f"{name}.new")
    if skip is not None:
        new = g.binary_select(old, new, skip, name=f"{name}.or_skip")
    return new.set_uid(old.uid).set_name(old.name).set_data_type(old.data_type).set_output(True)


class Optimizer:
    """Hyper-parameters (device scalars once a step is built), per-parameter state names, and the
    update ops. Set a value with `opt.set(lr=0.1)` or `opt.lr = 0.1`: the bound device tensors are
    written at once (a fill, no synchronisation), so a captured step reads the new value."""

    HYPER: ClassVar[tuple[str, ...]] = ()
    STATE: ClassVar[tuple[str, ...]] = ()
    COUNTS_STEPS: ClassVar[bool] = False

    def __init__(self, **values: float) -> None:
        object.__setattr__(self, "_values", {k: float(v) for k, v in values.items()})
        object.__setattr__(self, "_bound", [])

    # -- hyper-parameters ---------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.HYPER:
            self.set(**{name: value})
        else:
            object.__setattr__(self, name, value)

    def set(self, **values: float) -> None:
        """New hyper-parameter values, written into every bound device scalar."""
        unknown = sorted(set(values) - set(self.HYPER))
        if unknown:
            raise AttributeValueError(
                f"{type(self).__name__} has no hyper-parameter(s) {unknown}",
                rule="training.hyper",
                hint=f"set one of {list(self.HYPER)}",
            )
        for name, value in values.items():
            self._values[name] = float(value)
            for buffers in self._bound:
                if name in buffers:
                    _fill(buffers[name], float(value))

    @property
    def hyper(self) -> dict[str, float]:
        return dict(self._values)

    @property
    def name(self) -> str:
        """The prefix of its device scalars' names in a step graph ("sgd.lr", "adamw.beta1")."""
        return type(self).__name__.lower()

    def bind(self, buffers: dict[str, Any]) -> None:
        """Device scalars (name -> 1-element tensor or array) that `set` writes from now on."""
        self._bound.append(buffers)

    def state_names(self) -> tuple[str, ...]:
        """Per-parameter state buffers (zeros at the start, like torch's lazily made state)."""
        return self.STATE

    def used_hyper(self) -> tuple[str, ...]:
        """The hyper-parameters the update reads (device scalars of the step graph)."""
        return self.HYPER

    # -- ops ------------------------------------------------------------------------------------------
    def prepare(self, s: UpdateScope) -> None:
        """Ops computed once per step (before any parameter's update)."""

    def update(self, s: UpdateScope, w: Tensor, grad: Tensor, state: dict[str, Tensor], tag: str) -> None:
        """The ops updating parameter `w` (and its `state`) in place from its gradient `grad`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v:g}" for k, v in self._values.items())
        return f"{type(self).__name__}({args})"


class SGD(Optimizer):
    """torch.optim.SGD(lr, momentum, nesterov, weight_decay) with dampening 0 (see the module)."""

    HYPER = ("lr", "momentum", "weight_decay")

    def __init__(self, lr: float, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0) -> None:
        if nesterov and momentum == 0:
            raise AttributeValueError(
                "Nesterov momentum needs a momentum",
                rule="training.nesterov",
                hint="pass momentum > 0 with nesterov=True",
            )
        super().__init__(lr=lr, momentum=momentum, weight_decay=weight_decay)
        object.__setattr__(self, "nesterov", bool(nesterov))
        object.__setattr__(self, "has_momentum", momentum != 0)
        object.__setattr__(self, "has_decay", weight_decay != 0)

    def state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.has_momentum else ()

    def used_hyper(self) -> tuple[str, ...]:
        return ("lr",) + (("momentum",) if self.has_momentum else ()) + (("weight_decay",) if self.has_decay else ())

    def prepare(self, s: UpdateScope) -> None:
        if self.has_momentum:
            s.shared["momentum_minus_1"] = s.g.sub(s.hyper["momentum"], 1.0, name="sgd.momentum_minus_1")

    def update(self, s: UpdateScope, w: Tensor, grad: Tensor, state: dict[str, Tensor], tag: str) -> None:
        g = s.g
        d = grad
        if self.has_decay:
            d = g.add(d, g.mul(w, s.hyper["weight_decay"], name=f"sgd.decay.{tag}"), name=f"sgd.decayed.{tag}")
        if self.has_momentum:
            buf = state["momentum_buffer"]
            mb = g.mul(buf, s.shared["momentum_minus_1"], name=f"sgd.mb.{tag}")
            delta = g.add(mb, d, name=f"sgd.buf_delta.{tag}")
            new_buf = commit(g, buf, delta, s.skip, name=f"sgd.buf.{tag}")
            if self.nesterov:
                d = g.add(
                    d, g.mul(new_buf, s.hyper["momentum"], name=f"sgd.nesterov_mb.{tag}"), name=f"sgd.nesterov.{tag}"
                )
            else:
                d = new_buf
        commit(g, w, g.mul(d, s.hyper["lr"], name=f"sgd.step.{tag}"), s.skip, subtract=True, name=f"sgd.update.{tag}")


class AdamW(Optimizer):
    """torch.optim.AdamW(lr, betas, eps, weight_decay) without amsgrad (see the module)."""

    HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")
    STATE = ("exp_avg", "exp_avg_sq")
    COUNTS_STEPS = True

    def __init__(
        self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01
    ) -> None:
        b1, b2 = betas
        for name, v in (("beta1", b1), ("beta2", b2)):
            if not 0.0 <= v < 1.0:
                raise AttributeValueError(
                    f"AdamW {name} {v} is not in [0, 1)",
                    rule="training.betas",
                    hint="pass betas=(beta1, beta2) with both in [0, 1)",
                )
        super().__init__(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay)

    @property
    def betas(self) -> tuple[float, float]:
        return self._values["beta1"], self._values["beta2"]

    def prepare(self, s: UpdateScope) -> None:
        g, h = s.g, s.hyper
        assert s.step is not None
        t = commit(g, s.step, 1.0, s.skip, name="adamw.step")
        bc1 = g.sub(1.0, g.pow(h["beta1"], t, name="adamw.beta1_t"), name="adamw.bias_correction1")
        bc2 = g.sub(1.0, g.pow(h["beta2"], t, name="adamw.beta2_t"), name="adamw.bias_correction2")
        s.shared["step_size"] = g.div(h["lr"], bc1, name="adamw.step_size")
        s.shared["inv_sqrt_bc2"] = g.rsqrt(bc2, name="adamw.inv_sqrt_bc2")
        s.shared["decay"] = g.mul(h["lr"], h["weight_decay"], name="adamw.decay")
        s.shared["one_minus_beta1"] = g.sub(1.0, h["beta1"], name="adamw.one_minus_beta1")
        s.shared["one_minus_beta2"] = g.sub(1.0, h["beta2"], name="adamw.one_minus_beta2")

    def update(self, s: UpdateScope, w: Tensor, grad: Tensor, state: dict[str, Tensor], tag: str) -> None:
        g, sh = s.g, s.shared
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m_new = commit(
            g,
            m,
            g.mul(g.sub(grad, m, name=f"adamw.dm.{tag}"), sh["one_minus_beta1"], name=f"adamw.m_delta.{tag}"),
            s.skip,
            name=f"adamw.m.{tag}",
        )
        sq = g.mul(grad, grad, name=f"adamw.g2.{tag}")
        v_new = commit(
            g,
            v,
            g.mul(g.sub(sq, v, name=f"adamw.dv.{tag}"), sh["one_minus_beta2"], name=f"adamw.v_delta.{tag}"),
            s.skip,
            name=f"adamw.v.{tag}",
        )
        denom = g.add(
            g.mul(g.sqrt(v_new, name=f"adamw.sqrt_v.{tag}"), sh["inv_sqrt_bc2"], name=f"adamw.vhat.{tag}"),
            s.hyper["eps"],
            name=f"adamw.denom.{tag}",
        )
        step = g.mul(g.div(m_new, denom, name=f"adamw.ratio.{tag}"), sh["step_size"], name=f"adamw.step.{tag}")
        delta = g.add(g.mul(w, sh["decay"], name=f"adamw.decay.{tag}"), step, name=f"adamw.delta.{tag}")
        commit(g, w, delta, s.skip, subtract=True, name=f"adamw.update.{tag}")


def _fill(buffer: Any, value: float) -> None:
    """Write `value` into a bound scalar: a torch tensor (a fill on its device, no synchronisation) or an array."""
    if hasattr(buffer, "fill_"):
        buffer.fill_(value)
    else:
        buffer[...] = value


def scalar_type(param_types: set[DataType]) -> DataType:
    """The type of the hyper-parameter scalars: DOUBLE for float64 parameters, else FLOAT."""
    return DataType.DOUBLE if DataType.DOUBLE in param_types else DataType.FLOAT
