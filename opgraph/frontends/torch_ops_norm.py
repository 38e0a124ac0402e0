"""Translators of normalization (batch norm in eval and train mode, its running-statistics write-back,
layer norm) and pooling (max, average, adaptive) aten ops; registered on import like torch_ops_nn's."""

from __future__ import annotations

from typing import Any

from ..core.errors import expect
from ..core.tensor import Tensor
from ..ops.norm import Batchnorm
from ..ops.pooling import ResampleMode
from ..ops.reduction import ReductionMode
from .torch_importer import Args, Importer, Untranslatable, Value
from .torch_ops import PREPARE, TRANSLATORS, Translator, _ints, _meta, op
from .torch_ops_nn import reduce

# -- normalization -----------------------------------------------------------------------------------


def _per_channel(imp: Importer, v: Value | None, x: Value, fill: float) -> Tensor | float:
    """A [C] parameter as [1, C, 1, ...] (a bind-time view), or the number `fill` when absent."""
    if v is None:
        return fill
    return imp.reshaped(v, (1, x.shape[1]) + (1,) * (x.rank - 2))


def _filled(imp: Importer, value: Tensor | float, x: Value) -> Tensor:
    """A per-channel tensor: `value`, or a constant [1, C, 1, ...] tensor of that number."""
    if isinstance(value, Tensor):
        return value
    pc = (1, x.shape[1]) + (1,) * (x.rank - 2)
    dtype = imp.g.intermediate_data_type.to_torch()
    return imp.tensor(imp.constant_value(imp.torch.full(pc, float(value), dtype=dtype), "fill"))


def _eval_coefficients(imp: Importer, x: Value, a: Args, eps: float) -> Any:
    """Graph ops on the parameters alone, so that they follow rebinding. For eval_batchnorm
    'scale_shift' (PyTorch's own CPU formula): s = weight * rsqrt(running_var + eps) and
    t = bias - running_mean * s, applied as y = x * s + t, pointwise ops that fuse into a
    preceding conv's epilogue; for 'op': rsqrt(running_var + eps), batchnorm_inference's inv_variance."""
    g = imp.g
    form = imp.options.get("eval_batchnorm", "folded")
    if form == "folded":
        folded = _folded(imp, x, a, eps)
        if folded is not None:
            return folded
    var = _per_channel(imp, a["running_var"], x, 1.0)
    inv = g.rsqrt(g.add(var, float(eps), name=imp.op_name("var_eps")), name=imp.op_name("inv_std"))
    if form == "op":
        return inv
    w, b = _per_channel(imp, a.get("weight"), x, 1.0), _per_channel(imp, a.get("bias"), x, 0.0)
    s = inv if not isinstance(w, Tensor) else g.mul(w, inv, name=imp.op_name("scale"))
    m = g.mul(_per_channel(imp, a["running_mean"], x, 0.0), s, name=imp.op_name("mean_scale"))
    t = g.neg(m, name=imp.op_name("shift")) if not isinstance(b, Tensor) else g.sub(b, m, name=imp.op_name("shift"))
    return s, t


def _folded(imp: Importer, x: Value, a: Args, eps: float) -> tuple[Tensor, Tensor] | None:
    """s and t as bind-time derived inputs (None when a parameter is computed in the graph)."""
    values = [a.get(k) for k in ("weight", "bias", "running_mean", "running_var")]
    if not all(v is None or v.is_bound for v in values):
        return None
    pc = [1, x.shape[1]] + [1] * (x.rank - 2)
    present = [
        expect(imp.view(v, imp.torch.ops.aten.view.default, pc), "the view of a bound parameter")
        for v in values
        if v is not None
    ]
    has_w, has_b = values[0] is not None, values[1] is not None
    wide = imp.g.intermediate_data_type.to_torch()

    def scale(*ts: Any) -> Any:
        w = ts[0] if has_w else None
        rv = ts[-1]
        s = (rv.to(wide) + eps).rsqrt()
        return s if w is None else s * w.to(wide)

    def shift(*ts: Any) -> Any:
        s = scale(*ts)
        rm = ts[-2].to(wide)
        b = ts[1 if has_w else 0].to(wide) if has_b else None
        return -(rm * s) if b is None else b - rm * s

    stem = _module_path(values[3]) or imp.node.name
    s = imp.derived_value(scale, present, f"{stem}.folded_scale")
    t = imp.derived_value(shift, present, f"{stem}.folded_shift")
    return imp.tensor(s), imp.tensor(t)


def _module_path(v: Value | None) -> str:
    """'layer1.0.bn1' for the value of buffer 'layer1.0.bn1.running_var'."""
    if v is None or v.source is None or v.source.kind not in ("parameter", "buffer"):
        return ""
    return v.source.key.rpartition(".")[0]


def _bn_args(node: Any, a: Args) -> tuple[bool, float, float]:
    """(training, momentum, eps) of any batch-norm variant."""
    base = node.target._schema.name.split("::")[-1].rstrip("_")
    if base == "_native_batch_norm_legit_no_training":
        return False, a["momentum"], a["eps"]
    if base == "cudnn_batch_norm" or base == "miopen_batch_norm":
        return a["training"], a["exponential_average_factor"], a["epsilon"]
    return a["training"], a["momentum"], a["eps"]


def _ready(v: Any) -> bool:
    return v is None or (isinstance(v, Value) and (v.tensor is not None or v.is_bound))


def _prepare_bn(imp: Importer, node: Any, a: Args) -> Any:
    training, _, eps = _bn_args(node, a)
    x = a["input"]
    stats = [a.get("running_mean"), a.get("running_var")]
    if (
        training
        or None in stats
        or not isinstance(x, Value)
        or x.rank < 2
        or not all(_ready(a.get(k)) for k in ("running_mean", "running_var", "weight", "bias"))
    ):
        return None
    return _eval_coefficients(imp, x, a, eps)


_BN_MUTATING = {"batch_norm", "native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm", "miopen_batch_norm"}


@op(
    "batch_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional",
    "cudnn_batch_norm",
    "miopen_batch_norm",
)
def _batch_norm(imp: Importer, node: Any, a: Args) -> Any:
    base = node.target._schema.name.split("::")[-1]
    x, rm, rv = a["input"], a.get("running_mean"), a.get("running_var")
    training, momentum, eps = _bn_args(node, a)
    if x.rank < 2:
        raise Untranslatable("batch norm of a 1-D input")
    g = imp.g
    multi = isinstance(_meta(node), (list, tuple))
    used = imp.used.get(node, {0}) if multi else {0}
    if not training and (rm is None or rv is None):
        raise Untranslatable("eval-mode batch norm without running stats")
    if not training and used - {0}:
        raise Untranslatable("saved stats of an eval-mode batch norm")
    if not training:
        coefficients = imp.prepared.get(node)
        if coefficients is None:
            coefficients = _eval_coefficients(imp, x, a, eps)
        if isinstance(coefficients, tuple):
            s, t = coefficients
            y = g.add(g.mul(imp.tensor(x), s, name=imp.op_name("scale_x")), t, name=imp.op_name())
        else:
            y = g.batchnorm_inference(
                imp.tensor(x),
                _filled(imp, _per_channel(imp, rm, x, 0.0), x),
                coefficients,
                _filled(imp, _per_channel(imp, a.get("weight"), x, 1.0), x),
                _filled(imp, _per_channel(imp, a.get("bias"), x, 0.0), x),
                name=imp.op_name(),
            )
        return [y] + [None] * (len(_meta(node)) - 1) if multi else y
    scale = _filled(imp, _per_channel(imp, a.get("weight"), x, 1.0), x)
    bias = _filled(imp, _per_channel(imp, a.get("bias"), x, 0.0), x)
    running = rm is not None and rv is not None
    wanted = ["y"] + [r for i, r in ((1, "mean"), (2, "inv_variance")) if i in used]
    if running:
        wanted += ["next_running_mean", "next_running_var"]
    inputs = [
        imp.tensor(x),
        scale,
        bias,
        _per_channel(imp, rm, x, 0.0) if running else None,
        _per_channel(imp, rv, x, 1.0) if running else None,
        float(eps),
        float(momentum) if running else None,
    ]
    outs = dict(zip(Batchnorm().output_roles(), g._add_op(Batchnorm(), inputs, name=imp.op_name(), outputs=wanted)))
    c = [x.shape[1]]
    if rm is not None and rv is not None and base in _BN_MUTATING:  # (running)
        for role, v in (("next_running_mean", rm), ("next_running_var", rv)):
            _write_back(imp, expect(outs[role], f"batchnorm's {role}"), v)
    if not multi:
        return outs["y"]
    results: list[Any] = [outs["y"]]
    for i, role in ((1, "mean"), (2, "inv_variance"), (3, "next_running_mean"), (4, "next_running_var")):
        if i >= len(_meta(node)):
            break
        t = outs.get(role)
        results.append(None if t is None or i not in used else imp.reshape(t, c, name=imp.op_name(role)))
    return results


def _write_back(imp: Importer, t: Tensor, target: Value) -> None:
    from .torch_runtime import Mutation, ReportEntry

    src = target.source
    if src is None or src.kind != "buffer" or src.views:
        imp.note(f"{imp.node.name}: the running stats are not a module buffer; their update is not written back")
        return
    t.set_output(True).set_name(imp._unique(f"{src.key}@next")).set_data_type(target.dtype)
    imp.mutations.append(Mutation("buffer", src.key, t))
    imp.report.entries.append(
        ReportEntry(
            imp.node.name,
            f"buffer {src.key}",
            "translated",
            (),
            f"output '{src.key}@next', copied into the module by write_back",
        )
    )


for _name in (
    "batch_norm",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit",
    "native_batch_norm",
    "cudnn_batch_norm",
    "miopen_batch_norm",
):
    PREPARE.register(_name, _prepare_bn)


@op("layer_norm")
def _layer_norm(imp: Importer, node: Any, a: Args) -> Tensor:
    x, shape = a["input"], list(a["normalized_shape"])
    full = (1,) * (x.rank - len(shape)) + tuple(shape)
    w, b = a.get("weight"), a.get("bias")
    torch = imp.torch
    scale = (
        imp.reshaped(w, full)
        if w is not None
        else imp.tensor(imp.constant_value(torch.ones(full, dtype=imp.g.intermediate_data_type.to_torch()), "ones"))
    )
    bias = imp.reshaped(b, full) if b is not None else None
    y = imp.g.layernorm("inference", imp.tensor(x), scale, bias, epsilon=float(a["eps"]), name=imp.op_name())
    return y[0]


# -- pooling ----------------------------------------------------------------------------------------


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


@op("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices")
def _max_pool(imp: Importer, node: Any, a: Args) -> Any:
    x = a["self"]
    nsp = x.rank - 2
    multi = isinstance(_meta(node), (list, tuple))
    if multi and imp.used.get(node, set()) - {0}:
        raise Untranslatable("max pooling indices")
    if nsp < 1:
        raise Untranslatable("pooling an unbatched input")
    k = _ints(a["kernel_size"], nsp)
    s = _ints(a["stride"], nsp) if a["stride"] else k
    p, d = _ints(a["padding"], nsp), _ints(a["dilation"], nsp)
    if any(v != 1 for v in d):
        raise Untranslatable("dilated max pooling")
    post = list(p)
    if a["ceil_mode"]:
        for i in range(nsp):
            out = _pool_out(x.shape[2 + i], k[i], s[i], p[i], 1, True)
            post[i] = (out - 1) * s[i] + k[i] - x.shape[2 + i] - p[i]
            if post[i] >= k[i] or post[i] < 0:
                raise Untranslatable("ceil_mode pooling with a window past the padding")
    y, _ = imp.g.resample(
        imp.tensor(x), ResampleMode.MAX, window=k, stride=s, pre_padding=p, post_padding=post, name=imp.op_name()
    )
    return [y, None] if multi else y


@op("avg_pool1d", "avg_pool2d", "avg_pool3d")
def _avg_pool(imp: Importer, node: Any, a: Args) -> Tensor:
    x = a["self"]
    nsp = x.rank - 2
    if nsp < 1:
        raise Untranslatable("pooling an unbatched input")
    if a.get("ceil_mode"):
        raise Untranslatable("ceil_mode average pooling")
    if a.get("divisor_override") is not None:
        raise Untranslatable("avg_pool divisor_override")
    k = _ints(a["kernel_size"], nsp)
    s = _ints(a["stride"], nsp) if a["stride"] else k
    p = _ints(a["padding"], nsp)
    mode = ResampleMode.AVG_INCLUDE_PADDING if a.get("count_include_pad", True) else ResampleMode.AVG_EXCLUDE_PADDING
    y, _ = imp.g.resample(imp.tensor(x), mode, window=k, stride=s, pre_padding=p, post_padding=p, name=imp.op_name())
    return y


def _adaptive(mode: ReductionMode, resample: ResampleMode) -> Translator:
    def translate(imp: Importer, node: Any, a: Args) -> Any:
        x = a["self"]
        multi = isinstance(_meta(node), (list, tuple))
        if multi and imp.used.get(node, set()) - {0}:
            raise Untranslatable("adaptive max pooling indices")
        nsp = x.rank - 2
        out = _ints(a["output_size"], nsp)
        sizes = x.shape[2:]
        if nsp < 1:
            raise Untranslatable("pooling an unbatched input")
        if all(o == 1 for o in out):
            y = reduce(imp, x, list(range(2, x.rank)), True, mode, x.shape[:2] + (1,) * nsp)
        elif all(i % o == 0 for i, o in zip(sizes, out)):
            win = [i // o for i, o in zip(sizes, out)]
            y, _ = imp.g.resample(imp.tensor(x), resample, window=win, stride=win, name=imp.op_name())
        else:
            raise Untranslatable("adaptive pooling to a size that does not divide the input")
        return [y, None] if multi else y

    return translate


for _name in (
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d",
):
    TRANSLATORS.register(_name, _adaptive(ReductionMode.AVG, ResampleMode.AVG_INCLUDE_PADDING))
for _name in ("adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"):
    TRANSLATORS.register(_name, _adaptive(ReductionMode.MAX, ResampleMode.MAX))
